"""Program harnesses: a real program runs in the sandbox, every model call it makes goes through
the run's interception server, is answered by the seat's engine and recorded on the trace.

The program is tests/program_envs/script_agent.py's `ScriptAgent` (a stdlib-only agent script
with a `bash` tool); the engine is the scripted OpenAI stub (model `bash:CMD`: first a tool call
running CMD, then the tool's output as the reply) or the embedded tiny model (token ids and
log-probs).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from vf.trainer.samples import trace_samples

from vf.errors import UsageError
from vf.interception.server import InterceptionServer
from vf.trace import Episode

HERE = Path(__file__).parent
ENV = HERE / "program_envs" / "script_agent.py"
AGENT = f"{ENV}:ScriptAgent"

needs_bwrap = pytest.importorskip("test_runtime_sandbox").needs_bwrap


def evaluate(tmp_path: Path, model: str, harness: dict, url: str | None = None, **extra) -> tuple[dict, list[Episode]]:
    from vf.config import deep_merge
    from vf.evaluate import execute, open_run, resolve_config

    over = {"taskset": {"id": str(ENV)}, "model": model, "env": {"agent": {"harness": {"id": AGENT, **harness}}}}
    if url is not None:
        over["engine"] = {"base_url": url, "api_key_var": "FAKE_KEY"}
    over = deep_merge(over, extra)
    out = tmp_path / "run"
    shutil.rmtree(out, ignore_errors=True)
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(out), None)
    summary = execute(config, run, kept)
    episodes = [Episode.model_validate_json(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    return summary, sorted(episodes, key=lambda e: e.traces[0].task.data["expected"])


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")


@pytest.fixture
def secrets(monkeypatch):
    """Every per-rollout secret the run's interception server hands out."""
    seen: list[str] = []
    register = InterceptionServer.register

    def spy(self, handler):
        registration = register(self, handler)
        seen.append(registration.secret)
        return registration

    monkeypatch.setattr(InterceptionServer, "register", spy)
    return seen


@needs_bwrap
def test_sandboxed_program_is_answered_through_interception_and_recorded(stub, tmp_path, secrets):
    summary, episodes = evaluate(tmp_path, "bash:echo hi > out.txt", {}, stub.url)
    # the program's tool call ran in its sandbox: "hi" was asked for in one task, "bye" in the other
    assert [e.traces[0].rewards["wrote_file"].score for e in episodes] == [0.0, 1.0]
    assert summary["num_errors"] == 0 and summary["mean_reward"] == 0.5
    for episode in episodes:
        trace = episode.traces[0]
        roles = [n.message["role"] for n in trace.nodes]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        assert [n.parent for n in trace.nodes] == [None, 0, 1, 2, 3]  # one branch: each call extends it
        assert trace.nodes[2].message["tool_calls"][0]["function"]["name"] == "bash"
        assert [n.sampled for n in trace.nodes] == [False, False, True, False, True]
        assert len(trace.calls) == 2 and trace.metrics["model_calls"] == 2.0
        assert trace.tools and trace.tools[0]["function"]["name"] == "bash"  # the program's own tool
    # each rollout had its own secret, and none of them is written anywhere in the run dir
    assert len(set(secrets)) == 2
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert not any(s in path.read_text(errors="replace") for s in secrets), path


@needs_bwrap
def test_the_sandbox_reaches_the_interception_server_and_nothing_else(stub, tmp_path):
    # the program's command tries the model provider directly (the stub on the host's loopback)
    command = (f"python3 -c \"import urllib.request; urllib.request.urlopen('{stub.url}/chat/completions', "
               f"data=b'{{}}', timeout=3)\"")
    before = len(stub.requests)
    _, episodes = evaluate(tmp_path, f"bash:{command}", {}, stub.url)
    for episode in episodes:
        tool = episode.traces[0].nodes[3].message["content"]
        assert "Connection refused" in tool or "Network is unreachable" in tool, tool
    # the stub saw the engine's 4 calls (2 per episode) and nothing from inside the sandboxes
    assert len(stub.requests) - before == 4
    assert all(r["model"] == f"bash:{command}" for r in stub.requests[before:])


def test_every_call_is_a_training_sample_even_when_the_program_rewrites_its_history(tmp_path):
    _, episodes = evaluate(tmp_path, "tiny", {"max_calls": 2, "compact": True},
                           select={"limit": 1}, env={"agent": {"runtime": {"type": "subprocess"}}})
    trace = episodes[0].traces[0]
    assert len(trace.calls) >= 2 and not trace.errors
    replies = [i for i, n in enumerate(trace.nodes) if n.sampled]
    compacted = replies[-1] - 1  # the rewritten history's user message: a new branch off the system prompt
    assert trace.nodes[compacted].parent == 0 and trace.nodes[compacted].token_reset
    for i in replies:
        node = trace.nodes[i]
        assert node.token_ids and len(node.logprobs) == len(node.token_ids) and all(m == 1 for m in node.mask)
    samples = trace_samples(trace)
    # each reply trained on exactly once, across both branches
    assert sum(s.num_loss_tokens for s in samples) == sum(len(trace.nodes[i].token_ids) for i in replies)
    assert len(samples) == 2


def test_a_program_that_fails_is_a_harness_error_and_the_run_goes_on(stub, tmp_path, monkeypatch):
    # a program whose model key is wrong: its call is refused (401) and it exits 97
    monkeypatch.setattr(InterceptionServer, "register",
                        lambda self, handler, _r=InterceptionServer.register: _replace_secret(_r(self, handler)))
    summary, episodes = evaluate(tmp_path, "bash:echo hi > out.txt", {}, stub.url,
                                 env={"agent": {"runtime": {"type": "subprocess"}}})
    assert summary["num_errors"] == 2
    for episode in episodes:
        trace = episode.traces[0]
        assert not trace.ok and trace.errors[0].type == "InterceptionError"
        assert "401" in trace.errors[0].message and not trace.calls


def _replace_secret(registration):
    import dataclasses

    return dataclasses.replace(registration, secret="not-the-secret")


def test_intercept_hooks_rewrite_what_the_program_and_the_trace_see(stub, tmp_path):
    env = tmp_path / "hooked.py"
    env.write_text(ENV.read_text() + '''

class Hooked(FileTask):
    @vf.intercept
    def answer_bye(self, response: vf.Response):
        calls = response.message.tool_calls or []
        for call in calls:  # the program runs what the hook says, not what the policy said
            call.arguments = json.dumps({"command": "echo bye > out.txt; echo done"})
        return response if calls else None

    @vf.intercept
    def redact(self, request: vf.Request):
        last = request.messages[-1]
        if last.role == "tool" and last.content:  # an empty one is the tool gate's: filling it denies the call
            last.content = "REDACTED"
            return request
        return None


class HookedTaskset(vf.Taskset[Hooked]):
    def load(self):
        return [Hooked(Data(prompt="Write bye into out.txt.", expected="bye"))]


__all__ = ["HookedTaskset", "ScriptAgent"]
''')
    from vf.config import deep_merge
    from vf.evaluate import execute, open_run, resolve_config

    over = {"taskset": {"id": str(env)}, "model": "bash:echo hi > out.txt",
            "engine": {"base_url": stub.url, "api_key_var": "FAKE_KEY"},
            "env": {"agent": {"harness": {"id": f"{env}:ScriptAgent"}, "runtime": {"type": "subprocess"}}}}
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, deep_merge(over, {})), over,
                                    str(tmp_path / "run"), None)
    execute(config, run, kept)
    trace = Episode.model_validate_json((tmp_path / "run" / "traces.jsonl").read_text()).traces[0]
    assert trace.rewards["wrote_file"].score == 1.0  # the rewritten command ran
    assert trace.nodes[3].message["content"] == "REDACTED"  # the tool result the policy saw
    assert stub.requests[-1]["messages"][-1]["content"] == "REDACTED"
    assert [i["hook"] for i in trace.info["intercepts"]] == ["answer_bye", "redact"]


def test_harness_ids_resolve_and_a_wrong_one_says_what_exists(tmp_path):
    from vf.episode.harnesses import make_harness
    from vf.program import Harness

    sys.path.insert(0, str(ENV.parent))
    try:
        by_module = make_harness({"id": "script_agent:ScriptAgent", "max_calls": 3})
        by_package = make_harness({"id": "script_agent", "compact": True})  # exports exactly one Harness
    finally:
        sys.path.remove(str(ENV.parent))
    assert isinstance(by_module, Harness) and by_module.config.max_calls == 3
    assert type(by_package).__name__ == "ScriptAgent" and by_package.config.compact is True
    with pytest.raises(UsageError) as e:
        make_harness({"id": "no_such_harness_anywhere"})
    assert e.value.exit_code == 2 and "null" in e.value.hint and "bash" in e.value.hint
    with pytest.raises(Exception, match="max_calls"):
        make_harness({"id": AGENT, "max_calls": "many"})


def test_vf_train_takes_rl_steps_on_a_programs_intercepted_calls(tmp_path):
    from conftest import run_train

    env = HERE / "program_envs" / "script_agent_train.py"
    out = tmp_path / "train"
    proc = run_train("-o", out, "--taskset", env, "--env.agent.harness.id", f"{env}:ScriptAgent",
                     "--env.agent.harness.max-calls", 2, "--sampling.max-tokens", 7, "--steps", 2,
                     "--batch-size", 4, "--group-size", 2, "--eval.at-start", "false", "--eval.at-end", "false",
                     "--warmup.steps", 0, "--seed", 3, timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    episodes = [Episode.model_validate_json(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    calls = [t for e in episodes for t in e.traces]
    assert len(calls) == 8 and all(len(t.calls) >= 1 and not t.errors for t in calls)
    # every reply the program got is a trained-on node with its inference log-probs ...
    replies = [n for t in calls for n in t.nodes if n.sampled]
    assert replies and all(n.token_ids and len(n.logprobs) == len(n.token_ids) for n in replies)
    # ... and a step with reward variance trained on them (the IPO mask and staleness reported)
    trained = [r for r in rows if r["num_loss_tokens"] > 0]
    assert trained and all(r["masked_fraction"] is not None and "off_policy/mean" in r for r in trained)


@pytest.mark.parametrize("runtime", [pytest.param("sandbox", marks=needs_bwrap), "subprocess"])
def test_a_stuck_program_is_stopped_at_the_agent_deadline_and_leaves_no_process(stub, tmp_path, runtime):
    import subprocess
    import uuid

    marker = f"vf-stuck-{uuid.uuid4().hex[:8]}"
    summary, episodes = evaluate(tmp_path, "bash:echo hi > out.txt", {"hang": marker}, stub.url,
                                 **{"env": {"agent": {"runtime": {"type": runtime}, "timeout": {"rollout": 3}}}})
    for episode in episodes:
        trace = episode.traces[0]
        assert trace.stop_condition == "agent_timeout" and trace.is_timeout and len(trace.calls) == 1
        assert "wrote_file" in trace.rewards  # a timeout is a stop: scoring still ran
    assert summary["num_errors"] == 0
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    if runtime == "subprocess":  # no isolation: a child in a session of its own survives (and is
        subprocess.run(["pkill", "-f", marker], check=False)  # not waited for); the run went on
    else:
        assert left == [], f"processes outlived their episode: {left}"


HOOK_BUGS = '''

class Buggy(FileTask):
    @vf.intercept
    def bad_request(self, task, request: vf.Request):
        if task.prompt == "request" and request.messages[-1].role == "tool":
            raise ValueError("hook bug on the tool result")

    @vf.intercept
    def bad_response(self, task, response: vf.Response):
        if task.prompt == "response":
            return {"not": "a response"}


class BuggyTaskset(vf.Taskset[Buggy]):
    def load(self):
        return [Buggy(Data(prompt=p, expected="hi")) for p in ("request", "response", "fine")]


__all__ = ["BuggyTaskset", "ScriptAgent"]
'''


def test_an_intercept_hook_that_raises_is_the_tasks_error_and_the_run_goes_on(stub, tmp_path):
    """As verifiers 0.4.0 (session.rewrite_request / rewrite_response): a hook's untyped error is a
    TaskError named by its boundary, recorded on the trace (stop `task_error`) in place of the
    program's exit that it caused; the other rollouts run as usual."""
    env = tmp_path / "buggy.py"
    env.write_text(ENV.read_text() + HOOK_BUGS)
    from vf.config import deep_merge
    from vf.evaluate import execute, open_run, resolve_config

    over = {"taskset": {"id": str(env)}, "model": "bash:echo hi > out.txt",
            "engine": {"base_url": stub.url, "api_key_var": "FAKE_KEY"},
            "env": {"agent": {"harness": {"id": f"{env}:ScriptAgent"}, "runtime": {"type": "subprocess"}}}}
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, deep_merge(over, {})), over,
                                    str(tmp_path / "run"), None)
    summary = execute(config, run, kept)
    traces = {t.task.data["prompt"]: t for line in (tmp_path / "run" / "traces.jsonl").read_text().splitlines()
              for t in Episode.model_validate_json(line).traces}
    request, response = traces["request"], traces["response"]
    assert (request.stop_condition, request.ok, [e.type for e in request.errors]) == ("task_error", False, ["TaskError"])
    assert request.errors[0].message == "request interception failed: ValueError: hook bug on the tool result"
    assert len(request.calls) == 1 and request.rewards == {}  # the first call was answered; not scored
    assert (response.stop_condition, [e.type for e in response.errors]) == ("task_error", ["TaskError"])
    assert response.errors[0].message == ("response interception failed: TypeError: @vf.intercept bad_response "
                                          "returned dict, not vf.Response")
    assert traces["fine"].ok and traces["fine"].rewards["wrote_file"].score == 1.0
    assert summary["num_errors"] == 2


MCP_ENV = '''
import json

import vf
from mcp_tools import Probe
from vf.configs.harness import HarnessConfig
from vf.harness import Harness

CLIENT = r"""
import json, sys, urllib.request
out = {}
for name, url in json.loads(sys.argv[1]).items():
    def post(method, params):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        request = urllib.request.Request(url, body, {"Content-Type": "application/json",
                                                     "Accept": "application/json, text/event-stream"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.load(reply)["result"]
    echo = post("tools/call", {"name": "echo", "arguments": {"text": "from the program"}})
    out[name] = {"tools": sorted(t["name"] for t in post("tools/list", {})["tools"]),
                 "echo": echo["content"][0]["text"]}
print(json.dumps(out))
"""


class McpAgent(Harness[HarnessConfig]):
    """A program that lists and calls the MCP tool servers it is given (no model calls)."""

    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        result = await runtime.run(["python3", "-c", CLIENT, json.dumps(mcp_urls)], timeout=60)
        trace.info["seen"] = json.loads(result.stdout) if result.exit_code == 0 else result.stderr[-800:]
        return result


class ToolTask(vf.Task):
    toolsets = [Probe]

    @vf.reward
    async def one(self, trace) -> float:
        return 1.0


class ToolTaskset(vf.Taskset[ToolTask]):
    def load(self):
        yield ToolTask(vf.TaskData(prompt="closed"))
        yield ToolTask(vf.TaskData(prompt="networked", network_allow=["*"]))


__all__ = ["ToolTaskset", "McpAgent"]
'''
PROBE_TOOLS = ["boom", "crash", "echo", "hang", "image", "pid", "slow"]


@pytest.mark.parametrize("runtime", [pytest.param("sandbox", marks=needs_bwrap), "subprocess"])
def test_a_program_harness_reaches_the_tasks_mcp_tool_servers(stub, tmp_path, capsys, monkeypatch, runtime):
    """verifiers passes a program the task's tool servers (`mcp_urls`, {server name: URL it can
    reach}); vf starts each toolset as an MCP server on the host's loopback, reachable from the
    subprocess runtime and from a sandbox with the host's network, and none from a closed sandbox."""
    import vf.runtime.resources

    monkeypatch.setattr(vf.runtime.resources, "_warned", set())  # the warning is once per run
    env = tmp_path / "mcp_env.py"
    env.write_text(MCP_ENV)
    from vf.config import deep_merge
    from vf.evaluate import execute, open_run, resolve_config

    over = {"taskset": {"id": str(env)}, "model": "echo", "engine": {"base_url": stub.url, "api_key_var": "FAKE_KEY"},
            "env": {"agent": {"harness": {"id": f"{env}:McpAgent"}, "runtime": {"type": runtime}}}}
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, deep_merge(over, {})), over,
                                    str(tmp_path / "run"), None)
    summary = execute(config, run, kept)
    traces = {t.task.data["prompt"]: t for line in (tmp_path / "run" / "traces.jsonl").read_text().splitlines()
              for t in Episode.model_validate_json(line).traces}
    assert summary["num_errors"] == 0, [t.errors for t in traces.values()]
    served = {"probe": {"tools": PROBE_TOOLS, "echo": "hi from the program"}}  # Probe.setup ran in the server
    assert traces["networked"].info["seen"] == served
    if runtime == "subprocess":
        assert traces["closed"].info["seen"] == served
    else:
        assert traces["closed"].info["seen"] == {}
        assert "runtime 'sandbox' has no route to the host" in capsys.readouterr().err
