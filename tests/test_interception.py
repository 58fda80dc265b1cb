"""The interception server on real loopback sockets, called by the real `openai` and `anthropic` SDKs
in all three dialects, and by hostile raw HTTP (wrong keys, malformed bodies, floods, failing policies)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from vf.dialects import DIALECTS, Call, DialectError
from vf.interception import InterceptionConfig, InterceptionServer, registration_env
from vf.types import (
    AssistantMessage,
    ImageUrlContentPart,
    Response,
    SystemMessage,
    TextContentPart,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
    content_text,
)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M/wHwAF/gL+Xw4AAAAASUVORK5CYII="
DATA_URL = f"data:image/png;base64,{PNG}"
MAX_INFLIGHT = 2
ADD_TOOL = {"name": "add", "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "required": ["a", "b"]}}


def reply(text: str | None = None, calls: list[ToolCall] | None = None, finish=None, usage=(11, 5)) -> Response:
    return Response(id="resp-1", created=1700000000, model="policy-model",
                    message=AssistantMessage(content=text, tool_calls=calls),
                    finish_reason=finish or ("tool_calls" if calls else "stop"),
                    usage=Usage(prompt_tokens=usage[0], completion_tokens=usage[1]))


class Scripted:
    """A handler that records every call and answers from a script (a Response, or a function of the call)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls: list[Call] = []

    async def __call__(self, call: Call) -> Response:
        self.calls.append(call)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return answer(call) if callable(answer) else answer


class Running:
    """An InterceptionServer on its own event loop in a thread, so the synchronous SDK clients of
    the test thread talk to it over real sockets."""

    def __init__(self, config: InterceptionConfig, socket_dir=None):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = InterceptionServer(config, socket_dir=socket_dir)
        self.run(self.server.start())

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def register(self, handler):
        async def reg():
            return self.server.register(handler)
        return self.run(reg())

    def unregister(self, secret: str) -> None:
        async def unreg():
            self.server.unregister(secret)
        self.run(unreg())

    def close(self) -> None:
        self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    r = Running(InterceptionConfig(max_body_mb=1, max_inflight_per_rollout=MAX_INFLIGHT, request_timeout=5),
                socket_dir=tmp_path_factory.mktemp("sock"))
    yield r
    r.close()


def oai(reg) -> openai.OpenAI:
    return openai.OpenAI(base_url=reg.url, api_key=reg.secret, max_retries=0, timeout=30)


# --- OpenAI Chat Completions -----------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_text(running, stream):
    handler = Scripted(reply("Hello there."))
    reg = running.register(handler)
    client = oai(reg)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    kw = {"model": "agent-model", "messages": messages, "temperature": 0.3, "max_completion_tokens": 64, "seed": 7,
              "stop": "END"}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        usage = next(c.usage for c in chunks if c.usage)
    else:
        out = client.chat.completions.create(**kw)
        text, usage = out.choices[0].message.content, out.usage
        assert out.choices[0].finish_reason == "stop" and out.model == "policy-model"
    assert text == "Hello there."
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (11, 5, 16)
    (call,) = handler.calls
    assert call.dialect == "chat" and call.model == "agent-model" and call.stream is stream
    assert call.sampling == {"temperature": 0.3, "max_tokens": 64, "seed": 7, "stop": ["END"]}
    assert call.request.messages == [SystemMessage(content="Be brief."), UserMessage(content="Hi")]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_call_round_trip(running, stream):
    call_id = "call_7f3a"
    handler = Scripted(reply(calls=[ToolCall(id=call_id, name="add", arguments='{"a": 2, "b": 3}')]),
                       reply("The sum is 5."))
    reg = running.register(handler)
    client = oai(reg)
    messages = [{"role": "user", "content": "What is 2+3? Use the tool."}]
    tools = [{"type": "function", "function": ADD_TOOL}]
    if stream:
        with client.chat.completions.stream(model="m", messages=messages, tools=tools) as s:
            first = s.get_final_completion()
    else:
        first = client.chat.completions.create(model="m", messages=messages, tools=tools)
    assert first.choices[0].finish_reason == "tool_calls"
    (tc,) = first.choices[0].message.tool_calls
    assert (tc.id, tc.function.name, json.loads(tc.function.arguments)) == (call_id, "add", {"a": 2, "b": 3})
    # the agent runs the tool and sends the result back
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": tc.id, "content": "5"}]
    second = client.chat.completions.create(model="m", messages=messages, tools=tools)
    assert second.choices[0].message.content == "The sum is 5."
    tools_seen = handler.calls[0].request.tools
    assert [(t.type, t.name, t.parameters["required"]) for t in tools_seen] == [("function", "add", ["a", "b"])]
    history = handler.calls[1].request.messages
    assert isinstance(history[1], AssistantMessage) and history[1].tool_calls[0].id == call_id
    assert history[1].tool_calls[0].name == "add" and json.loads(history[1].tool_calls[0].arguments) == {"a": 2, "b": 3}
    assert history[2] == ToolMessage(tool_call_id=call_id, name="add", content="5")


def test_chat_image_reaches_handler_as_image_url_part(running):
    handler = Scripted(reply("a red pixel"))
    reg = running.register(handler)
    oai(reg).chat.completions.create(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": DATA_URL}}]}])
    (message,) = handler.calls[0].request.messages
    assert message.content == [TextContentPart(text="What is this?"),
                               ImageUrlContentPart(image_url={"url": DATA_URL})]


# --- OpenAI Responses ------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_responses_text_and_instructions(running, stream):
    handler = Scripted(reply("Bonjour."))
    reg = running.register(handler)
    client = oai(reg)
    kw = {"model": "codex-model", "instructions": "Answer in French.", "input": "Say hello.", "temperature": 0.5,
              "max_output_tokens": 32, "store": False}
    if stream:
        with client.responses.stream(**kw) as s:
            kinds = [e.type for e in s]
            out = s.get_final_response()
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.output_text.delta" in kinds
    else:
        out = client.responses.create(**kw)
    assert out.output_text == "Bonjour." and out.status == "completed"
    assert (out.usage.input_tokens, out.usage.output_tokens, out.usage.total_tokens) == (11, 5, 16)
    (call,) = handler.calls
    assert call.dialect == "responses" and call.model == "codex-model" and call.stream is stream
    assert call.sampling == {"temperature": 0.5, "max_tokens": 32}
    assert call.request.messages == [SystemMessage(content="Answer in French."), UserMessage(content="Say hello.")]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_tool_call_round_trip(running, stream):
    call_id = "call_resp_42"
    handler = Scripted(reply(calls=[ToolCall(id=call_id, name="add", arguments='{"a": 4, "b": 1}')]),
                       reply("It is 5."))
    reg = running.register(handler)
    client = oai(reg)
    tools = [{"type": "function", **ADD_TOOL}]
    items: list = [{"role": "user", "content": "4+1?"}]
    if stream:
        with client.responses.stream(model="m", input=items, tools=tools) as s:
            first = s.get_final_response()
    else:
        first = client.responses.create(model="m", input=items, tools=tools)
    (fc,) = [o for o in first.output if o.type == "function_call"]
    assert (fc.call_id, fc.name, json.loads(fc.arguments)) == (call_id, "add", {"a": 4, "b": 1})
    items += [fc.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": fc.call_id, "output": "5"}]
    second = client.responses.create(model="m", input=items, tools=tools)
    assert second.output_text == "It is 5."
    assert [(t.name, t.parameters["required"]) for t in handler.calls[0].request.tools] == [("add", ["a", "b"])]
    history = handler.calls[1].request.messages
    assert history[1].tool_calls[0].id == call_id and history[1].tool_calls[0].name == "add"
    assert history[2] == ToolMessage(tool_call_id=call_id, name="add", content="5")


def test_responses_input_image_becomes_image_url_part(running):
    handler = Scripted(reply("a pixel"))
    reg = running.register(handler)
    oai(reg).responses.create(model="m", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Describe."},
        {"type": "input_image", "image_url": DATA_URL, "detail": "auto"}]}])
    (message,) = handler.calls[0].request.messages
    assert message.content == [TextContentPart(text="Describe."), ImageUrlContentPart(image_url={"url": DATA_URL})]


def test_responses_previous_response_id_refused(running):
    handler = Scripted(reply("x"))
    reg = running.register(handler)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        oai(reg).responses.create(model="m", input="hi", previous_response_id="resp_123")
    assert handler.calls == []


# --- Anthropic Messages ----------------------------------------------------------------------------

@pytest.fixture
def anthropic():
    return pytest.importorskip("anthropic")


def claude(anthropic, reg):
    # Claude Code's setup: ANTHROPIC_BASE_URL (no /v1: the SDK adds it) + ANTHROPIC_API_KEY (x-api-key)
    env = registration_env(reg)
    return anthropic.Anthropic(base_url=env["ANTHROPIC_BASE_URL"], api_key=env["ANTHROPIC_API_KEY"], max_retries=0,
                               timeout=30)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_text_and_system(running, anthropic, stream):
    handler = Scripted(reply("Ahoy."))
    reg = running.register(handler)
    client = claude(anthropic, reg)
    kw = {"model": "claude-x", "max_tokens": 100, "extra_body": {"temperature": 0.2}, "stop_sequences": ["\nHuman:"],
              "system": [{"type": "text", "text": "You are a pirate."}, {"type": "text", "text": "Be brief."}],
              "messages": [{"role": "user", "content": "Greet me."}]}
    if stream:
        with client.messages.stream(**kw) as s:
            text = "".join(s.text_stream)
            out = s.get_final_message()
        assert text == "Ahoy."
    else:
        out = client.messages.create(**kw)
    assert [b.type for b in out.content] == ["text"] and out.content[0].text == "Ahoy."
    assert out.stop_reason == "end_turn" and (out.usage.input_tokens, out.usage.output_tokens) == (11, 5)
    (call,) = handler.calls
    assert call.dialect == "anthropic" and call.model == "claude-x" and call.stream is stream
    assert call.sampling == {"temperature": 0.2, "max_tokens": 100, "stop": ["\nHuman:"]}
    assert call.request.messages == [SystemMessage(content="You are a pirate.\nBe brief."),
                                     UserMessage(content="Greet me.")]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_tool_use_round_trip(running, anthropic, stream):
    call_id = "toolu_01AbC"
    handler = Scripted(reply("Let me add.", calls=[ToolCall(id=call_id, name="add", arguments='{"a": 6, "b": 7}')]),
                       reply("13."))
    reg = running.register(handler)
    client = claude(anthropic, reg)
    tools = [{"name": "add", "description": ADD_TOOL["description"], "input_schema": ADD_TOOL["parameters"]}]
    messages: list = [{"role": "user", "content": "6+7?"}]
    if stream:
        with client.messages.stream(model="m", max_tokens=50, tools=tools, messages=messages) as s:
            first = s.get_final_message()
    else:
        first = client.messages.create(model="m", max_tokens=50, tools=tools, messages=messages)
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"]
    use = first.content[1]
    assert (use.id, use.name, use.input) == (call_id, "add", {"a": 6, "b": 7})
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "13"}]}]
    second = client.messages.create(model="m", max_tokens=50, tools=tools, messages=messages)
    assert second.content[0].text == "13."
    assert [(t.type, t.name, t.parameters) for t in handler.calls[0].request.tools] == \
        [("function", "add", ADD_TOOL["parameters"])]
    history = handler.calls[1].request.messages
    assert history[1].content == "Let me add." and history[1].tool_calls[0].id == call_id
    assert json.loads(history[1].tool_calls[0].arguments) == {"a": 6, "b": 7}
    assert history[2] == ToolMessage(tool_call_id=call_id, name="add", content="13")


def test_anthropic_image_block_becomes_data_url(running, anthropic):
    handler = Scripted(reply("a pixel"))
    reg = running.register(handler)
    claude(anthropic, reg).messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "text", "text": "What is it?"}]}])
    (message,) = handler.calls[0].request.messages
    assert message.content == [ImageUrlContentPart(image_url={"url": DATA_URL}), TextContentPart(text="What is it?")]


def test_anthropic_text_document_reads_as_text_and_pdf_is_refused(running, anthropic):
    handler = Scripted(reply("read it"))
    reg = running.register(handler)
    client = claude(anthropic, reg)
    client.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "line one"}},
        {"type": "text", "text": "Summarise."}]}])
    assert handler.calls[0].request.messages == [UserMessage(content="line one\nSummarise.")]
    with pytest.raises(anthropic.BadRequestError, match="only text documents"):
        client.messages.create(model="m", max_tokens=20, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PNG}}]}])
    assert len(handler.calls) == 1


def test_anthropic_mid_conversation_system_and_effort(running):
    """Claude Code 2.1 sends environment notes as role "system" messages inside `messages` (read as
    user messages, as verifiers does), and its reasoning effort as output_config.effort."""
    handler = Scripted(reply("ok"))
    reg = running.register(handler)
    body = {"model": "m", "max_tokens": 9, "output_config": {"effort": "high"}, "thinking": {"type": "adaptive"},
            "messages": [{"role": "user", "content": [{"type": "text", "text": "task",
                                                       "cache_control": {"type": "ephemeral"}}]},
                         {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}]}
    r = httpx.post(reg.url + "/messages", json=body,
                   headers={"x-api-key": reg.secret, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and r.json()["content"] == [{"type": "text", "text": "ok"}]
    (call,) = handler.calls
    assert call.request.messages == [UserMessage(content="task"), UserMessage(content="# Environment")]
    assert call.sampling == {"max_tokens": 9, "reasoning_effort": "high"}


def test_anthropic_bad_key_is_authentication_error(running, anthropic):
    handler = Scripted(reply("x"))
    reg = running.register(handler)
    bad = anthropic.Anthropic(base_url=reg.url.removesuffix("/v1"), api_key="not-" + reg.secret, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert handler.calls == []


# --- hostile callers -------------------------------------------------------------------------------

def chat_body(**over) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **over}


def assert_serves(running, reg, handler) -> None:
    """The server still answers a well-formed call on this key."""
    before = len(handler.calls)
    r = httpx.post(reg.url + "/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {reg.secret}"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "ok"
    assert len(handler.calls) == before + 1


@pytest.mark.parametrize("route,auth_header", [("/chat/completions", "Authorization"), ("/responses", "Authorization"),
                                               ("/messages", "x-api-key")])
def test_missing_or_wrong_key_is_401_and_handler_never_runs(running, route, auth_header):
    handler = Scripted(reply("ok"))
    reg = running.register(handler)
    other = running.register(Scripted(reply("other")))  # a valid key of another rollout
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
    wrong = [{}, {auth_header: "Bearer " + reg.secret[:-1] if auth_header == "Authorization" else reg.secret[:-1]},
             {auth_header: ("Bearer " if auth_header == "Authorization" else "") + reg.secret + "x"},
             {"Authorization": "Basic " + reg.secret}]
    for headers in wrong:
        r = httpx.post(reg.url + route, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        err = r.json()["error"]
        assert err["type"] == "authentication_error" and reg.secret not in r.text
        if route == "/messages":
            assert r.json()["type"] == "error"  # Anthropic's error shape
    assert handler.calls == []
    # the other rollout's key reaches the other handler, never this one
    r = httpx.post(reg.url + route, json=body, headers={
        auth_header: ("Bearer " if auth_header == "Authorization" else "") + other.secret})
    assert r.status_code == 200 and handler.calls == []
    # an unregistered key is refused from then on
    running.unregister(reg.secret)
    r = httpx.post(reg.url + "/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {reg.secret}"})
    assert r.status_code == 401 and handler.calls == []


def test_malformed_bodies_are_400_not_500(running):
    handler = Scripted(reply("ok"))
    reg = running.register(handler)
    auth = {"Authorization": f"Bearer {reg.secret}", "Content-Type": "application/json"}
    deep = b"[" * 100_000 + b"]" * 100_000
    deep_messages = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases = {
        "/chat/completions": [b"", b"{", b"not json", b"[1, 2]", b'{"messages": "hi"}', b'{"messages": []}',
                              b'{"messages": [{"role": "wizard", "content": "x"}]}',
                              b'{"messages": [{"role": "user", "content": 5}]}',
                              b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
                              b'{"messages": [{"role": "assistant", "tool_calls": [{"id": 1}]}]}',
                              b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
                              b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
                              b'{"messages": [{"role": "user", "content": "x"}], "n": 3}',
                              b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
                              b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                              b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
                              deep, deep_messages, b"\xff\xfe"],
        "/responses": [b'{"input": 5}', b'{"input": [{"type": "function_call_output"}]}',
                       b'{"input": [{"type": "item_reference", "id": "x"}]}', b'{"input": [7]}', deep],
        "/messages": [b'{"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]}',
                      b'{"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}',
                      b'{"system": 5, "messages": [{"role": "user", "content": "x"}]}', deep],
    }
    for route, bodies in cases.items():
        headers = {**auth, "x-api-key": reg.secret} if route == "/messages" else auth
        for body in bodies:
            r = httpx.post(reg.url + route, content=body, headers=headers)
            assert r.status_code == 400, (route, body[:80], r.status_code, r.text)
            message = r.json()["error"]["message"]
            assert message and "Traceback" not in message and reg.secret not in r.text
    assert handler.calls == []
    assert_serves(running, reg, handler)


def test_oversized_body_is_413_and_server_keeps_serving(running):
    handler = Scripted(reply("ok"))
    reg = running.register(handler)
    big = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * (1024 * 1024 + 10)}])).encode()
    # a raw client sends the head, then reads the answer before sending a byte of the body
    with socket.create_connection(("127.0.0.1", running.server.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + reg.secret.encode() + b"\r\nContent-Length: "
                  + str(len(big)).encode() + b"\r\n\r\n")
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    # and the openai client, which sends all of the body first, sees the 413 too
    with pytest.raises(openai.APIStatusError) as e:
        oai(reg).chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 3_000_000}])
    assert e.value.status_code == 413
    assert handler.calls == []
    assert_serves(running, reg, handler)


def test_flood_past_max_inflight_is_429_while_others_complete(running):
    release = threading.Event()
    started = []

    async def slow(call: Call) -> Response:
        started.append(call)
        while not release.is_set():
            await asyncio.sleep(0.01)
        return reply("done")

    reg = running.register(slow)
    bystander = Scripted(reply("ok"))
    other = running.register(bystander)
    n = MAX_INFLIGHT + 4

    def post(_):
        return httpx.post(reg.url + "/chat/completions", json=chat_body(),
                          headers={"Authorization": f"Bearer {reg.secret}"}, timeout=30)

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(post, i) for i in range(n)]
        deadline = time.time() + 20
        while sum(f.done() for f in futures) < n - MAX_INFLIGHT and time.time() < deadline:
            time.sleep(0.02)
        refused = [f.result() for f in futures if f.done()]
        assert len(refused) == n - MAX_INFLIGHT and len(started) == MAX_INFLIGHT
        assert all(r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error" for r in refused)
        # another rollout is not starved by this one's flood
        assert_serves(running, other, bystander)
        release.set()
        done = [f.result() for f in futures]
    ok = [r for r in done if r.status_code == 200]
    assert len(ok) == MAX_INFLIGHT and all(r.json()["choices"][0]["message"]["content"] == "done" for r in ok)
    # the slots are free again
    release.set()
    r = post(0)
    assert r.status_code == 200


def test_handler_failures_are_502_or_their_status_and_never_leak_the_secret(running, caplog):
    caplog.set_level(logging.DEBUG)
    box = {}

    async def boom(call: Call) -> Response:
        raise RuntimeError(f"upstream said no to {box['secret']}\nTraceback (most recent call last): ...")

    async def refuse(call: Call) -> Response:
        raise DialectError("context too long for this policy", status=400)

    async def junk(call: Call):
        return {"not": "a response"}

    async def own_timeout(call: Call) -> Response:
        await asyncio.wait_for(asyncio.sleep(1), 0.01)

    for handler, status, needle in [(boom, 502, "RuntimeError"), (refuse, 400, "context too long"),
                                    (junk, 502, "no valid response"), (own_timeout, 502, "TimeoutError")]:
        reg = running.register(handler)
        box["secret"] = reg.secret
        for route, headers, body in [
                ("/chat/completions", {"Authorization": f"Bearer {reg.secret}"}, chat_body()),
                ("/chat/completions", {"Authorization": f"Bearer {reg.secret}"}, chat_body(stream=True)),
                ("/responses", {"Authorization": f"Bearer {reg.secret}"}, {"model": "m", "input": "hi"}),
                ("/messages", {"x-api-key": reg.secret}, chat_body(max_tokens=5))]:
            r = httpx.post(reg.url + route, json=body, headers=headers)
            assert r.status_code == status, (route, r.text)
            assert needle in r.json()["error"]["message"]
            assert reg.secret not in r.text and "Traceback" not in r.text
    assert caplog.records and not any(box["secret"] in r.getMessage() for r in caplog.records)
    handler = Scripted(reply("ok"))
    assert_serves(running, running.register(handler), handler)


def test_routes_models_and_unix_socket(running):
    handler = Scripted(reply("ok"))
    reg = running.register(handler)
    auth = {"Authorization": f"Bearer {reg.secret}"}
    r = httpx.post(reg.url + "/completions", json=chat_body(), headers=auth)
    assert r.status_code == 404 and "/v1/chat/completions" in r.json()["error"]["message"]
    assert httpx.get(reg.url + "/models").status_code == 401
    models = oai(reg).models.list()
    assert [m.id for m in models.data] == ["vf-policy"]
    # the same server over its Unix socket (how a sandbox without network reaches it)
    with httpx.Client(transport=httpx.HTTPTransport(uds=reg.socket), base_url="http://localhost/v1") as c:
        r = c.post("/chat/completions", json=chat_body(), headers=auth)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
        assert c.post("/chat/completions", json=chat_body()).status_code == 401
    assert len(handler.calls) == 1


def test_stop_removes_socket_and_refuses_connections(tmp_path):
    r = Running(InterceptionConfig())
    reg = r.register(Scripted(reply("ok")))
    assert os.stat(reg.socket).st_mode & 0o777 == 0o666
    port = r.server.port
    r.close()
    assert not os.path.exists(reg.socket)
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat_body(),
                   headers={"Authorization": f"Bearer {reg.secret}"})


def test_registration_repr_hides_secret(running):
    reg = running.register(Scripted(reply("ok")))
    assert reg.secret not in repr(reg) and reg.url in repr(reg)
    assert set(DIALECTS) == {"chat", "responses", "anthropic"}


# --- rendering details that agents act on ----------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_length_and_reasoning_render_in_each_dialect(running, anthropic, stream):
    """A reply cut at max tokens is reported as each API reports it (agents continue or stop on it),
    and the policy's reasoning arrives where each SDK keeps it."""
    out = reply("partial answ", finish="length")
    out.message.reasoning_content = "thinking it over"
    handler = Scripted(out)
    reg = running.register(handler)
    client = oai(reg)
    messages = [{"role": "user", "content": "Long answer please."}]
    if stream:  # (the openai stream helper raises on length: read the chunks)
        chunks = [c for c in client.chat.completions.create(model="m", messages=messages, stream=True) if c.choices]
        finish_reason = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
        with client.responses.stream(model="m", input="Long answer please.") as s:
            kinds = [e.type for e in s]
            resp = s.get_final_response()
        assert kinds[-1] == "response.completed"
        with claude(anthropic, reg).messages.stream(model="m", max_tokens=4, messages=messages) as s:
            msg = s.get_final_message()
    else:
        chat = client.chat.completions.create(model="m", messages=messages).choices[0]
        finish_reason, text = [chat.finish_reason], chat.message.content
        reasoning = chat.message.model_extra["reasoning_content"]
        resp = client.responses.create(model="m", input="Long answer please.")
        msg = claude(anthropic, reg).messages.create(model="m", max_tokens=4, messages=messages)
    assert (finish_reason, text, reasoning) == (["length"], "partial answ", "thinking it over")
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in resp.output] == ["reasoning", "message"] and resp.output_text == "partial answ"
    assert resp.output[0].summary[0].text == "thinking it over"
    assert msg.stop_reason == "max_tokens"
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in msg.content] == \
        [("thinking", "thinking it over"), ("text", "partial answ")]
    # reasoning the agent replays comes back to the policy as reasoning_content
    r = client.responses.create(model="m", input=[{"role": "user", "content": "go"},
                                                  *[o.model_dump(exclude_none=True) for o in resp.output],
                                                  {"role": "user", "content": "more"}])
    assert r.output_text == "partial answ"
    replayed = handler.calls[-1].request.messages[1]
    assert replayed.reasoning_content == "thinking it over" and replayed.content == "partial answ"


def test_handler_timeout_is_504():
    async def hang(call: Call) -> Response:
        await asyncio.sleep(30)

    r = Running(InterceptionConfig(handler_timeout=0.3))
    try:
        reg = r.register(hang)
        t0 = time.monotonic()
        resp = httpx.post(reg.url + "/chat/completions", json=chat_body(),
                          headers={"Authorization": f"Bearer {reg.secret}"})
        assert resp.status_code == 504 and time.monotonic() - t0 < 5
        assert resp.json()["error"]["type"] == "timeout_error"
    finally:
        r.close()


# --- real agent programs (opt in: VF_CLAUDE_BIN / VF_CODEX_BIN name the native binaries) -----------

def agent_policy(tool: str, args: dict):
    """A policy that calls `tool` once, then answers with what the tool returned."""
    def handler(call: Call) -> Response:
        results = [m for m in call.request.messages if isinstance(m, ToolMessage)]
        if results:
            return reply(f"Done: {content_text(results[-1].content).strip()[-40:]}")
        assert tool in [t.name for t in call.request.tools or []]
        return reply("Running it.", calls=[ToolCall(id="call_agent_1", name=tool, arguments=json.dumps(args))])
    return Scripted(handler)


def run_agent(cmd: list[str], cwd, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, check=False)


@pytest.mark.skipif(not os.environ.get("VF_CLAUDE_BIN"), reason="set VF_CLAUDE_BIN to a Claude Code binary")
def test_real_claude_code_runs_a_tool_through_the_server(running, tmp_path):
    handler = agent_policy("Bash", {"command": "echo made-by-agent > out.txt && cat out.txt", "description": "write"})
    reg = running.register(handler)
    env = {**{k: v for k, v in registration_env(reg).items() if k.startswith("ANTHROPIC_")},
           "HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude"), "IS_SANDBOX": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "ANTHROPIC_MODEL": "policy"}
    p = run_agent([os.environ["VF_CLAUDE_BIN"], "-p", "Write out.txt", "--permission-mode", "bypassPermissions",
                   "--output-format", "json"], tmp_path, env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (tmp_path / "out.txt").read_text() == "made-by-agent\n"
    assert json.loads(p.stdout)["result"] == "Done: made-by-agent"
    assert [c.dialect for c in handler.calls] == ["anthropic", "anthropic"] and all(c.stream for c in handler.calls)
    assert handler.calls[1].request.messages[-1].tool_call_id == "call_agent_1"
    assert reg.secret not in p.stdout + p.stderr


@pytest.mark.skipif(not os.environ.get("VF_CODEX_BIN"), reason="set VF_CODEX_BIN to a Codex binary")
def test_real_codex_runs_a_tool_through_the_server(running, tmp_path):
    handler = agent_policy("exec_command", {"cmd": "echo made-by-agent > out.txt && cat out.txt"})
    reg = running.register(handler)
    home = tmp_path / "codex-home"
    home.mkdir()
    # a custom provider speaking the Responses API, its key read from an environment variable
    (home / "config.toml").write_text(f'model = "policy"\nmodel_provider = "vf"\n[model_providers.vf]\nname = "vf"\n'
                                      f'base_url = "{reg.url}"\nenv_key = "VF_KEY"\nwire_api = "responses"\n')
    work = tmp_path / "work"
    work.mkdir()
    p = run_agent([os.environ["VF_CODEX_BIN"], "exec", "--skip-git-repo-check",
                   "--dangerously-bypass-approvals-and-sandbox", "Write out.txt"], work,
                  {"HOME": str(tmp_path), "CODEX_HOME": str(home), "VF_KEY": reg.secret})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (work / "out.txt").read_text() == "made-by-agent\n"
    assert "Done: " in p.stdout and "made-by-agent" in p.stdout
    assert [c.dialect for c in handler.calls] == ["responses", "responses"] and all(c.stream for c in handler.calls)
    assert handler.calls[1].request.messages[-1].tool_call_id == "call_agent_1"
    assert reg.secret not in p.stdout + p.stderr



# --- issue 33: the provider fetches nothing the agent names; nothing outlives a kill -9 ------------

IMAGE_URLS = ["https://example.com/cat.png", "http://127.0.0.1:8080/admin", "file:///etc/shadow",
              "HTTP://169.254.169.254/latest/meta-data/", "//example.com/x.png", "data:text/html;base64,PGI+"]


@pytest.mark.parametrize("url", IMAGE_URLS)
def test_an_image_by_url_is_refused_never_passed_on_and_told_to_the_rollout(running, url):
    """Before: each URL reached the handler (and so the provider and the trace) verbatim; a
    provider that fetches image URLs could be made to reach the host's loopback or carry data out."""
    handler = Scripted(reply("ok"))
    reg = running.register(handler)
    refused: list = []

    async def listen():
        running.server.on_refused(reg.secret, lambda status, message: refused.append((status, message)))
    running.run(listen())
    auth = {"Authorization": f"Bearer {reg.secret}"}
    bodies = {
        "/chat/completions": chat_body(messages=[{"role": "user", "content": [
            {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}]}]),
        "/responses": {"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": url}]}]},
        "/messages": {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "see"}]}]},
    }
    for route, body in bodies.items():
        headers = {**auth, "x-api-key": reg.secret} if route == "/messages" else auth
        r = httpx.post(reg.url + route, json=body, headers=headers)
        assert r.status_code == 400, (route, r.status_code, r.text)
        assert "image by URL" in r.json()["error"]["message"] and url not in r.text
    assert handler.calls == []  # never passed on
    assert [status for status, _ in refused] == [400, 400, 400]
    assert all("data:image/" in message and url not in message for _, message in refused)
    assert_serves(running, reg, handler)  # an inline image still goes through (test_chat_image_...)


SOCKET_HOLDER = """
import asyncio, sys
from vf.interception import InterceptionServer
async def main():
    server = InterceptionServer()
    await server.start()
    print(server.socket, flush=True)
    await asyncio.sleep(120)
asyncio.run(main())
"""


def test_the_socket_dir_is_removed_after_kill_9(tmp_path):
    """Before: every `kill -9` of vf left a `vf-intercept-*` directory (and its socket) in the temp dir."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", SOCKET_HOLDER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        sock = proc.stdout.readline().strip()
        assert sock and os.path.exists(sock) and os.path.basename(os.path.dirname(sock)).startswith("vf-intercept-")
    finally:
        proc.kill()
        proc.wait()
    for _ in range(100):  # vf's reaper notices the kill at once and removes what it was told of
        if not os.path.exists(os.path.dirname(sock)):
            break
        time.sleep(0.05)
    assert not os.path.exists(os.path.dirname(sock))
