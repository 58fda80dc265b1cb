"""Context parallelism (CP): one micro-batch's sequence split over `size` processes, each running the
model on its own slice of every row; attention, the only layer that mixes tokens, talks to the
other ranks. Two styles, on torch.distributed (gloo on CPU, NCCL on GPU; ranks start under torchrun):

  ring     keys/values travel round the ring of CP ranks (P2P, `dist.batch_isend_irecv`); each
           rank attends its queries to one block at a time and merges the blocks with the
           log-sum-exp rule. Any head count; per layer size-1 K/V blocks go round in forward
           and size-1 gradient blocks come back in backward.
  ulysses  two all-to-alls turn the sequence split into a head split and back: each rank runs
           ordinary per-document causal attention (`layers.sdpa` with `Documents`) over the FULL
           rows for nh/size of the heads. Needs nh % size == 0.

Usage (the trainer's micro-batch step):

    shard = ContextShard(group, size, rank, "ring", position_ids)        # FULL rows' positions [B, T]
    with context_parallel(shard):                                        # forward AND backward
        hidden = model(split_sequence(input_ids, size, rank), split_sequence(position_ids, size, rank))
        loss = per_token_loss(hidden, split_sequence(targets, size, rank)).sum()
        loss.backward()
    all-reduce (SUM) the parameter gradients over `group`             # every rank saw part of the tokens

Under the context `layers.positions_and_mask` returns the local positions (the true positions:
rotary uses them) and, as the layers' opaque attention `mask`, a `ShardedAttention` carrying the
shard; `layers.sdpa` hands q/k/v to it. Layers that build their own masks or carry state along the
sequence refuse it (`layers.refuse_context_parallel`: DSA, sink attention, DeltaNet, Mamba-2,
DeepSeek-V4, the transformers fallback) rather than compute on a slice as if it were the row.

Load balance (`shard_columns`): with causal attention the later tokens do more work, so a
contiguous split would give the last rank ~2·size-1 times the first one's attention work. The row
(length T, padded by the caller to a multiple of 2·size) is cut into 2·size chunks and rank r takes
chunks r and 2·size-1-r: the pair's causal work is (r + ½) + (2·size-1-r + ½) = 2·size chunk-pairs
for every r.

Masking: documents of a packed row start where the position is 0; a token's document id is the
count of starts up to its column. Query column i may see key column j iff same document and j <= i
(global columns), exactly what `layers.Documents` gives the one-process model.

Loss and gradients: each rank's loss covers only its tokens, so the parameter gradients are partial
sums; SUM them over the CP group (with data parallelism too: over dp × cp) and normalise the loss by
the token count of the whole micro-batch, not of the rank's slice.

Measured (project CPU, fp32, gloo, tests/parallel/cp_memory.py: a 2-layer hidden-64 GQA model, one
row in 4 documents, peak bytes allocated during one forward+backward per rank, torch's CPU memory
profiler): T=4096: one process 52.3 MiB, ring cp2 46.2, ulysses cp2 28.4; T=8192: 104.3, 92.0,
56.9. Ring's peak is mostly one query tile's fp32 scores (`Q_TILE`); its time on CPU is ~10× the
one-process flash kernel (explicit fp32 math, tiles recomputed in backward): 3.7 s vs 0.35 s at 4096.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch.utils.checkpoint import checkpoint
from vf.models.layers import CONTEXT_SHARD, Documents, ShardedMask, sdpa

from vf.errors import UsageError

STYLES = ("ring", "ulysses")


def shard_columns(T: int, size: int, rank: int, device=None) -> torch.LongTensor:
    """Load-balanced causal split: T (a multiple of 2·size, padded by the caller) in 2·size chunks;
    rank r gets chunks r and 2·size-1-r, so every rank has the same causal work (module doc).
    Returns the global column indices of this rank's T/size tokens, in order."""
    if T % (2 * size):
        raise UsageError(f"context parallelism over {size} ranks needs a sequence length that is a multiple "
                         f"of {2 * size}; got {T}", hint="pad the rows to a multiple of 2 × the CP size")
    c = T // (2 * size)
    first, second = rank * c, (2 * size - 1 - rank) * c
    return torch.cat((torch.arange(first, first + c, device=device), torch.arange(second, second + c, device=device)))


def split_sequence(t: torch.Tensor, size: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of `t` along `dim` (the columns of `shard_columns`)."""
    return t.index_select(dim, shard_columns(t.shape[dim], size, rank, t.device))


@dataclass
class ContextShard:
    """One rank's part of a CP micro-batch. `position_ids` [B, T] are the FULL rows' positions (a
    document starts where the position is 0); `rank`/`size` are within `group`."""

    group: object  # torch.distributed ProcessGroup
    size: int
    rank: int
    style: str  # "ring" | "ulysses"
    position_ids: torch.Tensor

    def __post_init__(self):
        if self.style not in STYLES:
            raise UsageError(f"unknown context-parallel style {self.style!r}", hint=f"one of {', '.join(STYLES)}")
        if not 0 <= self.rank < self.size:
            raise UsageError(f"context-parallel rank {self.rank} of {self.size} does not exist")
        shard_columns(self.position_ids.shape[1], self.size, self.rank)  # refuses a length it cannot split

    @classmethod
    def for_group(cls, group, style: str, position_ids: torch.Tensor) -> ContextShard:
        return cls(group, dist.get_world_size(group), dist.get_rank(group), style, position_ids)

    @cached_property
    def columns(self) -> torch.LongTensor:
        """This rank's global columns [T/size]."""
        return self.columns_of(self.rank)

    def columns_of(self, rank: int) -> torch.LongTensor:
        return shard_columns(self.position_ids.shape[1], self.size, rank, self.position_ids.device)

    @cached_property
    def doc_ids(self) -> torch.Tensor:
        """[B, T] int: each column's document number in its row (starts where the position is 0)."""
        starts = self.position_ids == 0
        starts[:, 0] = True
        return starts.cumsum(1)

    def local_positions(self, position_ids: torch.Tensor | None) -> torch.Tensor:
        """The positions a sharded forward uses: the caller's local slice (checked against the full
        rows: a caller that forgot to split would otherwise get silently wrong attention)."""
        local = self.position_ids.index_select(1, self.columns)
        if position_ids is not None and (position_ids.shape != local.shape or not torch.equal(position_ids, local)):
            raise UsageError(f"context parallelism: the model got positions {tuple(position_ids.shape)} that are "
                             f"not this rank's slice {tuple(local.shape)} of the shard's rows",
                             hint="pass split_sequence(position_ids, size, rank) and the same for input_ids")
        return local

    def mask(self) -> ShardedAttention:
        return ShardedAttention(self)


@contextmanager
def context_parallel(shard: ContextShard | None):
    """Run the model's forwards under `shard` (None: a no-op). The mask object the forward builds
    carries the shard, so backward (and activation-checkpoint recomputation) needs nothing from
    here; keep the context open across both anyway, as one micro-batch's scope."""
    if shard is None:
        yield None
        return
    token = CONTEXT_SHARD.set(shard)
    try:
        yield shard
    finally:
        CONTEXT_SHARD.reset(token)


class ShardedAttention(ShardedMask):
    """The attention `mask` under context parallelism: `layers.sdpa(q, k, v, mask)` calls `attend`."""

    def __init__(self, shard: ContextShard):
        self.shard = shard

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, nh, T/size, dq], k [B, nkv, T/size, dq], v [B, nkv, T/size, dv] (this rank's tokens)
        -> [B, nh, T/size, dv]."""
        if self.shard.style == "ring":
            return ring_attention(q, k, v, self.shard)
        return ulysses_attention(q, k, v, self.shard, self.documents)

    @cached_property
    def documents(self) -> Documents:
        """The full rows' layout (ulysses attends over whole rows); built once per forward."""
        return Documents(self.shard.position_ids)


# ---- ring -----------------------------------------------------------------------------------------


def _ring_peers(shard: ContextShard) -> tuple[int, int]:
    """Global ranks of (next, previous) in the CP ring."""
    return (dist.get_global_rank(shard.group, (shard.rank + 1) % shard.size),
            dist.get_global_rank(shard.group, (shard.rank - 1) % shard.size))


class _Exchange:
    """Send `tensors` to global rank `send_to` and receive same-shaped ones from `recv_from`,
    started now (`dist.batch_isend_irecv`) and finished by `wait()`, so that attention on the
    block at hand runs while the next one travels."""

    def __init__(self, tensors, send_to: int, recv_from: int, group):
        self.sent = [t.detach().contiguous() for t in tensors]  # dense buffers (P2P), alive until wait()
        self.out = [torch.empty_like(t) for t in self.sent]
        ops = [dist.P2POp(dist.isend, t, send_to, group) for t in self.sent]
        ops += [dist.P2POp(dist.irecv, o, recv_from, group) for o in self.out]
        self.requests = dist.batch_isend_irecv(ops)

    def wait(self) -> list[torch.Tensor]:
        for req in self.requests:
            req.wait()
        return self.out


class _RingPass(torch.autograd.Function):
    """Forward: the tensors passed one step round the ring (sent to rank+1, received from rank-1),
    by an `_Exchange` already started on exactly these `tensors`. Backward: the gradients go the
    opposite way (the gradient of what we received belongs to its sender). Every rank runs the same
    graph, so sends and receives pair up in backward as in forward."""

    @staticmethod
    def forward(ctx, shard: ContextShard, exchange: _Exchange, *tensors):
        ctx.group, ctx.shapes = shard.group, [(t.shape, t.dtype, t.device) for t in tensors]
        ctx.peers = _ring_peers(shard)
        return tuple(exchange.wait())

    @staticmethod
    def backward(ctx, *grads):
        # an output nobody used still has to answer its sender's receive: send zeros
        grads = [torch.zeros(*sh, dtype=dt, device=dev) if g is None else g for g, (sh, dt, dev) in zip(grads, ctx.shapes)]
        return (None, None, *_Exchange(grads, ctx.peers[1], ctx.peers[0], ctx.group).wait())


Q_TILE = 256  # query rows per score tile: the transient scores are [B, nh, Q_TILE, T/size] fp32 (a few copies)


def _tile(q, k, v, q_pos, k_pos, scale):
    """One tile of queries against one block of keys. q [B, nkv, rep, Tq, d] (query head g·rep + j
    is q[:, g, j]: GQA's h // rep), k/v [B, nkv, Tk, d|dv]; q_pos/k_pos = (document ids [B, T*],
    global columns [T*]). Visible: same document and key column <= query column. Returns (out fp32
    [B, nkv, rep, Tq, dv] normalised over this block, lse fp32 [B, nkv, rep, Tq]); a query that sees
    no key of the block gets lse -inf and out 0, with finite gradients."""
    (q_docs, q_cols), (k_docs, k_cols) = q_pos, k_pos
    visible = (q_docs[:, :, None] == k_docs[:, None, :]) & (k_cols[None, :] <= q_cols[:, None])  # [B, Tq, Tk]
    s = (q.float() @ k.float().transpose(-1, -2)[:, :, None]) * scale  # [B, nkv, rep, Tq, Tk]
    s = s.masked_fill(~visible[:, None, None], float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()  # any constant works: it cancels
    p = torch.exp(s - m)  # 0 where masked
    denom = p.sum(-1, keepdim=True)
    seen = denom > 0
    safe = torch.where(seen, denom, torch.ones_like(denom))
    out = (p @ v.float()[:, :, None]) / safe
    lse = torch.where(seen, m + torch.log(safe), torch.full_like(m, float("-inf")))
    return out, lse.squeeze(-1)


def _block(q, k, v, q_pos, k_pos, scale):
    """`_tile` over the query rows Q_TILE at a time, each tile recomputed in backward
    (torch.utils.checkpoint): what stays alive is the inputs and the [.., Tq, dv] outputs, and
    the scores of one tile at a time, forward and backward."""
    grad = torch.is_grad_enabled()
    outs, lses = [], []
    for t in range(0, q.shape[3], Q_TILE):
        tile = slice(t, t + Q_TILE)
        args = (q[:, :, :, tile], k, v, (q_pos[0][:, tile], q_pos[1][tile]), k_pos, scale)
        o, l = checkpoint(_tile, *args, use_reentrant=False) if grad else _tile(*args)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs, 3), torch.cat(lses, 3)


def ring_attention(q, k, v, shard: ContextShard) -> torch.Tensor:
    """Ring attention over the CP group (module doc). Step i holds the K/V block of rank
    (rank - i) mod size; per block (out_i, lse_i) and the running merge

        lse = log(e^lse + e^lse_i),   out = out · e^(lse_old - lse) + out_i · e^(lse_i - lse)

    in fp32, which is softmax over the union of the blocks. Scores are built a tile of queries at
    a time and recomputed in backward (`_block`), so a rank keeps its queries' outputs and the K/V
    blocks, never a [T/size × T] score matrix. GQA: kv head h // (nh / nkv) serves query head h,
    as SDPA's enable_gqa, by broadcasting (the blocks travel and stay at nkv heads). The merge
    keeps autograd's saved tensors per step ([B, nh, T/size, dv] fp32); a fused flash-style
    backward (one custom Function re-running the ring) would keep only the final out and lse."""
    B, nh, Tq, d = q.shape
    nkv = k.shape[1]
    scale = 1.0 / math.sqrt(d)
    docs = shard.doc_ids
    q_pos = (docs.index_select(1, shard.columns), shard.columns)
    qg = q.view(B, nkv, nh // nkv, Tq, d)
    out = lse = None
    kv, pending = (k, v), None
    for step in range(shard.size):
        src = (shard.rank - step) % shard.size
        if step:  # the block sent last step has arrived; none is sent after the last step, so every one is used
            kv = _RingPass.apply(shard, pending, *kv)
        if step + 1 < shard.size:  # start passing this block on before attending to it (overlap)
            pending = _Exchange(kv, *_ring_peers(shard), shard.group)
        k_cols = shard.columns_of(src)
        o_i, l_i = _block(qg, *kv, q_pos, (docs.index_select(1, k_cols), k_cols), scale)
        if out is None:  # step 0 is the rank's own block: every query sees at least itself
            out, lse = o_i, l_i
            continue
        new = torch.logaddexp(lse, l_i)
        out = out * torch.exp(lse - new)[..., None] + o_i * torch.exp(l_i - new)[..., None]
        lse = new
    return out.reshape(B, nh, Tq, -1).to(q.dtype)


# ---- ulysses --------------------------------------------------------------------------------------


def _seq_to_heads(x: torch.Tensor, shard: ContextShard) -> torch.Tensor:
    """[B, h, T/size, d] (this rank's tokens, all heads) -> [B, h/size, T, d] (heads of this rank's
    group, every token in global column order)."""
    B, h, Tl, d = x.shape
    n = shard.size
    parts = x.reshape(B, n, h // n, Tl, d).transpose(0, 1).contiguous()  # [n (head group), B, h/n, Tl, d]
    got = dist_fn.all_to_all_single(torch.empty_like(parts), parts, group=shard.group)  # [n (source rank), ...]
    got = got.permute(1, 2, 0, 3, 4).reshape(B, h // n, n * Tl, d)  # columns: rank 0's, rank 1's, ...
    order = torch.cat([shard.columns_of(r) for r in range(n)])
    return got.index_select(2, torch.argsort(order))


def _heads_to_seq(x: torch.Tensor, shard: ContextShard) -> torch.Tensor:
    """The inverse of `_seq_to_heads`: [B, h/size, T, d] -> [B, h, T/size, d]."""
    B, hl, T, d = x.shape
    n = shard.size
    parts = torch.stack([x.index_select(2, shard.columns_of(r)) for r in range(n)])  # [n (dest rank), B, hl, Tl, d]
    got = dist_fn.all_to_all_single(torch.empty_like(parts), parts, group=shard.group)  # [n (head group), ...]
    return got.permute(1, 0, 2, 3, 4).reshape(B, n * hl, T // n, d)


def ulysses_attention(q, k, v, shard: ContextShard, documents: Documents) -> torch.Tensor:
    """All-to-all to a head split, per-document causal `sdpa` over the full rows, all-to-all back.
    Rank j takes query heads [j·nh/size, (j+1)·nh/size) and the kv heads they use; when nkv is not
    a multiple of size the kv heads are first repeated to nh (GQA's head h // (nh/nkv)), which sends
    more bytes but is exact."""
    nh, nkv, n = q.shape[1], k.shape[1], shard.size
    if nh % n:
        raise UsageError(f"ulysses context parallelism over {n} ranks needs the head count ({nh}) to be a "
                         "multiple of it", hint="use --cp-style ring, or a CP size dividing the head count")
    if nkv % n:
        k, v = (t.repeat_interleave(nh // nkv, dim=1) for t in (k, v))
    out = sdpa(_seq_to_heads(q, shard), _seq_to_heads(k, shard), _seq_to_heads(v, shard), documents)
    return _heads_to_seq(out, shard)
