"""Expert parallelism (EP) for the one MoE runtime (models/moe.py), on torch.distributed
(gloo on CPU, NCCL on GPU; the same code, torchrun-launched).

Shape legend as in models/moe.py: N tokens on this rank, H hidden, E routed experts, k experts per
token, A = N*k assignments; ep ranks in the expert group, c = E/ep experts per rank, R = rows this
rank receives.

Layout: the ep ranks of a group split every MoE layer's experts into contiguous blocks; rank r of
the group holds global experts [r*c, (r+1)*c) (`shard_experts`, which sets `moe.ep` to an
ExpertShard). Everything else (attention, router, shared experts, embeddings) stays whole on every
rank, and each rank keeps its own tokens.

Forward of a sharded layer (`ExpertShard.compute`, called from `MoE.forward`):
  1. the router runs on this rank's N tokens and picks global expert ids (router replay applies as
     usual: replay ids are global);
  2. the A assignments are sorted by global expert id; since blocks are contiguous that is also the
     order by destination rank (dest = id // c), then by local expert (id − dest*c);
  3. counts: each rank sends its per-expert assignment counts [E] (chunk r of c counts goes to rank r)
     with one all_to_all_single and receives [ep, c]: from each source, rows per local expert. That
     gives both the uneven split sizes of the next collectives and the local expert id of every row
     that will arrive (rows come sorted by expert within each source's chunk), so ids need no
     collective of their own;
  4. dispatch: the sorted token rows go out with the autograd-aware
     `torch.distributed.nn.functional.all_to_all_single` (its backward is the reverse exchange of the
     gradients), R rows arrive;
  5. this rank runs its c local experts over the R rows with the layer's own compute path (grouped /
     loop, on the local weight slice, router weight 1);
  6. combine: the R results go back with the reverse autograd-aware all_to_all_single; each source
     gets its A rows in the order it sent them, multiplies them by the router weights and index-adds
     them per source token: out[t] = Σ_j w[t, j] · expert_{idx[t, j]}(x[t]), the same sum as without EP.
A rank that sends or receives zero rows still runs every collective (forward and backward): the
others wait on it. Steps 3, 4 and 6's return trip are `exchange_counts` and `exchange_rows`, which
know nothing of experts: models/ngram_parallel.py sends its table lookups to their owners with them.

Gradients: a sharded expert's gradient on rank r covers the tokens of every rank of its ep group
(the dispatch backward brings them back), so summing over the replicas (the ranks of other ep
groups that hold the same block: `reduce_expert_grads`) gives the gradient over all tokens. Non-expert
parameters are whole on every rank and are reduced over the whole world as in data parallelism.
Load-balance counts stay global (`_record` counts global ids over [E]); `global_moe_stats` sums them
over the ranks so max_vio describes the global batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn
from vf.models.errors import ModelLoadError
from vf.models.moe import MoE, check_impl, moe_layers, moe_stats

from vf.errors import UsageError

# torch 2.13 marks torch.distributed.nn.functional deprecated in favour of _functional_collectives;
# its all_to_all_single is still the autograd-aware one with uneven splits that works eagerly on gloo
# and NCCL alike. Silence that one warning (it would print once per process and call site).
warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_to_all_single is deprecated",
                        category=FutureWarning)

# the per-expert tensors of a MoE layer (dim 0 = expert), the ones expert parallelism splits
EXPERT_PARAMS = ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")


def exchange_counts(per_bucket: torch.Tensor, size: int, group) -> tuple[list[int], list[int], torch.Tensor]:
    """Step 3 of the module docstring, for any rows that go to the rank owning their bucket: per_bucket
    [size*c] int64 counts of the rows this rank sends to each bucket (bucket b lives on rank b // c)
    → (send [size] rows to each rank, recv [size] rows from each rank, recv_per_bucket [size*c]:
    from source s, rows for its local bucket e at s*c + e). One all_to_all_single over `group`,
    which every rank of the group calls, also one with nothing to send."""
    recv_per_bucket = torch.empty_like(per_bucket)
    dist.all_to_all_single(recv_per_bucket, per_bucket, group=group)
    send = per_bucket.view(size, -1).sum(1).tolist()
    recv = recv_per_bucket.view(size, -1).sum(1).tolist()
    return send, recv, recv_per_bucket


def exchange_rows(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    """x [Σsend, ...] (rows for rank r in the r-th block of send[r] rows) → [Σrecv, ...] the rows the
    other ranks sent here, by source rank; autograd-aware (backward: the reverse exchange of the
    gradients). Swap send and recv to return results to where their rows came from."""
    return dist_nn.all_to_all_single(x.new_empty(sum(recv), *x.shape[1:]), x, recv, send, group=group)


@dataclass
class ExpertShard:
    """Set as `moe.ep` on every MoE layer by `shard_experts`."""

    group: dist.ProcessGroup  # the ep ranks that split this layer's experts (dispatch/combine group)
    size: int  # ep size
    rank: int  # this rank's index in the group
    first: int  # global index of this rank's first local expert
    count: int  # local expert count (E / ep)

    def compute(self, moe: MoE, x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Routed-expert output for this rank's tokens: x [N, H], w [N, k] (x.dtype), idx [N, k]
        global expert ids -> [N, H] (steps 2-6 of the module docstring)."""
        k = idx.shape[1]
        flat_idx = idx.reshape(-1)  # [A]
        order = torch.argsort(flat_idx, stable=True)  # by destination rank, then local expert
        tok = order // k  # [A] source token of each sorted assignment
        per_expert = torch.bincount(flat_idx, minlength=self.size * self.count)  # [E]
        send, recv, recv_per_expert = exchange_counts(per_expert, self.size, self.group)
        local = torch.arange(self.count, device=idx.device).repeat(self.size).repeat_interleave(recv_per_expert)  # [R]
        xr = exchange_rows(x[tok], send, recv, self.group)  # [R, H]
        if xr.shape[0]:
            run = moe._grouped if check_impl(moe.impl) == "grouped" else moe._loop
            ys = run(xr, xr.new_ones(xr.shape[0], 1), local[:, None])  # [R, H], row i = its expert's output
        else:  # nothing to compute, but the (empty) result must stay tied to the dispatch and the
            # weights: this rank's backward has to run the reverse exchanges the other ranks wait on
            ys = xr + 0 * moe.down_proj.sum()
        back = exchange_rows(ys, recv, send, self.group)  # [A, H]
        return torch.zeros_like(x).index_add_(0, tok, back * w.reshape(-1)[order, None])


def _size_rank(group) -> tuple[int, int]:
    """(size, this rank's index) of a ProcessGroup (None: the world). Any object with `size()` and
    `rank()` works, which lets a test check the arithmetic without a process group."""
    if group is None:
        group = dist.group.WORLD
    return group.size(), group.rank()


def shard_experts(model: nn.Module, group) -> int:
    """Keep only this rank's contiguous block of experts in every MoE layer (moe_layers(model)):
    gate_up_proj/down_proj (and their biases) become nn.Parameters of the [first:first+count] slice
    (contiguous clones, same names), set moe.ep. Returns the number of layers sharded. Call after weights
    are loaded and before FSDP wrapping. E % ep != 0 → raise vf.errors UsageError (exit 2) naming the numbers.

    Every layer is checked before any is changed, so a refusal leaves the model whole."""
    size, rank = _size_rank(group)
    layers = moe_layers(model)
    for moe in layers:
        if moe.ep is not None:
            raise UsageError("expert parallelism: the model's experts are already sharded")
        if moe.num_experts % size:
            raise UsageError(f"expert parallelism over {size} ranks needs the experts to split evenly: "
                             f"{moe.num_experts} experts per MoE layer, {moe.num_experts} % {size} = "
                             f"{moe.num_experts % size}",
                             hint=f"choose an ep size that divides {moe.num_experts}")
    for moe in layers:
        count = moe.num_experts // size
        first = rank * count
        for name in EXPERT_PARAMS:
            p = getattr(moe, name)
            if p is not None:
                setattr(moe, name, nn.Parameter(p.detach()[first:first + count].clone(), requires_grad=p.requires_grad))
        moe.ep = ExpertShard(group if group is not None else dist.group.WORLD, size, rank, first, count)
    return len(layers)


def _sharded(model: nn.Module) -> Iterator[tuple[str, nn.Parameter, ExpertShard]]:
    """(full name, local parameter, its layer's shard) of every sharded expert tensor, in module order."""
    for prefix, m in model.named_modules():
        if isinstance(m, MoE) and m.ep is not None:
            for name in EXPERT_PARAMS:
                p = getattr(m, name)
                if p is not None:
                    yield (f"{prefix}.{name}" if prefix else name), p, m.ep


def expert_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(full names) of the sharded expert params."""
    return [(name, p) for name, p, _ in _sharded(model)]


def reduce_expert_grads(model: nn.Module, replicas, divide: float) -> None:
    """All-reduce (SUM) the expert grads over `replicas` (ranks holding the same experts; None = no other
    replica) then divide by `divide`.

    A missing grad (a rank whose experts got no rows) counts as zeros, so every replica contributes
    the same tensors; the grads travel as one flat buffer (one collective, not one per tensor)."""
    params = [p for _, p, _ in _sharded(model) if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    if replicas is not None and replicas.size() > 1:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=replicas)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    if divide != 1.0:
        for p in params:
            p.grad.div_(divide)


def full_expert_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """all_gather over the ep group along dim 0: {full name: full [E, ...] tensor} per expert param
    (a collective: every rank of the group calls it). Group rank r's block lands at rows
    [r*c, (r+1)*c), its global experts."""
    out = {}
    for name, p, shard in _sharded(model):
        local = p.detach().contiguous()
        parts = [torch.empty_like(local) for _ in range(shard.size)]
        dist.all_gather(parts, local, group=shard.group)
        out[name] = torch.cat(parts)
    return out


def load_expert_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Slice full [E, ...] tensors (as `full_expert_state` returns) into the local params."""
    for name, p, shard in _sharded(model):
        if name not in state:
            raise ModelLoadError(f"expert parallelism: no tensor {name!r} in the expert state")
        t = state[name]
        if t.shape[0] != shard.size * shard.count or t.shape[1:] != p.shape[1:]:
            raise ModelLoadError(f"expert parallelism: {name} has shape {tuple(t.shape)}, expected "
                                 f"{(shard.size * shard.count, *p.shape[1:])}")
        with torch.no_grad():
            p.copy_(t[shard.first:shard.first + shard.count])


def global_moe_stats(model: nn.Module, group=None) -> dict[str, float]:
    """Like models.moe.moe_stats (pops each layer's counts) but the counts/confidence/tokens are all-reduced
    over `group` (default world) first, so max_vio etc. describe the global batch (a collective).

    One float64 all-reduce of [counts (E), Σ confidence, tokens] per layer, laid end to end (float64
    holds the integer counts exactly); then moe_stats reads the summed counters."""
    layers = moe_layers(model)
    if not layers:
        return {}
    device = layers[0].router.weight.device
    rows = []
    for m in layers:
        counts = m._counts if m._counts is not None else torch.zeros(m.num_experts, dtype=torch.long, device=device)
        conf = m._confidence if m._confidence is not None else torch.zeros((), device=device)
        rows.append(torch.cat([counts.to(device, torch.float64), conf.to(device, torch.float64).reshape(1),
                               torch.tensor([float(m._tokens)], dtype=torch.float64, device=device)]))
    flat = torch.cat(rows)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for m in layers:
        E = m.num_experts
        m._counts = flat[offset:offset + E].round().long()
        m._confidence = flat[offset + E]
        m._tokens = int(flat[offset + E + 1].item())
        offset += E + 2
    return moe_stats(model)
