"""verifiers 0.4.0's reader accepts the traces `vf-train` and `vf-rollout` write.

verifiers' `Episode.run` is `TrainRunInfo | EvalRunInfo` (discriminated by `type`): a train run's
episode must carry `work` ({type, step, policy}), and there is no "rollout" run type. The live
tests write real traces (a tiny run on the embedded default; a vf-rollout against the stub
server) and have verifiers 0.4.0 (`VF_VERIFIERS_PYTHON`) validate every line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vf.trainer.orchestrator import record_work

from vf.trace import Episode, Trace

VERIFIERS_PY = os.environ.get("VF_VERIFIERS_PYTHON")
live = pytest.mark.skipif(not VERIFIERS_PY, reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

READ = """\
import json, sys
from verifiers.v1 import WireEpisode
for path in sys.argv[1:]:
    for line in open(path):
        ep = WireEpisode.model_validate_json(line)
        work = getattr(ep.run, "work", None)
        print(json.dumps({"type": ep.run.type, "id": ep.run.id, "step": work.step if work else None,
                          "policy": [work.policy.start, work.policy.end] if work and work.policy else None}))
"""


def verifiers_read(*files: Path) -> list[dict]:
    """Every line of `files` as verifiers 0.4.0 parses it (fails the test when it refuses one)."""
    proc = subprocess.run([VERIFIERS_PY, "-c", READ, *map(str, files)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_record_work_states_the_step_and_the_policy_span():
    ep = Episode(run={"type": "train", "id": "r", "name": "r"},
                 traces=[Trace(policy={"start": 3, "end": 4}), Trace(policy={"start": 2, "end": 3})])
    record_work(ep, 5)
    assert ep.run == {"type": "train", "id": "r", "name": "r", "step": 5,
                      "work": {"type": "train", "step": 5, "policy": {"start": 2, "end": 4}}}
    errored = Episode(run={"type": "train", "id": "r"}, traces=[])  # no trace: no span to state
    record_work(errored, 0)
    assert errored.run["work"] == {"type": "train", "step": 0}


@live
@pytest.mark.parametrize("mode", [[], ["--async.deterministic"]], ids=["continuous", "replay"])
def test_verifiers_reads_vf_train_traces(tmp_path, mode):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "vf.commands.train", "-o", str(run), "--warmup.steps", "1",
                           "--steps", "2", "--batch-size", "8", "--eval.at-start", "false", "--eval.at-end", "true",
                           "-n", "2", "--eval.num-rollouts", "1", "--seed", "0", "--trainer.threads", "1", *mode],
                          capture_output=True, text=True, timeout=300, env=ENV, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = verifiers_read(run / "traces.jsonl")
    assert len(train) == 16  # 2 RL steps × 8 rollouts
    assert {r["type"] for r in train} == {"train"} and {r["id"] for r in train} == {"run"}
    assert sorted({r["step"] for r in train}) == [1, 2]  # after the one warm-up step
    assert all(r["policy"] and r["policy"][0] <= r["policy"][1] <= r["step"] for r in train)
    (evals,) = run.glob("evals/*/traces.jsonl")
    assert {r["type"] for r in verifiers_read(evals)} == {"eval"}


@live
def test_verifiers_reads_vf_rollout_traces(tmp_path, stub, cli):
    out = tmp_path / "rollouts"
    cli("vf-rollout", "reverse-text", "-m", "reverse", "--base-url", stub.url, "-n", "3", "-r", "2", "-o", str(out),
        check=True)
    read = verifiers_read(out / "traces.jsonl")
    assert len(read) == 6 and {(r["type"], r["id"], r["step"]) for r in read} == {("eval", "rollouts", None)}
    ours = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert {ep["run"]["command"] for ep in ours} == {"rollout"}  # which command wrote it stays on record
