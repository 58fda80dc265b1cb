"""vf-eval and vf-rollout end to end: real subprocesses against the stub server on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import BIN, json_out

from vf.trace import read_episodes


def eval_args(stub, out, *extra, model="reverse"):
    return ("vf-eval", "reverse-text", "-m", model, "--base-url", stub.url, "-o", str(out), *extra)


def test_eval_resume_and_score_agree(tmp_path, stub, cli):
    out = tmp_path / "run"
    proc = cli(*eval_args(stub, out, "-n", "20", "-r", "3", "--json"), check=True)
    summary = json_out(proc)
    assert summary["num_episodes"] == 60 and summary["num_errors"] == 0
    assert summary["mean_reward"] == 1.0 and summary["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert summary["rewards"] == {"lcs": 1.0} and summary["metrics"] == {"exact": 1.0}
    assert json.loads((out / "summary.json").read_text())["mean_reward"] == 1.0
    assert (out / "config.yaml").exists()
    episodes = read_episodes(out / "traces.jsonl")
    assert len({(e.task.hash, e.rollout) for e in episodes}) == 60
    resumed = json_out(cli("vf-eval", "--resume", str(out), "--json", check=True))
    assert resumed["num_owed"] == 0 and resumed["num_episodes"] == 60
    scored = json_out(cli("vf-eval", "--score", str(out), "--json", check=True))
    assert scored["mean_reward"] == summary["mean_reward"] and scored["num_episodes"] == 60
    piped = json_out(cli("vf-eval", "reverse-text", "--score", "-", "--json",
                         input=(out / "traces.jsonl").read_text(), check=True))
    assert piped["mean_reward"] == 1.0


def test_kill_9_then_resume_loses_nothing(tmp_path, stub):
    out = tmp_path / "run"
    cmd = [str(BIN / "vf-eval"), "reverse-text", "-m", "slow-0.25", "--base-url", stub.url, "-n", "8", "-r", "2",
           "-c", "2", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "NO_COLOR": "1"})
    traces = out / "traces.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not traces.exists() or traces.read_text().count("\n") < 4):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = read_episodes(traces)
    assert 4 <= len(before) < 16
    with open(traces, "a") as f:  # a torn last line, as a crash mid-write leaves it
        f.write(before[0].to_json()[:100])
    resumed = subprocess.run([str(BIN / "vf-eval"), "--resume", str(out), "--json"], capture_output=True,
                             text=True, env={**os.environ, "NO_COLOR": "1"})
    assert resumed.returncode == 0, resumed.stderr
    after = read_episodes(traces)  # strict: the torn line is gone
    assert len(after) == 16
    assert len({(e.task.hash, e.rollout) for e in after}) == 16
    assert {e.id for e in before} <= {e.id for e in after}
    assert json.loads(resumed.stdout)["num_resumed"] == len(before)


def test_growing_n_on_resume_keeps_old_tasks(tmp_path, stub, cli):
    out = tmp_path / "run"
    cli(*eval_args(stub, out, "-n", "3", "-r", "2"), check=True)
    first = {e.id for e in read_episodes(out / "traces.jsonl")}
    summary = json_out(cli("vf-eval", "--resume", str(out), "-n", "5", "--json", check=True))
    assert summary["num_episodes"] == 10 and summary["num_owed"] == 4 and summary["num_resumed"] == 6
    assert first <= {e.id for e in read_episodes(out / "traces.jsonl")}


def test_resume_refuses_changes_to_meaning(tmp_path, stub, cli):
    out = tmp_path / "run"
    cli(*eval_args(stub, out, "-n", "2"), check=True)
    proc = cli("vf-eval", "--resume", str(out), "--sampling.temperature", "0.2", "-r", "4")
    assert proc.returncode == 2
    assert "num_rollouts: saved 1, now 4" in proc.stderr and "sampling.temperature" in proc.stderr
    assert "Traceback" not in proc.stderr
    shrink = cli("vf-eval", "--resume", str(out), "-n", "1")
    assert shrink.returncode == 2 and "select.limit" in shrink.stderr


BOOM = textwrap.dedent('''
    import vf

    class D(vf.TaskData):
        answer: str

    class T(vf.Task[D, vf.State, vf.TaskConfig]):
        @vf.stop
        def one(self, trace):
            return trace.num_turns >= 1

        @vf.reward
        def ok(self, task, trace):
            if task.idx % 2:
                raise ValueError(f"bad task {task.idx}")
            return 1.0

    class Boom(vf.Taskset[T, vf.TasksetConfig]):
        def load(self):
            for i in range(6):
                yield D(prompt=f"p{i}", answer="x")
''')


def test_raising_reward_and_provider_errors_are_recorded(tmp_path, stub, cli):
    env_file = tmp_path / "boom.py"
    env_file.write_text(BOOM)
    out = tmp_path / "boom"
    summary = json_out(cli("vf-eval", str(env_file), "-m", "echo", "--base-url", stub.url, "-o", str(out), "--json",
                           "--max-errors", "3", check=True))
    assert summary["num_episodes"] == 6 and summary["num_errors"] == 3 and summary["mean_reward"] == 1.0
    bad = [e for e in read_episodes(out / "traces.jsonl") if not e.ok]
    assert sorted(e.traces[0].errors[0].message for e in bad) == [f"reward 'ok': bad task {i}" for i in (1, 3, 5)]
    # all episodes fail at the provider: errors recorded, exit 1
    out2 = tmp_path / "p500"
    proc = cli(*eval_args(stub, out2, "-n", "2", "--engine.max-retries", "0", "--json", model="fail500"))
    assert proc.returncode == 1
    s = json_out(proc)
    assert s["num_errors"] == 2
    err = read_episodes(out2 / "traces.jsonl")[0].traces[0]
    assert err.stop_condition == "provider_error" and err.errors[0].status_code == 500
    assert err.calls[0].error.type == "ProviderError"
    # a hanging provider times out per call; the episode records it
    out3 = tmp_path / "hang"
    proc = cli(*eval_args(stub, out3, "-n", "1", "--engine.timeout", "0.3", "--engine.max-retries", "0",
                          model="hang"))
    assert proc.returncode == 1
    assert read_episodes(out3 / "traces.jsonl")[0].traces[0].errors[0].type == "Timeout"


def test_usage_errors_exit_2_without_traceback(tmp_path, stub, cli):
    cases = [
        (("vf-eval", "reverse-text", "--bogus-flag", "1", "--base-url", stub.url), "No such option"),
        (("vf-eval", "reverse-text", "--bogus.flag", "1", "--base-url", stub.url), "unknown key 'bogus'"),
        (("vf-eval", "no-such-taskset", "--base-url", stub.url), "unknown taskset"),
        (("vf-eval", "reverse-text", "--taskset.nope", "1", "--base-url", stub.url), "unknown key 'taskset.nope'"),
        (("vf-eval", "reverse-text", "-n", "-3", "--base-url", stub.url), "select.limit"),
        (("vf-eval",), "missing TASKSET"),
        (("vf-eval", "--resume", str(tmp_path / "nothing")), "not a run dir"),
    ]
    for args, needle in cases:
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    out = tmp_path / "full"
    cli(*eval_args(stub, out, "-n", "1"), check=True)
    again = cli(*eval_args(stub, out, "-n", "1"))
    assert again.returncode == 2 and "--resume" in again.stderr


def test_min_reward_gate_exits_3(tmp_path, stub, cli):
    proc = cli(*eval_args(stub, tmp_path / "g", "-n", "2", "--min-reward", "0.5", "--json", model="echo"))
    assert proc.returncode == 3 and json_out(proc)["mean_reward"] < 0.5


def test_rollout_streams_jsonl_with_tokens(stub, cli):
    proc = cli("vf-rollout", "reverse-text", "-m", "reverse", "--base-url", stub.url, "-n", "3", "-r", "2", "-o", "-",
               check=True)
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert len(lines) == 6 and len({(x["task"]["hash"], x["rollout"]) for x in lines}) == 6
    for ep in lines:
        node = ep["traces"][0]["nodes"][-1]
        assert node["sampled"] and len(node["token_ids"]) == len(node["logprobs"]) == len(node["mask"]) > 0
        assert ep["run"]["type"] == "eval" and ep["run"]["command"] == "rollout"  # verifiers has no "rollout" run


def test_rollout_refuses_engine_without_tokens(tmp_path, stub, cli):
    proc = cli("vf-rollout", "reverse-text", "-m", "notokens", "--base-url", stub.url, "-n", "2", "-o",
               str(tmp_path / "r"))
    assert proc.returncode == 2 and "token ids" in proc.stderr


def test_help_does_not_import_torch():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom vf.commands.eval import app\n"
            "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "assert '--min-reward' in r.output\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_full_disk_stops_cleanly_and_resume_completes(tmp_path, stub):
    """A file-size limit stands in for a full disk: writes fail with EFBIG mid-run."""
    import resource

    out = tmp_path / "run"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (12_000, 12_000))

    cmd = [str(BIN / "vf-eval"), "reverse-text", "-m", "reverse", "--base-url", stub.url, "-n", "10", "-r", "2",
           "-c", "1", "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 1, proc.stderr
    assert "could not write" in proc.stderr and f"--resume {out}" in proc.stderr and "Traceback" not in proc.stderr
    saved = read_episodes(out / "traces.jsonl")  # strict: no torn line was left behind
    assert 0 < len(saved) < 20
    resumed = subprocess.run([str(BIN / "vf-eval"), "--resume", str(out), "--json"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    after = read_episodes(out / "traces.jsonl")
    assert len(after) == 20 and {e.id for e in saved} <= {e.id for e in after}


def test_attempt_logs_name_failed_episodes(tmp_path, stub, cli):
    out = tmp_path / "run"
    cli(*eval_args(stub, out, "-n", "2", "--engine.max-retries", "0", model="fail500"))
    cli("vf-eval", "--resume", str(out), "--engine.base-url", stub.url)
    logs = sorted((out / "logs").glob("attempt_*.log"))
    assert [p.name for p in logs] == ["attempt_1.log", "attempt_2.log"]
    first = logs[0].read_text().splitlines()
    assert first[0].endswith("eval: 2 owed, 0 kept")
    assert sum("ProviderError: HTTP 500" in line for line in first) == 2
