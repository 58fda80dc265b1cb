"""A caller that hangs up before its answer: the interception server cancels the handler (the
policy stops generating a reply nobody will read) and tells the rollout the call was abandoned;
a caller that waits, however slow the answer, gets it."""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest

from vf.interception.server import InterceptionServer
from vf.types import AssistantMessage, Response


class SlowPolicy:
    """A handler that takes `seconds` to answer and records how each call ended."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.started = asyncio.Event()
        self.ended: list[str] = []

    async def __call__(self, call):
        self.started.set()
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        self.ended.append("answered")
        return Response(id="r1", created=0, model="m", message=AssistantMessage(content="slow answer"))


async def hang_up_mid_call(server: InterceptionServer, policy: SlowPolicy, secret: str, stream: bool) -> None:
    host, port = server.url.removeprefix("http://").removesuffix("/v1").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + secret.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    await asyncio.wait_for(policy.started.wait(), 5)
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize("stream", [False, True])
def test_a_caller_that_hangs_up_cancels_its_call_and_the_call_is_marked_abandoned(stream):
    async def main():
        policy, abandoned = SlowPolicy(30), []
        async with InterceptionServer() as server:
            registration = server.register(policy)
            server.on_abandoned(registration.secret, abandoned.append)
            start = time.monotonic()
            await hang_up_mid_call(server, policy, registration.secret, stream)
            while not policy.ended and time.monotonic() - start < 5:
                await asyncio.sleep(0.02)
            took = time.monotonic() - start
            assert server._slots[registration.secret].inflight == 0
        return policy, abandoned, took

    policy, abandoned, took = asyncio.run(main())
    assert policy.ended == ["cancelled"] and took < 2, (policy.ended, took)
    assert len(abandoned) == 1 and abandoned[0].stream is stream and abandoned[0].dialect == "chat"


def test_a_caller_whose_sdk_times_out_cancels_its_call():
    async def main():
        policy, abandoned = SlowPolicy(30), []
        async with InterceptionServer() as server:
            registration = server.register(policy)
            server.on_abandoned(registration.secret, abandoned.append)
            client = openai.AsyncOpenAI(base_url=registration.url, api_key=registration.secret, max_retries=0,
                                        timeout=0.5)
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            await client.close()
            for _ in range(100):
                if policy.ended:
                    break
                await asyncio.sleep(0.02)
        return policy, abandoned

    policy, abandoned = asyncio.run(main())
    assert policy.ended == ["cancelled"] and len(abandoned) == 1


def test_a_caller_that_waits_gets_a_slow_answer_streamed_or_not():
    async def main():
        policy, abandoned = SlowPolicy(0.6), []  # several looks at the connection while it waits
        async with InterceptionServer() as server:
            registration = server.register(policy)
            server.on_abandoned(registration.secret, abandoned.append)
            client = openai.AsyncOpenAI(base_url=registration.url, api_key=registration.secret, max_retries=0)
            whole = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                          stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            await client.close()
        return whole.choices[0].message.content, text, policy, abandoned

    whole, text, policy, abandoned = asyncio.run(main())
    assert whole == text == "slow answer"
    assert policy.ended == ["answered", "answered"] and abandoned == []
