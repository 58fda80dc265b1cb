"""Mixed precision: low-precision compute with fp32 master weights, gradients and optimizer state.

    --model.dtype         the compute dtype: forward and backward, the engine, the weight push
    --model.master-dtype  what the optimizer updates and checkpoints keep (float32, the default;
                          the compute dtype itself for pure low precision)
    --model.tf32          fp32 matmuls on CUDA through TF32 tensor cores (default on)

Why: an AdamW update at RL learning rates (1e-6..1e-5) is far below bf16's resolution for most
weights (8 bits of mantissa: a weight of 0.02 moves only in steps of ~1e-4), so a bf16 optimizer
silently drops most updates. Measured on CPU, same deterministic run at lr 1e-5 over 12 steps:
pure bf16 moved 11% of the weights and its update had cosine 0.29 with the fp32 run's; with fp32
masters the update follows the fp32 run's (tests/test_precision.py).

One process (`MasterWeights`): the model's parameters hold the compute dtype and an fp32 master
copy of each is what the optimizer sees. Each backward's gradient is added into the master's fp32
gradient as soon as autograd has accumulated it (a post-accumulate-grad hook) and the compute
gradient is freed, so micro-batches accumulate in fp32 and at most one layer's low-precision
gradient is alive at a time. After `optimizer.step()` the compute weights are rounded from their
masters (`sync`). Under torchrun FSDP2 gives the same semantics with its mixed-precision policy:
the sharded parameters are the fp32 masters, all-gathered as the compute dtype for the forward,
gradients reduce-scattered in fp32 (`fsdp_policy`).

Bytes per parameter with AdamW: fp32 16 (weight, grad, two moments); bf16 compute with fp32
masters 18 (+2 for the bf16 weight; its gradient lives one layer at a time); pure bf16 8.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

LOW = {torch.bfloat16, torch.float16}


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def mixed(compute: torch.dtype, master: torch.dtype) -> bool:
    """Compute in a low-precision dtype while the optimizer keeps a wider master copy."""
    return compute != master


def configure_matmul(device: str, tf32: bool) -> None:
    """TF32 for fp32 matmuls and convolutions on CUDA (10-bit mantissa products, fp32 accumulate:
    ~8x the fp32 throughput on Ampere and later); `--model.tf32 false` keeps exact fp32. A no-op
    on CPU, where the setting does not exist in the kernels."""
    if not str(device).startswith("cuda"):
        return
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def fsdp_policy(compute: torch.dtype, master: torch.dtype):
    """FSDP2's mixed-precision policy for fp32 sharded parameters computing in `compute`: the
    all-gather casts to the compute dtype, gradients are reduced (and kept) in fp32. None when
    compute and master agree (FSDP then reduces in the parameters' own dtype)."""
    if not mixed(compute, master):
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=master)


class MasterWeights:
    """fp32 master copies of a module's trainable parameters, which are cast to `compute` in place.

        masters = MasterWeights(policy, torch.bfloat16)
        optimizer = AdamW(masters.parameters())
        ... backward ...                 # hooks add each gradient into the masters' fp32 grads
        masters.collect()                # (gradients added outside autograd, see below)
        clip_grad_norm_(masters.parameters()); optimizer.step(); masters.sync()

    `collect` sweeps any compute gradient that no hook saw into the masters: the tied embedding
    adds its rows into `weight.grad` by hand after autograd is done (`layers.Embedding.grad_in_place`)."""

    def __init__(self, module: nn.Module, compute: torch.dtype, master: torch.dtype = torch.float32,
                 initial: dict[str, torch.Tensor] | None = None):
        self.compute, self.master = compute, master
        self.names: list[str] = []
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []  # (compute parameter, its master)
        for name, p in module.named_parameters():
            if not p.is_floating_point():
                continue
            if not p.requires_grad:  # computes in the compute dtype, as load_model(dtype=compute) leaves it
                p.data = p.data.to(compute)
                continue
            source = initial.get(name, p) if initial else p  # a checkpoint's fp32 values, not their rounding
            m = nn.Parameter(source.detach().to(device=p.device, dtype=master, copy=True))
            p.data = p.data.to(compute)
            p.register_post_accumulate_grad_hook(self._hook(m))
            self.names.append(name)
            self.pairs.append((p, m))

    @staticmethod
    def _hook(m: nn.Parameter):
        def add(p: torch.Tensor) -> None:
            if m.grad is None:
                m.grad = p.grad.to(m.dtype)
            else:
                m.grad.add_(p.grad)
            p.grad = None  # the low-precision gradient is not kept

        return add

    def parameters(self) -> list[nn.Parameter]:
        return [m for _, m in self.pairs]

    def collect(self) -> None:
        for p, m in self.pairs:
            if p.grad is not None:
                self._hook(m)(p)

    def zero_grad(self) -> None:
        for p, m in self.pairs:
            p.grad = m.grad = None

    @torch.no_grad()
    def sync(self) -> None:
        """Round every compute weight from its updated master."""
        for p, m in self.pairs:
            p.copy_(m)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The masters under the module's parameter names (what checkpoints keep)."""
        return {name: m.detach() for name, (_, m) in zip(self.names, self.pairs)}


def bytes_per_parameter(modules: Iterable[nn.Module], optimizer, masters: MasterWeights | None) -> float:
    """Training memory per model parameter: weights, gradients, masters (and their gradients) and
    the optimizer's state, in bytes, counted from the live tensors (the figure mixed precision is
    judged by: 16 for fp32 AdamW, 18 with bf16 compute over fp32 masters)."""
    seen: set[int] = set()
    total = 0
    count = 0

    def add(t) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            local = t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 shard: this rank's bytes
            total += local.numel() * local.element_size()

    for module in modules:
        for p in module.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            count += local.numel()
            add(p)
            add(p.grad)
    for m in masters.parameters() if masters else ():
        add(m)
        add(m.grad)
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                add(v)
    return total / max(count, 1)
