"""Toolsets inside whole episodes (`vf-eval`'s in-process path against tests/openai_stub.py's
`calc` model, which calls `add(a, b)` once and answers `\\boxed{<tool result>}`): a toolset served
per rollout or shared by the run reaches the trace and the reward, each rollout sees only its
own state, and no tool server outlives the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # served toolsets are imported from here by their server process
from test_toolset_mcp import children
from test_v1_envs import evaluate

ENV = '''
import vf
from mcp_tools import Adder, AddState

SERVED = vf.ToolsetConfig(runtime={"type": "subprocess"})


class AddTask(vf.Task[vf.TaskData, AddState]):
    @classmethod
    def toolsets(cls, config):
        return [Adder(SERVED)] if MODE == "task" else []

    @vf.reward
    async def right(self, trace) -> float:
        # 100 per call the rollout made: a state shared across rollouts would push it past 1
        expected = self.data.idx + 3 + 100
        return float(trace.last_reply == f"\\\\boxed{{{expected}}}" and trace.state.calls == 1)

    @vf.metric
    async def server_pid(self, trace) -> float:
        return float(trace.state.server_pid)


class AddTaskset(vf.Taskset[AddTask]):
    @classmethod
    def toolsets(cls, config):
        return [Adder(vf.SharedToolsetConfig(runtime={"type": "subprocess"}))] if MODE == "shared" else []

    def load(self):
        for a in range(4):
            yield AddTask(vf.TaskData(prompt=f"What is {a} + 3?"))


__all__ = ["AddTaskset"]
'''


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["task", "shared"])
def test_served_toolsets_reach_trace_and_reward_and_stop_with_the_run(stub, tmp_path, mode):
    from vf.trace import read_episodes

    env = tmp_path / f"add_{mode}.py"
    env.write_text(f"MODE = {mode!r}\n" + ENV)
    before = children()
    summary, out = evaluate(str(env), "calc", stub.url, tmp_path,
                            extra={"num_rollouts": 2, "max_concurrent": 8})
    assert children() == before  # every tool server is gone with its rollout / the run
    episodes = read_episodes(out / "traces.jsonl")
    assert summary["num_episodes"] == 8 and summary["num_errors"] == 0
    assert summary["mean_reward"] == 1.0
    trace = episodes[0].traces[0]
    assert [t["function"]["name"] for t in trace.tools] == ["add"]
    a = episodes[0].task.data["idx"]
    assert trace.tool_messages[0].content == str(a + 3 + 100)
    pids = {e.traces[0].metrics["server_pid"] for e in episodes}
    assert 0 not in pids and float(__import__("os").getpid()) not in pids
    assert len(pids) == (8 if mode == "task" else 1)  # a server per rollout, or one for the run


KILL_ENV = '''
import vf
from mcp_tools import Adder, AddState


class ShellTask(vf.Task[vf.TaskData, AddState]):
    @classmethod
    def toolsets(cls, config):
        return [Adder(vf.ToolsetConfig(runtime={"type": "subprocess"}))]

    @vf.reward
    async def answered(self, trace) -> float:
        return float("42" in trace.last_reply)


class ShellTaskset(vf.Taskset[ShellTask]):
    def load(self):
        for _ in range(4):
            yield ShellTask(vf.TaskData(prompt="print 42"))


__all__ = ["ShellTaskset"]
'''


def marked(mark: str) -> list[int]:
    """Live processes whose environment carries `mark` (everything vf-eval started inherits it)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            if mark.encode() in Path(f"/proc/{d}/environ").read_bytes() and \
                    Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
def test_kill_9_leaves_no_tool_or_runtime_process_and_resume_completes(stub, tmp_path):
    """Each rollout has a served toolset and a bash command that leaves a background process in
    the runtime; `kill -9` of vf-eval mid-run must take all of them down, and --resume finishes."""
    from conftest import BIN

    from vf.trace import read_episodes

    (tmp_path / "shell_env.py").write_text(KILL_ENV)
    mark = f"VF_TEST_MARK_{uuid.uuid4().hex}"
    env = {**os.environ, "NO_COLOR": "1", "FAKE_KEY": "sk-test", mark: "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "run"
    cmd = [str(BIN / "vf-eval"), str(tmp_path / "shell_env.py"), "-m", "bash:sleep 60 >/dev/null 2>&1 & sleep 1; echo 42",
           "--base-url", stub.url, "--api-key-var", "FAKE_KEY", "-n", "4", "-r", "2", "-c", "2", "-o", str(out),
           "--env.agent.harness.id", "bash", "--env.agent.runtime.type", "subprocess"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    traces = out / "traces.jsonl"

    def in_flight() -> list[bytes]:
        """Command lines of the tool servers and background sleeps vf-eval has running."""
        return [c for c in (_cmdline(p) for p in marked(mark)) if b"vf.mcp.server" in c or c.startswith(b"sleep\x0060")]

    deadline = time.time() + 60
    while time.time() < deadline:
        done = traces.read_text().count("\n") if traces.exists() else 0
        running = in_flight()
        if done >= 1 and any(c.startswith(b"sleep") for c in running) and any(b"mcp" in c for c in running):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert any(c.startswith(b"sleep") for c in running) and any(b"mcp" in c for c in running), running
    for _ in range(100):
        left = marked(mark)
        if not left:
            break
        time.sleep(0.1)
    assert not left, [_cmdline(p) for p in left]
    assert 1 <= len(read_episodes(traces)) < 8
    resumed = subprocess.run([str(BIN / "vf-eval"), "--resume", str(out), "--trust-run-dir", "--json"], capture_output=True,
                             text=True, env=env, timeout=120, check=False)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    episodes = read_episodes(traces)
    # on a failure, say which episode erred and how (a flake under load must be diagnosable)
    errors = [[e.model_dump() for e in [*ep.errors, *(x for t in ep.traces for x in t.errors)]]
              for ep in episodes if ep.errors or not all(t.ok for t in ep.traces)]
    assert summary["num_episodes"] == 8 and summary["num_errors"] == 0 and summary["mean_reward"] == 1.0, \
        (summary, errors, resumed.stderr[-2000:])
    assert len({(e.task.hash, e.rollout) for e in episodes}) == len(episodes) == 8
    for _ in range(100):  # and a run that ends normally leaves nothing either (the reaper exits last)
        left = marked(mark)
        if not left:
            break
        time.sleep(0.1)
    assert not left, [_cmdline(p) for p in left]
