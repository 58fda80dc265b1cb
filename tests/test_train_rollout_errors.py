"""vf-train and rollouts that cannot succeed: a harness that cannot be built stops the run before
it starts (exit 2); a step whose every rollout errored stops it (exit 1) naming the first error,
with the step's traces written and the last checkpoint kept; a resumed run does not import the
harness file its config.yaml names without --trust-run-dir (the rollouts' thread included)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESSES = '''
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("imported")
from vf.harness import Harness


class Abstract(Harness):
    pass


class Broken(Harness):
    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        raise RuntimeError("the agent program is broken")
'''

TRAIN = [str(Path(sys.executable).parent / "vf-train")]
QUICK = ["--taskset", "reverse-text", "--eval.at-start", "false", "--eval.at-end", "false",
         "--warmup.batch-size", "4", "--orchestrator.batch-size", "4", "--orchestrator.group-size", "2"]


@pytest.fixture
def harness_file(tmp_path):
    path = tmp_path / "my_harness.py"
    path.write_text(HARNESSES)
    return path


def vf_train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAIN, *args], capture_output=True, text=True, timeout=300, check=False)


def test_an_unbuildable_harness_stops_vf_train_before_the_run(tmp_path, harness_file):
    proc = vf_train(*QUICK, "--env.agent.harness.id", f"{harness_file}:Abstract", "--warmup.steps", "0",
                    "--steps", "1", "-o", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cannot be built" in proc.stderr and "launch" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing was run: no run dir left behind


def test_a_step_whose_every_rollout_errored_stops_the_run_and_keeps_it(tmp_path, harness_file):
    run = tmp_path / "run"
    proc = vf_train(*QUICK, "--env.agent.harness.id", f"{harness_file}:Broken", "--warmup.steps", "1", "--ckpt.every", "1",
                    "--steps", "2", "-o", str(run))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "step 1: every rollout errored (4), nothing to train on" in proc.stderr
    assert "RuntimeError: the agent program is broken" in proc.stderr and "--resume" in proc.stderr
    assert "Traceback" not in proc.stderr
    episodes = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and not any(e["ok"] for e in episodes)  # the step's traces hold each error
    assert all(e["traces"][0]["errors"][0]["message"] == "the agent program is broken" for e in episodes)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["errored_rollouts"] == 4
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1"]  # the warm-up's, kept

    # the run dir's config.yaml names host code: --resume imports it only on the user's word
    (tmp_path / "IMPORTED").unlink()
    refused = vf_train("--resume", str(run), "--steps", "2")
    assert refused.returncode == 2 and "--trust-run-dir" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "IMPORTED").exists()
