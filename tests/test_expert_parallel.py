"""Expert parallelism (models/expert_parallel.py): real torchrun worlds (gloo on CPU) run
tests/parallel/ep_worker.py, which checks an expert-parallel model against the 1-process model on
the same packed batch (loss, every grad, routing, global MoE stats, the full expert state) and
writes its errors as JSON; plus the in-process parts that need no process group."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vf.models.config import ModelConfig
from vf.models.errors import ModelLoadError
from vf.models.expert_parallel import expert_params, load_expert_state, shard_experts
from vf.models.moe import moe_layers
from vf.models.transformer import build_model

from vf.errors import UsageError

WORKER = Path(__file__).parent / "parallel" / "ep_worker.py"
TOL = 1e-5
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # torchrun's processes share a few cores


def torchrun() -> list[str]:
    """The torchrun next to this interpreter, else the same launcher as a module (a venv that
    reaches torch through a .pth has no torchrun script of its own)."""
    exe = Path(sys.executable).parent / "torchrun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def launch_worker(worker: Path, out: Path, nproc: int, *args: str) -> tuple[dict, int, str]:
    """Run `worker OUT ARGS` on `nproc` torchrun processes: (the JSON report it wrote to OUT, exit
    code, stderr). Its own session, so a hung collective is killed with every worker process."""
    proc = subprocess.Popen([*torchrun(), "--standalone", "--nproc_per_node", str(nproc), str(worker), str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert out.exists(), stderr[-3000:]
    return json.loads(out.read_text()), proc.returncode, stderr


def run_worker(tmp_path, nproc: int, *args: str) -> dict:
    report, code, stderr = launch_worker(WORKER, tmp_path / "ep.json", nproc, *args)
    assert code == 0 and report["ok"], (report["errors"], stderr[-2000:])
    return report


def check(report: dict, ep: int) -> None:
    errors = report["errors"]
    assert max(errors.values()) < TOL, errors
    assert report["routing_ok"] and report["replay_ok"]
    assert report["layers_sharded"] == 2
    assert report["grad_max"] > 1.0  # the comparison is of real gradients, not of zeros
    assert report["stats"]["moe/max_vio"] == report["stats_ref"]["moe/max_vio"]  # integer counts: exact
    assert report["expert_bytes"] * ep == report["ref_expert_bytes"]  # each rank holds 1/ep of the experts
    assert {"grad/layers.0.mlp.gate_up_proj", "grad/layers.1.mlp.down_proj", "full_state", "load_state",
            "stats", "loss"} <= errors.keys()


def test_ep2_grouped_matches_one_process(tmp_path):
    report = run_worker(tmp_path, 2, "--ep", "2")
    check(report, 2)
    assert report["expert_bytes"] == 49152 and report["ref_expert_bytes"] == 98304


def test_ep2_loop_shared_expert_router_replay_and_checkpointing(tmp_path):
    """Replay ids on half the rows: the EP forward routes to exactly those experts (replay_ok), the
    rest as the reference does (routing_ok), and the shared expert's grads reduce like any other.
    With activation checkpointing, whose backward recomputes each layer's exchanges."""
    report = run_worker(tmp_path, 2, "--ep", "2", "--impl", "loop", "--shared", "--replay", "random", "--ckpt")
    assert report["ckpt"]
    check(report, 2)
    assert "grad/layers.0.mlp.shared.down_proj.weight" in report["errors"]


@pytest.mark.matrix
def test_ep2_latent_moe_matches_one_process(tmp_path):
    """A latent MoE (Nemotron-H Super): the projections run on each token's own rank and the ranks
    exchange 24-wide latent rows; the experts are held in the latent width."""
    report = run_worker(tmp_path, 2, "--ep", "2", "--latent", "24", "--shared")
    check(report, 2)
    assert {"grad/layers.0.mlp.latent_in.weight", "grad/layers.1.mlp.latent_out.weight"} <= report["errors"].keys()
    assert report["ref_expert_bytes"] == 2 * 8 * (32 * 24 + 24 * 16) * 4  # 2 layers of [E, 2Im, 24] + [E, 24, Im], fp32


@pytest.mark.matrix
def test_zero_row_sends_and_receives(tmp_path):
    """Every token goes to the last rank's experts: rank 0 sends none of its rows to itself and
    receives none, yet runs every collective forward and backward; its expert grads are zero."""
    report = run_worker(tmp_path, 2, "--ep", "2", "--replay", "skew")
    check(report, 2)
    assert report["stats"]["moe/max_vio"] == pytest.approx(3.0)  # 2 of 8 experts take everything: (A/2 − A/8)/(A/8)


@pytest.mark.matrix
def test_ep2_times_two_replicas(tmp_path):
    """4 ranks: two ep groups {0,1} {2,3}; expert grads are summed over the replicas {0,2} {1,3}."""
    check(run_worker(tmp_path, 4, "--ep", "2", "--shared"), 2)


@pytest.mark.matrix
def test_ep4(tmp_path):
    check(run_worker(tmp_path, 4, "--ep", "4", "--impl", "loop", "--replay", "skew"), 4)


# ---- in process: no collective involved ---------------------------------------------------------


class FakeGroup:
    """What shard_experts reads of a ProcessGroup."""

    def __init__(self, size: int, rank: int):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def tiny(**kw):
    cfg = ModelConfig(architecture="qwen3_moe", vocab_size=16, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=2,
                      head_dim=4, intermediate_size=8, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=4,
                      **kw)
    return build_model(cfg, seed=0)


def test_ep_size_must_divide_the_experts():
    model = tiny()
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(UsageError, match=r"6 experts.*6 % 4 = 2") as e:
        shard_experts(model, FakeGroup(4, 1))
    assert e.value.exit_code == 2
    assert all(m.ep is None for m in moe_layers(model))  # refused before touching any layer
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_shard_keeps_this_ranks_block_and_loads_full_state():
    model = tiny(expert_bias_terms=True, router_bias=True)
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert shard_experts(model, FakeGroup(3, 1)) == 2
    names = dict(expert_params(model))
    assert set(names) == {f"layers.{i}.mlp.{p}" for i in (0, 1)
                          for p in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")}
    for n, p in names.items():
        assert p.shape[0] == 2 and p.is_contiguous() and torch.equal(p, full[n][2:4])  # experts 2, 3
        assert dict(model.named_parameters())[n] is p  # same names, registered parameters
    shard = moe_layers(model)[0].ep
    assert (shard.size, shard.rank, shard.first, shard.count) == (3, 1, 2, 2)
    assert moe_layers(model)[0].router.weight.shape[0] == 6  # the router still scores all experts
    new = {n: torch.randn_like(full[n]) for n in names}
    load_expert_state(model, new)
    assert all(torch.equal(p, new[n][2:4]) for n, p in names.items())
    with pytest.raises(UsageError, match="already sharded"):
        shard_experts(model, FakeGroup(3, 1))


@pytest.mark.parametrize("bad", ["missing", "rows", "shape"])
def test_load_expert_state_refuses_a_mismatched_state(bad):
    model = tiny()
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    shard_experts(model, FakeGroup(2, 0))
    state = {n: full[n] for n, _ in expert_params(model)}
    name = "layers.1.mlp.down_proj"
    if bad == "missing":
        del state[name]
    elif bad == "rows":
        state[name] = state[name][:4]
    else:
        state[name] = state[name][..., :3]
    with pytest.raises(ModelLoadError, match=name):
        load_expert_state(model, state)
