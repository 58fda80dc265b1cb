"""Toolsets inside whole episodes (`vf-eval`'s in-process path against tests/openai_stub.py's
`calc` model, which calls `add(a, b)` once and answers `\\boxed{<tool result>}`): a toolset served
per rollout or shared by the run reaches the trace and the reward, each rollout sees only its
own state, and no tool server outlives the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # served toolsets are imported from here by their server process
from test_toolset_mcp import children  # noqa: E402
from test_v1_envs import evaluate  # noqa: E402

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
