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
import concurrent.futures
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import openai_stub
import pytest
from openai_stub import tool_call
from test_agent_harnesses import HI_ENV, needs_bwrap

from vf.clients import ModelContext
from vf.dialects import DIALECTS, DialectError
from vf.episode.harnesses import harness_class
from vf.errors import HarnessError
from vf.harnesses import npm
from vf.harnesses.claude_code import ClaudeCodeConfig, ClaudeCodeHarness
from vf.harnesses.codex import CodexConfig, CodexHarness
from vf.harnesses.npm import NpmProgram
from vf.interception.server import InterceptionServer
from vf.runtime import RuntimeConfig, make_runtime
from vf.types import AssistantMessage, Response, ToolCall, Usage

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
    tool_result = next(n["message"] for n in trace["nodes"] if n["message"]["role"] == "tool")
    assert "Write hi into out.txt." in json.dumps(stub.requests[0]["messages"])  # the prompt arrived
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


@pytest.mark.agents
@needs_bwrap
@pytest.mark.parametrize("which", ["claude_code", "codex"])
def test_the_rollouts_turn_cap_ends_the_agent_at_once(stub, tmp_path, cli, which):
    """Past the seat's `max_turns` the interception answers 400: the agent stops (no retry loop),
    the trace says why, and the calls before the cap are all recorded."""
    harness = ClaudeCodeHarness(ClaudeCodeConfig()) if which == "claude_code" else CodexHarness(CodexConfig())
    installed_or_skip(harness)
    loop = ([tool_call("Bash", {"command": "echo step >> steps.txt"})] if which == "claude_code"
            else [tool_call("exec_command", {"cmd": "echo step >> steps.txt"})])
    _, episode, seconds = vf_eval(cli, stub, tmp_path, which, loop, "--env.agent.max_turns", "2")
    trace = episode["traces"][0]
    assert trace["stop_condition"] == "max_turns" and not episode["errors"], (trace["stop_condition"], episode["errors"])
    assert len(trace["calls"]) == 2 and len(stub.requests) == 2
    assert seconds < 60


@pytest.mark.agents
@needs_bwrap
def test_claude_codes_own_turn_limit_ends_the_rollout_without_an_error(stub, tmp_path, cli):
    installed_or_skip(ClaudeCodeHarness(ClaudeCodeConfig()))
    _, episode, _ = vf_eval(cli, stub, tmp_path, "claude_code", [tool_call("Bash", {"command": "echo step >> steps.txt"})],
                            "--env.agent.harness.max_turns", "2")
    trace = episode["traces"][0]
    assert trace["stop_condition"] == "agent_completed" and not episode["errors"], episode["errors"]
    assert len(trace["calls"]) == 2 and len(stub.requests) == 2


# ---- episodes driven directly: the run's interception server and a scripted handler -------------

def reply(call_index: int, script: list[dict]) -> Response:
    step = script[min(call_index, len(script) - 1)]
    calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
             for c in step.get("tool_calls") or []]
    return Response(id=f"r{call_index}", created=0, model="script",
                    message=AssistantMessage(content=step.get("content") or None, tool_calls=calls or None),
                    finish_reason="tool_calls" if calls else "stop", usage=Usage(prompt_tokens=1, completion_tokens=1))


async def direct_episode(harness, script: list[dict], runtime_config: RuntimeConfig, *, wrong_key: bool = False):
    """The agent in `runtime_config` against vf's interception server, each call answered by
    `script` (the Nth reply for a call with N assistant turns). Returns what a check needs."""
    calls = []

    async def handler(call):
        calls.append(call)
        return reply(sum(1 for m in call.request.messages if m.role == "assistant"), script)

    sock_dir = tempfile.mkdtemp(prefix="vf-npm-sock-")
    os.chmod(sock_dir, 0o755)
    server = InterceptionServer(socket_dir=Path(sock_dir))
    await server.start()
    try:
        for entry in os.scandir(sock_dir):
            os.chmod(entry.path, 0o666)
        registration = server.register(handler)
        async with make_runtime(runtime_config) as rt:
            endpoint = rt.model_endpoint(registration.url, registration.socket)
            await harness.setup(rt)
            started = time.monotonic()
            result = await harness.launch(ModelContext(model="script"), None, rt, endpoint,
                                          "sk-wrong" if wrong_key else registration.secret, {},
                                          SimpleNamespace(prompt=PROMPT, system_prompt=None))
            seconds = time.monotonic() - started
            files = {str(p.relative_to(rt.workdir)): p.read_bytes() for p in rt.workdir.rglob("*")
                     if p.is_file() and not p.is_symlink()}
        print(f"\n{harness.config.id}: {seconds:.1f} s, {len(calls)} calls, exit {result.exit_code}")
        return SimpleNamespace(result=result, calls=calls, files=files, seconds=seconds,
                               secret=registration.secret)
    finally:
        await server.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


PROMPT = "--help is not a flag here: write hi into out.txt."
"""Starts with a dash: the program must take it as the prompt (on stdin), not as an option."""

NET_PROBE = ("python3 -c \"import socket; s=socket.socket(); s.settimeout(3); "
             "print(s.connect_ex(('1.1.1.1', 443)))\" > net.txt 2>&1")


@pytest.mark.agents
@needs_bwrap
@pytest.mark.parametrize("which", ["claude_code", "codex"])
def test_the_agent_cannot_reach_the_network_in_the_sandbox(which):
    """Offline: the agent's own commands reach nothing but the bridged model endpoint."""
    harness, script = ((ClaudeCodeHarness(ClaudeCodeConfig()), [tool_call("Bash", {"command": NET_PROBE})])
                       if which == "claude_code" else
                       (CodexHarness(CodexConfig()), [tool_call("exec_command", {"cmd": NET_PROBE})]))
    installed_or_skip(harness)
    ep = asyncio.run(direct_episode(harness, [*script, {"content": "done"}], RuntimeConfig(type="sandbox")))
    assert ep.result.exit_code == 0 and len(ep.calls) == 2, ep.result.stderr[-2000:]
    assert ep.files["net.txt"].strip() not in (b"0", b"")  # ENETUNREACH, not a connection
    assert all(ep.secret.encode() not in data for data in ep.files.values())  # the key is in no file


@pytest.mark.agents
@needs_bwrap
@pytest.mark.parametrize("which", ["claude_code", "codex"])
def test_a_wrong_key_fails_fast_and_runs_nothing(which):
    harness, script = ((ClaudeCodeHarness(ClaudeCodeConfig()), CLAUDE_SCRIPT) if which == "claude_code"
                       else (CodexHarness(CodexConfig()), CODEX_SCRIPT))
    installed_or_skip(harness)
    ep = asyncio.run(direct_episode(harness, script, RuntimeConfig(type="sandbox"), wrong_key=True))
    assert ep.result.exit_code != 0 and not ep.calls  # the server refused it (401); no policy call
    assert "out.txt" not in ep.files
    assert ep.seconds < 30  # an auth failure is not retried for minutes


@pytest.mark.agents
@needs_bwrap
def test_claude_code_stops_at_its_turn_limit():
    harness = ClaudeCodeHarness(ClaudeCodeConfig(max_turns=2))
    installed_or_skip(harness)
    ep = asyncio.run(direct_episode(harness, [tool_call("Bash", {"command": "echo step >> steps.txt"})],
                                    RuntimeConfig(type="sandbox")))
    assert len(ep.calls) == 2 and ep.files["steps.txt"] == b"step\n" * 2
    summary = ClaudeCodeHarness.result(ep.result)
    assert summary["subtype"] == "error_max_turns" and summary["num_turns"] >= 2


@pytest.mark.agents
@needs_bwrap
def test_claude_code_reports_its_own_result():
    harness = ClaudeCodeHarness(ClaudeCodeConfig())
    installed_or_skip(harness)
    ep = asyncio.run(direct_episode(harness, CLAUDE_SCRIPT, RuntimeConfig(type="sandbox")))
    assert ep.result.exit_code == 0 and ep.files["out.txt"] == b"hi\n"
    summary = ClaudeCodeHarness.result(ep.result)
    assert summary["is_error"] is False and summary["result"] == "I wrote hi into out.txt."
    first = ep.calls[0]
    assert first.dialect == "anthropic" and first.stream  # Claude Code streams /v1/messages
    assert [m.role for m in ep.calls[1].request.messages][-2:] == ["assistant", "tool"]
    assert PROMPT in json.dumps([m.model_dump() for m in first.request.messages])


@pytest.mark.agents
def test_codex_episode_on_the_host():
    harness = CodexHarness(CodexConfig())
    installed_or_skip(harness)
    ep = asyncio.run(direct_episode(harness, CODEX_SCRIPT, RuntimeConfig(type="subprocess")))
    assert ep.result.exit_code == 0 and ep.files["out.txt"] == b"hi\n", ep.result.stderr[-2000:]
    assert [c.dialect for c in ep.calls] == ["responses", "responses"] and ep.calls[0].stream
    assert ep.calls[1].request.messages[-1].role == "tool"
    assert PROMPT in json.dumps([m.model_dump() for m in ep.calls[0].request.messages])


# ---- what each harness hands its program (no install needed) ------------------------------------

def test_harness_ids_resolve_to_the_npm_agents():
    assert harness_class("claude_code") is ClaudeCodeHarness and harness_class("claude-code") is ClaudeCodeHarness
    assert harness_class("codex") is CodexHarness
    with pytest.raises(ValueError):
        CodexConfig(version="^0.171")  # a range is not a pin: the cache is keyed by version
    assert ClaudeCodeHarness(ClaudeCodeConfig(version="2.1.300")).program.packages == (
        "@anthropic-ai/claude-code@2.1.300",)


class _RecordingRuntime:
    """Stands for a runtime: records what the harness runs and writes."""

    def __init__(self, workdir: Path):
        self.workdir, self.written, self.ran = workdir, {}, []

    async def write(self, path, data):
        self.written[path] = data

    async def run(self, argv, env, **kw):
        self.ran.append((argv, env, kw))
        return SimpleNamespace(exit_code=0, stdout="", stderr="")


def test_claude_code_gets_the_endpoint_without_v1_and_the_key_only_in_its_environment(tmp_path):
    rt = _RecordingRuntime(tmp_path)
    harness = ClaudeCodeHarness(ClaudeCodeConfig(max_turns=3))
    data = SimpleNamespace(prompt="-- Fix the bug.", system_prompt="Be terse.")
    asyncio.run(harness.launch(ModelContext(model="policy"), None, rt, "http://127.0.0.1:47821/v1", "sk-r", {}, data))
    (argv, env, kw), = rt.ran
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:47821"  # Claude Code appends /v1/messages
    assert env["ANTHROPIC_API_KEY"] == "sk-r" and "sk-r" not in argv
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "0"  # vf retries the policy; a dead rollout's 400 is final
    assert env["CLAUDE_CONFIG_DIR"] == env["HOME"] == f"{tmp_path}/.vf-claude"
    assert kw["input"] == "-- Fix the bug." and "-- Fix the bug." not in argv  # on stdin: never read as a flag
    assert "--append-system-prompt=Be terse." in argv  # not folded into the prompt
    assert argv[argv.index("--permission-mode") + 1] == "bypassPermissions"
    assert argv[argv.index("--max-turns") + 1] == "3"


def test_codex_gets_a_responses_provider_and_the_key_only_in_its_environment(tmp_path):
    rt = _RecordingRuntime(tmp_path)
    harness = CodexHarness(CodexConfig())
    data = SimpleNamespace(prompt="-- Fix the bug.", system_prompt="Be terse.")
    asyncio.run(harness.launch(ModelContext(model='po"licy'), None, rt, "http://127.0.0.1:47821/v1", "sk-r", {}, data))
    (argv, env, kw), = rt.ran
    config = tomllib.loads(rt.written[".vf-codex/config.toml"])
    assert config["model"] == 'po"licy' and config["model_provider"] == "vf"  # quoting survives
    provider = config["model_providers"]["vf"]
    assert provider["base_url"] == "http://127.0.0.1:47821/v1" and provider["wire_api"] == "responses"
    assert env[provider["env_key"]] == "sk-r"
    assert "sk-r" not in rt.written[".vf-codex/config.toml"] and "sk-r" not in argv
    assert env["CODEX_HOME"] == f"{tmp_path}/.vf-codex"
    assert argv[-1] == "-" and kw["input"] == "Be terse.\n\n-- Fix the bug."  # on stdin; no separate system prompt
    assert {"--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check", "--ephemeral"} <= set(argv)


CLAUDE_CODE_BODY = {
    "model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "You are Claude Code."}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Write hi."}]},
                 {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                 {"role": "assistant", "content": "ok"}, {"role": "system", "content": "note"}]}
VERIFIERS_READS = [{"role": "system", "content": "You are Claude Code."}, {"role": "user", "content": "Write hi."},
                   {"role": "user", "content": "# Environment"}, {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": "note"}]
"""verifiers 0.4.0's `dialects.anthropic.parse_messages(CLAUDE_CODE_BODY)` (exclude_none dumps)."""


def test_the_anthropic_dialect_reads_claude_codes_system_turns_as_verifiers_does():
    """Claude Code 2.1.3xx sends its environment as a `system` turn after the first user turn (a
    dialect that refuses it fails every Claude Code call with 400). verifiers reads it as a user
    message, so the one system message stays first (chat templates such as Qwen's refuse a system
    message after the first turn); any other role is refused."""
    dialect = DIALECTS["anthropic"]
    messages = dialect.parse_object(CLAUDE_CODE_BODY).request.messages
    assert [m.model_dump(exclude_none=True) for m in messages] == VERIFIERS_READS
    for role in ("tool", "developer", None, ["user"]):
        with pytest.raises(DialectError, match="role must be"):
            dialect.parse_object({**CLAUDE_CODE_BODY, "messages": [{"role": role, "content": "x"}]})


@pytest.mark.skipif(not os.environ.get("VF_VERIFIERS_PYTHON"), reason="set VF_VERIFIERS_PYTHON to verifiers 0.4.0's python")
def test_verifiers_still_reads_claude_codes_system_turns_that_way():
    code = ("import json, sys\nfrom verifiers.v1.dialects.anthropic import parse_messages\n"
            "print(json.dumps([m.model_dump(exclude_none=True) for m in parse_messages(json.loads(sys.argv[1]))]))")
    proc = subprocess.run([os.environ["VF_VERIFIERS_PYTHON"], "-c", code, json.dumps(CLAUDE_CODE_BODY)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == VERIFIERS_READS


# ---- the npm install cache: once, under a lock, world-readable, failures leave nothing ----------

needs_npm = pytest.mark.skipif(shutil.which("npm") is None or not os.path.exists(npm.NODE),
                               reason=f"node ({npm.NODE}) and npm are not installed")


def tiny_package(folder: Path, version: str = "1.0.0", exit_code: int = 0) -> Path:
    """A one-file npm package tarball made by hand (no registry): its bin prints its version."""
    path = folder / f"vf-tiny-agent-{version}.tgz"
    files = {"package/package.json": json.dumps({"name": "vf-tiny-agent", "version": version,
                                                 "bin": {"vf-tiny": "cli.js"}}),
             "package/cli.js": f"#!/usr/bin/env node\nconsole.log('tiny {version}');\nprocess.exit({exit_code});\n"}
    return package_tarball(path, files)


def package_tarball(path: Path, files: dict[str, str]) -> Path:
    """`files` ({"package/NAME": text}) as an npm package tarball at `path` (.js files executable)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text.encode()), 0o755 if name.endswith(".js") else 0o644
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


@pytest.fixture
def offline_npm(monkeypatch, tmp_path):
    monkeypatch.setenv("npm_config_offline", "true")  # these tests never ask a registry
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))


@needs_npm
def test_concurrent_npm_installs_make_one(tmp_path, monkeypatch, offline_npm):
    runs = []
    real_run = npm.subprocess.run

    def counting_run(argv, **kw):
        runs.append(argv)
        return real_run(argv, **kw)

    monkeypatch.setattr(npm.subprocess, "run", counting_run)
    program = NpmProgram("tiny", "1.0.0", (str(tiny_package(tmp_path)),), "vf-tiny", root=tmp_path / "cache")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        markers = list(pool.map(lambda _: program.ensure(), range(4)))
    assert len(runs) == 2  # one npm install and one --version check, for four concurrent callers
    assert len({m["installed_at"] for m in markers}) == 1 and markers[0]["reports"] == "tiny 1.0.0"
    for path in (program.dir, *program.dir.rglob("*")):  # the sandbox's nobody reads and runs it
        if not path.is_symlink():
            mode = path.stat().st_mode
            assert mode & stat.S_IROTH and not mode & (stat.S_IWOTH | stat.S_IWGRP), path
            if path.is_dir() or path.name == "cli.js":
                assert mode & stat.S_IXOTH, path
    assert NpmProgram("tiny", "1.0.0", (str(tiny_package(tmp_path)),), "vf-tiny",
                      root=tmp_path / "cache").ensure() == markers[0]
    assert len(runs) == 2  # a later run finds it installed and runs nothing


@needs_npm
def test_an_unfinished_npm_install_is_made_again(tmp_path, offline_npm):
    program = NpmProgram("tiny", "1.0.0", (str(tiny_package(tmp_path)),), "vf-tiny", root=tmp_path / "cache")
    (program.dir / "node_modules").mkdir(parents=True)
    (program.dir / "node_modules" / "half-written").write_text("a crash mid-install")
    assert program.ensure()["reports"] == "tiny 1.0.0"
    assert not (program.dir / "node_modules" / "half-written").exists()


@needs_npm
def test_a_failed_npm_install_says_why_and_leaves_nothing(tmp_path, offline_npm):
    program = NpmProgram("nothere", "9.9.9", ("vf-no-such-package-anywhere@9.9.9",), "nothere",
                         root=tmp_path / "cache")
    with pytest.raises(HarnessError) as e:
        program.ensure()
    assert "nothere@9.9.9" in str(e.value) and "vf-no-such-package-anywhere" in str(e.value)
    assert not program.dir.exists() and program.installed() is None


@needs_npm
def test_an_install_whose_program_does_not_run_is_not_kept(tmp_path, offline_npm):
    """A placeholder binary (a skipped postinstall) fails at install, not in every rollout."""
    program = NpmProgram("broken", "1.0.0", (str(tiny_package(tmp_path, exit_code=3)),), "vf-tiny",
                         root=tmp_path / "cache")
    with pytest.raises(HarnessError) as e:
        program.ensure()
    assert "running broken@1.0.0" in str(e.value) and "exited 3" in str(e.value)
    assert not program.dir.exists()


def test_a_missing_node_is_named(tmp_path):
    program = NpmProgram("x", "1.0.0", ("x@1.0.0",), "x", node=str(tmp_path / "no-node"), root=tmp_path / "c")
    with pytest.raises(HarnessError, match="needs Node.js"):
        program.ensure()
