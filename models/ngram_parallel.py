"""Vocabulary-sharded n-gram tables (models/ngram_embedding.py) on torch.distributed (gloo on CPU,
NCCL on GPU; the same code, torchrun-launched). A PLE table of Qwen3.8 Flash Next holds 16 heads of
~20M rows each (transformers counts ~45B parameters over all PLE layers): too big to copy to every
rank, and each token reads only H rows of it. Ids are not deduplicated before they travel.

Shape legend as in models/ngram_embedding.py (H heads, D head width, P padded rows) and: `size`
ranks in the group, block = ⌈P / size⌉, M = B·T·H ids this rank looks up, R = ids it receives.

Layout: rank r of the group holds the contiguous rows [r·block, min((r+1)·block, P)) (`row_block`,
`cut_table`); `shard_ngram_embeddings` replaces every NGramEmbedding's `weight` by its block and
sets `shard` (a RowShard). P is a multiple of make_ngram_vocab_size_divisible_by (128 in the real
config), so with a size dividing it every rank holds P/size rows; otherwise the last ranks hold
fewer (or none). Only padding rows may lie in a rank's block: it still takes part in every exchange.

Lookup of one layer (`RowShard.lookup`, called from NGramEmbedding.forward):
  1. this rank hashes its own tokens to ids [M] (the history never leaves a row, so no exchange);
  2. the ids are sorted by owner = id // block (stable);
  3. counts: ids per owner [size] go out with one all_to_all_single (expert_parallel.exchange_counts),
     which also tells each owner how many ids each rank will send;
  4. the ids go to their owners (expert_parallel.exchange_rows; int64, no gradient): R arrive;
  5. each owner reads its rows weight[id − first] → [R, D];
  6. the rows go back with the reverse autograd-aware exchange and are put back in the ids' order.
Backward: step 6's backward carries each row's gradient to its owner, whose embedding backward adds
it into its own block: a table gradient lands only on the owner's rows and covers the tokens of
every rank of the group. A rank with no tokens, one whose ids all belong to other ranks, and one
holding only padding run every collective, forward and backward: the others wait on it.
Ranks of other groups holding the same blocks (data-parallel replicas) must still sum their table
gradients, as models/expert_parallel.reduce_expert_grads does for experts.

Export/checkpoint: `gather_table` (one table) and `full_ngram_state` (a model) all_gather the blocks
back to full [P, D] tables; `load_ngram_state` slices full tables into the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from vf.models.errors import ModelLoadError
from vf.models.expert_parallel import _size_rank, exchange_counts, exchange_rows
from vf.models.ngram_embedding import NGramEmbedding

from vf.errors import UsageError


def row_block(rows: int, size: int, rank: int) -> tuple[int, int]:
    """(first row, row count) of `rank`'s block when `rows` split over `size` ranks (module docstring)."""
    block = -(-rows // size)
    first = min(rank * block, rows)
    return first, min(block, rows - first)


def cut_table(full: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    """`rank`'s block of a full [P, D] table: a contiguous copy (the full table can then be freed)."""
    first, count = row_block(full.shape[0], size, rank)
    return full.detach()[first:first + count].clone()


@dataclass
class RowShard:
    """Set as `shard` on an NGramEmbedding by `shard_ngram_embeddings`."""

    group: dist.ProcessGroup  # the ranks that split this table's rows
    size: int
    rank: int  # this rank's index in the group
    rows: int  # P, the full table's rows
    first: int  # this rank's first row
    count: int  # rows held here

    @property
    def block(self) -> int:
        return -(-self.rows // self.size)

    def lookup(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """ids [M] int64 rows of the full table → [M, D], weight = this rank's block (module docstring
        steps 2-6; a collective over the group)."""
        owner = ids // self.block
        order = torch.argsort(owner, stable=True)
        per_rank = torch.bincount(owner, minlength=self.size)  # [size]
        send, recv, _ = exchange_counts(per_rank, self.size, self.group)
        got = exchange_rows(ids[order], send, recv, self.group)  # [R] ids owned here, by source rank
        rows = F.embedding(got - self.first, weight)  # [R, D]; empty but still tied to the weight when R = 0
        back = exchange_rows(rows, recv, send, self.group)  # [M, D] in sorted order
        unsort = torch.empty_like(order)
        unsort[order] = torch.arange(len(order), device=order.device)
        return back[unsort]


def gather_table(local: torch.Tensor, shard: RowShard) -> torch.Tensor:
    """The full [P, D] table from every rank's block (all_gather over the group: every rank calls
    it). Blocks are padded to `block` rows for the collective, then trimmed."""
    local = local.detach()
    pad = local.new_zeros(shard.block - local.shape[0], *local.shape[1:])
    mine = torch.cat([local, pad]).contiguous()
    parts = [torch.empty_like(mine) for _ in range(shard.size)]
    dist.all_gather(parts, mine, group=shard.group)
    return torch.cat(parts)[:shard.rows]


def ngram_tables(model: nn.Module) -> list[tuple[str, NGramEmbedding]]:
    """(full parameter name of the table, module) of every NGramEmbedding, in module order."""
    return [(f"{prefix}.weight" if prefix else "weight", m) for prefix, m in model.named_modules()
            if isinstance(m, NGramEmbedding)]


def shard_ngram_embeddings(model: nn.Module, group) -> int:
    """Keep only this rank's row block of every NGramEmbedding table in `model` (itself one, or
    holding some): `weight` becomes an nn.Parameter of the block (a contiguous clone), `shard` is
    set. Returns the number of tables sharded. Every table is checked before any is changed."""
    size, rank = _size_rank(group)
    tables = ngram_tables(model)
    if any(m.shard is not None for _, m in tables):
        raise UsageError("n-gram table sharding: the model's tables are already sharded")
    for _, m in tables:
        first, count = row_block(m.rows, size, rank)
        m.weight = nn.Parameter(cut_table(m.weight, size, rank), requires_grad=m.weight.requires_grad)
        m.shard = RowShard(group if group is not None else dist.group.WORLD, size, rank, m.rows, first, count)
    return len(tables)


def full_ngram_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """{full name: full [P, D] table} of every sharded table (a collective over each table's group)."""
    return {name: gather_table(m.weight, m.shard) for name, m in ngram_tables(model) if m.shard is not None}


def load_ngram_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Slice full [P, D] tables (as `full_ngram_state` returns, or a checkpoint's) into the blocks."""
    for name, m in ngram_tables(model):
        if m.shard is None:
            continue
        if name not in state:
            raise ModelLoadError(f"n-gram table sharding: no tensor {name!r} in the table state")
        t = state[name]
        if tuple(t.shape) != (m.rows, m.weight.shape[1]):
            raise ModelLoadError(f"n-gram table sharding: {name} has shape {tuple(t.shape)}, expected "
                                 f"{(m.rows, m.weight.shape[1])}")
        with torch.no_grad():
            m.weight.copy_(t[m.shard.first:m.shard.first + m.shard.count])
