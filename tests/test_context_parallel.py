"""Context parallelism (models/context_parallel.py): the load-balanced split in process; ring and
Ulysses attention under torchrun (gloo, tests/parallel/cp_worker.py) against the one-process model,
token by token and gradient by gradient; the refusals of layers that cannot run on a slice."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vf.models import context_parallel as cp_module
from vf.models.config import ModelConfig
from vf.models.context_parallel import (
    ContextShard,
    context_parallel,
    ring_attention,
    shard_columns,
    split_sequence,
)
from vf.models.layers import CONTEXT_SHARD, Documents, positions_and_mask, sdpa
from vf.models.transformer import build_model

from vf.errors import UsageError

PY = sys.executable
WORKER = Path(__file__).parent / "parallel" / "cp_worker.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TOL = 1e-5


# ---- the split ------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_shard_columns_partition_the_row_with_equal_causal_work(size):
    T = 2 * size * 5
    parts = [shard_columns(T, size, r) for r in range(size)]
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(T))  # a permutation of 0..T-1
    # causal work of a query at column i = i + 1 keys; every rank gets the same total
    work = [int((p + 1).sum()) for p in parts]
    assert work == [T * (T + 1) // 2 // size] * size
    # a contiguous split would not be balanced (the point of the zigzag): last rank does most
    if size > 1:
        contiguous = [int((torch.arange(r * T // size, (r + 1) * T // size) + 1).sum()) for r in range(size)]
        assert contiguous[-1] > contiguous[0]
    assert parts[0][:5].tolist() == list(range(5)) and parts[0][5:].tolist() == list(range(T - 5, T))


def test_split_sequence_and_bad_lengths():
    t = torch.arange(24).view(2, 12)
    assert split_sequence(t, 3, 1).tolist() == [[2, 3, 8, 9], [14, 15, 20, 21]]
    assert split_sequence(t.t(), 3, 1, dim=0).t().tolist() == [[2, 3, 8, 9], [14, 15, 20, 21]]
    with pytest.raises(UsageError, match="multiple of 4"):
        shard_columns(10, 2, 0)
    with pytest.raises(UsageError, match="unknown context-parallel style"):
        ContextShard(None, 2, 0, "zigzag", torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(UsageError, match="rank 2 of 2"):
        ContextShard(None, 2, 2, "ring", torch.zeros(1, 8, dtype=torch.long))


def test_positions_and_mask_under_a_shard_checks_the_slice():
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    shard = ContextShard(None, 2, 1, "ring", pos)
    ids = split_sequence(torch.zeros_like(pos), 2, 1)
    with context_parallel(shard):
        local, mask = positions_and_mask(ids, split_sequence(pos, 2, 1))
        assert local.tolist() == [[2, 0, 1, 2]] and mask.shard is shard  # columns 2, 3, 4, 5
        assert shard.doc_ids.tolist() == [[1, 1, 1, 2, 2, 2, 2, 2]]
        with pytest.raises(UsageError, match="not this rank's slice"):  # the full rows: forgot to split
            positions_and_mask(torch.zeros_like(pos), pos)
        _, cached = positions_and_mask(ids, None, cache=object())  # the engine's cache path is untouched
        assert cached is None
    assert CONTEXT_SHARD.get() is None
    assert isinstance(positions_and_mask(ids, split_sequence(pos, 2, 1))[1], Documents)


@pytest.mark.parametrize("fused", [True, False])  # CPU fp32: torch's flash kernel per block; else the tile math
@pytest.mark.parametrize("tile", [5, 256])
def test_ring_block_math_on_one_rank_matches_sdpa(monkeypatch, tile, fused):
    """A ring of one rank is the tiled block math alone (no communication): values and q/k/v grads
    equal per-document SDPA with GQA, ragged query tiles and a row of one document next to a packed one
    (v's head size differs from q's: the fused path pads)."""
    monkeypatch.setattr(cp_module, "Q_TILE", tile)
    if not fused:
        monkeypatch.setattr(cp_module, "_fused", lambda q: False)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 24, d, generator=g, requires_grad=True) for h, d in ((4, 8), (2, 8), (2, 6)))
    pos = torch.cat([torch.arange(24)[None], torch.cat([torch.arange(n) for n in (7, 9, 8)])[None]])
    want = sdpa(q, k, v, Documents(pos))
    got = ring_attention(q, k, v, ContextShard(None, 1, 0, "ring", pos))
    assert (got - want).abs().max() < 1e-6
    w = torch.randn(want.shape, generator=g)
    grads_want = torch.autograd.grad((want * w).sum(), (q, k, v))
    grads_got = torch.autograd.grad((got * w).sum(), (q, k, v))
    assert max(float((a - b).abs().max()) for a, b in zip(grads_got, grads_want)) < 1e-5


LAYOUTS = {  # document lengths per row (T = 32: a ring of one has chunks [0, 16) and [16, 32))
    "one document": [[32], [32]],  # chunk pairs without a mask: the diagonals causal, the other full
    "chunk-aligned": [[16, 16], [16, 16]],  # the off-diagonal pair skipped: keys of an earlier document
    "ragged": [[3, 29], [3, 29]],  # masked tiles where a document starts; trimmed tiles full or causal
    "rows differ": [[3, 20, 9], [16, 16]],  # every block is decided over both rows
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fused_ring_blocks_cover_each_kind_and_match_sdpa(monkeypatch, layout):
    """The fused path's per-block decisions (`_blocks`: unmasked / is_causal / additive mask / skipped)
    against per-document SDPA, with the kinds each layout must produce recorded: a wrong "full"
    would let a query see another document or the future and fail the comparison."""
    monkeypatch.setattr(cp_module, "Q_TILE", 4)
    seen = []
    blocks = cp_module._blocks
    monkeypatch.setattr(cp_module, "_blocks", lambda *a: [seen.append(b[2]) or b for b in blocks(*a)])
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, h, 32, 8, generator=g, requires_grad=True) for h in (4, 2, 2))
    pos = torch.cat([torch.cat([torch.arange(n) for n in row])[None] for row in LAYOUTS[layout]])
    want = sdpa(q, k, v, Documents(pos))
    got = ring_attention(q, k, v, ContextShard(None, 1, 0, "ring", pos))
    assert (got - want).abs().max() < 1e-6
    w = torch.randn(want.shape, generator=g)
    grads = [torch.autograd.grad((o * w).sum(), (q, k, v)) for o in (got, want)]
    assert max(float((a - b).abs().max()) for a, b in zip(*grads)) < 1e-5
    kinds = set(seen[: len(seen) // 2])  # forward's blocks (backward repeats them)
    assert kinds == {"one document": {"full", "causal"}, "chunk-aligned": {"causal"},
                     "ragged": {"full", "causal", "mask"}, "rows differ": {"causal", "mask"}}[layout], seen
    if layout == "chunk-aligned":
        assert len(seen) == 2 * 2  # two diagonal pairs, forward and backward


def test_ulysses_refuses_a_head_count_the_ranks_do_not_divide():
    q = torch.zeros(1, 4, 4, 8)
    shard = ContextShard(None, 3, 0, "ulysses", torch.arange(12)[None])
    with pytest.raises(UsageError, match=r"head count \(4\) to be a multiple"):
        shard.mask().attend(q, q[:, :2], q[:, :2])


# ---- against one process, under torchrun ------------------------------------------------------------


def run_worker(tmp_path, nproc: int, style: str, model: str, *extra: str) -> dict:
    out = tmp_path / f"{style}-{model}-{nproc}.json"
    proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                           str(WORKER), style, model, str(out), *extra],
                          capture_output=True, text=True, timeout=300, env=ENV, check=False)
    report = json.loads(out.read_text()) if out.exists() else None
    assert proc.returncode == 0, (report, proc.stderr[-3000:])
    assert report["size"] == nproc and report["grad_scale"] > 1.0  # gradients are not trivially zero
    assert max(report["errors"].values()) < TOL, report
    return report


@pytest.mark.parametrize("style,model,extra", [("ring", "dense", ())] + [  # the rest: -m matrix
    pytest.param(*case, marks=pytest.mark.matrix) for case in [
        ("ring", "mla", ("--checkpointing", "--q-tile", "12")), ("ring", "gated", ()), ("ulysses", "dense", ()),
        ("ulysses", "mla", ()), ("ring", "dsa", ()), ("ulysses", "sinks", ()), ("ring", "dsv4", ())]
])
def test_two_ranks_match_one_process(tmp_path, style, model, extra):
    run_worker(tmp_path, 2, style, model, *extra)


@pytest.mark.matrix
@pytest.mark.parametrize("style,model", [("ring", "dense"), ("ulysses", "dense"), ("ring", "sinks")])
def test_four_ranks_match_one_process(tmp_path, style, model):  # ulysses at 4: 2 kv heads are repeated to 4 first
    run_worker(tmp_path, 4, style, model)


# ---- refusals ---------------------------------------------------------------------------------------

def test_layers_that_cannot_run_on_a_slice_refuse():
    """A layer that cannot run on a slice (the transformers fallback, vision inputs) refuses a shard
    before any communication (the shard has no process group)."""
    from vf.models.layers import refuse_context_parallel

    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
    refuse_context_parallel(Documents(pos), "transformers-fallback")  # no shard: runs
    with pytest.raises(UsageError, match="does not support transformers-fallback"):
        refuse_context_parallel(ContextShard(None, 2, 0, "ring", pos).mask(), "transformers-fallback")


def test_gather_path_on_one_rank_is_the_plain_forward():
    """DSA, sink attention and DeepSeek-V4 under a 1-rank shard (gather = identity, `visible` = the
    documents' mask rows) give the plain packed forward: masks and key positions are assembled right."""
    spec = importlib.util.spec_from_file_location("cp_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    for name in ("dsa", "sinks", "dsv4"):
        model = build_model(worker.config(name), seed=0)
        pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5]])
        ids = torch.randint(0, worker.V, (1, 16), generator=torch.Generator().manual_seed(0))
        want = model(ids, pos)
        with context_parallel(ContextShard(None, 1, 0, "ring", pos)):
            got = model(ids, pos)
        assert (got - want).abs().max() < 1e-6, name
