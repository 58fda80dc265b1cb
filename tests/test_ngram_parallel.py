"""Vocabulary-sharded n-gram tables (models/ngram_parallel.py): real torchrun worlds (gloo on CPU) run
tests/parallel/ngram_worker.py, which checks the sharded lookup against the one-process tables on the
same packed batch (outputs bit-exact, gathered table gradients, the full table state) and writes its
errors as JSON; plus the in-process parts that need no process group."""

import itertools
from pathlib import Path

import pytest
import torch
from test_expert_parallel import FakeGroup, launch_worker
from torch import nn
from vf.models.errors import ModelLoadError
from vf.models.ngram_embedding import NGramEmbedding, NGramSpec
from vf.models.ngram_parallel import (
    cut_table,
    load_ngram_state,
    ngram_tables,
    row_block,
    shard_ngram_embeddings,
)

from vf.errors import UsageError

WORKER = Path(__file__).parent / "parallel" / "ngram_worker.py"
TOL = 1e-6
IDS_PER_ROW = 16 * 4  # the worker's T tokens × H heads


def run_worker(tmp_path, nproc: int, *cases: str) -> list[dict]:
    args = [a for c in cases for a in ("--case", c)]
    report, code, stderr = launch_worker(WORKER, tmp_path / "ngram.json", nproc, *args)
    assert code == 0 and report["ok"], ([c["errors"] for c in report["cases"]], stderr[-2000:])
    for case in report["cases"]:
        assert case["forward_exact"] and case["tables"] == 2
        assert max(case["errors"].values()) < TOL, case["errors"]
        assert case["grad_max"] > 1.0  # real gradients are compared, not zeros
        assert case["hashed_rows"] == [890, 964]
    return report["cases"]


def test_two_ranks_match_one_process(tmp_path):
    """Case 1: rank 1 has no tokens, yet owns half of each table: it receives rank 0's ids and sends
    back rows (its forward output and gradient are empty). Case 2: P = 2048 puts every hashed row in
    rank 0's block: rank 1 sends all its ids to rank 0 and receives none; its gradient is all zero."""
    idle, skew = run_worker(tmp_path, 2, "1:1", "2048:-1")
    assert idle["rows"] == [890, 964] and idle["held"] == [[445, 445], [482, 482]]
    for sent in idle["sent"]:  # per table: [from rank][to rank]
        assert sent[1] == [0, 0] and sent[0][1] > 0 and sum(sent[0]) == 6 * IDS_PER_ROW
    assert skew["rows"] == [2048, 2048] and skew["held"] == [[1024, 1024], [1024, 1024]]
    for sent in skew["sent"]:
        assert sent == [[3 * IDS_PER_ROW, 0], [3 * IDS_PER_ROW, 0]]


@pytest.mark.matrix
def test_four_ranks_match_one_process(tmp_path):
    """Uneven blocks (P = 1202 = 3·301 + 299; P = 890 = 3·223 + 221), rank 2 without tokens, and
    in the first table rank 3's block [903, 1202) is padding alone: no id reaches it."""
    padded, plain = run_worker(tmp_path, 4, "601:2", "1:-1")
    assert padded["held"] == [[301, 301, 301, 299]] * 2
    for t, sent in enumerate(padded["sent"]):
        assert sent[2] == [0, 0, 0, 0]
        if t == 0:
            assert [row[3] for row in sent] == [0, 0, 0, 0]
    assert plain["held"] == [[223, 223, 223, 221], [241, 241, 241, 241]]
    assert all(all(n > 0 for row in sent for n in row) for sent in plain["sent"])  # everyone to everyone


# ---- in process: no collective involved ---------------------------------------------------------


def tables() -> nn.ModuleList:
    return nn.ModuleList(NGramEmbedding(NGramSpec(vocab_size=61, embed_dim=8, eos_token_id=3, layer=layer,
                                                  heads_per_ngram=2, vocab_size_base=200, divisible_by=1))
                         for layer in (0, 1))


def test_row_blocks_cover_the_table_once():
    for rows in (1, 7, 890, 1202):
        for size in (1, 2, 3, 4, 9):
            blocks = [row_block(rows, size, r) for r in range(size)]
            assert blocks[0][0] == 0 and all(c >= 0 for _, c in blocks)
            assert all(f + c == nf for (f, c), (nf, _) in itertools.pairwise(blocks) if c)  # contiguous, in rank order
            assert sum(c for _, c in blocks) == rows
    assert [row_block(7, 4, r) for r in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 1)]
    assert [row_block(2, 4, r) for r in range(4)] == [(0, 1), (1, 1), (2, 0), (2, 0)]  # more ranks than rows


def test_shard_keeps_this_ranks_block_and_loads_full_state():
    model = tables()
    full = {n: m.weight.detach().clone() for n, m in ngram_tables(model)}
    assert list(full) == ["0.weight", "1.weight"]
    assert shard_ngram_embeddings(model, FakeGroup(3, 2)) == 2
    for (name, m), rows in zip(ngram_tables(model), (890, 964)):
        first, count = row_block(rows, 3, 2)
        assert (m.shard.size, m.shard.rank, m.shard.rows, m.shard.first, m.shard.count) == (3, 2, rows, first, count)
        assert m.weight.shape == (count, 2) and m.weight.is_contiguous()
        assert torch.equal(m.weight, full[name][first:first + count])
        assert dict(model.named_parameters())[name] is m.weight  # same name, a registered parameter
    assert torch.equal(cut_table(full["0.weight"], 3, 2), full["0.weight"][594:])
    new = {n: torch.randn_like(t) for n, t in full.items()}
    load_ngram_state(model, new)
    assert torch.equal(model[1].weight, new["1.weight"][row_block(964, 3, 2)[0]:])
    with pytest.raises(UsageError, match="already sharded"):
        shard_ngram_embeddings(model, FakeGroup(3, 2))


@pytest.mark.parametrize("bad", ["missing", "rows", "width"])
def test_load_ngram_state_refuses_a_mismatched_state(bad):
    model = tables()
    state = {n: m.weight.detach().clone() for n, m in ngram_tables(model)}
    shard_ngram_embeddings(model, FakeGroup(2, 1))
    name = "1.weight"
    if bad == "missing":
        del state[name]
    elif bad == "rows":
        state[name] = state[name][:-1]
    else:
        state[name] = state[name][:, :1]
    with pytest.raises(ModelLoadError, match=name):
        load_ngram_state(model, state)
