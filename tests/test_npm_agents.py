"""Claude Code and Codex (npm) run in vf's sandbox against a scripted policy, every call intercepted.

The agent is the real program from npm at its pinned version, installed once into the host's
agent cache (vf.harnesses.npm); a machine that has neither the install nor a reachable registry
skips with the reason. The episode is the whole path a user gets from `vf-eval`: the run's
interception server answers the agent in its own dialect (Anthropic Messages for Claude Code,
OpenAI Responses for Codex) from the seat's policy, here tests/openai_stub.py's `script` model,
which makes the agent run `echo hi > out.txt` with its own shell tool and then answer in words.
What is checked is what a broken harness would get wrong: the file the agent's command wrote (the
task's reward), both calls recorded on the trace, each reaching the policy once, the agent ending
on its own (the trace's `agent_completed`, exit 0), and the provider key nowhere in the run dir.

One Claude Code episode runs in the default suite when the install is already cached (no network
needed); everything else is marked `agents` (`pytest -m agents`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import openai_stub
from openai_stub import StubServer, tool_call
from test_agent_harnesses import HI_ENV, SECRET, needs_bwrap, socket_dir
from vf.clients import ModelContext
from vf.errors import HarnessError
from vf.harnesses.claude_code import ClaudeCodeConfig, ClaudeCodeHarness
from vf.harnesses.codex import CodexConfig, CodexHarness
from vf.harnesses.npm import NpmProgram
from vf.runtime import RuntimeConfig, make_runtime

OFFLINE_SIGNS = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ENETUNREACH", "network",
                 "needs Node.js")

CLAUDE_SCRIPT = [tool_call("Bash", {"command": "echo hi > out.txt", "description": "Write hi"}),
                 {"content": "I wrote hi into out.txt."}]
CODEX_SCRIPT = [tool_call("exec_command", {"cmd": "echo hi > out.txt"}),
                {"content": "I wrote hi into out.txt."}]


def installed_or_skip(harness, *, cached_only: bool = False) -> dict:
    """Install the harness's program (cached); skip when this machine cannot (no registry, no
    node), or, with `cached_only`, when it is not installed yet (the default suite takes no network)."""
    program: NpmProgram = harness.program
    if cached_only and program.installed() is None:
        pytest.skip(f"{program.name}@{program.version} is not in the agent cache ({program.dir}); "
                    "the default suite does not download it: run `pytest -m agents` once")
    started = time.monotonic()
    try:
        marker = program.ensure()
    except HarnessError as e:
        if any(sign in str(e) for sign in OFFLINE_SIGNS):
            pytest.skip(f"cannot install {program.name}@{program.version}: {str(e)[-300:]}")
        raise
    print(f"\n{program.name}: ready in {time.monotonic() - started:.1f} s (install took {marker['seconds']} s, "
          f"reports {marker['reports']!r}) at {program.dir}")
    return marker


def vf_eval(cli, stub, tmp_path: Path, harness_id: str, script: list, *extra: str):
    """One vf-eval episode of the hi task with `harness_id`. Returns (process, episode record, seconds)."""
    (tmp_path / "hi_env.py").write_text(HI_ENV)
    stub.requests.clear()
    openai_stub.Handler.script = script
    started = time.monotonic()
    try:
        proc = cli("vf-eval", str(tmp_path / "hi_env.py"), "-m", "script", "--base-url", stub.url,
                   "--api-key-var", "FAKE_KEY", "-n", "1", "-r", "1", "-o", str(tmp_path / "run"),
                   "--env.agent.harness.id", harness_id, *extra,
                   env={"FAKE_KEY": "sk-provider"}, timeout=300)
    finally:
        openai_stub.Handler.script = []
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    episode = json.loads((tmp_path / "run" / "traces.jsonl").read_text().splitlines()[0])
    print(f"\nvf-eval {harness_id}: {seconds:.1f} s, {len(stub.requests)} policy calls")
    return proc, episode, seconds


def check_hi_trace(episode: dict, stub, tmp_path: Path) -> dict:
    trace = episode["traces"][0]
    assert trace["stop_condition"] == "agent_completed" and not episode["errors"], episode["errors"]
    assert trace["rewards"]["wrote_hi"]["score"] == 1.0  # the agent's own command wrote the file
    assert len(trace["calls"]) == 2 and len(stub.requests) == 2  # each call recorded, answered once
    roles = [n["message"]["role"] for n in trace["nodes"]]
    assert roles[-3:] == ["assistant", "tool", "assistant"] and "user" in roles
    tool_result = [n["message"] for n in trace["nodes"] if n["message"]["role"] == "tool"][0]
    assert "Write hi into out.txt." in json.dumps(stub.requests[0]["messages"])
    # the tool result the agent sent back answers the scripted call, by its id
    assert tool_result["tool_call_id"] == stub.requests[1]["messages"][-1]["tool_call_id"]
    run_text = "".join(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert "sk-provider" not in run_text
    return trace


# ---- the default suite: one Claude Code episode, when the install is cached ---------------------

@needs_bwrap
def test_vf_eval_runs_claude_code_in_the_offline_sandbox(stub, tmp_path, cli):
    installed_or_skip(ClaudeCodeHarness(ClaudeCodeConfig()), cached_only=True)
    _, episode, _ = vf_eval(cli, stub, tmp_path, "claude_code", CLAUDE_SCRIPT)
    check_hi_trace(episode, stub, tmp_path)
    tools = [t["function"]["name"] for t in stub.requests[0]["tools"]]
    assert "Bash" in tools  # Claude Code's own tool set reached the policy through the dialect


# ---- the full matrix (pytest -m agents) ---------------------------------------------------------

@pytest.mark.agents
@needs_bwrap
def test_vf_eval_runs_codex_in_the_offline_sandbox(stub, tmp_path, cli):
    installed_or_skip(CodexHarness(CodexConfig()))
    _, episode, _ = vf_eval(cli, stub, tmp_path, "codex", CODEX_SCRIPT)
    check_hi_trace(episode, stub, tmp_path)
    tools = [t["function"]["name"] for t in stub.requests[0]["tools"]]
    assert "exec_command" in tools
