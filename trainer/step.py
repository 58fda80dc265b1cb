"""One optimizer step over one global batch.

    for each of this rank's micro-batches:
        hidden = model(input_ids, position_ids)                    packed rows, block-diagonal attention
        logπ   = chunked_logprobs(hidden, lm_head_weight, targets, T)    (no [tokens, V] logits)
        out    = loss(logπ, logμ, A, loss_mask)                     out.loss = Σ over loss tokens
        backward(out.loss · world_size / N_global)                  gradient accumulation
    clip grad norm; optimizer.step(); scheduler.step()

N_global is the loss-token count of the whole step (all micro-batches of all ranks), counted
before the forward pass, so the step is the token mean over the global batch whatever the
micro-batching and the number of data-parallel ranks. The `world_size` factor undoes the mean
that data-parallel gradient reduction (FSDP/DDP) applies across ranks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from vf.models.moe import moe_stats
from vf.trainer.logprobs import chunked_logprobs
from vf.trainer.losses import Loss, merge_stats, stat_value
from vf.trainer.samples import MicroBatch


class PolicyLogprobs(torch.nn.Module):
    """The native model plus the chunked LM head, as one module: forward returns the per-token
    log-probs of `targets`. Under FSDP2 this wrapper is the root, so the (tied) LM-head weight is
    unsharded inside its forward, where the log-probs are computed."""

    def __init__(self, model, chunk_size: int = 8192):
        super().__init__()
        self.model = model
        self.chunk_size = chunk_size

    def forward(self, input_ids, position_ids, targets, temperature: float = 1.0):
        hidden = self.model(input_ids, position_ids)  # [R, T, H]
        flat = hidden.reshape(-1, hidden.shape[-1])
        return chunked_logprobs(flat, self.model.lm_head_weight, targets.reshape(-1), temperature, self.chunk_size)


@dataclass
class StepResult:
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    grad_norm: float = 0.0
    num_tokens: int = 0  # tokens forwarded on this rank (incl. padding)
    seconds: float = 0.0


def forward_backward(policy: PolicyLogprobs, micro_batches: list[MicroBatch], loss_fn: Loss, loss_params: dict,
                     num_loss_tokens: int, temperature: float = 1.0, world_size: int = 1):
    """Accumulate gradients of Σ loss / num_loss_tokens; returns (Σ loss.detach(), [stats])."""
    denom = max(int(num_loss_tokens), 1)
    total = torch.zeros((), dtype=torch.float64)
    stats = []
    for mb in micro_batches:
        logp = policy(mb.input_ids, mb.position_ids, mb.targets, temperature)
        out = loss_fn(logp, mb.inference_logprobs.reshape(-1), mb.advantages.reshape(-1),
                      mb.loss_mask.reshape(-1), **loss_params)
        (out.loss * (world_size / denom)).backward()
        total += out.loss.detach().double()
        stats.append(out.stats)
    return total, stats


def train_step(policy: PolicyLogprobs, optimizer, scheduler, micro_batches: list[MicroBatch], loss_fn: Loss,
               loss_params: dict, num_loss_tokens: int, temperature: float = 1.0, grad_clip: float = 1.0,
               world_size: int = 1) -> StepResult:
    """One full optimizer step. With world_size > 1 every rank calls it with its own micro-batches
    and the same global `num_loss_tokens`; loss and metrics come back reduced over all ranks."""
    t0 = time.perf_counter()
    policy.train()
    optimizer.zero_grad(set_to_none=True)
    moe_stats(policy.model)  # drop routing counts of forwards outside this step
    total, stats = forward_backward(policy, micro_batches, loss_fn, loss_params, num_loss_tokens,
                                    temperature, world_size)
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    scheduler.step()
    merged = merge_stats(stats)
    if world_size > 1:
        from vf.trainer.distributed import all_reduce_stats, all_reduce_sum

        total = all_reduce_sum(total)
        merged = all_reduce_stats(merged)
    metrics = {k: stat_value(v) for k, v in merged.items()}
    metrics.update(moe_stats(policy.model))  # MoE load balance of this step (this rank's tokens)
    return StepResult(loss=float(total) / max(int(num_loss_tokens), 1), metrics=metrics,
                      grad_norm=float(grad_norm), num_tokens=sum(mb.num_tokens for mb in micro_batches),
                      seconds=time.perf_counter() - t0)


def make_optimizer(model, lr: float, betas=(0.9, 0.99), weight_decay: float = 0.0):
    # foreach=False: identical arithmetic whether parameters are plain tensors or FSDP2 shards
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                             foreach=False)


def make_scheduler(optimizer, kind: str = "constant", warmup_steps: int = 0, total_steps: int = 0,
                   phase_lrs: list[tuple[int, float]] | None = None):
    """LambdaLR: linear warm-up over `warmup_steps`, then constant or linear decay to 0 at
    `total_steps`. `phase_lrs` [(first_step, lr), ...] switches the base LR from a step on (the SFT
    warm-up phase may use its own LR); the factor is relative to the optimizer's initial lr."""
    base = optimizer.param_groups[0]["lr"]
    phases = sorted(phase_lrs or [])

    def factor(step: int) -> float:
        lr = base
        for first, value in phases:
            if step >= first:
                lr = value
        f = lr / base
        if warmup_steps and step < warmup_steps:
            f *= (step + 1) / warmup_steps
        if kind == "linear" and total_steps:
            f *= max(0.0, 1.0 - step / total_steps)
        return f

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
