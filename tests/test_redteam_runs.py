"""Red team, data loss (issue 22): nothing a run wrote is lost by a resume, a kill -9 or a failed
command. Real `vf-train` / `vf-eval` / `vf-rollout` subprocesses; each test failed on the main
this branched from (resume deleted what it did not keep, no checkpoint unless asked, failed commands
left run dirs and rewrote config.yaml)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TRAIN_ENV as ENV
from conftest import json_out, run_train

PY = sys.executable
# tests/test_trainer_cli.py's small run, on a taskset of 2 tasks: the same task and rollout index
# recur at every step, as they do every few steps of a real run
SMALL = ["--warmup.steps", "2", "--warmup.batch-size", "8", "--batch-size", "8", "--group-size", "4",
         "--eval.at-start", "false", "--eval.at-end", "false", "--seed", "7", "--trainer.threads", "1",
         "--taskset", "reverse-text", "--taskset.size", "2", "--taskset.max-words", "1"]


train = run_train


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True) if path.exists() else []


def step_of(line: bytes) -> int:
    return json.loads(line)["run"]["step"] if b'"traces"' in line else json.loads(line)["step"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """6 steps (2 warm-up, 4 RL), checkpoints at 3 and 6 (the end)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    proc = train("-o", str(run), *SMALL, "--steps", "4", "--ckpt-every", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_3", "step_6"]
    return run


def copy(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def test_training_resume_keeps_every_trained_on_line(trained, tmp_path):
    run = copy(trained, tmp_path)
    before, metrics = lines(run / "traces.jsonl"), lines(run / "metrics.jsonl")
    assert len(before) == 4 * 8 and len(metrics) == 6
    # killed after step 5 trained, before checkpoint 6 landed; resumed with one more step
    # (main: the (task, rollout) de-duplication of evaluations kept 1 line of 8 per step)
    shutil.rmtree(run / "checkpoints" / "step_6")
    proc = train("--resume", str(run), "--steps", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "traces.after-step-3.jsonl" in proc.stderr and "metrics.after-step-3.jsonl" in proc.stderr
    kept, aside = lines(run / "traces.jsonl"), lines(run / "traces.after-step-3.jsonl")
    covered = [x for x in before if step_of(x) < 3]
    assert len(covered) == 8 and kept[:8] == covered  # every line the checkpoint covers, byte for byte
    assert aside == [x for x in before if step_of(x) >= 3]  # the rest, byte for byte, in file order
    assert len(covered) + len(aside) == len(before)  # no line lost
    assert sorted(step_of(x) for x in kept) == sorted(s for s in range(2, 7) for _ in range(8))
    assert lines(run / "metrics.after-step-3.jsonl") == metrics[3:]
    assert lines(run / "metrics.jsonl")[:3] == metrics[:3]
    assert [step_of(x) for x in lines(run / "metrics.jsonl")] == list(range(7))
    # a second resume from the same checkpoint appends to the set-aside file, never overwrites it
    from vf.trainer.run_state import RunFiles

    second = [x for x in kept if step_of(x) >= 3]
    RunFiles(run, 3)
    assert lines(run / "traces.after-step-3.jsonl") == aside + second
    assert lines(run / "traces.jsonl") == covered


def test_kill_9_with_the_default_config_resumes_from_the_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([PY, "-m", "vf.commands.train", "-o", str(run), *SMALL, "--steps", "14"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    metrics, deadline = run / "metrics.jsonl", time.time() + 180
    while proc.poll() is None and time.time() < deadline:
        if len(lines(metrics)) >= 12:  # step 11 trained: checkpoint step_10 is on disk
            break
        time.sleep(0.02)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert killed, "the run finished before the kill"
    traces_before, metrics_before = lines(run / "traces.jsonl"), lines(metrics)
    assert 12 <= len(metrics_before) < 16
    res = train("--resume", str(run), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step_10 (step 10)" in res.stderr and "starting from step 0" not in res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["resumed_from"] == 10
    kept, aside = lines(run / "traces.jsonl"), lines(run / "traces.after-step-10.jsonl")
    covered = [x for x in traces_before if step_of(x) < 10]
    assert kept[:len(covered)] == covered  # byte for byte
    assert aside == [x for x in traces_before if step_of(x) >= 10]
    assert len(covered) + len(aside) == len(traces_before)  # no line lost
    assert lines(run / "metrics.after-step-10.jsonl") == [x for x in metrics_before if step_of(x) >= 10]
    assert [step_of(x) for x in lines(metrics)] == list(range(16))
    assert sorted(step_of(x) for x in kept) == sorted(s for s in range(2, 16) for _ in range(8))


def test_no_checkpoint_refuses_to_restart_over_results_unless_from_scratch(trained, tmp_path):
    run = copy(trained, tmp_path)
    shutil.rmtree(run / "checkpoints")  # killed before its first checkpoint
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    proc = train("--resume", str(run))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "no checkpoint yet" in proc.stderr and "--from-scratch" in proc.stderr and "Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files  # nothing touched
    proc = train("--resume", str(run), "--from-scratch", "--steps", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "traces.after-step-0.jsonl").read_bytes() == files["traces.jsonl"]
    assert (run / "metrics.after-step-0.jsonl").read_bytes() == files["metrics.jsonl"]
    assert len(lines(run / "metrics.jsonl")) == 3 and len(lines(run / "traces.jsonl")) == 8
    config = (run / "config.yaml").read_bytes()
    again = train("--resume", str(run), "--from-scratch", "--steps", "2")  # a checkpoint exists now
    assert again.returncode == 2 and "step_3" in again.stderr and "Traceback" not in again.stderr
    assert (run / "config.yaml").read_bytes() == config


def test_eval_resume_sets_errored_episodes_aside(tmp_path, stub, cli):
    out = tmp_path / "run"
    proc = cli("vf-eval", "reverse-text", "-m", "fail500", "--base-url", stub.url, "-n", "2",
               "--engine.max-retries", "0", "-o", str(out))
    assert proc.returncode == 1
    errored = lines(out / "traces.jsonl")
    assert len(errored) == 2
    proc = cli("vf-eval", "--resume", str(out))
    assert "traces.errored.jsonl" in proc.stderr
    assert lines(out / "traces.errored.jsonl") == errored  # moved, byte for byte (main: deleted)
    assert len(lines(out / "traces.jsonl")) == 2  # redone (and failed again)


def test_score_and_resume_count_duplicates_alike(tmp_path, stub, cli):
    out = tmp_path / "run"
    cli("vf-eval", "reverse-text", "-m", "reverse", "--base-url", stub.url, "-n", "3", "-r", "2", "-o", str(out),
        check=True)
    original = lines(out / "traces.jsonl")
    with open(out / "traces.jsonl", "ab") as f:
        f.write(original[0] + original[3])  # the same (task, rollout) twice more
    scored = json_out(cli("vf-eval", "--score", str(out), "--json", check=True))
    assert scored["num_episodes"] == 6 and "2 line(s) not counted" in cli("vf-eval", "--score", str(out)).stderr
    resumed = json_out(cli("vf-eval", "--resume", str(out), "--json", check=True))
    assert resumed["num_resumed"] == scored["num_episodes"] == 6 and resumed["num_owed"] == 0
    assert lines(out / "traces.jsonl") == original
    assert lines(out / "traces.duplicate.jsonl") == [original[0], original[3]]


def test_failed_commands_leave_no_run_dir_and_keep_the_config(trained, tmp_path):
    run = copy(trained, tmp_path)
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    (tmp_path / "empty").mkdir()
    bad_model = str(tmp_path / "no-model")
    bin_dir = Path(PY).parent
    cases = [  # all at once: each is mostly start-up
        [bin_dir / "vf-eval", "no-such-taskset", "-n", "1", "-o", tmp_path / "a"],
        [bin_dir / "vf-eval", "no-such-taskset", "-n", "1", "-o", tmp_path / "empty"],
        [bin_dir / "vf-rollout", "reverse-text", "-m", bad_model, "-n", "1", "-o", tmp_path / "b" / "c"],
        [PY, "-m", "vf.commands.train", "-o", tmp_path / "t", "-m", bad_model, "--steps", "1"],
        [PY, "-m", "vf.commands.train", "--resume", run, "-m", bad_model, "--steps", "9"],
    ]
    procs = [subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=ENV) for args in cases]
    for args, proc in zip(cases, procs):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and "Traceback" not in err, (args, err[-2000:])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "t").exists()
    assert list((tmp_path / "empty").iterdir()) == []  # given empty, left empty
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files  # config.yaml too


def test_setting_aside_never_follows_a_planted_symlink(tmp_path):
    from vf.errors import UsageError
    from vf.rundir import RunDir

    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (run / "traces.jsonl").write_bytes(b"not json\n")
    (run / "traces.corrupt.jsonl").symlink_to(victim)  # main appended the corrupt line to the victim
    rd = RunDir(run)
    with pytest.raises(UsageError):
        rd.rewrite(rd.read().kept)
    assert victim.read_text() == "keep me\n" and (run / "traces.jsonl").read_bytes() == b"not json\n"
