"""verifiers 0.4.0 wire compatibility: vf's traces, typed task data, the rollout-error taxonomy.

vf writes tools (`trace.tools`) and an assistant's `tool_calls` in verifiers' flat shape and reads
both that and the OpenAI nested shape its older run dirs hold; `trace.task.data` is the taskset's
typed TaskData (a `vf.WireTaskData` when read from a file); `vf.errors` has verifiers' error
names, and a rollout ended by one stops as verifiers' condition (`TaskError` → `task_error`).

The episodes vf writes (tools, images, two seats, an intercepted agent program) are validated by
verifiers 0.4.0's own `WireEpisode` reader in a subprocess when VF_VERIFIERS_PYTHON names a python that has it; the
golden-line, typed-data and error tests run without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vf
import vf.errors
from vf.trace import parse_episode, read_episodes

VERIFIERS_PY = os.environ.get("VF_VERIFIERS_PYTHON")
needs_verifiers = pytest.mark.skipif(not VERIFIERS_PY, reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")
GOLDEN = Path(__file__).parent / "golden" / "wire_v04_flat.jsonl"

RELAY_ENV = '''
import vf

__all__ = ["RelayTaskset", "RelayEnv"]

WORDS = ["apple", "banana", "cherry"]


class RelayData(vf.TaskData):
    answer: str


class RelayTask(vf.Task[RelayData]):
    @vf.reward
    async def exact(self, task, trace) -> float:
        return float(trace.last_reply == task.answer)


class RelayTaskset(vf.Taskset[RelayTask]):
    def load(self):
        for word in WORDS:
            yield RelayTask(RelayData(prompt=word, answer=word))


class RelayConfig(vf.EnvConfig):
    first: vf.AgentConfig = vf.AgentConfig()
    second: vf.AgentConfig = vf.AgentConfig()


class RelayEnv(vf.Env[RelayConfig]):
    async def run(self, task, agents):
        first = await agents.first.run(task)
        # the second seat's task is built from the first seat's trace, by its typed row
        data = first.task.data
        nxt = WORDS[(data.idx + 1) % len(WORDS)]
        first.info["data_class"] = type(data).__name__
        first.info["answer_attr"] = data.answer
        await agents.second.run(RelayTask(RelayData(idx=data.idx, prompt=nxt, answer=nxt)))
'''

SETUP_ERRORS_ENV = '''
import vf
from vf.errors import TaskError

__all__ = ["SetupTaskset"]


class SetupData(vf.TaskData):
    kind: str


class SetupTask(vf.Task[SetupData]):
    async def setup(self, trace, runtime):
        if self.data.kind == "task":
            raise TaskError("the fixture repository is missing")
        if self.data.kind == "plain":
            raise ValueError("an untyped bug")
        await runtime.run("true")

    @vf.reward
    async def one(self, trace) -> float:
        return 1.0


class SetupTaskset(vf.Taskset[SetupTask]):
    def load(self):
        for kind in ("task", "plain", "fine"):
            yield SetupTask(SetupData(prompt=kind, kind=kind))
'''


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")


def evaluate(taskset: str, model: str, url: str, out: Path, n: int | None = None, extra: dict | None = None,
             resume: bool = False):
    from vf.config import deep_merge
    from vf.evaluate import execute, open_run, resolve_config

    over = deep_merge({"taskset": {"id": taskset}, "model": model,
                       "engine": {"base_url": url, "api_key_var": "FAKE_KEY"}, "select": {"limit": n}},
                      extra or {})
    if resume:
        config, run, kept, _ = open_run(None, {}, None, str(out))
    else:
        config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(out), None)
    return execute(config, run, kept), out


def write_env(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    sys.modules.pop(name, None)
    return str(path)


def verifiers_read(*paths: Path) -> list[dict]:
    """Every line of `paths` read by verifiers 0.4.0's WireEpisode; what it saw, per episode."""
    code = r"""
import json, sys
from verifiers.v1 import WireEpisode
for path in sys.argv[1:]:
    for line in open(path):
        ep = WireEpisode.model_validate_json(line)
        print(json.dumps({"seats": [t.agent.name for t in ep.traces], "idx": ep.task.data.idx,
            "rewards": [t.reward for t in ep.traces],
            "tools": [[tool.name for tool in t.tools] for t in ep.traces],
            "calls": [[c.name for n in t.nodes if n.message.role == "assistant" for c in n.message.tool_calls or []]
                      for t in ep.traces],
            "images": [sum(1 for n in t.nodes if n.message.role == "user" and not isinstance(n.message.content, str)
                           for p in n.message.content if p.type == "image_url") for t in ep.traces],
            "prompts": [t.task.data.prompt if isinstance(t.task.data.prompt, str) else None for t in ep.traces],
            "seat_idx": [t.task.data.idx for t in ep.traces],
            "extra": getattr(ep.task.data, "answer", None),
            "runtime": [t.agent.runtime and {"type": t.agent.runtime.type, "borrowed": t.agent.runtime.borrowed}
                        for t in ep.traces]}))
"""
    proc = subprocess.run([VERIFIERS_PY, "-c", code, *map(str, paths)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


# ---- the flat shape on disk, both shapes read (no verifiers needed) -----------------------------


def nested_shape(line: str) -> str:
    """The golden line as vf wrote it before the flat shape (OpenAI's nested function objects)."""
    ep = json.loads(line)
    for t in ep["traces"]:
        t["tools"] = [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
                      for tool in t["tools"]]
        for n in t["nodes"]:
            for i, c in enumerate(n["message"].get("tool_calls") or []):
                n["message"]["tool_calls"][i] = {"id": c["id"], "type": "function",
                                                 "function": {"name": c["name"], "arguments": c["arguments"]}}
    return json.dumps(ep, separators=(",", ":"))


def test_golden_flat_line_reads_typed_and_rewrites_identically():
    line = GOLDEN.read_text().strip()
    ep = parse_episode(line)
    assert ep.to_json() == line
    trace = ep.traces[0]
    # in memory the engines' shape: OpenAI's nested function schema and tool calls
    assert trace.tools == [{"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}]
    assert trace.nodes[1].message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    # the row typed without its taskset: framework fields and the author's, as attributes
    data = trace.task.data
    assert isinstance(data, vf.WireTaskData) and isinstance(data, vf.TaskData)
    assert (data.idx, data.id, data.prompt, data.answer, data.operation) == (3, "calc-3", "What is 2 + 3? Use the tools.", 5, "add")
    assert data["idx"] == 3 and data.get("answer") == 5 and data.get("missing", "-") == "-"
    assert trace.reward == 1.0 and ep.num_total_tokens == 11


def test_old_nested_line_still_loads_and_is_rewritten_flat():
    golden = GOLDEN.read_text().strip()
    old = nested_shape(golden)
    assert '"function":{"name":"add"' in old and old != golden
    ep = parse_episode(old)
    assert ep.traces[0].tools[0]["function"]["name"] == "add"
    assert ep.traces[0].nodes[1].message["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    assert ep.to_json() == golden  # an old run dir rewritten (--resume, --score) comes out flat
    assert ep.traces[0].task.data.answer == 5


def test_tool_shapes_convert_one_way_each_and_leave_others_alone():
    from vf.trace import flat_tool, nested_tool

    nested = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}, "strict": True}}
    flat = {"type": "function", "name": "f", "description": "d", "parameters": {}, "strict": True}
    assert flat_tool(nested) == flat and list(flat_tool(nested)) == list(flat)
    assert nested_tool(flat) == nested and nested_tool(nested) == nested and flat_tool(flat) == flat
    other = {"type": "web_search", "search_context_size": "low"}  # no function to move: kept
    assert flat_tool(other) == other and nested_tool(other) == other


def test_task_data_that_is_not_a_row_is_a_format_error():
    line = json.loads(GOLDEN.read_text())
    line["task"]["data"] = {"idx": "not a number"}
    with pytest.raises(vf.errors.UsageError, match="task.data.idx"):
        parse_episode(json.dumps(line), "traces.jsonl", 7)
    line["task"]["data"] = ["a", "list"]
    with pytest.raises(vf.errors.UsageError, match="traces.jsonl:7"):
        parse_episode(json.dumps(line), "traces.jsonl", 7)


# ---- runs that vf writes ------------------------------------------------------------------------


def test_two_seats_build_a_task_from_the_first_seats_typed_row(tmp_path, stub):
    env = write_env(tmp_path, "relay_wire", RELAY_ENV)
    summary, out = evaluate(env, "echo", stub.url, tmp_path / "relay")
    episodes = sorted(read_episodes(out / "traces.jsonl"), key=lambda e: e.task.data.idx)
    assert [e.ok for e in episodes] == [True] * 3, [e.errors for e in episodes]
    for ep in episodes:
        first, second = ep.traces
        assert (first.agent.name, second.agent.name) == ("first", "second")
        # built in-process from the taskset's own class; the author's field read as an attribute
        assert first.info["data_class"] == "RelayData" and first.info["answer_attr"] == first.task.data.answer
        assert second.task.data.idx == first.task.data.idx
        assert second.task.data.prompt == ["apple", "banana", "cherry"][(first.task.data.idx + 1) % 3]
        assert (first.reward, second.reward) == (1.0, 1.0)
    assert summary["mean_reward"] == 1.0 and summary["num_errors"] == 0


def test_resume_of_an_old_nested_run_keeps_it_and_types_its_rows(tmp_path, stub):
    summary, out = evaluate("calculator", "calc", stub.url, tmp_path / "calc", n=2)
    traces = out / "traces.jsonl"
    flat = traces.read_text().splitlines()
    traces.write_text("".join(nested_shape(line) + "\n" for line in flat))  # as vf wrote it before
    from vf.evaluate import open_run
    from vf.loading import load_taskset
    from vf.runner import make_plan

    config, _, kept, aside = open_run(None, {}, None, str(out))
    assert len(kept) == 2 and not any(aside.values())
    assert kept[0].traces[0].tools[0]["function"]["name"] in {"add", "divide", "multiply", "subtract"}
    plan = make_plan(load_taskset(config.taskset["id"], config.taskset, config.env), config, kept)
    assert plan.owed == [] and len(plan.kept) == 2
    for ep in plan.kept:  # the taskset is known: its TaskData class again, on the episode and the seat
        assert type(ep.task.data).__name__ == "CalculatorData" == type(ep.traces[0].task.data).__name__
        assert isinstance(ep.task.data.answer, int)
    assert sorted(ep.to_json() for ep in plan.kept) == sorted(flat)  # rewritten exactly as vf writes now
    summary2, _ = evaluate("calculator", "calc", stub.url, out, resume=True)
    assert summary2["mean_reward"] == summary["mean_reward"] and summary2["num_resumed"] == 2


@needs_verifiers
def test_verifiers_reads_vf_episodes_with_tools_images_and_two_seats(tmp_path, stub):
    _, tools = evaluate("calculator", "calc", stub.url, tmp_path / "tools", n=2)
    _, images = evaluate("image-colors", "vision", stub.url, tmp_path / "images", n=2)
    _, seats = evaluate(write_env(tmp_path, "relay_wire", RELAY_ENV), "echo", stub.url, tmp_path / "seats")
    seen = verifiers_read(tools / "traces.jsonl", images / "traces.jsonl", seats / "traces.jsonl", GOLDEN)
    assert len(seen) == 2 + 2 + 3 + 1
    for ep in seen[:2]:  # calculator: four tools, the stub's first reply calls add
        assert ep["tools"] == [["add", "divide", "multiply", "subtract"]] and ep["calls"] == [["add"]]
        assert isinstance(ep["extra"], int)  # the author's `answer` kept on WireTaskData
    for ep in seen[2:4]:  # one image part in the prompt
        assert ep["images"] == [1] and ep["tools"] == [[]]
    relay = sorted(seen[4:7], key=lambda e: e["idx"])
    assert [e["seats"] for e in relay] == [["first", "second"]] * 3
    assert [e["seat_idx"] for e in relay] == [[0, 0], [1, 1], [2, 2]]
    assert [e["prompts"] for e in relay] == [["apple", "banana"], ["banana", "cherry"], ["cherry", "apple"]]
    assert [e["rewards"] for e in relay] == [[1.0, 1.0]] * 3
    assert seen[7]["tools"] == [["add"]] and seen[7]["calls"] == [["add"]] and seen[7]["extra"] == 5


AGENT_ENV = Path(__file__).parent / "program_envs" / "script_agent.py"
AGENT_GOLDEN = Path(__file__).parent / "golden" / "wire_v04_agent.jsonl"
VERIFIERS_RUNTIME_KEYS = ["type", "id", "borrowed"]
"""What verifiers 0.4.0 records as `agent.runtime` for its subprocess runtime (SubprocessRuntimeInfo:
no other key is allowed, `workdir` included); `id` is the runtime's working directory."""


def agent_run(tmp_path: Path, stub, runtime: str) -> Path:
    """A program harness (tests/program_envs/script_agent.py) whose model calls went through the
    interception server: the program's own `bash` tool and its calls, flat on disk."""
    agent = {"harness": {"id": f"{AGENT_ENV}:ScriptAgent"}, "runtime": {"type": runtime}}
    _, out = evaluate(str(AGENT_ENV), "bash:echo hi > out.txt", stub.url, tmp_path / "agent",
                      extra={"env": {"agent": agent}})
    return out / "traces.jsonl"


def test_golden_agent_line_reads_and_rewrites_identically():
    line = AGENT_GOLDEN.read_text().strip()
    ep = parse_episode(line)
    assert ep.to_json() == line
    trace = ep.traces[0]
    assert trace.agent.runtime == {"type": "subprocess", "id": trace.agent.runtime["id"], "borrowed": False}
    assert [t["function"]["name"] for t in trace.tools] == ["bash"] and len(trace.calls) == 2


@pytest.mark.parametrize("runtime", ["subprocess", "sandbox"])
def test_an_intercepted_agent_records_its_runtime_as_verifiers_does(tmp_path, stub, runtime):
    path = agent_run(tmp_path, stub, runtime)
    episodes = read_episodes(path)  # vf's own reader: flat tools, both calls recorded
    assert [t.tools[0]["function"]["name"] for e in episodes for t in e.traces] == ["bash", "bash"]
    assert all('"name":"bash","arguments"' in line for line in path.read_text().splitlines())
    for ep in episodes:
        info = ep.traces[0].agent.runtime
        assert list(info) == VERIFIERS_RUNTIME_KEYS and (info["type"], info["borrowed"]) == ("subprocess", False)
        assert Path(info["id"]).name.startswith(f"vf-{runtime}-")  # the (removed) working directory
        assert list(json.loads(AGENT_GOLDEN.read_text())["traces"][0]["agent"]["runtime"]) == list(info)


@needs_verifiers
@pytest.mark.parametrize("runtime", ["subprocess", "sandbox"])
def test_verifiers_reads_an_intercepted_agent_episode(tmp_path, stub, runtime):
    seen = verifiers_read(agent_run(tmp_path, stub, runtime), AGENT_GOLDEN)
    assert len(seen) == 3
    for ep in seen:
        assert ep["tools"] == [["bash"]] and ep["calls"] == [["bash"]]
        assert ep["runtime"] == [{"type": "subprocess", "borrowed": False}]


# ---- the error taxonomy -------------------------------------------------------------------------

NAMES = ["RolloutError", "ProviderError", "HarnessError", "ToolsetError", "EnvError", "SandboxError", "TaskError",
         "InterceptionError", "TunnelError"]


def test_error_taxonomy_names_hierarchy_and_stop_conditions():
    from vf.errors import SandboxError, TaskError  # noqa: F401 - the import a verifiers fixture makes
    from vf.runtime import RuntimeLimitError, SandboxUnavailable
    from vf.runtime.base import CommandResult

    for name in NAMES:
        cls = getattr(vf.errors, name)
        assert getattr(vf, name) is cls and issubclass(cls, vf.errors.RolloutError)
        assert issubclass(cls, vf.errors.VfError) and cls("x").exit_code == 1
    assert issubclass(vf.errors.TunnelError, vf.errors.InterceptionError)
    stops = {name: vf.errors.stop_condition(getattr(vf.errors, name)("x")) for name in NAMES}
    assert stops == {"RolloutError": "rollout_error", "ProviderError": "provider_error", "HarnessError": "harness_error",
                     "ToolsetError": "toolset_error", "EnvError": "env_error", "SandboxError": "sandbox_error",
                     "TaskError": "task_error", "InterceptionError": "interception_error", "TunnelError": "tunnel_error"}
    assert vf.errors.stop_condition(ValueError("x")) == "error"
    # vf's own errors in the one hierarchy: the engines' failures are provider errors ...
    engine = vf.errors.EngineError("HTTP 500", type="ProviderError", status_code=500)
    assert isinstance(engine, vf.errors.ProviderError) and engine.stop_condition == "provider_error"
    assert engine.status_code == 500 and vf.errors.ProviderError("x").status_code == 502
    # ... the runtime's are sandbox errors; a limit keeps vf's own stop condition
    limit = RuntimeLimitError(CommandResult(1, "", "", limit="disk"))
    assert isinstance(limit, SandboxError) and limit.stop_condition == "limit" and limit.exit_code == 1
    unavailable = SandboxUnavailable("no bwrap", hint="install it")
    assert isinstance(unavailable, SandboxError) and isinstance(unavailable, vf.errors.UsageError)
    assert unavailable.exit_code == 2 and unavailable.stop_condition == "sandbox_error"
    assert vf.errors.UsageError("x").exit_code == 2 and vf.errors.GateFailed("x").exit_code == 3


def test_boundary_attributes_untyped_errors_and_passes_typed_ones():
    async def cross(exc):
        async with vf.errors.boundary(vf.errors.TaskError, "task setup"):
            raise exc

    with pytest.raises(vf.errors.TaskError, match="task setup: KeyError: 'x'") as e:
        asyncio.run(cross(KeyError("x")))
    assert isinstance(e.value.__cause__, KeyError)
    with pytest.raises(vf.errors.SandboxError, match="^box$"):
        asyncio.run(cross(vf.errors.SandboxError("box")))
    with pytest.raises(vf.errors.TaskError, match="task setup timed out"):
        asyncio.run(cross(TimeoutError()))


@needs_verifiers
def test_stop_conditions_match_verifiers():
    code = ("import json\nfrom verifiers.v1 import errors\n"
            f"print(json.dumps({{n: errors.stop_condition(getattr(errors, n)('x')) for n in {NAMES!r}}}))")
    proc = subprocess.run([VERIFIERS_PY, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    peer = json.loads(proc.stdout)
    assert peer == {n: vf.errors.stop_condition(getattr(vf.errors, n)("x")) for n in NAMES}


def test_task_setup_errors_end_as_verifiers_stop_conditions(tmp_path, stub):
    env = write_env(tmp_path, "setup_wire", SETUP_ERRORS_ENV)
    _, out = evaluate(env, "echo", stub.url, tmp_path / "setup", extra={"env": {"agent": {"runtime": {"type": "subprocess"}}}})
    by_kind = {e.task.data.kind: e.traces[0] for e in read_episodes(out / "traces.jsonl")}
    task = by_kind["task"]
    assert (task.stop_condition, task.ok, [x.type for x in task.errors]) == ("task_error", False, ["TaskError"])
    assert task.errors[0].message == "the fixture repository is missing" and task.rewards == {}
    plain = by_kind["plain"]  # an untyped error stays vf's `error`, under its own name
    assert (plain.stop_condition, [x.type for x in plain.errors]) == ("error", ["ValueError"])
    assert by_kind["fine"].ok and by_kind["fine"].reward == 1.0


def test_a_sandbox_that_cannot_start_is_a_sandbox_error_on_the_trace(tmp_path, stub, monkeypatch):
    import vf.runtime.sandbox as sandbox_mod

    monkeypatch.setattr(sandbox_mod, "find_bwrap", lambda: None)  # as on a machine without bubblewrap
    env = write_env(tmp_path, "setup_wire", SETUP_ERRORS_ENV)
    _, out = evaluate(env, "echo", stub.url, tmp_path / "sandbox", extra={"env": {"agent": {"runtime": {"type": "sandbox"}}}})
    fine = next(e.traces[0] for e in read_episodes(out / "traces.jsonl") if e.task.data.kind == "fine")
    assert fine.stop_condition == "sandbox_error" and not fine.ok
    assert [x.type for x in fine.errors] == ["SandboxUnavailable"] and "bubblewrap" in fine.errors[0].message


def test_a_command_the_runtime_cannot_start_raises_sandbox_error(tmp_path):
    from vf.runtime import RuntimeConfig, make_runtime

    async def go():
        async with make_runtime(RuntimeConfig(type="subprocess"), tmp_path / "work") as rt:
            with pytest.raises(vf.errors.SandboxError, match="could not start the command") as e:
                await rt.run("true", cwd="no/such/dir")
            assert isinstance(e.value.__cause__, FileNotFoundError)
            return (await rt.run("echo ok")).stdout

    assert asyncio.run(go()) == "ok\n"
    closed = make_runtime(RuntimeConfig(type="subprocess"), tmp_path / "work2")
    asyncio.run(closed.close())
    with pytest.raises(vf.errors.SandboxError, match="the runtime is closed"):
        asyncio.run(closed.read("x"))
