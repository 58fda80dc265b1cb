"""The v1 taskset API: hooks, argument injection, scoring, tools, Env control flow, loading by id."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

import vf
from vf.engines.base import GenerateRequest, GenerateResult, Sampling
from vf.episode.scoring import score
from vf.episode.tools import ToolRunner
from vf.errors import ConfigError, TasksetNotFound
from vf.loading import load_taskset
from vf.runner import EpisodeSpec, run_episode
from vf.toolset import ToolError, tool_schema
from vf.trace import Trace


class ScriptedEngine:
    """A model stand-in that replies with a fixed list of messages, in order."""

    name = "scripted"
    supports_tokens = False

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        reply = self.replies.pop(0)
        message = reply if isinstance(reply, dict) else {"role": "assistant", "content": reply}
        return GenerateResult(message=message, finish_reason="tool_calls" if message.get("tool_calls") else "stop")

    async def close(self):
        pass


class QAData(vf.TaskData):
    answer: str


class QATask(vf.Task[QAData, vf.State, vf.TaskConfig]):
    @vf.stop
    def one_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=0.75)
    def correct(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.25)
    async def short(self, trace) -> float:  # async hook, names only what it needs
        await asyncio.sleep(0)
        return 1.0 if len(trace.last_reply) <= 3 else 0.0

    @vf.metric
    def parts(self, trace):
        return {"len": len(trace.last_reply), "turns": trace.num_turns}


class QATaskset(vf.Taskset[QATask, vf.TasksetConfig]):
    def load(self):
        yield QAData(prompt="2+2?", answer="4")
        yield QAData(prompt="3+3?", answer="6", system_prompt="Be brief.")


def run(task, replies, **kw):
    spec = EpisodeSpec(engine=ScriptedEngine(replies), model="m", **kw)
    return asyncio.run(run_episode(task, spec))


def test_generic_parameters_resolve():
    assert QATaskset.task_class() is QATask
    assert QATask.data_class() is QAData
    assert QATaskset.config_class() is vf.TasksetConfig


def test_tasks_get_idx_and_opening_messages():
    tasks = list(QATaskset().tasks())
    assert [t.data.idx for t in tasks] == [0, 1]
    assert tasks[1].messages() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+3?"}]


def test_reward_is_weighted_sum_and_hooks_get_what_they_name():
    task = next(iter(QATaskset().tasks()))
    ep = run(task, ["4"])
    t = ep.traces[0]
    assert t.rewards["correct"].score == 1.0 and t.rewards["correct"].weight == 0.75
    assert t.rewards["short"].score == 1.0
    assert t.reward == pytest.approx(1.0)
    assert t.metrics == {"len": 1.0, "turns": 1.0}
    assert t.stop_condition == "one_turn"
    wrong = run(task, ["four!"]).traces[0]
    assert wrong.reward == pytest.approx(0.0)
    partial = run(task, ["5"]).traces[0]
    assert partial.reward == pytest.approx(0.25)


def test_raising_reward_records_error_and_keeps_others():
    class Boom(QATask):
        @vf.reward(weight=1.0)
        def broken(self, trace):
            raise RuntimeError("kaboom")

    task = Boom(QAData(prompt="x", answer="4"))
    trace = Trace()
    trace.nodes.append(vf.MessageNode(message={"role": "assistant", "content": "4"}, sampled=True))
    asyncio.run(score(task, trace, vf.State()))
    assert trace.rewards["broken"] is None
    assert trace.rewards["correct"].score == 1.0
    assert trace.ok is False and "kaboom" in trace.errors[0].message and trace.errors[0].type == "RuntimeError"


def test_trace_views():
    task = next(iter(QATaskset().tasks()))
    t = run(task, ["4"]).traces[0]
    assert t.messages == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert t.assistant_messages == [{"role": "assistant", "content": "4"}]
    assert t.last_reply == "4" and t.num_turns == 1


class Calc(vf.Toolset):
    TOOL_PREFIX = None
    @vf.tool
    def add(self, a: int, b: int, state=None) -> int:
        """Add two integers.

        More text that is not the description."""
        self.state.calls = getattr(self.state, "calls", 0) + 1
        return a + b


class ToolTask(vf.Task[QAData, vf.State, vf.TaskConfig]):
    toolsets = [Calc]

    @vf.reward
    def correct(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.metric
    def calls(self, state) -> float:
        return state.calls


def test_tool_schema_from_signature():
    schema = tool_schema(Calc.add, "add")
    assert schema["function"]["description"] == "Add two integers."
    assert schema["function"]["parameters"] == {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}


def test_tool_calls_run_in_process_and_model_mistakes_are_reported():
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 5}'}}
    bad = {"id": "c2", "type": "function", "function": {"name": "mul", "arguments": "{}"}}
    task = ToolTask(QAData(prompt="2+5?", answer="7"))
    replies = [{"role": "assistant", "content": None, "tool_calls": [call, bad]}, "7"]
    engine = ScriptedEngine(replies)
    ep = asyncio.run(run_episode(task, EpisodeSpec(engine=engine, model="m")))
    t = ep.traces[0]
    tool_msgs = [m for m in t.messages if m["role"] == "tool"]
    assert tool_msgs[0]["content"] == "7" and tool_msgs[0]["tool_call_id"] == "c1"
    assert tool_msgs[1]["content"].startswith("error: unknown tool 'mul'")
    assert engine.requests[0].tools[0]["function"]["name"] == "add"
    assert t.rewards["correct"].score == 1.0 and t.metrics["calls"] == 1.0
    assert t.num_turns == 2


def test_tool_runner_rejects_bad_arguments():
    runner = ToolRunner([Calc(vf.State())])
    with pytest.raises(ToolError, match="unexpected arguments"):
        asyncio.run(runner.call("add", {"a": 1, "b": 2, "c": 3}, {}))
    with pytest.raises(ToolError, match="not valid JSON"):
        asyncio.run(runner.call("add", "{a:", {}))


class CountEnv(vf.Env):
    """Scripted user: says 'again' until the model has answered three times."""

    async def respond(self, task, trace, state):
        return None if trace.num_turns >= 3 else f"again ({trace.num_turns})"


class ChatTask(vf.Task[QAData, vf.State, vf.TaskConfig]):
    @vf.reward
    def turns(self, trace) -> float:
        return trace.num_turns / 3


def test_env_drives_multi_turn_conversation():
    task = ChatTask(QAData(prompt="hi", answer=""))
    engine = ScriptedEngine(["a", "b", "c", "never"])
    ep = asyncio.run(run_episode(task, EpisodeSpec(engine=engine, model="m", env=CountEnv())))
    t = ep.traces[0]
    assert [m["content"] for m in t.messages] == ["hi", "a", "again (1)", "b", "again (2)", "c"]
    assert t.reward == 1.0 and t.stop_condition == "env_done"
    assert len(engine.replies) == 1  # exactly three model calls


def test_max_turns_caps_the_env():
    task = ChatTask(QAData(prompt="hi", answer=""))
    ep = asyncio.run(run_episode(task, EpisodeSpec(engine=ScriptedEngine(list("abcdef")), model="m",
                                                   env=CountEnv(), max_turns=2)))
    assert ep.traces[0].num_turns == 2 and ep.traces[0].stop_condition == "max_turns"


MODULE = textwrap.dedent('''
    import vf

    class D(vf.TaskData):
        answer: str

    class C(vf.TasksetConfig):
        size: int = 3

    class T(vf.Task[D, vf.State, vf.TaskConfig]):
        @vf.reward
        def ok(self, task, trace):
            return float(trace.last_reply == task.answer)

    class MyTaskset(vf.Taskset[T, C]):
        def load(self):
            for i in range(self.config.size):
                yield D(prompt=str(i), answer=str(i))
''')


def test_load_by_path_file_and_package(tmp_path):
    f = tmp_path / "my_env.py"
    f.write_text(MODULE)
    loaded = load_taskset(str(f), {"size": 5})
    assert len(list(loaded.taskset.tasks())) == 5
    pkg = tmp_path / "pkg_env"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(MODULE)
    assert len(list(load_taskset(str(pkg)).taskset.tasks())) == 3


def test_load_by_entry_point(tmp_path, monkeypatch):
    (tmp_path / "ep_env_mod.py").write_text(MODULE)
    dist = tmp_path / "ep_env-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vf.environments]\nmy-plugin = ep_env_mod:MyTaskset\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load_taskset("my-plugin", {"size": 2})
    assert type(loaded.taskset).__name__ == "MyTaskset" and len(list(loaded.taskset.tasks())) == 2
    sys.modules.pop("ep_env_mod", None)


def test_load_errors_are_usage_errors():
    with pytest.raises(TasksetNotFound) as e:
        load_taskset("no-such-taskset")
    assert e.value.exit_code == 2 and "reverse-text" in e.value.hint
    with pytest.raises(ConfigError) as e:
        load_taskset("reverse-text", {"size": "many", "bogus": 1})
    assert len(e.value.problems) == 2
    assert any("unknown key 'taskset.bogus'" in p for p in e.value.problems)


def test_system_prompt_override_file(tmp_path):
    p = tmp_path / "sys.txt"
    p.write_text("NEW SYSTEM")
    loaded = load_taskset("reverse-text", {"size": 2, "system_prompt": str(p)})
    assert all(t.data.system_prompt == "NEW SYSTEM" for t in loaded.taskset.tasks())


def test_sampling_full_distribution_flag():
    assert Sampling().is_full_distribution
    assert not Sampling(top_p=0.9).is_full_distribution
