"""The `openai` engine against a real HTTP server on loopback: tokens, retries, timeouts, keys."""

from __future__ import annotations

import asyncio
import time

import pytest

from openai_stub import Handler
from vf.engines.base import GenerateRequest, Sampling
from vf.engines.openai_client import OpenAIEngine
from vf.errors import EngineError

MSGS = [{"role": "user", "content": "abc"}]


def generate(engine, model, messages=MSGS, **sampling):
    async def go():
        try:
            return await engine.generate(GenerateRequest(messages=messages, model=model, sampling=Sampling(**sampling)))
        finally:
            await engine.close()

    return asyncio.run(go())


def test_reply_tokens_and_logprobs(stub):
    r = generate(OpenAIEngine(stub.url, api_key_var=""), "reverse", max_tokens=7, temperature=0.5, seed=3)
    assert r.message == {"role": "assistant", "content": "<reversed_text>cba</reversed_text>"}
    assert r.token_ids == list(b"<reversed_text>cba</reversed_text>")
    assert r.logprobs == [-0.5] * len(r.token_ids)
    assert r.prompt_token_ids is not None and r.usage.completion_tokens == len(r.token_ids)
    sent = stub.requests[-1]
    assert sent["max_tokens"] == 7 and sent["temperature"] == 0.5 and sent["seed"] == 3
    assert sent["logprobs"] is True and sent["return_token_ids"] is True


def test_api_key_comes_from_named_env_var(stub, monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-test-123")
    generate(OpenAIEngine(stub.url, api_key_var="MY_KEY"), "echo")
    assert Handler.auth[-1] == "Bearer sk-test-123"


def test_retries_5xx_then_succeeds(stub):
    r = generate(OpenAIEngine(stub.url, max_retries=3, backoff=0.01), "flaky-2",
                 messages=[{"role": "user", "content": "retry-me"}])
    assert r.message["content"].startswith("<reversed_text>") and r.attempts == 3


def test_gives_up_after_bounded_retries(stub):
    n0 = len(stub.requests)
    with pytest.raises(EngineError) as e:
        generate(OpenAIEngine(stub.url, max_retries=2, backoff=0.01), "fail500")
    assert e.value.status_code == 500 and e.value.type == "ProviderError" and e.value.attempts == 3
    assert len(stub.requests) - n0 == 3


def test_timeout_is_an_engine_error(stub):
    t0 = time.time()
    with pytest.raises(EngineError) as e:
        generate(OpenAIEngine(stub.url, timeout=0.3, max_retries=1, backoff=0.01), "hang")
    assert e.value.type == "Timeout" and e.value.attempts == 2
    assert time.time() - t0 < 5


def test_server_without_token_extensions_falls_back(stub):
    engine = OpenAIEngine(stub.url)
    r = generate(engine, "notokens")
    assert r.message["content"] and r.token_ids is None and engine.supports_tokens is False


def test_tool_calls_are_parsed(stub):
    r = generate(OpenAIEngine(stub.url), "calc", messages=[{"role": "user", "content": "What is 4 + 9?"}])
    (call,) = r.message["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": '{"a": 4, "b": 9}'} and r.finish_reason == "tool_calls"
