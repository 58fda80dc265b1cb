"""The recurrent layers (gated DeltaNet, Mamba-2) under context parallelism
(models/context_parallel_recurrent.py): head splits and refusals in process; under torchrun (gloo,
tests/parallel/cp_recurrent_worker.py) hybrid models against one process, token by token and
gradient by gradient, and against each document run alone (the state restarts at a document start
inside a rank's chunk)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vf.models.config import ModelConfig
from vf.models.context_parallel import ContextShard, context_parallel, split_sequence
from vf.models.context_parallel_recurrent import HeadSplit, heads_to_sequence, sequence_to_heads
from vf.models.transformer import build_model

from vf.errors import UsageError

PY = sys.executable
WORKER = Path(__file__).parent / "parallel" / "cp_recurrent_worker.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TOL = 1e-5

COMMON = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "num_kv_heads": 2,
          "head_dim": 16}
DELTANET = {"architecture": "qwen3_5_text", "num_layers": 2, "layer_types": ["linear_attention", "full_attention"],
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4}
MAMBA = {"architecture": "nemotron_h", "num_layers": 2, "layer_types": ["linear_attention", "full_attention"],
         "mlp_act": "relu2", "ssm_state_size": 8, "mamba_num_heads": 4, "mamba_head_dim": 8, "mamba_n_groups": 2,
         "mamba_chunk_size": 4}


# ---- in process -----------------------------------------------------------------------------------


def test_head_split_contiguous_and_replicated():
    s = HeadSplit("L", 8, 4, 2, 1)  # 8 value heads read key heads h // 2
    assert not s.replicate and s.value_index(1).tolist() == [4, 5, 6, 7] and s.key_index(1).tolist() == [2, 3]
    # every value head of a rank reads a key head that rank holds
    assert set((s.value_index(1) // 2).tolist()) == set(s.key_index(1).tolist())
    s = HeadSplit("L", 4, 2, 4, 3)  # 2 key heads over 4 ranks: the one value head 3 reads, replicated
    assert s.replicate and s.value_index(3).tolist() == [3] and s.key_index(3).tolist() == [1]
    s = HeadSplit("L", 6, 1, 3, 2)
    assert s.replicate and s.key_index(2).tolist() == [0, 0] and s.keys_per_rank == 2


def test_one_rank_exchange_is_the_identity():
    shard = ContextShard(None, 1, 0, "ring", torch.zeros(2, 8, dtype=torch.long))
    x = torch.randn(2, 8, 1, 5)
    assert torch.equal(sequence_to_heads(x, shard), x[:, :, 0])
    assert torch.equal(heads_to_sequence(x[:, :, 0], shard), x)


@pytest.mark.parametrize("cfg", [DELTANET, MAMBA], ids=["deltanet", "mamba2"])
def test_one_rank_shard_runs_the_one_process_numbers(cfg):
    """A CP group of one (no communication) takes the sharded code path: its log-probs equal the plain
    packed forward's, so the refactored core is the one-process core."""
    model = build_model(ModelConfig(**{**COMMON, **cfg}), seed=0)
    pos = torch.cat([torch.arange(5), torch.arange(11)])[None].repeat(2, 1)
    pos[1] = torch.arange(16)
    ids = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(0))
    want = model(ids, pos)
    with context_parallel(ContextShard(None, 1, 0, "ring", pos)):
        got = model(ids, pos)
    assert (got - want).abs().max() < 1e-6


@pytest.mark.parametrize("cfg,size,match", [
    ({**DELTANET, "linear_num_value_heads": 2}, 3, r"Gated DeltaNet's 2 value heads \(2 key heads\)"),
    ({**MAMBA, "mamba_num_heads": 4}, 3, r"Mamba-2's 4 heads \(2 groups"),
], ids=["deltanet", "mamba2"])
def test_a_head_count_the_ranks_do_not_divide_is_refused(cfg, size, match):
    model = build_model(ModelConfig(**{**COMMON, **cfg}), seed=0)
    pos = torch.arange(12)[None]
    ids = torch.zeros_like(pos)
    # refused before any communication (the shard has no process group)
    with context_parallel(ContextShard(None, size, 0, "ulysses", pos)), pytest.raises(UsageError, match=match):
        model(split_sequence(ids, size, 0), split_sequence(pos, size, 0))


# ---- against one process, under torchrun ------------------------------------------------------------


def run_worker(tmp_path, nproc: int, style: str, model: str, *extra: str) -> dict:
    out = tmp_path / f"{style}-{model}-{nproc}.json"
    proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                           str(WORKER), style, model, str(out), *extra],
                          capture_output=True, text=True, timeout=300, env=ENV, check=False)
    report = json.loads(out.read_text()) if out.exists() else None
    assert proc.returncode == 0, (report, proc.stderr[-3000:])
    assert report["size"] == nproc and report["grad_scale"] > 1.0  # gradients are not trivially zero
    assert min(report["recurrent_grads"].values()) > 1e-2  # the recurrent parameters' grads are checked for real
    assert max(report["errors"].values()) < TOL, report
    if "--single" not in extra:  # carrying state over a document start would change log-probs by far more
        assert report["unreset"] > 0.1, report
    return report


@pytest.mark.parametrize("style,model,extra", [("ring", "qwen3_next", ())] + [  # the rest: -m matrix
    pytest.param(*case, marks=pytest.mark.matrix) for case in [
        ("ulysses", "qwen3_next", ()), ("ulysses", "qwen3_next", ("--single",)), ("ring", "nemotron_h", ()),
        ("ulysses", "nemotron_h_g1", ("--checkpointing",))]
])
def test_two_ranks_match_one_process(tmp_path, style, model, extra):
    run_worker(tmp_path, 2, style, model, *extra)


@pytest.mark.matrix
@pytest.mark.parametrize("style,model", [("ulysses", "qwen3_next"), ("ring", "nemotron_h")])
def test_four_ranks_match_one_process(tmp_path, style, model):
    """4 ranks: DeltaNet's 2 key heads and Mamba-2's 2 groups are replicated per head."""
    run_worker(tmp_path, 4, style, model)
