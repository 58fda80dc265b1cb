"""Reliability of program harnesses in the default (`sandbox`) runtime (issue 23): an agent
program that forks daemons, fills its disk, floods or garbles its model endpoint, leaks its key,
or whose `vf-eval` is killed with -9, costs its own episode at most, never the run or the host.

The program is tests/program_envs/hostile_agent.py's `HostileAgent` (a stdlib-only agent with a
`bash` tool that misbehaves by its task's `mode`), answered through the run's interception
server by the scripted stub (tests/openai_stub.py: `bash:CMD`, `slow-S`). Processes are found
by a marker unique to each test in their argv (/proc/PID/cmdline). A call without the rollout's
key gets 401 without reaching its handler: tests/test_interception.py
(test_missing_or_wrong_key_is_401_and_handler_never_runs); here an agent's own keyless and
wrong-key calls do too (the malformed test).

Failed on the main this branched from: the disk test (a HarnessError "exited -9" with no word of
the disk, or no error at all when the program exited before the check saw the disk full), the
flood test (16 concurrent calls all answered: 16 turns of a seat capped at 8, each reply chained
to the one before and the earlier replies' tokens overwritten by the next prompt's) and the
secret test (the key in a tool result the policy saw and the trace kept, and in an error message).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import BIN
from test_program_harness import secrets  # noqa: F401 - the fixture: every per-rollout secret handed out

from vf.configs.harness import HarnessConfig
from vf.errors import SandboxError
from vf.runtime.base import RuntimeLimitError
from vf.trace import Episode

HERE = Path(__file__).parent
ENV = HERE / "program_envs" / "hostile_agent.py"
AGENT = f"{ENV}:HostileAgent"
NUL = b"\0"

needs_bwrap = pytest.importorskip("test_runtime_sandbox").needs_bwrap


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")


@pytest.fixture
def marker():
    return f"vf-rel-{uuid.uuid4().hex[:10]}"


def config(model: str, modes: list[str], url: str, marker: str, concurrency: int, **extra) -> dict:
    from vf.config import deep_merge

    over = {"taskset": {"id": str(ENV), "modes": modes}, "model": model, "max_concurrent": concurrency,
            "engine": {"base_url": url, "api_key_var": "FAKE_KEY", "max_retries": 0},
            "env": {"agent": {"harness": {"id": AGENT, "marker": marker}}}}
    return deep_merge(over, extra)


def evaluate(out: Path, over: dict) -> tuple[dict, list[Episode]]:
    """An in-process `vf-eval` run into `out`; its episodes in task order."""
    from vf.evaluate import execute, open_run, resolve_config

    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(out), None)
    summary = execute(config, run, kept)
    return summary, episodes(out)


def episodes(out: Path) -> list[Episode]:
    found = [Episode.model_validate_json(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    return sorted(found, key=lambda e: e.traces[0].task.data["prompt"])


def survivors(marker: str, but: tuple[int, ...] = ()) -> list[str]:
    """'PID argv' of every live process whose command line carries `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if marker.encode() in argv and not zombie and int(pid) not in but and int(pid) != os.getpid():
            found.append(f"{pid} {argv.replace(NUL, b' ').decode(errors='replace')[-200:]}")
    return found


def kill_all(marker: str) -> None:
    """Kill, by pid, what a test's unsandboxed run left behind."""
    for line in survivors(marker):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except OSError:
            pass


def tool_output(trace) -> str:
    return next(n.message["content"] for n in trace.nodes if n.message["role"] == "tool")


def user_text(trace) -> str:
    return next(n.message["content"] for n in trace.nodes if n.message["role"] == "user")


# ---- 1. fork: detached daemons ----------------------------------------------------------------

@pytest.mark.parametrize("runtime", [pytest.param("sandbox", marks=needs_bwrap), "subprocess"])
def test_detached_daemons_do_not_outlive_their_episode(stub, tmp_path, marker, runtime):
    # the agent program double-forks a setsid `sleep` itself; its bash tool (the model's command)
    # detaches another one, as `sh -c 'setsid sleep 300 &'` does
    command = f"(setsid sh -c 'sleep 300; : {marker}' >/dev/null 2>&1 &); echo started"
    over = config(f"bash:{command}", ["fork", "fork", "normal"], stub.url, marker, 2,
                  env={"agent": {"runtime": {"type": runtime}}})
    try:
        summary, found = evaluate(tmp_path / "run", over)
        left = survivors(marker)
    finally:
        kill_all(marker)
    # the run went on: every episode ran its tool call and finished, none errored
    assert summary["num_errors"] == 0 and len(found) == 3
    assert [tool_output(e.traces[0]).strip() for e in found] == ["started"] * 3
    assert all(e.traces[0].ok and len(e.traces[0].calls) == 2 for e in found)
    if runtime == "subprocess":  # no isolation: the check sees both daemons of both fork episodes
        assert len(left) == 5, left  # and the tool's daemon of the normal one
    else:  # the sandbox's PID namespace took them all down before its episode ended
        assert left == [], f"processes outlived their episode: {left}"


# ---- 2. disk: past the runtime's disk_mb --------------------------------------------------------

@needs_bwrap
def test_filling_the_disk_ends_that_episode_with_a_sandbox_error_and_no_other(stub, tmp_path, marker, monkeypatch):
    host_tmp = Path(tempfile.mkdtemp(prefix="vf-rel-"))  # the runtimes' work dirs go here
    os.chmod(host_tmp, 0o711)  # nobody (who runs sandboxed commands under a root vf) must reach them
    monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
    try:
        over = config("bash:echo hi > out.txt", ["disk", "normal"], stub.url, marker, 1,
                      env={"agent": {"runtime": {"disk_mb": 2}}})
        summary, (filled, normal) = evaluate(tmp_path / "run", over)
        left = [p.name for p in host_tmp.iterdir() if not p.name.startswith("vf-bwrap-")]
    finally:
        shutil.rmtree(host_tmp, ignore_errors=True)
    trace = filled.traces[0]
    # 6 MB written past 2: the program was stopped, the error recorded as the sandbox's (a
    # RuntimeLimitError is verifiers' SandboxError; vf stops it as `limit`, as the bash harness does)
    assert not trace.ok and [e.type for e in trace.errors] == ["RuntimeLimitError"], trace.errors
    assert "disk limit" in trace.errors[0].message and issubclass(RuntimeLimitError, SandboxError)
    assert trace.stop_condition == "limit" and not trace.rewards  # errored: not scored
    # the next episode ran as if nothing happened (a fresh runtime, scored)
    trace = normal.traces[0]
    assert trace.ok and trace.rewards["wrote_hi"].score == 1.0, (trace.errors, trace.stop_condition)
    assert summary["num_errors"] == 1 and summary["num_episodes"] == 2, summary
    # nothing outside the work dir changed: beside it (the work dir's parent) nothing is left,
    # the files the agent wrote there and into /tmp went to its private /tmp, the run dir holds no fill
    assert left == [], left
    assert not Path(f"/tmp/escaped-{marker}").exists()
    assert sum(p.stat().st_size for p in (tmp_path / "run").rglob("*") if p.is_file()) < 1_000_000


def test_a_program_that_filled_its_runtime_and_exited_0_is_still_a_sandbox_error():
    # the disk check after the command ended is the one that saw it (a fast writer): exit 0
    from vf.program import Harness
    from vf.runtime.base import CommandResult
    from vf.trace import Trace

    class Program(Harness):
        async def launch(self, *args):
            raise NotImplementedError

    program, trace = Program(HarnessConfig(id="p")), Trace()
    for limit in ("disk", "total_memory"):
        with pytest.raises(RuntimeLimitError) as e:
            asyncio.run(program.check_result(trace, None, CommandResult(0, "done", "", limit=limit)))
        assert e.value.stop_condition == "limit" and isinstance(e.value, SandboxError)
    asyncio.run(program.check_result(trace, None, CommandResult(0, "done", "")))  # a clean exit is no error


# ---- 3. flood and malformed calls to the interception server ---------------------------------

@needs_bwrap
def test_a_flood_of_calls_is_answered_429_and_costs_no_other_episode(stub, tmp_path, marker):
    # 24 identical calls at once, the policy taking 0.5 s a call: the server refuses those past
    # 16 in flight (429), the rest queue and are answered one at a time, each a turn, until the
    # seat's 8 turns are spent (400: the rollout has ended); the agent gives up on a 429 (exit 97)
    summary, (flood, normal) = evaluate(tmp_path / "run", config("slow-0.5", ["flood", "normal"], stub.url, marker, 2))
    trace = flood.traces[0]
    # main answered all 16 at once: 16 turns of a seat capped at 8, and no stop recorded
    assert len(trace.calls) == 8 and trace.num_turns == 8
    answered, busy, ended = (trace.metrics[f"answered_{code}"] for code in (200, 429, 400))
    assert answered == 8 and answered + busy + ended == 24 and busy >= 1  # 8 busy unless threads start slowly
    assert trace.stop_condition == "max_turns" and not trace.errors  # its exit after the cap is expected
    # each reply follows its own prompt (main: each the one before, whose tokens the next call's
    # prompt tokens overwrote) and keeps its trained-on tokens
    for call in trace.calls:
        reply = trace.nodes[call.node]
        assert trace.nodes[reply.parent].message["content"] == "Task 0: write hi into out.txt."
        assert reply.sampled and reply.token_ids and reply.mask == [1] * len(reply.token_ids)
    trace = normal.traces[0]  # ran beside it, untouched
    assert trace.ok and len(trace.calls) == 1 and "ksaT" in trace.nodes[-1].message["content"]
    assert summary["num_errors"] == 0


@needs_bwrap
def test_malformed_calls_are_refused_and_the_agent_that_recovers_finishes(stub, tmp_path, marker):
    summary, (bad, normal) = evaluate(tmp_path / "run",
                                      config("bash:echo hi > out.txt", ["malformed", "normal"], stub.url, marker, 2))
    trace = bad.traces[0]
    statuses = json.loads(re.search(r"statuses: (\[.*?\])", user_text(trace)).group(1))
    # bad JSON, a JSON array, messages a string, no messages, an unknown role: 400; no key and
    # a wrong key: 401; GET: 405; an unknown path: 404
    assert statuses == [400, 400, 400, 400, 400, 401, 401, 405, 404]
    assert trace.ok and trace.rewards["wrote_hi"].score == 1.0
    assert len(trace.calls) == 2  # none of the refused calls reached the policy or the trace
    assert normal.traces[0].ok and normal.traces[0].rewards["wrote_hi"].score == 1.0
    assert summary["num_errors"] == 0


# ---- 4. kill -9 of vf-eval mid-episode, then --resume ---------------------------------------

@needs_bwrap
def test_kill_9_mid_episode_leaves_no_agent_and_resume_runs_each_task_once(stub, tmp_path, marker):
    out, host_tmp = tmp_path / "run", Path(tempfile.mkdtemp(prefix="vf-rel-"))
    os.chmod(host_tmp, 0o711)
    conf = tmp_path / "eval.yaml"  # the marker in the config, not in vf-eval's own argv
    conf.write_text(yaml.safe_dump(config("slow-0.5", ["fork"] * 6, stub.url, marker, 2)))
    env = {**os.environ, "NO_COLOR": "1", "TMPDIR": str(host_tmp)}
    traces = out / "traces.jsonl"
    proc = subprocess.Popen([str(BIN / "vf-eval"), "--config", str(conf), "-n", "6", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:  # killed while episodes run
            if traces.exists() and len(traces.read_bytes().splitlines()) >= 2 and survivors(marker):
                break
            time.sleep(0.05)
        running = survivors(marker)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert running, "no episode was running at the kill"
        done = len(traces.read_bytes().splitlines())
        assert 2 <= done < 6
        # vf's reaper kills every agent, its sandbox and its daemon, and removes their work dirs
        for _ in range(100):
            left = survivors(marker)
            work = [p.name for p in host_tmp.iterdir() if p.name.startswith("vf-sandbox-")]
            if not left and not work:
                break
            time.sleep(0.05)
        assert left == [] and work == [], (left, work)
        proc = subprocess.run([str(BIN / "vf-eval"), "--resume", str(out), "--trust-run-dir", "--json"], capture_output=True,
                              text=True, env=env, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert survivors(marker) == []
    finally:
        if proc.returncode is None:
            proc.kill()
        kill_all(marker)
        shutil.rmtree(host_tmp, ignore_errors=True)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["num_resumed"] == done and summary["num_errors"] == 0
    found = episodes(out)
    prompts = [e.traces[0].task.data["prompt"] for e in found]
    assert prompts == [f"Task {i}: write hi into out.txt." for i in range(6)]  # each once: none lost, none twice
    assert all(e.ok and len(e.traces[0].calls) == 1 for e in found)


# ---- 5. the per-rollout secret stays out of the record ---------------------------------------

@needs_bwrap
def test_the_rollout_secret_is_never_recorded_nor_shown_to_the_policy(stub, tmp_path, marker, secrets, capfd):  # noqa: F811
    # one agent's bash tool prints its key (the model ran `env`), the other logs it on stderr and fails
    before = len(stub.requests)
    summary, (shown, leaked) = evaluate(tmp_path / "run", config("bash:echo key=$OPENAI_API_KEY", ["normal", "leak"],
                                                                 stub.url, marker, 2))
    captured = capfd.readouterr()
    assert len(set(secrets)) == 2
    assert tool_output(shown.traces[0]).strip() == "key=***"  # blanked before the policy and the trace
    assert [e.type for e in leaked.traces[0].errors] == ["HarnessError"]
    assert "Authorization: Bearer ***" in leaked.traces[0].errors[0].message
    everything = [captured.out, captured.err, json.dumps(stub.requests[before:])]
    everything += [p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file()]
    for secret in secrets:
        assert not any(secret in text for text in everything)
    assert summary["num_errors"] == 1
