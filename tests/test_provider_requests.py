"""Every request vf sends a provider is valid for vLLM's and OpenAI's request schemas, checked by
strict validators, not a lenient stub:

- OpenAI: the `openai` package's own request type (`CompletionCreateParamsNonStreaming`) compiled
  with every object closed to unknown keys and every `Iterable` field read eagerly (pydantic
  validates an `Iterable` lazily: a TypeAdapter alone lets a `web_search` tool through);
- vLLM: vLLM's own `ChatCompletionRequest` (0.32: vllm.entrypoints.openai.chat_completion.protocol),
  run in the vLLM venv named by VF_VLLM_PYTHON (skipped without it), which also fails a top-level
  key vLLM would silently ignore.

The requests are the ones vf really sent: a real agent program (tests/program_envs/dialect_agent.py)
speaks each dialect through a real `vf-eval` run (a Codex-like Responses request with the hosted
`web_search`, a Claude-Code-like Anthropic request with server tools, a chat request with tools),
and the scripted OpenAI stub on loopback, standing in for the provider, records what reached it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from typing import Any

import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai_stub import StubServer
from pydantic import TypeAdapter
from pydantic_core import SchemaValidator, ValidationError
from test_hosted_tools import SCRIPT, run_agent

from vf.engines.openai_client import EXTENSION_KEYS

VLLM_ONLY_KEYS = (*EXTENSION_KEYS, "top_k", "min_p")
"""vLLM's sampling extensions vf's engine adds (the token-id ones it drops when a provider refuses
them); OpenAI's schema is checked without them."""


def closed(node: Any) -> Any:
    """A pydantic core schema with every typed dict / model closed (`extra: forbid`) and every
    lazy `Iterable` validated as the list it is on the wire."""
    if isinstance(node, dict):
        if node.get("type") == "generator":
            node["type"] = "list"
        if node.get("type") in ("typed-dict", "model-fields"):
            node["extra_behavior"] = "forbid"
        for value in node.values():
            closed(value)
    elif isinstance(node, list):
        for value in node:
            closed(value)
    return node


OPENAI = SchemaValidator(closed(copy.deepcopy(TypeAdapter(CompletionCreateParamsNonStreaming).core_schema)))

VLLM_CHECK = r'''
import json, sys
# the request models need pydantic only, but their package imports transformers' image utilities,
# which import torchvision/torchaudio when installed: a CPU wheel built for another torch fails there
for name in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules[name] = None
from pydantic import ValidationError
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

known = set()
for name, field in ChatCompletionRequest.model_fields.items():
    known |= {name, field.alias} - {None}
out = []
for body in json.load(sys.stdin):
    try:
        ChatCompletionRequest.model_validate(body)
        error = None
    except ValidationError as e:
        error = "; ".join(".".join(map(str, d["loc"])) + ": " + d["msg"] for d in e.errors())[:600]
    out.append({"error": error, "ignored": sorted(set(body) - known)})
print(json.dumps(out))
'''

GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
BAD = [  # what vf sent before hosted tools were dropped, and other shapes a lenient check lets by
    {**GOOD, "tools": [{"type": "web_search", "name": "web_search", "external_web_access": False}]},
    {**GOOD, "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]},
    {**GOOD, "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},  # flat, not nested
    {**GOOD, "tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
]


@pytest.fixture(scope="module")
def sent(tmp_path_factory) -> dict[str, list[dict]]:
    """dialect → the request bodies vf sent the provider while answering that agent."""
    out = {}
    with pytest.MonkeyPatch.context() as mp, StubServer(script=SCRIPT) as provider:
        mp.setenv("FAKE_KEY", "sk-test")
        for dialect in ("chat", "responses", "anthropic"):
            before = len(provider.requests)
            trace = run_agent(tmp_path_factory.mktemp(dialect), provider.url, dialect).traces[0]
            assert not trace.errors, trace.errors
            out[dialect] = copy.deepcopy(provider.requests[before:])
            assert len(out[dialect]) == 2 and all(b.get("tools") for b in out[dialect])
    return out


def openai_view(body: dict) -> dict:
    """`body` as OpenAI reads it: without vLLM's extensions, and without the `name` vf puts on a
    tool message (the SDK's type omits it; OpenAI's own function-calling cookbook sends it and the
    API takes it). Nothing else is let by."""
    messages = [{k: v for k, v in m.items() if k != "name"} if isinstance(m, dict) and m.get("role") == "tool" else m
                for m in body.get("messages") or []]
    return {**{k: v for k, v in body.items() if k not in VLLM_ONLY_KEYS}, "messages": messages}


def openai_errors(body: dict) -> str | None:
    try:
        OPENAI.validate_python(openai_view(body))
    except ValidationError as e:
        return "; ".join(".".join(map(str, d["loc"])) + ": " + d["msg"] for d in e.errors()[:6])
    return None


def test_the_openai_validator_is_strict():
    assert openai_errors(GOOD) is None
    for bad in BAD:
        assert openai_errors(bad) is not None, bad
    assert openai_errors({**GOOD, "messages": [{"role": "user", "content": "hi", "extra": 1}]})
    assert openai_errors({**GOOD, "messages": [{"role": "tool_result", "content": "x"}]})  # vLLM takes any role
    assert openai_errors({**GOOD, "messages": [{"role": "user", "content": "hi", "name": "bob"}]}) is None
    assert openai_errors({**GOOD, "stream_options": {"include_usage": True}, "stream": False}) is None


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
def test_every_request_vf_sends_is_valid_for_openai(sent, dialect):
    for body in sent[dialect]:
        assert openai_errors(body) is None, (openai_errors(body), json.dumps(body)[:2000])


@pytest.mark.skipif(not os.environ.get("VF_VLLM_PYTHON"), reason="set VF_VLLM_PYTHON to a python with vllm")
def test_every_request_vf_sends_is_valid_for_vllm(sent):
    bodies = [b for dialect in ("chat", "responses", "anthropic") for b in sent[dialect]]
    proc = subprocess.run([os.environ["VF_VLLM_PYTHON"], "-c", VLLM_CHECK], check=False, input=json.dumps([GOOD, *BAD, *bodies]),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    good, bad, ours = verdicts[0], verdicts[1:1 + len(BAD)], verdicts[1 + len(BAD):]
    assert good == {"error": None, "ignored": []}
    assert all(v["error"] for v in bad), bad  # the validator rejects what vLLM's server answers 400
    for body, verdict in zip(bodies, ours):
        assert verdict == {"error": None, "ignored": []}, (verdict, json.dumps(body)[:2000])


def test_agents_own_tool_keys_stay_on_the_trace_and_never_reach_the_provider():
    """Claude Code's `defer_loading` and Codex's `namespace` ride on vf's flat tool (the trace keeps
    them); in the provider's `function` object OpenAI answers 400 to them."""
    from vf.engines.base import GenerateRequest
    from vf.engines.openai_client import OpenAIEngine
    from vf.trace import Trace

    flat = [{"type": "function", "name": "DeferredToolPlaceholder", "description": "d", "defer_loading": True,
             "parameters": {"type": "object", "properties": {}}},
            {"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1", "strict": False,
             "parameters": {"type": "object", "properties": {}}}]
    tools = Trace(tools=flat).tools  # the nested shape a call's request carries
    assert tools[0]["function"]["defer_loading"] is True  # the trace keeps what the agent offered
    body = OpenAIEngine("http://127.0.0.1:9", model="m")._body(
        GenerateRequest(messages=[{"role": "user", "content": "hi"}], tools=tools))
    assert openai_errors(body) is None, openai_errors(body)
    assert [t["function"] for t in body["tools"]] == [
        {"name": "DeferredToolPlaceholder", "description": "d", "parameters": {"type": "object", "properties": {}}},
        {"name": "spawn_agent", "parameters": {"type": "object", "properties": {}}, "strict": False}]
    assert openai_errors({**body, "tools": tools}) is not None  # what vf sent before
