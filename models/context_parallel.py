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
shard; `layers.sdpa` hands q/k/v to it. The recurrent layers (Gated DeltaNet, Mamba-2) switch to a
head split around their scan (models/context_parallel_recurrent.py).

Attention that builds its own mask (DSA's per-query top-k selection, GPT-OSS's sinks and sliding
windows, DeepSeek-V4's compressed entries pooled across chunk edges) takes the third way, in either style: `gather` all-gathers the key side (MLA's latent and
rope key plus DSA's index key; GPT-OSS's K/V at its kv heads; DeepSeek-V4's per-token kv,
compressor and indexer streams) into the whole rows, `visible` gives
this rank's query rows of the per-document causal mask, and the layer runs its own masked path for
its T/size queries over T keys. The keys are all here (O(T) per rank for the key side, O(T/size · T)
for the mask), the queries and everything per query are not. Layers that still refuse a slice
(`layers.refuse_context_parallel`: the transformers fallback, vision inputs) exit 2 rather than
compute on a slice as if it were the row.

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

Measured (project CPU, 2 shared cores, fp32, gloo; tests/parallel/cp_memory.py: hidden-64 GQA model
4/2 heads × 16, one row in 4 documents; peak bytes allocated during one forward+backward on rank 0,
from torch's CPU profiler allocation events):
                          one process   ring cp2   ulysses cp2
    T=4096, 2 layers        51.9 MiB    26.0 MiB     30.2 MiB
    T=8192, 2 layers       103.8 MiB    51.9 MiB     56.4 MiB
    T=8192, 8 layers       358.1 MiB   179.0 MiB    194.0 MiB
Time on this CPU at T=8192, 2 layers: one process 0.69 s, ulysses 0.66 s, ring 0.65 s (4096: 0.25 s
one process, ring 0.17-0.29 s; the bench's documents meet the cp-2 chunk edges, so no block needs a
mask: a ring of one over the same row at T=4096, whose blocks do, takes 0.13 s vs SDPA's 0.09 s for
one attention forward+backward). Ring runs each block through torch's fused CPU flash kernel
(`_blocks`); before that, explicit fp32 tile math took 7.7-10.8 s, most of it in the [Q_TILE, chunk]
score matmuls, exp and mask fills. On CUDA in fp16/bf16 the unmasked blocks (every key visible, or
one document's causal diagonal) go to torch's CUDA flash kernel with its log-sum-exp
(`attention_kernels.flash_block_forward`/`_backward`) and the masked tiles (where a document starts
inside a chunk) to the tile math; fp32 on CUDA runs the tile math throughout. Ring has not yet run on
NCCL/GPU: the CUDA block path is checked on CPU against the tile math with a stand-in for the op.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from vf.models import attention_kernels
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
    def gather_order(self) -> torch.LongTensor:
        """Where each global column sits in the ranks' slices laid end to end (rank 0's, rank 1's, …)."""
        return torch.argsort(torch.cat([self.columns_of(r) for r in range(self.size)]))

    @cached_property
    def doc_ids(self) -> torch.Tensor:
        """[B, T] int: each column's document number in its row (starts where the position is 0)."""
        starts = self.position_ids == 0
        starts[:, 0] = True
        return starts.cumsum(1)

    @cached_property
    def doc_spans(self) -> list[list[int]]:
        """`doc_ids` as Python lists (one per row), for the fused ring's per-block decisions."""
        return self.doc_ids.tolist()

    @cached_property
    def doc_starts(self) -> list[list[int]]:
        """Per row, each column's document's first column (Python lists, as `doc_spans`)."""
        starts = []
        for row in self.doc_spans:
            first, out = 0, []
            for i, doc in enumerate(row):
                if i and doc != row[i - 1]:
                    first = i
                out.append(first)
            starts.append(out)
        return starts

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

    def gather(self, *slices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.shard.size == 1:
            return slices
        return tuple(_GatherColumns.apply(t, self.shard) for t in slices)

    @cached_property
    def visible(self) -> torch.Tensor:
        return self.documents.dense().index_select(2, self.shard.columns)

    @property
    def key_positions(self) -> torch.Tensor:
        return self.shard.position_ids

    @property
    def columns(self) -> torch.Tensor:
        return self.shard.columns


class _GatherColumns(torch.autograd.Function):
    """All-gather for attention that builds its own mask (DSA, sinks: module doc): this rank's
    columns [B, h, T/size, d] -> the whole rows [B, h, T, d] in column order. Backward: every rank's
    queries used every key, so the gradient of a key is the sum over ranks (all-reduce) at its
    columns. Keys are the small side here (MLA's latent, DSA's index key, GQA's kv heads); the
    queries and everything per query stay on their rank."""

    @staticmethod
    def forward(ctx, x, shard: ContextShard):
        ctx.shard = shard
        parts = [torch.empty_like(x) for _ in range(shard.size)]
        dist.all_gather(parts, x.contiguous(), group=shard.group)
        return torch.cat(parts, dim=2).index_select(2, shard.gather_order)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.shard.group)
        return grad.index_select(2, ctx.shard.columns), None


# ---- ring -----------------------------------------------------------------------------------------


def _ring_peers(shard: ContextShard) -> tuple[int, int] | tuple[None, None]:
    """Global ranks of (next, previous) in the CP ring (None for a ring of one: nothing to send)."""
    if shard.size == 1:
        return None, None
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


Q_TILE = 256  # query rows per score tile / masked fused block: transient [B, nh, Q_TILE, T/(2·size)] fp32


def _visible(q_pos, k_pos) -> torch.Tensor:
    """bool [B, 1, 1, Tq, Tk]: same document and key column <= query column. q_pos/k_pos =
    (document ids [B, T*], global columns [T*])."""
    (q_docs, q_cols), (k_docs, k_cols) = q_pos, k_pos
    return ((q_docs[:, :, None] == k_docs[:, None, :]) & (k_cols[None, :] <= q_cols[:, None]))[:, None, None]


def _scores(q, k, q_pos, k_pos, scale) -> torch.Tensor:
    """fp32 [B, nkv, rep, Tq, Tk], -inf where not visible. q [B, nkv, rep, Tq, d] (query head
    g·rep + j is q[:, g, j]: GQA's h // rep), k [B, nkv, Tk, d]."""
    s = (q.float() @ k.float().transpose(-1, -2)[:, :, None]) * scale
    return s.masked_fill(~_visible(q_pos, k_pos), float("-inf"))


def _tile_forward(q, k, v, q_pos, k_pos, scale):
    """One tile of queries against one block: (out fp32 [B, nkv, rep, Tq, dv] normalised over the
    block, lse fp32 [B, nkv, rep, Tq]; -inf and out 0 for a query that sees no key of the block)."""
    s = _scores(q, k, q_pos, k_pos, scale)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # any finite shift works: it cancels
    p = s.sub_(m).exp_()  # in place (one tile-sized buffer less); 0 where masked
    denom = p.sum(-1, keepdim=True)
    seen = denom > 0
    out = (p @ v.float()[:, :, None]) / torch.where(seen, denom, torch.ones_like(denom))
    lse = torch.where(seen, m + torch.log(denom), torch.full_like(m, float("-inf")))
    return out, lse.squeeze(-1)


def _pairs(shard: ContextShard, src: int, Tq: int):
    """(query tile, key chunk) slices of this rank's queries × rank `src`'s block that causality
    leaves anything visible in: Q_TILE query rows against each of the block's two chunks, skipping
    a chunk that starts after the tile's last query column (about half of all pairs in the
    load-balanced layout). Decided from the layout alone: no device sync."""
    n, c = shard.size, shard.position_ids.shape[1] // (2 * shard.size)

    def column(rank: int, i: int) -> int:  # global column of local token i of `rank` (shard_columns)
        return rank * c + i if i < c else (2 * n - 1 - rank) * c + i - c

    for t in range(0, Tq, Q_TILE):
        last = column(shard.rank, min(t + Q_TILE, Tq) - 1)
        for j in range(2):
            if column(src, j * c) <= last:
                yield slice(t, t + Q_TILE), slice(j * c, (j + 1) * c)


def _merge(out, lse, o, l):
    """In place on `out` [.., Tq, dv] / `lse` [.., Tq]: lse = log(e^lse + e^l),
    out = out·e^(lse_old - lse) + o·e^(l - lse); rows still without any visible key stay (0, -inf)."""
    new = torch.logaddexp(lse, l)
    seen = torch.isfinite(new)
    zero = torch.zeros_like(new)
    out.mul_(torch.where(seen, torch.exp(lse - new), zero)[..., None])
    out.add_(o * torch.where(seen, torch.exp(l - new), zero)[..., None])
    lse.copy_(new)



# ---- fused blocks ---------------------------------------------------------------------------------
# Each block goes to a fused flash kernel returning (out, lse), merged with `_merge`; backward hands
# the kernel the FINAL out and lse and gets the block's dq/dk/dv (the same identity as
# `_RingAttention`). The kernels want one head count and one head size, so K/V are expanded to the
# query heads and q/k/v zero-padded to a common head size (zeros change no score and no output column
# we keep); a block is run unmasked when all its keys are visible to all its queries, `is_causal` on
# the diagonal of one document, else (`_blocks`) with an additive mask Q_TILE query rows at a time.
#   CPU fp32   torch's fused CPU flash kernel (`_CpuBlocks`), masked tiles included: ~10x the tile math.
#   CUDA 16-bit  torch's CUDA flash kernel (`_CudaBlocks`, attention_kernels.flash_block_*), which takes
#              no mask: the masked tiles run the tile math, in fp32. $VF_ATTENTION=sdpa_loop, fp32 on
#              CUDA and head sizes over 256 run the tile math throughout.
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _fused(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and q.dtype == torch.float32


def _blocks(shard: ContextShard, src: int, Tq: int, masks: bool = True):
    """(query slice, key slice, kind, mask) of this rank's queries × rank `src`'s block, decided from
    the layout and the documents' spans (document ids rise along a row and each chunk's columns are
    contiguous): kind "full" (every key visible to every query: no mask), "causal" (the diagonal
    chunk of one document), "mask" (an additive fp32 mask [B, 1, tq, tk], -inf where hidden; queries
    in Q_TILE rows so the mask stays small, each tile's keys trimmed to the span from its first
    query's document start to its last query; `masks` False: None, for a kernel that sends masked
    tiles to the tile math). Pairs where nothing is visible are skipped."""
    n, c = shard.size, shard.position_ids.shape[1] // (2 * shard.size)
    docs = shard.doc_spans

    def start(rank: int, j: int) -> int:  # global column of `rank`'s chunk j's first token
        return (rank if j == 0 else 2 * n - 1 - rank) * c

    def kind(qs: int, qe: int, ks: int, ke: int) -> str | None:  # global column ranges [s, e)
        if ks > qe - 1 or all(row[ke - 1] < row[qs] for row in docs):  # keys later, or of earlier documents
            return None
        one_doc = all(row[qe - 1] == row[ks] for row in docs)  # k and q ranges inside one document
        if ke - 1 <= qs and one_doc:
            return "full"
        if ks == qs and ke == qe and one_doc:
            return "causal"
        return "mask"

    for j in range(2):
        q0 = start(shard.rank, j)
        for i in range(2):
            k0 = start(src, i)
            what = kind(q0, q0 + c, k0, k0 + c)
            if what in ("full", "causal"):
                yield slice(j * c, (j + 1) * c), slice(i * c, (i + 1) * c), what, None
                continue
            if what is None:
                continue
            for t in range(0, c, Q_TILE):
                qs, qe = q0 + t, q0 + min(t + Q_TILE, c)
                # the tile's keys can only lie from its first query's document start to its last query
                ks = max(k0, min(row[qs] for row in shard.doc_starts))
                ke = min(k0 + c, qe)
                what = kind(qs, qe, ks, ke) if ks < ke else None
                if what is None:
                    continue
                qsl, ksl = slice(j * c + t, j * c + qe - q0), slice(i * c + ks - k0, i * c + ke - k0)
                mask = None
                if what == "mask" and masks:
                    device = shard.position_ids.device
                    q_pos = (shard.doc_ids[:, qs:qe], torch.arange(qs, qe, device=device))
                    k_pos = (shard.doc_ids[:, ks:ke], torch.arange(ks, ke, device=device))
                    visible = _visible(q_pos, k_pos)[:, 0]  # [B, 1, tq, tk]
                    mask = torch.zeros(visible.shape, dtype=torch.float32, device=visible.device)
                    mask.masked_fill_(~visible, float("-inf"))
                yield qsl, ksl, what, mask


def _pad(t: torch.Tensor, d: int) -> torch.Tensor:
    return t if t.shape[-1] == d else torch.nn.functional.pad(t, (0, d - t.shape[-1]))


def _heads(t: torch.Tensor, rep: int, d: int) -> torch.Tensor:
    """K or V block [B, nkv, Tk, dk] -> [B, nkv·rep, Tk, d] (GQA expanded, zero-padded to d)."""
    B, nkv, Tk, _ = t.shape
    return _pad(t, d)[:, :, None].expand(B, nkv, rep, Tk, d).reshape(B, nkv * rep, Tk, d)


def _fused_forward_block(q4, kb, vb, what, mask, scale):
    """(out [B, nh, tq, d], lse [B, nh, tq]) of one block; rows that see no key get (0, -inf)."""
    o, lse = _FLASH(q4, kb, vb, 0.0, what == "causal", attn_mask=mask, scale=scale)
    if mask is not None:  # the kernel gives such rows lse 0 (and out 0)
        lse = lse.masked_fill(torch.isneginf(mask.amax(-1)), float("-inf"))
    return o, lse


class _CpuBlocks:
    """torch's fused CPU flash kernel (fp32), masked tiles included."""

    masks = True

    def __init__(self, q, v):
        self.d, self.dtype = max(q.shape[-1], v.shape[-1]), q.dtype

    def forward(self, q4, kb, vb, what, mask, scale):
        return _fused_forward_block(q4, kb, vb, what, mask, scale)

    def backward(self, do4, q4, kb, vb, o4, l4, what, mask, scale):
        return _FLASH_BACKWARD(do4, q4, kb, vb, o4, l4, 0.0, what == "causal", attn_mask=mask, scale=scale)


class _CudaBlocks:
    """torch's CUDA flash kernel (fp16/bf16, attention_kernels.flash_block_*): unmasked blocks only,
    head size padded to a multiple of 8; keeps the op's philox placeholders from forward for backward."""

    masks = False

    def __init__(self, d: int, dtype: torch.dtype):
        self.d, self.dtype, self.aux = d, dtype, None

    def forward(self, q4, kb, vb, what, mask, scale):
        o, lse, self.aux = attention_kernels.flash_block_forward(q4, kb, vb, what == "causal", scale)
        return o, lse

    def backward(self, do4, q4, kb, vb, o4, l4, what, mask, scale):
        return attention_kernels.flash_block_backward(do4, q4, kb, vb, o4, l4, what == "causal", scale, self.aux)


def _block_kernel(q, v):
    """The fused kernel for this rank's blocks (`_CpuBlocks`, `_CudaBlocks`), or None: the tile math.
    Asks attention_kernels first, so a forced $VF_ATTENTION that cannot run here raises."""
    backend = attention_kernels.ring_block_backend(q)
    if _fused(q):
        return _CpuBlocks(q, v)
    d = -(-max(q.shape[-1], v.shape[-1]) // 8) * 8
    if backend == "flash" and d <= attention_kernels.MAX_HEAD_DIM:
        return _CudaBlocks(d, q.dtype)
    return None


def _tile_backward(q, dout, kb, vb, lse, D, grads, tile, ks, q_pos, k_pos, scale) -> None:
    """The tile math's backward for queries `tile` × keys `ks` of a block (kb/vb fp32), added into
    grads = (dq [B, nkv, rep, Tq, d], dk, dv [B, nkv, Tk, *]) in place; q_pos/k_pos: the block's
    (document ids, global columns)."""
    dq, dk, dv = grads
    qt, dot, kt, vt = q[:, :, :, tile].float(), dout[:, :, :, tile], kb[:, :, ks], vb[:, :, ks]
    # in place where possible: at most ~2 tile-sized [.., Q_TILE, chunk] buffers live at once
    p = _scores(qt, kt, (q_pos[0][:, tile], q_pos[1][tile]), (k_pos[0][:, ks], k_pos[1][ks]), scale)
    p = p.sub_(lse[:, :, :, tile, None]).exp_()  # 0 where masked
    dv[:, :, ks] += (p.transpose(-1, -2) @ dot).sum(2)
    ds = (dot @ vt.transpose(-1, -2)[:, :, None]).sub_(D[:, :, :, tile, None]).mul_(p)
    del p
    dq[:, :, :, tile] += (ds @ kt[:, :, None]) * scale
    dk[:, :, ks] += (ds.transpose(-1, -2) @ qt).sum(2) * scale


class _RingAttention(torch.autograd.Function):
    """Ring attention with a flash-style backward: saves only this rank's q, k, v, the output and
    its log-sum-exp, and in backward sends K/V round the ring again, now with their gradient
    accumulators dK/dV travelling alongside (each rank adds its queries' part), which arrive back
    at their owner after one more step. Per visible (query i, key j), with P = exp(S - lse):

        dV_j += Σ_i P_ij dO_i,   dS_ij = P_ij (dO_i·V_j - D_i),  D_i = dO_i·O_i,
        dQ_i += scale Σ_j dS_ij K_j,   dK_j += scale Σ_i dS_ij Q_i

    (the softmax gradient written with the final output and lse, so no per-block state is kept).
    Communication: forward size-1 K/V steps; backward size-1 K/V steps and size dK/dV steps. Each
    block is sent before it is attended to, so the transfer overlaps the compute."""

    @staticmethod
    def forward(ctx, q, k, v, shard: ContextShard, scale: float):
        docs = shard.doc_ids
        q_pos = (docs.index_select(1, shard.columns), shard.columns)
        nxt, prev = _ring_peers(shard)
        B, nkv, rep, Tq, _ = q.shape
        out = torch.zeros(B, nkv, rep, Tq, v.shape[-1], dtype=torch.float32, device=q.device)
        lse = torch.full((B, nkv, rep, Tq), float("-inf"), dtype=torch.float32, device=q.device)
        kernel = _block_kernel(q, v)
        if kernel:  # the kernel's layout: [B, nh, T, d], one head size d for q, k and v
            d = kernel.d
            q4 = _pad(q.reshape(B, nkv * rep, Tq, q.shape[-1]), d)
            out4, lse4 = out.view(B, nkv * rep, Tq, -1), lse.view(B, nkv * rep, Tq)
        kv, pending = (k, v), None
        for step in range(shard.size):
            src = (shard.rank - step) % shard.size
            if step:
                kv = pending.wait()
            if step + 1 < shard.size:  # pass this block on while attending to it
                pending = _Exchange(kv, nxt, prev, shard.group)
            k_docs, k_cols = docs.index_select(1, shard.columns_of(src)), shard.columns_of(src)
            if kernel:
                kb, vb = (_heads(t, rep, d) for t in kv)
                for qs, ks, what, mask in _blocks(shard, src, Tq, kernel.masks):
                    if what == "mask" and not kernel.masks:  # this tile by the tile math
                        o, lo = _tile_forward(q[:, :, :, qs], kv[0][:, :, ks], kv[1][:, :, ks],
                                              (q_pos[0][:, qs], q_pos[1][qs]), (k_docs[:, ks], k_cols[ks]), scale)
                        _merge(out[:, :, :, qs], lse[:, :, :, qs], o, lo)
                        continue
                    o, lo = kernel.forward(q4[:, :, qs], kb[:, :, ks], vb[:, :, ks], what, mask, scale)
                    _merge(out4[:, :, qs], lse4[:, :, qs], o[..., :out4.shape[-1]].float(), lo.float())
                continue
            for tile, ks in _pairs(shard, src, Tq):
                o, lo = _tile_forward(q[:, :, :, tile], kv[0][:, :, ks], kv[1][:, :, ks],
                                      (q_pos[0][:, tile], q_pos[1][tile]), (k_docs[:, ks], k_cols[ks]), scale)
                _merge(out[:, :, :, tile], lse[:, :, :, tile], o, lo)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.shard, ctx.scale, ctx.kernel = shard, scale, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        shard, scale = ctx.shard, ctx.scale
        docs = shard.doc_ids
        q_pos = (docs.index_select(1, shard.columns), shard.columns)
        nxt, prev = _ring_peers(shard)
        dout = dout.float()
        D = (dout * out).sum(-1)  # [B, nkv, rep, Tq]
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = (k, v)
        dkv = (torch.zeros(k.shape, dtype=torch.float32, device=k.device),
               torch.zeros(v.shape, dtype=torch.float32, device=v.device))
        pending_kv = pending_dkv = None
        B, nkv, rep, Tq, _ = q.shape
        kernel = ctx.kernel
        if kernel:  # the kernel's dtype (CUDA: 16-bit; the final out/lse in place of the block's own)
            d = kernel.d
            q4, do4, o4 = (_pad(t.reshape(B, nkv * rep, Tq, t.shape[-1]).to(kernel.dtype), d) for t in (q, dout, out))
            l4, dq4 = lse.view(B, nkv * rep, Tq), dq.view(B, nkv * rep, Tq, -1)
        for step in range(shard.size):
            src = (shard.rank - step) % shard.size
            if step:
                kv, dkv = pending_kv.wait(), pending_dkv.wait()
            if step + 1 < shard.size:
                pending_kv = _Exchange(kv, nxt, prev, shard.group)
            dk, dv = (t.clone() for t in dkv)
            k_pos = (docs.index_select(1, shard.columns_of(src)), shard.columns_of(src))
            if kernel:
                kb, vb = (_heads(t, rep, d) for t in kv)
                k32 = v32 = None
                for qs, ks, what, mask in _blocks(shard, src, Tq, kernel.masks):
                    if what == "mask" and not kernel.masks:  # this tile by the tile math
                        if k32 is None:
                            k32, v32 = (t.float() for t in kv)
                        _tile_backward(q, dout, k32, v32, lse, D, (dq, dk, dv), qs, ks, q_pos, k_pos, scale)
                        continue
                    gq, gk, gv = kernel.backward(do4[:, :, qs], q4[:, :, qs], kb[:, :, ks], vb[:, :, ks], o4[:, :, qs],
                                                 l4[:, :, qs], what, mask, scale)
                    dq4[:, :, qs] += gq[..., :dq4.shape[-1]]
                    dk[:, :, ks] += gk.reshape(B, nkv, rep, -1, d).sum(2)[..., :dk.shape[-1]]
                    dv[:, :, ks] += gv.reshape(B, nkv, rep, -1, d).sum(2)[..., :dv.shape[-1]]
            else:
                kb, vb = (t.float() for t in kv)
                for tile, ks in _pairs(shard, src, Tq):
                    _tile_backward(q, dout, kb, vb, lse, D, (dq, dk, dv), tile, ks, q_pos, k_pos, scale)
            # the block's accumulators go on with it; after the last step they go home (to rank src)
            if shard.size > 1:
                pending_dkv = _Exchange((dk, dv), nxt, prev, shard.group)
        if pending_dkv is not None:
            dk, dv = pending_dkv.wait()
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def ring_attention(q, k, v, shard: ContextShard) -> torch.Tensor:
    """Ring attention over the CP group (module doc; `_RingAttention`). Step i holds the K/V block
    of rank (rank - i) mod size; per block (out_i, lse_i), merged with the log-sum-exp rule in fp32,
    which is softmax over the union of the blocks (CPU fp32: per block torch's fused kernel, `_blocks`;
    CUDA fp16/bf16: torch's flash kernel for unmasked blocks, the tile math for masked tiles;
    elsewhere the tile math). Masked scores are built Q_TILE queries at a time, so
    the transient is [B, nh, Q_TILE, T/(2·size)] fp32, never [T/size × T]; what backward keeps is this
    rank's q, k, v, out and lse: activation memory O(T/size). GQA: kv head h // (nh / nkv) serves
    query head h, as SDPA's enable_gqa, by broadcasting (blocks travel at nkv heads)."""
    B, nh, Tq, d = q.shape
    nkv = k.shape[1]
    out = _RingAttention.apply(q.view(B, nkv, nh // nkv, Tq, d), k, v, shard, 1.0 / math.sqrt(d))
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
    return got.index_select(2, shard.gather_order)


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
                         "multiple of it", hint="use the ring style, or a CP size dividing the head count")
    if nkv % n:
        k, v = (t.repeat_interleave(nh // nkv, dim=1) for t in (k, v))
    out = sdpa(_seq_to_heads(q, shard), _seq_to_heads(k, shard), _seq_to_heads(v, shard), documents)
    return _heads_to_seq(out, shard)
