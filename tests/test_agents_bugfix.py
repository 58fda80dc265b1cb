"""Each real agent (mini-swe-agent, Terminus-2, Claude Code, Codex) fixes a generated bug in a
multi-step `vf-eval swe-gen` episode against a strict provider, in one branch (issue 36).

The task is one swe-gen task of kind `import` (environments/swe_gen), generated here with the
same seed/size/kinds as the `--taskset.*` flags, so the script knows its visible test command and
its gold fix (`GenRepo.fix_command`, a one-line `sed -i`). The policy is tests/openai_stub.py's
`script` model on loopback, standing in for the provider; it makes the agent, with the agent's own
tool and format, (1) run the visible test, (2) apply the gold fix, (3) run the test again, and
(4) finish with a short answer (Claude Code, Codex: a reply without a tool call; mini-swe-agent:
its submit command; Terminus-2: `task_complete`, then confirmed).

What a bug would break is what is checked: the hidden tests pass after the agent stops (reward
`solved` = 1.0, the fix really ran in the episode's sandbox), no errors, the agent ended on its
own, every call reached the provider once and is recorded on the trace (in order, each on its
assistant node), every request the provider received is valid for OpenAI's own request type
compiled closed (and for vLLM's `ChatCompletionRequest` when VF_VLLM_PYTHON is set: the
validators of tests/test_provider_requests.py), and the trace is one branch: one chain of nodes,
every assistant reply on it, no `token_reset` (the provider returns token ids a chat template would,
`ConsistentTokens`, so a reset would mean the agent really rewrote or resent its history).
These caught vf forwarding Claude Code's `defer_loading` and Codex's `namespace` inside the chat
tool's `function` object, which OpenAI answers with 400 (now dropped at the provider boundary,
`vf.engines.openai_client.provider_tool`).

One case runs in the default suite (Claude Code when its install is cached, else mini-swe-agent;
no network); the others are marked `agents` (`pytest -m agents`, which may install them).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import time

import openai_stub
import pytest
from conftest import run_cli
from openai_stub import bash_call, tool_call
from test_agent_harnesses import SUBMIT, needs_bwrap, terminus_reply
from test_agent_harnesses import installed_or_skip as pypi_installed_or_skip
from test_npm_agents import installed_or_skip as npm_installed_or_skip
from test_provider_requests import VLLM_CHECK, openai_errors

from vf.harnesses.claude_code import ClaudeCodeConfig, ClaudeCodeHarness
from vf.harnesses.codex import CodexConfig, CodexHarness
from vf.harnesses.mini_swe_agent import MiniSweAgentConfig, MiniSweAgentHarness
from vf.loading import load_taskset

from vf.environments.swe_gen.generate import GenRepo, generate  # isort: skip

FIELDS = {"seed": 3, "size": 1, "kinds": ["import"]}
"""The one task: the same fields go to vf-eval as `--taskset.*` flags."""
ANSWER = "Added the missing import; the test passes now."


def the_task() -> tuple[str, GenRepo]:
    """(prompt, generated repo) of the one swe-gen task the episode runs."""
    (task,) = list(load_taskset("swe-gen", dict(FIELDS)).taskset.tasks())
    return task.data.prompt, generate(task.data.kind, task.data.seed)


PROMPT, GEN = the_task()
TEST = f"python3 {GEN.repo.test}"
STEPS = [TEST, GEN.fix_command, TEST]
"""The gold trajectory's commands (environments/swe_gen/gold_server.py, `import` kind: no `cat`)."""


def claude_code_script() -> list[dict]:
    return [*(tool_call("Bash", {"command": c, "description": f"Step {i}"}) for i, c in enumerate(STEPS)),
            {"content": ANSWER}]


def codex_script() -> list[dict]:
    return [*(tool_call("exec_command", {"cmd": c}) for c in STEPS), {"content": ANSWER}]


def mini_script() -> list[dict]:
    return [*(bash_call(c) for c in STEPS), bash_call(SUBMIT, text=ANSWER)]


def terminus_script() -> list[dict]:
    # keystrokes into its tmux pane, one command a turn; done, then confirmed (its protocol)
    return [*(terminus_reply([c + "\n"], False) for c in STEPS), terminus_reply([], True),
            terminus_reply([], True)]


def terminus_harness():
    from vf.harnesses.terminus_2 import Terminus2Config, Terminus2Harness

    return Terminus2Harness(Terminus2Config())


AGENTS = {  # harness id -> (harness, script, extra vf-eval flags)
    "claude_code": (lambda: ClaudeCodeHarness(ClaudeCodeConfig()), claude_code_script, ()),
    "codex": (lambda: CodexHarness(CodexConfig()), codex_script, ()),
    "mini_swe_agent": (lambda: MiniSweAgentHarness(MiniSweAgentConfig()), mini_script,
                       ("--env.agent.harness.step_limit", "8")),
    "terminus_2": (terminus_harness, terminus_script, ("--env.agent.harness.max_turns", "8")),
}


def ready_or_skip(which: str, *, cached_only: bool):
    harness = AGENTS[which][0]()
    if which in ("claude_code", "codex"):
        npm_installed_or_skip(harness, cached_only=cached_only)
    elif cached_only and harness.program.installed() is None:
        pytest.skip(f"{harness.program.name} is not in the agent cache ({harness.program.dir}); "
                    "the default suite does not download it: run `pytest -m agents` once")
    else:
        pypi_installed_or_skip(harness)
    return harness


class ConsistentTokens(openai_stub.Handler):
    """The stub's replies with token ids a real chat template would give: each message rendered as
    bytes (`<|role|>content<call name args><|end|>`), the prompt all of them plus the assistant's
    header, the completion the reply's rendering. So a call whose conversation extends the last one
    (the last prompt, its reply, the results) gets a prompt extending the last prompt + completion,
    and a `token_reset` on the trace means the agent really rewrote or resent its history (the
    stub's own ids, a prefix of the request's JSON, would flag every text reply)."""

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.body = json.loads(raw or b"{}")
        kept, self.rfile = self.rfile, io.BytesIO(raw)  # the stub reads the body again
        try:
            super().do_POST()
        finally:
            self.rfile = kept  # the connection's next request

    def _send(self, status: int, body: dict):
        request = getattr(self, "body", {})
        if status == 200 and body.get("choices") and request.get("return_token_ids"):
            choice = body["choices"][0]
            prompt = b"".join(map(render, request["messages"])) + HEAD
            completion = render(choice["message"])[len(HEAD):]
            body["prompt_token_ids"], choice["token_ids"] = list(prompt), list(completion)
            if choice.get("logprobs") is not None:
                choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": -0.5}
                                                  for t in completion]}
            body["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                             "total_tokens": len(prompt) + len(completion)}
        super()._send(status, body)


HEAD = b"<|assistant|>"


def render(message: dict) -> bytes:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = "".join(f"<call {c['function']['name']} "
                    f"{json.dumps(json.loads(c['function']['arguments']), sort_keys=True)}>"
                    for c in message.get("tool_calls") or [])
    return f"<|{message['role']}|>{content or ''}{calls}<|end|>".encode()


@pytest.fixture(scope="module")
def provider():
    with openai_stub.StubServer() as server:
        server.httpd.RequestHandlerClass = ConsistentTokens
        yield server


EPISODES: dict[str, tuple[dict, list[dict], float]] = {}


def episode_of(which: str, provider, tmp_path_factory, *, cached_only: bool) -> tuple[dict, list, float]:
    """One `vf-eval swe-gen` episode with agent `which`, run once per session (its checks are
    separate tests). Returns (episode record, the request bodies the provider received, seconds)."""
    ready_or_skip(which, cached_only=cached_only)
    if which in EPISODES:
        return EPISODES[which]
    out = tmp_path_factory.mktemp(which)
    _, script, extra = AGENTS[which]
    provider.requests.clear()
    openai_stub.Handler.script = script()
    started = time.monotonic()
    try:
        proc = run_cli("vf-eval", "swe-gen", "--taskset.seed", str(FIELDS["seed"]),
                       "--taskset.size", str(FIELDS["size"]), "--taskset.kinds", json.dumps(FIELDS["kinds"]),
                       "-m", "script", "--base-url", provider.url, "--api-key-var", "FAKE_KEY",
                       "-n", "1", "-r", "1", "-o", str(out / "run"), "--env.agent.harness.id", which, *extra,
                       env={"FAKE_KEY": "sk-provider"}, timeout=300)
    finally:
        openai_stub.Handler.script = []
    seconds = time.monotonic() - started
    requests = json.loads(json.dumps(provider.requests))
    (out / "requests.json").write_text(json.dumps(requests, indent=1))  # kept for a failure's reader
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (out / "run" / "traces.jsonl").read_text().splitlines()
    assert len(lines) == 1
    print(f"\nvf-eval swe-gen with {which}: {seconds:.1f} s, {len(requests)} provider calls ({out})")
    EPISODES[which] = json.loads(lines[0]), requests, seconds
    return EPISODES[which]


def vllm_errors(bodies: list[dict]) -> list[dict]:
    proc = subprocess.run([os.environ["VF_VLLM_PYTHON"], "-c", VLLM_CHECK], check=False,
                          input=json.dumps(bodies), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def raw_text(message: dict) -> str:
    """A recorded message's content and tool-call arguments, as the strings they are."""
    content = message.get("content")
    parts = [c.get("text", "") if isinstance(c, dict) else str(c)
             for c in (content if isinstance(content, list) else [content or ""])]
    parts += [str(c.get("arguments", (c.get("function") or {}).get("arguments", "")))
              for c in message.get("tool_calls") or []]
    return "\n".join(parts)


def check_bugfix_episode(episode: dict, requests: list[dict], which: str) -> dict:
    script = AGENTS[which][1]()
    (trace,) = episode["traces"]
    assert not episode["errors"] and not trace.get("errors"), (episode["errors"], trace.get("errors"))
    assert trace["stop_condition"] == "agent_completed", trace["stop_condition"]
    assert episode["task"]["data"]["prompt"] == PROMPT  # the task the script was written for
    # solved: the pristine visible test and the hidden tests pass on what the agent left
    assert trace["rewards"]["solved"]["score"] == 1.0, trace.get("info", {}).get("swe_mini")
    assert trace["metrics"]["visible_test"] == 1.0

    # every call reached the provider once, in order, and is recorded on the trace
    assert len(requests) == len(script) == len(trace["calls"]), (len(requests), len(trace["calls"]))
    turns = [sum(m.get("role") == "assistant" for m in r["messages"]) for r in requests]
    assert turns == list(range(len(script)))  # each request answered once, none resent
    assert json.dumps(PROMPT)[1:-1] in json.dumps(requests[0]["messages"])  # the task reached the policy
    nodes = trace["nodes"]
    assistants = [i for i, n in enumerate(nodes) if n["message"]["role"] == "assistant"]
    assert [c["node"] for c in trace["calls"]] == assistants
    assert not any(c.get("error") for c in trace["calls"])
    # what each command printed went back to the policy: the failure, then the passing test
    after = [json.dumps(r["messages"][-1]) for r in requests[1:]]
    assert "NameError" in after[0], after[0][:2000]
    assert "OK" in after[2] and "NameError" not in after[2], after[2][:2000]

    # one branch: one chain root -> leaf, every assistant reply on it, no new training sample
    parents = [n.get("parent") for n in nodes]
    assert parents == [None, *range(len(nodes) - 1)], parents
    assert all(nodes[i].get("token_ids") for i in assistants)  # token ids came back, so a reset would show
    resets = [i for i, n in enumerate(nodes) if n.get("token_reset")]
    assert not resets, resets
    for i, step in enumerate(STEPS):  # the agent's own calls, as the policy made them, in order
        assert step in raw_text(nodes[assistants[i]]["message"]), (step, nodes[assistants[i]]["message"])
    return trace


def default_agent() -> str:
    cached = ClaudeCodeHarness(ClaudeCodeConfig()).program.installed() is not None
    return "claude_code" if cached else "mini_swe_agent"


def check_valid_for_openai(requests: list[dict]) -> None:
    for body in requests:
        assert openai_errors(body) is None, (openai_errors(body), json.dumps(body)[:2000])


def check_valid_for_vllm(requests: list[dict]) -> None:
    for body, verdict in zip(requests, vllm_errors(requests), strict=True):
        assert verdict == {"error": None, "ignored": []}, (verdict, json.dumps(body)[:2000])


needs_vllm = pytest.mark.skipif(not os.environ.get("VF_VLLM_PYTHON"),
                                reason="set VF_VLLM_PYTHON to a python with vllm")


# ---- the default suite: one representative agent (Claude Code when cached), no network ---------

DEFAULT = default_agent()


@needs_bwrap
def test_a_real_agent_fixes_a_generated_bug_in_one_branch(provider, tmp_path_factory):
    episode, requests, seconds = episode_of(DEFAULT, provider, tmp_path_factory, cached_only=True)
    check_bugfix_episode(episode, requests, DEFAULT)
    assert seconds < 60


@needs_bwrap
@pytest.mark.parametrize("which", [DEFAULT])
def test_its_requests_are_valid_for_openai(provider, tmp_path_factory, which):
    check_valid_for_openai(episode_of(which, provider, tmp_path_factory, cached_only=True)[1])


@needs_bwrap
@needs_vllm
def test_its_requests_are_valid_for_vllm(provider, tmp_path_factory):
    check_valid_for_vllm(episode_of(DEFAULT, provider, tmp_path_factory, cached_only=True)[1])


# ---- every agent (pytest -m agents; installs what is not cached) -----------------------------------

@pytest.mark.agents
@needs_bwrap
@pytest.mark.parametrize("which", list(AGENTS))
def test_each_real_agent_fixes_a_generated_bug_in_one_branch(provider, tmp_path_factory, which):
    episode, requests, seconds = episode_of(which, provider, tmp_path_factory, cached_only=False)
    check_bugfix_episode(episode, requests, which)
    assert seconds < 60


@pytest.mark.agents
@needs_bwrap
@pytest.mark.parametrize("which", AGENTS)
def test_each_agents_requests_are_valid_for_openai(provider, tmp_path_factory, which):
    check_valid_for_openai(episode_of(which, provider, tmp_path_factory, cached_only=False)[1])


@pytest.mark.agents
@needs_bwrap
@needs_vllm
@pytest.mark.parametrize("which", list(AGENTS))
def test_each_agents_requests_are_valid_for_vllm(provider, tmp_path_factory, which):
    check_valid_for_vllm(episode_of(which, provider, tmp_path_factory, cached_only=False)[1])
