"""`vf-train --parallel.*`: the layout checks (exit 2) and vf-train under torchrun with expert and
context parallelism against the 1-process run on the same batches (`--async.deterministic`).

The model-level parity (loss and every gradient, ring/Ulysses, ep × replicas) is in
tests/test_expert_parallel.py and tests/test_context_parallel.py; here the whole trainer runs:
micro-batching, the fused IPO loss on each rank's columns, the global gradient norm, the expert
blocks' gradient reduction, sharded checkpoints resumed at another ep."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from vf.trainer.config import ParallelSection
from vf.trainer.parallel import plan

from vf.errors import UsageError

PY = sys.executable
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
EXACT = ["--warmup.steps", "1", "--warmup.batch-size", "8", "--batch-size", "8", "--group-size", "4",
         "--eval.at-start", "false", "--eval.at-end", "false", "--seed", "7", "--trainer.threads", "1",
         "--trainer.micro-batch-size", "2", "--trainer.seq-len", "96", "--async.deterministic"]

MOE = SimpleNamespace(num_experts=8, num_heads=4)
DENSE = SimpleNamespace(num_experts=0, num_heads=4)


def section(**kw) -> ParallelSection:
    return ParallelSection(**kw)


@pytest.mark.parametrize("kw, world, model, expect", [
    ({"ep": 2}, 1, MOE, "--parallel.ep 2 does not divide the world size 1"),
    ({"ep": 2}, 2, DENSE, "--parallel.ep 2 needs a MoE model"),
    ({"ep": 16}, 16, MOE, "larger than the expert count (8)"),
    ({"ep": 3}, 3, MOE, "does not divide the expert count (8)"),
    ({"cp": 3}, 4, DENSE, "--parallel.cp 3 does not divide the world size 4"),
    ({"cp": 2, "dp_shard": 4}, 4, DENSE, "--parallel.dp-shard 4 × --parallel.cp 2 = 8 processes"),
    ({"cp": 8, "cp_style": "ulysses"}, 8, DENSE, "4 query heads do not split 8 ways"),
])
def test_impossible_layouts_are_refused_with_the_reason(kw, world, model, expect):
    with pytest.raises(UsageError) as e:
        plan(section(**kw), world, 0, model)
    assert expect in e.value.message


def test_auto_and_rank_coordinates():
    lay = plan(section(ep="auto", cp=2), 8, 5, MOE)
    assert (lay.dp_shard, lay.cp, lay.ep) == (4, 2, 8)
    assert (lay.dp_rank, lay.cp_rank, lay.ep_rank) == (2, 1, 5)
    assert plan(section(ep="auto"), 6, 0, MOE).ep == 2  # the largest divisor of 6 that divides 8
    assert plan(section(ep="auto"), 4, 0, DENSE).ep == 1
    assert plan(section(cp=2, cp_style="ulysses"), 2, 1, DENSE).describe() == \
        "parallel layout over 2 processes: dp_shard 1, cp 2 (ulysses)"


def command(nproc: int, *args: str) -> list[str]:
    return ([str(Path(PY).parent / "torchrun"), "--standalone", "--nproc_per_node", str(nproc)] if nproc > 1
            else [PY]) + ["-m", "vf.commands.train", *args]


def launch(nproc: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(nproc, *args), capture_output=True, text=True, timeout=400, env=ENV, check=False)
    assert proc.returncode == 0 or not check, proc.stderr[-3000:]
    return proc


def kill_9_after(step: int, run_dir: Path, nproc: int, *args: str) -> bool:
    """Start vf-train under torchrun and SIGKILL the whole job (launcher and every rank, as a lost
    node does) once the step-`step` checkpoint exists. True when the kill came before the end."""
    proc = subprocess.Popen(command(nproc, "-o", str(run_dir), *args), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    deadline = time.time() + 300
    while not (run_dir / "checkpoints" / f"step_{step}").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    killed = proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return killed


def back_to(step: int, src: Path, dst: Path) -> None:
    """A copy of the run as a kill after the step-`step` checkpoint would have left it."""
    shutil.copytree(src, dst)
    for ck in (dst / "checkpoints").glob("step_*"):
        if int(ck.name.split("_")[1]) > step:
            shutil.rmtree(ck)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in rows(run_dir)]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from test_router_replay import build_moe

    return build_moe(tmp_path_factory.mktemp("moe"))


def test_ep_on_one_process_exits_2_before_training(moe_dir, tmp_path):
    proc = launch(1, "-o", str(tmp_path / "run"), "--model", str(moe_dir), "--parallel.ep", "2", "--steps", "1",
                  check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--parallel.ep 2 does not divide the world size 1" in proc.stderr and "torchrun --nproc_per_node 2" \
        in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.matrix
def test_ep_2_matches_one_process_and_resumes_at_another_ep(moe_dir, tmp_path):
    """Two RL steps at ep 2 (each rank 4 of the 8 experts) give the 1-process losses and gradient
    norms; its sharded checkpoint resumes at ep 1 on 2 processes and on 1 process, and checkpoints
    saved at ep 1 (1 process, 2 processes) resume at ep 2, continuing the same losses (DCP reshards
    the expert blocks). An ep-2 job killed with SIGKILL during step 2 resumes at ep 1 the same way."""
    args = ["--model", str(moe_dir), *EXACT, "--steps", "2", "--ckpt-every", "2"]
    launch(1, "-o", str(tmp_path / "one"), *args)
    launch(2, "-o", str(tmp_path / "ep2"), *args, "--parallel.ep", "2")
    one, ep2 = rows(tmp_path / "one"), rows(tmp_path / "ep2")
    assert len(one) == len(ep2) == 3
    assert [r["loss"] for r in ep2] == pytest.approx([r["loss"] for r in one], rel=1e-5, abs=1e-7)
    assert [r["grad_norm"] for r in ep2] == pytest.approx([r["grad_norm"] for r in one], rel=1e-4)
    ck = tmp_path / "ep2" / "checkpoints" / "step_2"
    assert json.loads((ck / "trainer.json").read_text())["sharded"] == {"world_size": 2, "ep": 2, "cp": 1}
    want = losses(tmp_path / "ep2")

    for name, nproc in (("ep1_two", 2), ("ep1_one", 1)):
        run = tmp_path / name
        back_to(2, tmp_path / "ep2", run)
        launch(nproc, "--resume", str(run), "--parallel.ep", "1")
        assert losses(run) == pytest.approx(want, rel=1e-4, abs=1e-6), name
    for name, src in (("plain_to_ep2", "one"), ("ep1_to_ep2", "ep1_two")):  # 1 → 2: the blocks are cut on load
        run = tmp_path / name
        back_to(2, tmp_path / src, run)
        launch(2, "--resume", str(run), "--parallel.ep", "2")
        assert losses(run) == pytest.approx(want, rel=1e-4, abs=1e-6), name

    killed = tmp_path / "killed"
    assert kill_9_after(1, killed, 2, *args, "--ckpt-every", "1", "--parallel.ep", "2")
    assert len(losses(killed)) < 3
    launch(1, "--resume", str(killed), "--parallel.ep", "1")
    assert losses(killed) == pytest.approx(want, rel=1e-4, abs=1e-6)


@pytest.mark.matrix
@pytest.mark.parametrize("style", ["ring", "ulysses"])
def test_cp_2_matches_one_process(tmp_path, style):
    """Each row's tokens split over 2 ranks (documents straddle the split): the same losses."""
    args = [*EXACT, "--steps", "2"]
    launch(1, "-o", str(tmp_path / "one"), *args)
    launch(2, "-o", str(tmp_path / "cp2"), *args, "--parallel.cp", "2", "--parallel.cp-style", style)
    one, cp2 = rows(tmp_path / "one"), rows(tmp_path / "cp2")
    assert [r["loss"] for r in cp2] == pytest.approx([r["loss"] for r in one], rel=1e-5, abs=1e-7)
    assert [r["grad_norm"] for r in cp2] == pytest.approx([r["grad_norm"] for r in one], rel=1e-4)


@pytest.mark.slow
def test_cp_2_killed_with_sigkill_resumes_on_one_process(tmp_path):
    """A cp-2 job killed (every rank) during step 2 resumes from its step-1 checkpoint on one
    process at cp 1, continuing the 1-process losses (DCP reshards the FSDP shards)."""
    args = [*EXACT, "--steps", "2"]
    launch(1, "-o", str(tmp_path / "one"), *args)
    killed = tmp_path / "killed"
    assert kill_9_after(1, killed, 2, *args, "--ckpt-every", "1", "--parallel.cp", "2")
    assert len(losses(killed)) < 3
    launch(1, "--resume", str(killed), "--parallel.cp", "1")
    assert losses(killed) == pytest.approx(losses(tmp_path / "one"), rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_cp_and_ep_on_the_same_ranks_match_one_process(moe_dir, tmp_path):
    """cp 2 × ep 2 on 2 processes: each rank has half of every row's tokens and half of the experts
    (tokens from both halves reach every expert through the all-to-all)."""
    args = ["--model", str(moe_dir), *EXACT, "--steps", "1"]
    launch(1, "-o", str(tmp_path / "one"), *args)
    proc = launch(2, "-o", str(tmp_path / "both"), *args, "--parallel.cp", "2", "--parallel.ep", "2")
    assert "parallel layout over 2 processes: dp_shard 1, cp 2 (ring), ep 2" in proc.stderr
    one, both = rows(tmp_path / "one"), rows(tmp_path / "both")
    assert [r["loss"] for r in both] == pytest.approx([r["loss"] for r in one], rel=1e-5, abs=1e-7)
    assert [r["grad_norm"] for r in both] == pytest.approx([r["grad_norm"] for r in one], rel=1e-4)


@pytest.mark.matrix
def test_dp_shard_2_by_cp_2_with_ep_2_on_four_processes_matches_one_process(moe_dir, tmp_path):
    """Every dimension at once on 4 processes: FSDP2 over 4 ranks, 2 data-parallel rows groups,
    each row split over a cp pair, experts split over ep pairs with 2 replicas each."""
    args = ["--model", str(moe_dir), *EXACT, "--steps", "1"]
    launch(1, "-o", str(tmp_path / "one"), *args)
    proc = launch(4, "-o", str(tmp_path / "all"), *args, "--parallel.cp", "2", "--parallel.ep", "2")
    assert "parallel layout over 4 processes: dp_shard 2, cp 2 (ring), ep 2" in proc.stderr
    one, both = rows(tmp_path / "one"), rows(tmp_path / "all")
    assert [r["loss"] for r in both] == pytest.approx([r["loss"] for r in one], rel=1e-5, abs=1e-7)
    assert [r["grad_norm"] for r in both] == pytest.approx([r["grad_norm"] for r in one], rel=1e-4)


@pytest.mark.matrix
def test_ngram_tables_split_by_row_over_two_processes_match_one_process(tmp_path):
    """Qwen3.8 Flash Next (tiny qwen4_exp): under torchrun its hashed n-gram tables are split by row
    over the ranks (lookups exchange ids and rows); 2 data-parallel processes give the 1-process
    losses and gradient norms; the 2-process checkpoint (table blocks as DTensors) resumes on one
    process, and a 1-process checkpoint resumes on two (the blocks cut on load)."""
    from test_models_qwen4_exp import build

    model = tmp_path / "qwen4"
    build(model)
    args = ["--model", str(model), *EXACT, "--steps", "2", "--ckpt-every", "1"]
    launch(1, "-o", str(tmp_path / "one"), *args)
    proc = launch(2, "-o", str(tmp_path / "two"), *args)
    assert "n-gram table(s) by row over 2 processes" in proc.stderr, proc.stderr[-2000:]
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-5, abs=1e-7)
    assert [r["grad_norm"] for r in two] == pytest.approx([r["grad_norm"] for r in one], rel=1e-4)
    want = losses(tmp_path / "one")
    for name, src, nproc in (("two_to_one", "two", 1), ("one_to_two", "one", 2)):
        run = tmp_path / name
        back_to(2, tmp_path / src, run)  # the first RL step's checkpoint (step 1 is the warm-up)
        launch(nproc, "--resume", str(run))
        assert losses(run) == pytest.approx(want, rel=1e-4, abs=1e-6), name


@pytest.mark.matrix
def test_trainer_role_at_cp_2_with_an_orchestrator_process(tmp_path):
    """`--role trainer` under torchrun at cp 2, batches from a separate `--role orchestrator`
    process: the 1-process losses."""
    from test_roles import finish, orchestrator

    args = [*EXACT, "--steps", "1"]
    launch(1, "-o", str(tmp_path / "one"), *args)
    with orchestrator(tmp_path / "two", *args, "--parallel.cp", "2") as orch:
        launch(2, "--role", "trainer", "-o", str(tmp_path / "two"), *args, "--parallel.cp", "2")
        assert finish(orch, timeout=120) == 0
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5, abs=1e-7)
