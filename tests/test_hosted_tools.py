"""Agents connect cleanly: provider-hosted tools (Codex's `web_search`, Anthropic's server tools)
never reach the policy's Chat Completions request (vf.dialects.hosted), the harness's disabled
tools are withheld, and an agent that re-sends its earlier calls re-serialised (Claude Code's
`Edit` with `replace_all: false` added, keys reordered) keeps one branch (vf.dialects.tool_args).

The end-to-end tests run a real agent program (tests/program_envs/dialect_agent.py) through a
real `vf-eval` run: the interception server, the rollout, and the scripted OpenAI stub on
loopback standing in for the provider."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import openai
import pytest
from openai_stub import StubServer, tool_call

from vf.dialects import DIALECTS, DialectError
from vf.interception.server import InterceptionServer
from vf.trace import Episode
from vf.types import AssistantMessage, Response

HERE = Path(__file__).parent
ENV = HERE / "program_envs" / "dialect_agent.py"
EDIT_ARGS = {"file_path": "/w/a.py", "old_string": "x = 1", "new_string": "x = 2"}
SCRIPT = [tool_call("Edit", EDIT_ARGS, call_id="toolu_01"), {"content": "done"}]


def parse(dialect: str, body: dict):
    return DIALECTS[dialect].parse(json.dumps({"model": "m", **body}).encode())


# --- parsing: what is dropped, kept, translated ---------------------------------------------------

def test_codex_web_search_and_other_hosted_responses_tools_are_dropped_and_recorded():
    hosted = [{"type": "web_search", "external_web_access": False}, {"type": "web_search_preview"},
              {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "code_interpreter", "container": "x"},
              {"type": "image_generation"}, {"type": "mcp", "server_label": "s", "server_url": "https://x"},
              {"type": "local_shell"}]
    call = parse("responses", {"input": "hi", "tools": [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}}, *hosted,
        {"type": "namespace", "name": "fs", "tools": [{"type": "function", "name": "read"}]},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}]})
    assert [(t.type, t.name) for t in call.request.tools] == [("function", "shell"), ("function", "read"),
                                                               ("function", "apply_patch")]
    assert call.custom_tools == ["apply_patch"]
    assert [d["type"] for d in call.dropped_tools] == [t["type"] for t in hosted]
    assert all(d["reason"] == "hosted" and set(d) == {"type", "name", "reason"} for d in call.dropped_tools)
    only_hosted = parse("responses", {"input": "hi", "tools": [{"type": "web_search"}]})
    assert only_hosted.request.tools is None and only_hosted.dropped_tools[0]["name"] == "web_search"


def test_anthropic_server_tools_are_dropped_and_its_client_tools_translated():
    call = parse("anthropic", {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"name": "Edit", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}},
        {"type": "custom", "name": "Mine", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        {"type": "web_fetch_20250910", "name": "web_fetch"},
        {"type": "code_execution_20250522", "name": "code_execution"},
        {"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]})
    tools = {t.name: t for t in call.request.tools}
    assert list(tools) == ["Edit", "Mine", "bash", "str_replace_based_edit_tool"]
    assert all(t.type == "function" for t in tools.values())
    assert tools["bash"].parameters["properties"]["command"] == {"type": "string",
                                                                 "description": "The bash command to run."}
    assert tools["str_replace_based_edit_tool"].parameters["required"] == ["command", "path"]
    assert "max_uses" not in tools["bash"].model_dump()  # a server tool's options are not carried
    assert [(d["name"], d["reason"]) for d in call.dropped_tools] == [
        ("web_search", "hosted"), ("web_fetch", "hosted"), ("code_execution", "hosted"), ("computer", "hosted")]


def test_a_chat_request_keeps_its_functions_and_loses_anything_else():
    call = parse("chat", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"type": "web_search"}, {"type": "retrieval"}]})
    assert [t.name for t in call.request.tools] == ["f"]
    assert [d["type"] for d in call.dropped_tools] == ["web_search", "retrieval"]
    assert parse("chat", {"messages": [{"role": "user", "content": "hi"}]}).dropped_tools == []
    with pytest.raises(DialectError):  # a malformed tool is still refused, hosted or not
        parse("responses", {"input": "hi", "tools": [{"type": 3}]})


# --- the server: disabled tools withheld per rollout ------------------------------------------------

def test_the_harness_disabled_tools_are_withheld_from_the_policy_through_a_real_server():
    seen = []

    async def handler(call):
        seen.append(call)
        return Response(id="r1", created=0, model="m", message=AssistantMessage(content="hi"))

    async def main():
        async with InterceptionServer() as server:
            withheld = server.register(handler)
            server.disable_tools(withheld.secret, ["web_search", "Write"])
            plain = server.register(handler)
            tools = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("Read", "Write")]
            for registration in (withheld, plain):
                client = openai.AsyncOpenAI(base_url=registration.url, api_key=registration.secret, max_retries=0)
                reply = await client.responses.create(model="m", input="hi",
                                                      tools=[*tools, {"type": "web_search"}])
                assert reply.output_text == "hi"
                await client.close()

    asyncio.run(main())
    assert [t.name for t in seen[0].request.tools] == ["Read"]
    assert seen[0].dropped_tools == [{"type": "web_search", "name": "web_search", "reason": "hosted"},
                                     {"type": "function", "name": "Write", "reason": "disabled"}]
    assert [t.name for t in seen[1].request.tools] == ["Read", "Write"]
    assert seen[1].dropped_tools == [{"type": "web_search", "name": "web_search", "reason": "hosted"}]


def test_a_custom_tool_is_offered_as_a_function_and_its_calls_go_back_as_custom_calls():
    """Codex's free-form `apply_patch`: vLLM takes no custom tool, so the policy sees a function
    with one `input` string; the agent gets custom calls back, and its history is sent as the
    function calls the policy made (so it matches the trace)."""
    patch = "*** Begin Patch\n*** Add File: a.py\n+x = 2\n*** End Patch"
    seen = []

    async def handler(call):
        seen.append(call)
        calls = [{"id": "call_1", "name": "apply_patch", "arguments": json.dumps({"input": patch})},
                 {"id": "call_2", "name": "shell", "arguments": '{"command": ["ls"]}'},
                 {"id": "call_3", "name": "apply_patch", "arguments": "not json"}]
        return Response(id="r1", created=0, model="m", message=AssistantMessage(tool_calls=calls))

    async def main():
        async with InterceptionServer() as server:
            registration = server.register(handler)
            client = openai.AsyncOpenAI(base_url=registration.url, api_key=registration.secret, max_retries=0)
            tools = [{"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
                      "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}},
                     {"type": "function", "name": "shell", "parameters": {"type": "object"}}]
            history = [{"role": "user", "content": "fix it"},
                       {"type": "custom_tool_call", "call_id": "call_0", "name": "apply_patch", "input": patch},
                       {"type": "custom_tool_call_output", "call_id": "call_0", "output": "Done"}]
            reply = await client.responses.create(model="m", input=history, tools=tools)
            chat = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "fix it"}],
                tools=[{"type": "custom", "custom": {"name": "apply_patch"}}])
            await client.close()
            return reply, chat

    reply, chat = asyncio.run(main())
    offered = seen[0].request.tools[0]
    assert (offered.type, offered.name) == ("function", "apply_patch")
    assert offered.parameters["properties"] == {"input": {"type": "string", "description": "The tool's input."}}
    assert "start: begin_patch" in offered.description and "lark" in offered.description
    earlier = seen[0].request.messages[1].tool_calls[0]
    assert earlier.type == "function" and json.loads(earlier.arguments) == {"input": patch}
    kinds = [(o.type, getattr(o, "input", None) or getattr(o, "arguments", None)) for o in reply.output]
    assert kinds == [("custom_tool_call", patch), ("function_call", '{"command": ["ls"]}'),
                     ("function_call", "not json")]  # a malformed call is left for the agent to refuse
    calls = chat.choices[0].message.tool_calls
    assert calls[0].type == "custom" and calls[0].custom.input == patch and calls[1].type == "function"


# --- end to end: a real agent program through a real run -------------------------------------------

@pytest.fixture(scope="module")
def provider():
    with StubServer(script=SCRIPT) as server:
        yield server


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")


def run_agent(tmp_path: Path, url: str, dialect: str, model: str = "script", **harness) -> Episode:
    from vf.evaluate import execute, open_run, resolve_config

    over = {"taskset": {"id": str(ENV)}, "model": model,
            "engine": {"base_url": url, "api_key_var": "FAKE_KEY"},
            "env": {"agent": {"harness": {"id": f"{ENV}:DialectAgent", "dialect": dialect, **harness},
                              "runtime": {"type": "subprocess"}}}}
    out = tmp_path / dialect
    shutil.rmtree(out, ignore_errors=True)
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(out), None)
    execute(config, run, kept)
    return Episode.model_validate_json((out / "traces.jsonl").read_text().splitlines()[0])


@pytest.mark.parametrize("dialect", ["responses", "anthropic"])
def test_hosted_tools_never_reach_the_provider(provider, tmp_path, dialect):
    before = len(provider.requests)
    trace = run_agent(tmp_path, provider.url, dialect).traces[0]
    assert not trace.errors, trace.errors
    sent = provider.requests[before:]
    assert len(sent) == 2 and len(trace.calls) == 2
    for body in sent:  # every tool the provider was offered is a function tool; Edit among them
        assert {t["type"] for t in body["tools"]} == {"function"}
        assert "Edit" in [t["function"]["name"] for t in body["tools"]]
        assert "web_search" not in json.dumps(body["tools"])


def test_the_trace_records_the_tools_the_agent_offered_and_vf_dropped(provider, tmp_path):
    trace = run_agent(tmp_path, provider.url, "anthropic").traces[0]
    assert trace.info["dropped_tools"] == [{"type": "web_search_20250305", "name": "web_search", "reason": "hosted"}]


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
def test_an_agent_resending_its_calls_reserialised_keeps_one_branch(provider, tmp_path, dialect):
    trace = run_agent(tmp_path, provider.url, dialect).traces[0]
    assert not trace.errors, trace.errors
    roles = [n.message["role"] for n in trace.nodes]
    assert roles == ["system", "user", "assistant", "tool", "assistant"], roles
    assert [n.parent for n in trace.nodes] == [None, 0, 1, 2, 3]  # one branch: the second call extended it
    assert not any(getattr(n, "token_reset", None) for n in trace.nodes)  # no new training sample
    # the trace keeps the policy's own arguments (what it sampled), not the agent's re-serialisation
    assert json.loads(trace.nodes[2].message["tool_calls"][0]["function"]["arguments"]) == EDIT_ARGS


def test_the_harness_disabled_tools_never_reach_the_provider(provider, tmp_path):
    before = len(provider.requests)
    trace = run_agent(tmp_path, provider.url, "anthropic", disabled_tools=["bash"]).traces[0]
    assert not trace.errors, trace.errors
    for body in provider.requests[before:]:
        assert [t["function"]["name"] for t in body["tools"]] == ["Edit"]


def hang_up_and_retry(tmp_path: Path):
    """The agent's first call times out on its side (the provider takes 2s, the agent waits 0.5s),
    and it sends the call again."""
    with StubServer() as slow:
        return run_agent(tmp_path, slow.url, "chat", client_timeout=0.5, model="slow-2").traces[0]


def test_an_agent_that_hangs_up_and_retries_leaves_one_reply_and_one_branch(tmp_path):
    trace = hang_up_and_retry(tmp_path)
    assert not trace.errors, trace.errors
    # the abandoned call's generation was cancelled: no reply of it on the trace, so the retry
    # extends the one branch instead of forking off the reply the agent never saw
    assert [n.message["role"] for n in trace.nodes] == ["system", "user", "assistant"]
    assert [n.parent for n in trace.nodes] == [None, 0, 1]
    assert [c.node for c in trace.calls if c.node is not None] == [2]
    assert not any(getattr(n, "token_reset", None) for n in trace.nodes)


def test_the_trace_marks_the_call_its_agent_abandoned(tmp_path):
    trace = hang_up_and_retry(tmp_path)
    assert trace.info["abandoned_calls"] == 1
    assert [c.error.type if c.error else None for c in trace.calls] == ["Abandoned", None]
