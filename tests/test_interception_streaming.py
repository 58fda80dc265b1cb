"""Streaming through the interception server is incremental: an agent's `stream: true` call gets
the reply's text as the embedded engine decodes it (the real tiny model, through the rollout's one
model-call path), in each dialect's SSE framing, adding up to exactly the non-streamed reply; a
caller that hangs up mid-stream stops the decoding and leaves the call marked abandoned."""

from __future__ import annotations

import asyncio
import json
import time

import anthropic
import openai
import pytest

import vf
from vf.dialects import DialectError
from vf.engines.base import GenerateRequest, GenerateResult, Sampling, streams
from vf.engines.local import LocalEngine
from vf.engines.openai_client import OpenAIEngine
from vf.engines.textstream import ReplyText
from vf.episode.program import ProgramDriver
from vf.episode.rollout import Rollout, SeatSpec
from vf.interception.server import InterceptionServer
from vf.trace import Trace
from vf.types import AssistantMessage, Response, ToolCall

PROMPT = "Count from 1 to 500, one number a line."  # the tiny model does not stop on its own here


@pytest.fixture(scope="module")
def engine():
    engine = LocalEngine.from_model("tiny")
    yield engine
    asyncio.run(engine.close())


class Agent:
    """One rollout (the tiny model, greedy) answering an interception server's calls the way a
    program harness's rollout does (`ProgramDriver`), with clients of each SDK pointed at it."""

    def __init__(self, engine: LocalEngine, server: InterceptionServer, prompt: str = PROMPT):
        spec = SeatSpec(engine=engine, model="tiny", sampling=Sampling(max_tokens=1500, temperature=0.0),
                        max_turns=None)
        self.rollout = Rollout(vf.Task(vf.TaskData(prompt=prompt)), Trace(), spec)
        self.driver = ProgramDriver(self.rollout, None, server)
        registration = server.register(self.driver.answer)
        server.on_abandoned(registration.secret, self.driver._abandoned)
        self.openai = openai.AsyncOpenAI(base_url=registration.url, api_key=registration.secret, max_retries=0)
        self.anthropic = anthropic.AsyncAnthropic(base_url=registration.url.removesuffix("/v1"),
                                                  api_key=registration.secret, max_retries=0)
        self.messages = [{"role": "user", "content": prompt}]

    async def whole(self, dialect: str, max_tokens: int) -> str:
        """The reply's text, not streamed."""
        if dialect == "chat":
            reply = await self.openai.chat.completions.create(model="tiny", messages=self.messages,
                                                              max_tokens=max_tokens)
            return reply.choices[0].message.content
        if dialect == "responses":
            reply = await self.openai.responses.create(model="tiny", input=PROMPT, max_output_tokens=max_tokens)
            return reply.output_text
        reply = await self.anthropic.messages.create(model="tiny", messages=self.messages, max_tokens=max_tokens)
        return "".join(b.text for b in reply.content if b.type == "text")

    async def stream(self, dialect: str, max_tokens: int):
        """(seconds since the call, text) per text event of the streamed reply, as the SDK parses them."""
        start = time.monotonic()
        if dialect == "chat":
            events = await self.openai.chat.completions.create(model="tiny", messages=self.messages,
                                                               max_tokens=max_tokens, stream=True)
            text = lambda e: e.choices[0].delta.content if e.choices else None
        elif dialect == "responses":
            events = await self.openai.responses.create(model="tiny", input=PROMPT, max_output_tokens=max_tokens,
                                                        stream=True)
            text = lambda e: e.delta if e.type == "response.output_text.delta" else None
        else:
            events = await self.anthropic.messages.create(model="tiny", messages=self.messages, max_tokens=max_tokens,
                                                          stream=True)
            text = lambda e: (e.delta.text if e.type == "content_block_delta"
                              and e.delta.type == "text_delta" else None)
        async for event in events:
            if piece := text(event):
                yield time.monotonic() - start, piece


async def serve(engine, test):
    async with InterceptionServer() as server:
        return await test(Agent(engine, server))


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
def test_the_streamed_text_is_the_unstreamed_reply_arriving_in_pieces(engine, dialect):
    async def test(agent: Agent):
        whole = await agent.whole(dialect, 64)
        pieces = [piece async for _, piece in agent.stream(dialect, 64)]
        return whole, pieces, agent.rollout.trace

    whole, pieces, trace = asyncio.run(serve(engine, test))
    assert whole and "".join(pieces) == whole
    assert len(pieces) > 10  # streamed as decoded (64 tokens), not framed whole at the end
    assert [c.usage["completion_tokens"] for c in trace.calls] == [64, 64]
    assert trace.nodes[-1].message["content"] == whole  # what the trace keeps is what the agent read


def test_the_first_text_arrives_while_the_reply_is_still_being_generated(engine):
    async def test(agent: Agent):
        steps = engine.scheduler.steps
        first = None
        async for at, _ in agent.stream("chat", 64):
            if first is None:
                first = at, engine.scheduler.steps - steps
            last = at
        return first, last

    (first_at, steps_at_first), last_at = asyncio.run(serve(engine, test))
    assert steps_at_first < 32, steps_at_first  # of the reply's 64 decode steps (measured: 0 or 1)
    # the rest of the reply's decoding lies between them (measured: ~55 ms; framed whole: < 5 ms)
    assert last_at - first_at > 0.02, (first_at, last_at)


def test_a_caller_that_hangs_up_mid_stream_stops_generation_and_the_call_is_abandoned(engine):
    async def test(agent: Agent):
        steps = engine.scheduler.steps
        events = await agent.openai.chat.completions.create(model="tiny", messages=agent.messages, max_tokens=1500,
                                                            stream=True)
        async for event in events:
            if event.choices and event.choices[0].delta.content:
                break
        at_hang_up = engine.scheduler.steps - steps
        await events.close()
        for _ in range(200):  # the server sees the hang-up and cancels the call
            if agent.rollout.trace.calls[-1].error is not None:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # a decoder left running would reach hundreds of steps by now
        return at_hang_up, engine.scheduler.steps - steps, agent.rollout.trace

    at_hang_up, total, trace = asyncio.run(serve(engine, test))
    assert at_hang_up < 100 and total - at_hang_up < 50, (at_hang_up, total)  # of up to 1500
    assert trace.info["abandoned_calls"] == 1
    assert [c.error.type if c.error else None for c in trace.calls] == ["Abandoned"]
    assert [n.message["role"] for n in trace.nodes] == ["user"]  # no reply the agent never read


# --- what may be shown before the reply ends (vf.engines.textstream) ---------------------------

def pieces_of(texts: list[str], stops=()) -> str:
    """The deltas `ReplyText` gives when the decoded text grows piece by piece as `texts`."""
    whole = "".join(texts)
    ends = [sum(len(t) for t in texts[:i + 1]) for i in range(len(texts))]
    stream = ReplyText(lambda ids: whole[:ends[len(ids) - 1]], stops)
    return "".join(stream.push(i) for i in range(len(texts)))


def test_text_that_becomes_a_tool_call_is_never_streamed():
    shown = pieces_of(["I will ", "look. ", "<tool", "_call>", '{"name": "ls", ', '"arguments": {}}', "</tool_call>"])
    assert shown == "I will look."  # what the finished reply carries, without the space it strips


def test_a_stop_string_and_its_beginning_are_held_back():
    assert pieces_of(["one two ", "thr", "ee STO", "P four"], stops=["STOP"]) == "one two three"
    assert pieces_of(["one two ", "thr", "ee ST"], stops=["STOP"]) == "one two three"  # "ST" may begin "STOP"
    assert pieces_of(["one two ", "thr", "ee ST", "ART"], stops=["STOP"]) == "one two three START"
    assert pieces_of(["say <to", "ol"]) == "say"  # may begin "<tool_call>"


def test_a_reply_that_starts_with_whitespace_is_not_streamed():
    # a later tool call would strip the whitespace, no tool call keeps it: only the end can tell
    assert pieces_of(["  hello", " world and more text after it"]) == ""


# --- failures: before the first text an HTTP status, after it an event in the stream ------------

def policy_failing(after_text: str | None, error: Exception):
    """A rollout's handler that tells `after_text` (if any) as streamed text, then fails."""
    async def handler(call):
        if after_text is not None:
            call.on_delta(after_text)
            await asyncio.sleep(0.2)
        raise error
    return handler


async def stream_chat(handler, seen: list[str]) -> None:
    """A streamed chat call answered by `handler`; each chunk's text into `seen` as it arrives."""
    async with InterceptionServer() as server:
        registration = server.register(handler)
        client = openai.AsyncOpenAI(base_url=registration.url, api_key=registration.secret, max_retries=0)
        events = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                      stream=True)
        async for event in events:
            seen.append(event.choices[0].delta.content or "")


def test_a_failure_before_the_first_text_keeps_its_http_status():
    with pytest.raises(openai.APIStatusError) as caught:
        asyncio.run(stream_chat(policy_failing(None, DialectError("too big", status=413)), []))
    assert caught.value.status_code == 413 and "too big" in caught.value.message


def test_a_failure_after_the_first_text_is_an_error_event_in_the_stream():
    seen: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        asyncio.run(stream_chat(policy_failing("Hel", RuntimeError("the engine broke")), seen))
    assert "".join(seen) == "Hel"  # the status (200) and the text were sent before the failure
    assert "RuntimeError: the engine broke" in caught.value.message


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
def test_tool_calls_come_after_the_streamed_text_with_the_reply(dialect):
    async def handler(call):
        call.on_delta("I will")
        await asyncio.sleep(0.05)
        call.on_delta(" look.")
        return Response(id="r", created=0, model="m", message=AssistantMessage(
            content="I will look.", tool_calls=[ToolCall(id="call_1", name="ls", arguments='{"path": "."}')]))

    async def main():
        async with InterceptionServer() as server:
            registration = server.register(handler)
            client = openai.AsyncOpenAI(base_url=registration.url, api_key=registration.secret, max_retries=0)
            text, calls = [], []
            if dialect == "chat":
                async for e in await client.chat.completions.create(model="m", messages=[{"role": "user",
                                                                                          "content": "hi"}], stream=True):
                    text.append(e.choices[0].delta.content or "")
                    calls += [(c.function.name, c.function.arguments) for c in e.choices[0].delta.tool_calls or []]
            elif dialect == "responses":
                async for e in await client.responses.create(model="m", input="hi", stream=True):
                    text.append(e.delta if e.type == "response.output_text.delta" else "")
                    if e.type == "response.completed":
                        calls = [(o.name, o.arguments) for o in e.response.output if o.type == "function_call"]
                        assert e.response.output_text == "I will look."
            else:
                claude = anthropic.AsyncAnthropic(base_url=registration.url.removesuffix("/v1"),
                                                  api_key=registration.secret, max_retries=0)
                async with claude.messages.stream(model="m", max_tokens=64,
                                                  messages=[{"role": "user", "content": "hi"}]) as stream:
                    async for piece in stream.text_stream:
                        text.append(piece)
                    final = await stream.get_final_message()
                calls = [(b.name, json.dumps(b.input)) for b in final.content if b.type == "tool_use"]
            return [t for t in text if t], calls

    text, calls = asyncio.run(main())
    assert text == ["I will", " look."]  # two pieces, as told, then the rest of the reply
    assert calls == [("ls", '{"path": "."}')]


def test_the_openai_engine_tells_its_reply_whole_and_keeps_its_tokens(stub):
    """A provider's reply is fetched unstreamed (token ids and log-probs kept exact) and told as one delta."""
    async def go():
        engine = OpenAIEngine(stub.url, api_key_var="")
        try:
            request = GenerateRequest(messages=[{"role": "user", "content": "abc"}], model="reverse")
            return await engine.generate(request, on_delta=told.append)
        finally:
            await engine.close()

    told: list[str] = []
    result = asyncio.run(go())
    assert told == [result.message["content"]] == ["<reversed_text>cba</reversed_text>"]
    assert result.token_ids == list(b"<reversed_text>cba</reversed_text>") and "stream" not in stub.requests[-1]


def test_an_engine_that_does_not_stream_is_called_without_on_delta_and_its_reply_framed_whole():
    """Engines that take only the request (vLLM's in-process one, wrappers, test engines) still
    answer streamed calls: the reply is framed whole at the end."""
    class RequestOnly:
        name, supports_tokens = "request-only", False

        async def generate(self, request):
            return GenerateResult(message={"role": "assistant", "content": "whole reply"})

    async def main():
        async with InterceptionServer() as server:
            spec = SeatSpec(engine=RequestOnly(), model="m", max_turns=None)
            driver = ProgramDriver(Rollout(vf.Task(vf.TaskData(prompt="x")), Trace(), spec), None, server)
            registration = server.register(driver.answer)
            client = openai.AsyncOpenAI(base_url=registration.url, api_key=registration.secret, max_retries=0)
            seen: list[str] = []
            async for e in await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                                stream=True):
                seen.append(e.choices[0].delta.content or "")
            return [s for s in seen if s]

    assert not streams(type("RequestOnly", (), {"generate": lambda self, request: None})())
    assert asyncio.run(main()) == ["whole reply"]
