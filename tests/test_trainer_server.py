"""vf-train in server mode, end to end: a real `vf-serve` subprocess (API key on) generates the
rollouts and evaluations; the trainer pushes HF checkpoints to it over /v1/load_weights."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

KEY = "train-key-42"
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
W, RL = 2, 3  # SFT warm-up steps, RL steps
TOTAL = W + RL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vf.commands.serve", "tiny-random", "--port", str(port), "--threads", "1",
                             "--api-key", KEY, "--weights-root", str(tmp_path_factory.getbasetemp())], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"vf-serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise AssertionError("vf-serve did not come up")
        time.sleep(0.1)
    yield base
    proc.terminate()
    proc.wait(timeout=30)


def train(base: str, run_dir: Path, *args: str, key: str | None = KEY) -> subprocess.CompletedProcess:
    env = {k: v for k, v in ENV.items() if k != "OPENAI_API_KEY"}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    cmd = [sys.executable, "-m", "vf.commands.train", "--engine.base-url", base + "/v1", "-o", str(run_dir),
           "--json", "--trainer.threads", "1", "--seed", "7", "--batch-size", "4", "--group-size", "2",
           "--warmup.batch-size", "8", "-n", "4", "--eval.num-rollouts", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


def policy_starts(traces: Path) -> dict[int, set[int]]:
    """step (or train_step for evals) -> the policy versions its traces started from."""
    out: dict[int, set[int]] = {}
    for line in traces.read_text().splitlines():
        ep = json.loads(line)
        step = ep["run"].get("step", ep["run"].get("train_step"))
        out.setdefault(step, set()).update(t["policy"]["start"] for t in ep["traces"])
    return out


def test_train_against_vf_serve(server, tmp_path):
    run = tmp_path / "run"
    # deterministic replay: exact versions per batch (continuous dispatch pushes every version)
    proc = train(server, run, "--warmup.steps", str(W), "--steps", str(RL), "--async.deterministic")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    from test_serve import leaked

    assert leaked(KEY, run, texts=[proc.stdout, proc.stderr]) == []  # no key in checkpoints, logs, traces

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(TOTAL))
    assert [r["phase"] for r in rows] == ["warmup"] * W + ["rl"] * RL
    assert all(math.isfinite(r["loss"]) for r in rows)
    # batch s is generated from version max(W, s - async_level) (async_level 1)
    expected = {s: max(W, s - 1) for s in range(W, TOTAL)}
    assert {r["step"]: r["policy_version"] for r in rows if r["phase"] == "rl"} == expected
    # the first RL batch came from exactly the trainer's weights: the server's log-probs match
    assert rows[W]["mismatch_kl"] < 1e-5 and rows[W]["staleness"] == 0

    # every trace records the version the server reported (not the trainer's own bookkeeping)
    assert policy_starts(run / "traces.jsonl") == {s: {v} for s, v in expected.items()}
    # evaluations ran through the server, each on the version it evaluates
    for label, version in (("before", 0), ("after_warmup", W), ("after", TOTAL)):
        assert policy_starts(run / "evals" / label / "traces.jsonl") == {version: {version}}, label
        assert json.loads((run / "evals" / label / "summary.json").read_text())["num_episodes"] == 4
    assert summary["reward_before"] is not None and summary["reward_after"] is not None

    # the server ends on the trained policy; versions 0, W, W+1, TOTAL were each pushed once
    r = httpx.get(server + "/v1/policy_version", headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert r.json()["policy_version"] == TOTAL
    assert summary["weight_pushes"] == 4

    # the last pushed checkpoint is a loadable HF dir holding the final trained weights
    import torch
    from vf.models import load_model
    from vf.trainer import checkpoint

    pushed = load_model(run / "broadcasts" / f"step_{TOTAL}").state_dict()
    final = checkpoint.load(run / "checkpoints" / f"step_{TOTAL}")["model"]
    assert set(pushed) == set(final)
    assert all(torch.equal(pushed[k], final[k].to(pushed[k].dtype)) for k in final)


def test_missing_api_key_fails_with_a_hint(server, tmp_path):
    proc = train(server, tmp_path / "run", "--warmup.steps", "0", "--steps", "1", "--eval.at-start", "false",
                 "--eval.at-end", "false", key=None)
    assert proc.returncode == 1, proc.stderr
    assert "answered 401" in proc.stderr and "$OPENAI_API_KEY" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
