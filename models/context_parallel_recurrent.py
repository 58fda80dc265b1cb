"""The recurrent token mixers (gated DeltaNet `deltanet.py`, Mamba-2 `mamba2.py`) under context
parallelism (models/context_parallel.py): Ulysses-style, for either CP style of the attention layers.

A recurrent layer's state must flow along the whole row in order and restart at every document
start, so no rank can scan its own slice. Instead, around the sequence-mixing core only:

    per-token in_proj on the rank's slice         [B, T/size, channels of every head]
    all-to-all `sequence_to_heads`                [B, T, channels of this rank's heads]  (global column order)
    conv + chunked scan over the FULL rows        exactly the one-process packed path (`Documents` of
                                                  the shard's full position_ids: resets at document starts)
    all-to-all `heads_to_sequence`                [B, T/size, every head's output]
    per-token gated norm + out_proj on the slice

Both all-to-alls are autograd-aware (`torch.distributed.nn.functional.all_to_all_single`), so the
backward runs the reverse exchanges. Rank j takes head group j (`HeadSplit`); the per-head
parameters (conv rows, dt_bias, A_log, D) are indexed to its heads, so each rank's gradient covers
its heads' rows and the CP all-reduce (SUM) of the parameter grads completes them, as it completes
in_proj's partial sums over tokens.

Head groups: the core must see every channel its heads read. DeltaNet's value head h reads key head
h // (nv/nk) and Mamba-2's head h reads B/C group h // (nh/G). When the ranks divide the key heads
(groups) the split is contiguous; when they divide only the value heads (Mamba-2 heads), the key
heads (groups) are replicated per value head before the exchange (the conv is depthwise and the
scans repeat them per head anyway, so this is exact; it sends more bytes). When the ranks divide
neither, the layer refuses (`UsageError` naming the counts).

Traffic per layer and rank, forward (backward the same again): out, (size-1)/size of
[B, T/size, C] with C = DeltaNet 2·nk·dk + nv·dv + 2·nv (q, k, v, b, a; z stays: the gated norm is
per token), Mamba-2 nh·hd + 2·G·N + nh (x, B, C, dt); back, the core's output [B, T/size, nv·dv]
(Mamba-2: nh·hd in fp32, its y is fp32 before the norm). Memory: the core's activations are those of
the full rows for nv/size heads, as one process holds for all heads.
"""

from __future__ import annotations

import torch
import torch.distributed.nn.functional as dist_fn
from vf.models.layers import Documents

from vf.errors import UsageError


class HeadSplit:
    """Which heads rank `rank` of `size` runs. `value` heads are the scanned heads (DeltaNet value
    heads, Mamba-2 heads), `key` heads are the shared inputs they read (DeltaNet key heads, Mamba-2
    B/C groups), value head h reading key head h // (n_value / n_key).

      value_index(r) / key_index(r)   long [n_value/size] / [keys per rank]: rank r's heads, in order
      replicate                       True when the key heads were expanded to one per value head
    """

    def __init__(self, layer: str, n_value: int, n_key: int, size: int, rank: int,
                 value_name: str = "value heads", key_name: str = "key heads"):
        if n_value % size:
            raise UsageError(f"context parallelism over {size} ranks cannot split {layer}'s {n_value} {value_name} "
                             f"({n_key} {key_name}): the CP size must divide the {value_name}",
                             hint=f"use a CP size dividing {n_value}, or run without context parallelism")
        self.size, self.rank, self.n_value, self.n_key = size, rank, n_value, n_key
        self.replicate = n_key % size != 0
        self.per_rank = n_value // size

    def value_index(self, r: int) -> torch.Tensor:
        return torch.arange(r * self.per_rank, (r + 1) * self.per_rank)

    def key_index(self, r: int) -> torch.Tensor:
        if self.replicate:  # one key head per value head (the one it reads)
            return self.value_index(r) // (self.n_value // self.n_key)
        k = self.n_key // self.size
        return torch.arange(r * k, (r + 1) * k)

    @property
    def keys_per_rank(self) -> int:
        return len(self.key_index(0))


def sequence_to_heads(x: torch.Tensor, shard) -> torch.Tensor:
    """x [B, T/size, size, C]: slot j along dim 2 holds rank j's channels of this rank's tokens ->
    [B, T, C]: this rank's channels, every token of the rows in global column order."""
    B, Tl, n, C = x.shape
    if n == 1:
        return x[:, :, 0]
    parts = x.permute(2, 0, 1, 3).contiguous()  # [n (destination rank), B, Tl, C]
    got = dist_fn.all_to_all_single(torch.empty_like(parts), parts, group=shard.group)  # [n (source rank), ...]
    got = got.permute(1, 0, 2, 3).reshape(B, n * Tl, C)  # columns: rank 0's, rank 1's, ...
    order = torch.cat([shard.columns_of(r) for r in range(n)])
    return got.index_select(1, torch.argsort(order))


def heads_to_sequence(y: torch.Tensor, shard) -> torch.Tensor:
    """The inverse of `sequence_to_heads`: y [B, T, C] (this rank's channels, full rows) ->
    [B, T/size, size, C]: slot j holds rank j's channels of this rank's tokens."""
    n = shard.size
    if n == 1:
        return y[:, :, None]
    parts = torch.stack([y.index_select(1, shard.columns_of(r)) for r in range(n)])  # [n (dest), B, Tl, C]
    got = dist_fn.all_to_all_single(torch.empty_like(parts), parts, group=shard.group)  # [n (source = head group)]
    return got.permute(1, 2, 0, 3)


def full_documents(mask) -> Documents | None:
    """The full rows' packed layout as the one-process forward sees it (None: one document per row,
    where the one-process path runs the plain scan). `mask` is the forward's `ShardedAttention`,
    which builds the layout once per forward for every layer."""
    docs = mask.documents
    return None if docs.single else docs


def gather_heads(tensors: list[torch.Tensor], indices: list, split: HeadSplit) -> torch.Tensor:
    """Per-rank payload: tensors[i] [B, Tl, heads_i, d_i] with indices[i] a function r -> head index
    (rank r's heads of that tensor). Returns [B, Tl, size, C] (C = sum of heads_per_rank_i · d_i)."""
    slots = []
    for r in range(split.size):
        slots.append(torch.cat([t.index_select(2, idx(r).to(t.device)).flatten(2) for t, idx in zip(tensors, indices)],
                               dim=-1))
    return torch.stack(slots, dim=2)


def channels(heads: torch.Tensor, dim: int) -> torch.Tensor:
    """The channel indices of `heads` (long [h]) in a [..., heads·dim] layout, head by head."""
    return (heads[:, None] * dim + torch.arange(dim, device=heads.device)[None]).reshape(-1)
