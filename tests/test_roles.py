"""`vf-train --role orchestrator` and `--role trainer`: the two halves of one run as two real
processes sharing the run dir (trainer/exchange.py)."""

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
from test_trainer_cli import ENV, EXACT, PY, SMALL, losses, train
from test_trainer_server import server  # noqa: F401 - the vf-serve fixture

ORCH_LOG = "orchestrator.log"


@contextlib.contextmanager
def orchestrator(run_dir, *args, resume=False, env=ENV):
    """`vf-train --role orchestrator` in the background (its output in a log file next to the run),
    killed on the way out if it is still running."""
    where = ["--resume", str(run_dir)] if resume else ["-o", str(run_dir)]
    with open(run_dir.parent / ORCH_LOG, "a") as log:
        proc = subprocess.Popen([PY, "-m", "vf.commands.train", "--role", "orchestrator", *where, *args],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def finish(proc, timeout=60):
    """The orchestrator's exit code once the trainer is done (it stops on its own)."""
    return proc.wait(timeout=timeout)


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_repeat_the_one_process_losses(tmp_path):
    """Deterministic replay: the batches cross the process boundary unchanged, so every step's
    loss equals the one-process run's (RL steps: the engine's float32 noise, see test_train_golden)."""
    args = [*EXACT, "--steps", "2"]
    train("-o", str(tmp_path / "one"), *args)
    with orchestrator(tmp_path / "two", *args) as orch:
        train("--role", "trainer", "-o", str(tmp_path / "two"), *args)
        assert finish(orch) == 0, (tmp_path / ORCH_LOG).read_text()
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert [r["phase"] for r in two] == ["warmup", "warmup", "rl", "rl"]
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-6, abs=1e-7)
    for a, b in zip(one, two):
        assert (a["reward"], a["num_loss_tokens"], a["off_policy/hist"] if a["phase"] == "rl" else None) == \
               (b["reward"], b["num_loss_tokens"], b["off_policy/hist"] if b["phase"] == "rl" else None)
    # the rollouts trained on are logged by the trainer, as in one process
    assert len((tmp_path / "two" / "traces.jsonl").read_text().splitlines()) == 2 * 8
    assert not (tmp_path / "two" / "rollouts").exists()  # the orchestrator cleaned up what was consumed
    assert "the trainer's run is complete" in (tmp_path / ORCH_LOG).read_text()


@pytest.mark.matrix
def test_torchrun_trainer_ranks_with_an_orchestrator_process(tmp_path):
    """M trainer ranks under torchrun (`--role trainer`) + one orchestrator process: rank 0 takes
    the batches from the run dir and broadcasts them; the losses are the one-process run's."""
    args = [*EXACT, "--steps", "1", "--trainer.micro-batch-size", "1", "--trainer.seq-len", "96"]
    train("-o", str(tmp_path / "one"), *args)
    with orchestrator(tmp_path / "two", *args) as orch:
        proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
                               "vf.commands.train", "--role", "trainer", "-o", str(tmp_path / "two"), *args],
                              capture_output=True, text=True, timeout=240, env=ENV, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert finish(orch) == 0, (tmp_path / ORCH_LOG).read_text()
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-4, abs=1e-6)
    assert [r["phase"] for r in rows(tmp_path / "two")] == ["warmup", "warmup", "rl"]


@pytest.mark.slow
def test_continuous_two_processes_report_the_orchestrators_staleness(tmp_path):
    run = tmp_path / "c"
    with orchestrator(run, *SMALL, "--steps", "3") as orch:
        proc = train("--role", "trainer", "-o", str(run), *SMALL, "--steps", "3", "--json")
        assert finish(orch) == 0, (tmp_path / ORCH_LOG).read_text()
    rl = [r for r in rows(run) if r["phase"] == "rl"]
    assert len(rl) == 3
    for r in rl:  # the orchestrator's per-step counters reach the trainer's metrics
        assert sum(r["off_policy/hist"].values()) == 2  # two groups of 4 per step
        assert 0 <= r["off_policy/mean"] <= r["off_policy/max"] <= 8 and r["dropped"] == 0
        assert r["staleness"] == r["off_policy/mean"] and "weight_pushes" in r
    assert rl[0]["off_policy/max"] == 0  # the first RL batch comes from the warm-up's weights
    assert sum(r["weight_pushes"] for r in rl) >= 2  # versions 3 and 4 reached the orchestrator's engine
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sum(summary["off_policy_hist"].values()) == 3 * 2


@pytest.mark.slow
def test_trainer_stops_when_the_orchestrator_dies_and_both_resume(tmp_path):
    run = tmp_path / "k"
    args = [*SMALL, "--steps", "4", "--ckpt-every", "1", "--exchange.timeout", "4"]
    with orchestrator(run, *args) as orch:
        trainer = subprocess.Popen([PY, "-m", "vf.commands.train", "--role", "trainer", "-o", str(run), *args],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.time() + 120
        while time.time() < deadline and not any(r["phase"] == "rl" for r in (rows(run) if (run / "metrics.jsonl").exists() else [])):
            time.sleep(0.1)
        os.killpg(orch.pid, signal.SIGKILL)
        orch.wait()
        killed = time.time()
        _, err = trainer.communicate(timeout=60)
    assert trainer.returncode == 1, err
    assert time.time() - killed < 4 + 15  # the timeout, plus the step in progress
    assert "heartbeat" in err and str(run / "exchange" / "heartbeat.json") in err and "--resume" in err, err
    assert "Traceback" not in err
    done = len(rows(run))
    assert 3 <= done < 6 and (run / "checkpoints" / f"step_{done}").is_dir()  # checkpoints kept
    # restart both (the orchestrator first here; either order works)
    with orchestrator(run, resume=True) as orch:
        proc = train("--role", "trainer", "--resume", str(run), "--json")
        assert finish(orch) == 0, (tmp_path / ORCH_LOG).read_text()
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] == done
    assert [r["step"] for r in rows(run)] == list(range(6))


def test_role_errors_exit_2(tmp_path):
    bad = subprocess.run([PY, "-m", "vf.commands.train", "--role", "inference", "-o", str(tmp_path / "x")],
                         capture_output=True, text=True, env=ENV, timeout=60, check=False)
    assert bad.returncode == 2 and "--role 'inference'" in bad.stderr and "orchestrator" in bad.stderr
    nodir = subprocess.run([PY, "-m", "vf.commands.train", "--role", "orchestrator"],
                           capture_output=True, text=True, env=ENV, timeout=60, check=False)
    assert nodir.returncode == 2 and "-o RUN" in nodir.stderr


def test_orchestrator_refuses_a_config_that_differs_from_the_trainers(tmp_path):
    """Both roles must run the same config: the orchestrator waits `exchange.timeout` for a trainer
    with its config, then lists what differs (exit 2) and tells the trainer (error.json) instead of
    generating the wrong batches. `exchange` itself may differ per role."""
    from vf.trainer.config import resolve
    from vf.trainer.exchange import Paths, digest, write_json

    from vf.rundir import RunDir

    run = RunDir(tmp_path / "r")
    run.create()
    config = resolve({"steps": 3})
    run.save_config(config.model_dump(mode="json"))
    p = Paths(run.path)
    p.dir.mkdir()
    write_json(p.trainer, {"session": "s1", "first": 0, "total": 3, "config": digest(config)})
    proc = subprocess.run([PY, "-m", "vf.commands.train", "--role", "orchestrator", "--resume", str(run.path),
                           "--steps", "5", "--lr", "0.01", "--exchange.timeout", "1"], capture_output=True, text=True, env=ENV, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "steps: trainer 3, orchestrator 5" in proc.stderr and "optim.lr" in proc.stderr
    assert "exchange" not in proc.stderr.split("hint")[0]
    assert "differs" in json.loads(p.error.read_text())["message"]


def test_a_batch_crosses_the_boundary_unchanged(tmp_path):
    """Samples (NaN log-probs included), metrics and episodes read back exactly."""
    import math

    from vf.trainer.exchange import READY, load_batch, save_batch
    from vf.trainer.orchestrator import Batch
    from vf.trainer.samples import Sample

    from vf.trace import Episode

    s = Sample([1, 2, 3], [0, 1, 1], [0.0, -0.1234567890123, float("nan")], 0.25, {"step": 4, "reward": 0.5},
               ["data:image/png;base64,xx"])
    ep = Episode.model_validate({"traces": [], "run": {"step": 4}})
    save_batch(tmp_path / "b", Batch(4, [s], [ep], {"reward": 0.5, "off_policy/hist": {1: 2}}), "sess")
    assert json.loads((tmp_path / "b" / READY).read_text()) == {"session": "sess", "step": 4}
    got = load_batch(tmp_path / "b")
    g = got.samples[0]
    assert (g.token_ids, g.loss_mask, g.advantage, g.info, g.images) == (s.token_ids, s.loss_mask, 0.25, s.info, s.images)
    assert g.logprobs[:2] == s.logprobs[:2] and math.isnan(g.logprobs[2])
    assert got.episodes[0].run == {"step": 4} and got.metrics["off_policy/hist"] == {"1": 2}


@pytest.mark.slow
def test_orchestrator_drives_a_server_from_the_trainers_broadcasts(server, tmp_path):  # noqa: F811
    """Server mode across the boundary: the orchestrator has `vf-serve` load each policy version
    straight from the trainer's RUN/broadcasts (no second copy); deterministic replay, so batch b
    is sampled from exactly version max(W, b − 1)."""
    from test_trainer_server import KEY

    run = tmp_path / "s"
    args = ["--engine.base-url", server + "/v1", "--trainer.threads", "1", "--seed", "7", "--batch-size", "4",
            "--group-size", "2", "--warmup.steps", "2", "--warmup.batch-size", "8", "--steps", "3",
            "--eval.at-start", "false", "--eval.at-end", "false", "--async.deterministic"]
    env = {**ENV, "OPENAI_API_KEY": KEY}
    with orchestrator(run, *args, env=env) as orch:
        proc = subprocess.run([PY, "-m", "vf.commands.train", "--role", "trainer", "-o", str(run), *args],
                              capture_output=True, text=True, timeout=240, env=env, check=False)
        assert proc.returncode == 0, proc.stderr
        assert finish(orch) == 0, (tmp_path / ORCH_LOG).read_text()
    starts = {}
    for line in (run / "traces.jsonl").read_text().splitlines():
        ep = json.loads(line)
        starts.setdefault(ep["run"]["step"], set()).update(t["policy"]["start"] for t in ep["traces"])
    assert starts == {2: {2}, 3: {2}, 4: {3}}
    rl = [r for r in rows(run) if r["phase"] == "rl"]
    assert all(r["weight_sync_time"] > 0 for r in rl)  # the orchestrator's pusher metrics
    # after the run the server serves the final policy (version 5), as in one process
    import httpx

    assert httpx.get(server + "/health", timeout=10).json()["policy_version"] == 5
