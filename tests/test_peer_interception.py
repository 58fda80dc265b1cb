"""`@vf.intercept` hooks and call-boundary `@vf.stop`s, side by side with verifiers 0.4.0.

tests/v1_envs/verifiers/intercept_v1.py and image_rewrite_v1.py (vf copies: tests/v1_envs/vf/)
hook every model call of a `bash` agent: request hooks of two priorities note the newest user or
tool message, a tool-call hook denies a call before it runs, a response hook wraps the reply, a
request stop halts on what the hooks wrote, and a request hook adds an image the `vision` stub
model counts. Their rewards read what the hooks did, so a hook not run, run out of order or run
twice changes them. Each case runs the SAME command line through verifiers 0.4.0's `vf-eval`
(its `bash` harness is a program talking to its interception server) and vf's (an in-process
loop, which applies the hooks to each call the same way), against tests/openai_stub.py:

    vf-eval ENV -m MODEL --client.base-url http://127.0.0.1:PORT/v1 --client.api-key-var FAKE_KEY
            --no-push --no-rich --env.agent.runtime.type subprocess --env.agent.harness.id bash

Per row both must give the same stop condition, rewards, metrics, errors and the hooks that
changed something, in order (verifiers' `trace.request_rewrites` / `response_rewrites`; vf's
`trace.info["intercepts"]`). verifiers' results are the constants below, so CI without verifiers
still checks vf; with VF_VERIFIERS_PYTHON set, `test_peer_gives_the_recorded_outcome` re-runs it.
vf's program harness tests/program_envs/script_agent.py:ScriptAgent gives the same rows, except
that it cannot skip a call, so the denying hook ends that rollout instead (verifiers does the
same for a harness without a tool gate).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
PEER_ENVS = HERE / "v1_envs" / "verifiers"
ENVS = HERE / "v1_envs" / "vf"
PEER_PYTHON = os.environ.get("VF_VERIFIERS_PYTHON")
needs_peer = pytest.mark.skipif(not PEER_PYTHON, reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")

# case → (env, stub model)
CASES = {"intercept": ("intercept_v1", "bash:echo out"), "image": ("image_rewrite_v1", "vision")}

NOTES = ["note_first", "note_second"]
# verifiers 0.4.0's vf-eval on these envs, same stub (task idx → outcome)
PEER = {
    "intercept": {
        "0": {"stop": "agent_completed", "errors": 0, "rewards": {"prompt_noted": 1.0, "reply_wrapped": 1.0},
              "metrics": {"replies": 2.0, "tool_results": 1.0}, "request_hooks": NOTES + NOTES,
              "response_hooks": ["wrap"]},
        "1": {"stop": "agent_completed", "errors": 0, "rewards": {"prompt_noted": 1.0, "reply_wrapped": 1.0},
              "metrics": {"replies": 2.0, "tool_results": 1.0}, "request_hooks": [*NOTES, "deny"],
              "response_hooks": ["wrap"]},
        "2": {"stop": "halt", "errors": 0, "rewards": {"prompt_noted": 1.0, "reply_wrapped": 1.0},
              "metrics": {"replies": 0.0, "tool_results": 0.0}, "request_hooks": NOTES, "response_hooks": []},
    },
    "image": {
        str(i): {"stop": "agent_completed", "errors": 0,
                 "rewards": {"counted_after_adding": 1.0, "saw_the_added_image": 1.0}, "metrics": {},
                 "request_hooks": ["add_image", "count_images"], "response_hooks": []}
        for i in (0, 1)},
}
# the transcript verifiers recorded for intercept_v1's rows (after the system prompt)
PEER_MESSAGES = {
    "0": [("user", "say out +first +second"), ("assistant", None), ("tool", "out\n +first +second"),
          ("assistant", "<<out\n +first +second>>")],
    "1": [("user", "deny the command +first +second"), ("assistant", None), ("tool", "denied"),
          ("assistant", "<<denied>>")],
    "2": [("user", "please halt +first +second")],
}


def command(case: str, url: str) -> list[str]:
    """The arguments after the env, identical for both CLIs."""
    return ["-m", CASES[case][1], "--client.base-url", url, "--client.api-key-var", "FAKE_KEY", "--no-push",
            "--no-rich", "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "bash"]


def outcome(traces: Path) -> tuple[dict, dict]:
    """Per task idx: what the comparison covers, and the transcript (role, text) after the system prompt."""
    out, messages = {}, {}
    for line in traces.read_text().splitlines():
        episode = json.loads(line)
        (trace,) = episode["traces"]
        if "request_rewrites" in trace or "response_rewrites" in trace:  # verifiers; vf writes only non-empty ones
            request = [r["handler"] for r in trace.get("request_rewrites", [])]
            response = [r["handler"] for r in trace.get("response_rewrites", [])]
        else:
            seen = trace["info"].get("intercepts", [])
            request = [i["hook"] for i in seen if i["boundary"] == "request"]
            response = [i["hook"] for i in seen if i["boundary"] == "response"]
        idx = str(episode["task"]["data"]["idx"])
        out[idx] = {"stop": trace["stop_condition"], "errors": len(trace["errors"]),
                    "rewards": {k: v and v["score"] for k, v in sorted(trace["rewards"].items())},
                    "metrics": dict(sorted(trace["metrics"].items())),
                    "request_hooks": request, "response_hooks": response}
        messages[idx] = [(n["message"]["role"], n["message"].get("content")) for n in trace["nodes"]
                         if n["message"]["role"] != "system"]
    return dict(sorted(out.items())), messages


def run_ours(case: str, url: str, tmp: Path, harness: str = "bash") -> tuple[dict, dict]:
    from vf.evaluate import execute, open_run, resolve_config

    env = ENVS / f"{CASES[case][0]}.py"
    sys.modules.pop(env.stem, None)
    over = {"taskset": {"id": str(env)}, "model": CASES[case][1],
            "engine": {"base_url": url, "api_key_var": "FAKE_KEY"},
            "env": {"agent": {"harness": {"id": harness}, "runtime": {"type": "subprocess"}}}}
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(tmp / "run"), None)
    execute(config, run, kept)
    return outcome(tmp / "run" / "traces.jsonl")


def run_peer(case: str, url: str, tmp: Path) -> tuple[dict, dict]:
    peer = Path(PEER_PYTHON).parent / "vf-eval"
    env = {**os.environ, "PYTHONPATH": str(PEER_ENVS), "FAKE_KEY": "sk-test",
           "PATH": f"{peer.parent}:{os.environ['PATH']}"}
    proc = subprocess.run([str(peer), CASES[case][0], *command(case, url)], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (traces,) = (tmp / "outputs").glob("*/traces.jsonl")
    return outcome(traces)


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")


@pytest.mark.parametrize("case", sorted(CASES))
def test_hooks_give_what_verifiers_gives(case, stub, tmp_path):
    before = len(stub.requests)
    rows, messages = run_ours(case, stub.url, tmp_path)
    assert rows == PEER[case]
    if case == "intercept":
        assert messages == PEER_MESSAGES
        # the denied call never ran: the stub was never sent its real output for that row
        assert not any(m.get("content") == "out\n" for body in stub.requests[before:] for m in body.get("messages", []))


def test_hooks_apply_to_a_programs_calls_alike(stub, tmp_path):
    """ScriptAgent (a program, every call intercepted) gives verifiers' rows; having no tool gate,
    the row whose hook denies the call ends there, named by that hook, before the call runs."""
    rows, messages = run_ours("intercept", stub.url, tmp_path, f"{HERE / 'program_envs' / 'script_agent.py'}:ScriptAgent")
    assert rows["0"] == PEER["intercept"]["0"] and rows["2"] == PEER["intercept"]["2"]
    assert messages["0"] == PEER_MESSAGES["0"] and messages["2"] == PEER_MESSAGES["2"]
    assert rows["1"] == {**PEER["intercept"]["1"], "stop": "deny", "rewards": {"prompt_noted": 1.0, "reply_wrapped": 0.0},
                         "metrics": {"replies": 1.0, "tool_results": 0.0}, "response_hooks": []}


@needs_peer
@pytest.mark.parametrize("case", sorted(CASES))
def test_peer_gives_the_recorded_outcome(case, stub, tmp_path):
    rows, messages = run_peer(case, stub.url, tmp_path)
    assert rows == PEER[case]
    if case == "intercept":
        assert messages == PEER_MESSAGES


# ---- hostile hooks -----------------------------------------------------------------------------


def _interceptors(hook):
    import vf
    from vf.episode.intercept import Interceptors

    class T(vf.Task[vf.TaskData]):
        pass

    T.hook = vf.intercept(hook)
    trace = vf.Trace()
    return Interceptors(T(vf.TaskData(prompt="hi")), lambda: {"trace": trace}), trace


def _request():
    import vf

    return vf.Request(messages=[vf.UserMessage(content="old"), vf.AssistantMessage(content="ok"),
                                vf.UserMessage(content="new")],
                      tools=[vf.types.Tool(name="bash")])


@pytest.mark.parametrize(("edit", "error"), [
    (lambda r: r.messages.pop(), "same number of messages"),
    (lambda r: setattr(r.messages[0], "content", "rewritten"), "only new user or tool messages"),
    (lambda r: setattr(r.messages[1], "content", "rewritten"), "only new user or tool messages"),
    (lambda r: setattr(r, "tools", []), "cannot rewrite tools"),
])
def test_a_hook_may_change_only_the_new_user_and_tool_messages(edit, error):
    import asyncio

    def hook(self, request):  # the boundary by the parameter's name
        edit(request)
        return request

    interceptors, _ = _interceptors(hook)
    with pytest.raises((TypeError, ValueError), match=error):
        asyncio.run(interceptors.request(_request(), {2}))


def test_a_hook_returning_nothing_or_the_same_records_nothing():
    import asyncio

    interceptors, trace = _interceptors(lambda self, request: request if request.messages else None)
    request, stopped = asyncio.run(interceptors.request(_request(), {2}))
    assert request == _request() and stopped is None and "intercepts" not in trace.info


def test_a_bad_hook_is_an_error_on_its_rollout_and_the_run_goes_on(stub, tmp_path):
    """A hook that breaks the rules (adds a message) or raises fails only the rollouts it breaks."""
    from vf.evaluate import execute, open_run, resolve_config
    from vf.trace import read_episodes

    env = tmp_path / "bad_hooks.py"
    env.write_text('''
import vf

__all__ = ["BadTaskset"]


class T(vf.Task[vf.TaskData]):
    @vf.intercept
    async def bad(self, request: vf.Request):
        if "grow" in request.messages[-1].content:
            request.messages.append(vf.UserMessage(content="extra"))
            return request
        if "raise" in request.messages[-1].content:
            raise RuntimeError("hook broke")
        return None

    @vf.reward
    async def replied(self, trace) -> float:
        return float(trace.last_reply == "fine")


class BadTaskset(vf.Taskset[T]):
    def load(self):
        return [T(vf.TaskData(prompt=p)) for p in ("grow", "raise", "fine")]
''')
    over = {"taskset": {"id": str(env)}, "model": "echo", "engine": {"base_url": stub.url, "api_key_var": "FAKE_KEY"}}
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(tmp_path / "run"), None)
    summary = execute(config, run, kept)
    traces = {e.task.data["prompt"]: e.traces[0] for e in read_episodes(tmp_path / "run" / "traces.jsonl")}
    assert summary["num_errors"] == 2 and traces["fine"].rewards["replied"].score == 1.0
    assert "same number of messages" in traces["grow"].errors[0].message and not traces["grow"].calls
    assert traces["raise"].errors[0].message == "hook broke"


if __name__ == "__main__":  # print verifiers' outcome, to re-record PEER (needs VF_VERIFIERS_PYTHON)
    import tempfile

    sys.path.insert(0, str(HERE))
    from openai_stub import StubServer

    with StubServer() as server:
        for name in CASES:
            with tempfile.TemporaryDirectory() as tmp:
                print(name, json.dumps(run_peer(name, server.url, Path(tmp)), indent=1))
