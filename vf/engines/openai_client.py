"""The `openai` engine: chat completions against any OpenAI-compatible base URL.

Asks for per-token log-probs, and for token ids through the vLLM/vf-serve extensions
(`return_token_ids`, `return_tokens_as_token_ids`). A server that rejects the extensions
(HTTP 400 naming them) is asked again without them, and the engine then reports
`supports_tokens = False` (vf-rollout refuses such an engine).

Retries: 429, 5xx, timeouts and connection errors are retried with exponential backoff
(honouring Retry-After, capped) up to `max_retries` times; other 4xx fail at once. The API key
is read from the environment variable named by `api_key_var` and never recorded.

Router replay (`router_replay=True`): each reply must carry `choices[0].routed_experts` (per token
of `token_ids`, [L][k] expert ids; `vf-serve --router-replay` sends it), else the call fails
with `MissingRouting` instead of training without replay.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from typing import Any

import httpx

from vf.engines.base import GenerateRequest, GenerateResult, Usage
from vf.errors import EngineError

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
EXTENSION_KEYS = ("return_token_ids", "return_tokens_as_token_ids")
MAX_BACKOFF = 20.0


FUNCTION_KEYS = ("name", "description", "parameters", "strict")
"""What a Chat Completions function object may hold (OpenAI's `FunctionDefinition`; vLLM's too)."""


def provider_tool(tool: Any) -> Any:
    """A call's tool as the provider takes it: an agent's own extras on a function (Claude Code's
    `defer_loading`, Codex's `namespace`) stay on the trace and are not sent, since OpenAI answers
    400 to a key it does not know."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or tool.get("type", "function") != "function" or set(fn) <= set(FUNCTION_KEYS):
        return tool
    return {**tool, "function": {k: fn[k] for k in FUNCTION_KEYS if k in fn}}


class OpenAIEngine:
    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, api_key_var: str = "OPENAI_API_KEY",
                 timeout: float | httpx.Timeout = 120.0, max_retries: int = 3, backoff: float = 0.5,
                 max_connections: int = 256, router_replay: bool = False,
                 headers: dict[str, str] | None = None, **_: Any):
        if not base_url:
            raise EngineError("the openai engine needs a base URL", type="ConfigError")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_retries = max_retries
        self.backoff = backoff
        self.timeout = timeout
        self.supports_tokens = True
        self.router_replay = router_replay
        self._extensions = True
        key = os.environ.get(api_key_var) if api_key_var else None
        headers = {**(headers or {}), **({"Authorization": f"Bearer {key}"} if key else {})}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout, connect=min(timeout, 30.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def _body(self, req: GenerateRequest) -> dict[str, Any]:
        s = req.sampling
        body: dict[str, Any] = {
            "model": req.model or self.model,
            "messages": req.messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
        }
        if req.tools:
            body["tools"] = [provider_tool(t) for t in req.tools]
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = s.stop
        if s.top_k > 0:
            body["top_k"] = s.top_k
        if s.min_p > 0:
            body["min_p"] = s.min_p
        if s.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 0
        if self._extensions and s.logprobs:
            body.update({k: True for k in EXTENSION_KEYS})
        return body

    async def generate(self, request: GenerateRequest, *, on_delta: Callable[[str], None] | None = None
                       ) -> GenerateResult:
        """One reply. `on_delta` is told its text once, whole, when it has arrived: the request is
        not streamed from the provider. Why: vLLM does send `token_ids` (with `return_token_ids`)
        and `logprobs` on stream chunks, and `prompt_token_ids` on the first, but drops both from
        every chunk when a reasoning parser hides the reasoning (`include_reasoning: false`), and a
        tool parser's calls arrive as argument fragments to reassemble; a provider's API has no
        token ids at all. One non-streamed request keeps what training records exact in one place
        (`_parse`), with its retries. Cancelling the call closes the connection, and vLLM aborts a
        request whose client went away."""
        data, attempts = await self._post(f"{self.base_url}/chat/completions", lambda: self._body(request))
        result = self._parse(data)
        result.attempts = attempts  # type: ignore[attr-defined]
        if on_delta is not None and isinstance(text := result.message.get("content"), str) and text:
            on_delta(text)
        return result

    async def post_json(self, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        """One JSON POST (any URL) with this engine's key, timeouts and retries; the reply's JSON
        object. Judges send their own request bodies through it."""
        data, _ = await self._post(url, lambda: body, headers)
        if not isinstance(data, dict):
            raise EngineError(f"malformed response from {url}: not a JSON object", type="ProviderError")
        return data

    async def _post(self, url: str, make_body, headers: dict[str, str] | None = None) -> tuple[Any, int]:
        """POST `make_body()` (re-made per attempt: the extensions may be dropped) with retries."""
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = await self._client.post(url, json=make_body(), headers=headers)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                kind = "Timeout" if isinstance(e, httpx.TimeoutException) else "ConnectionError"
                error = EngineError(f"{kind} talking to {self.base_url}: {e or kind}", type=kind, retryable=True)
                retry_after = None
            else:
                if resp.status_code == 200:
                    try:
                        return resp.json(), attempt
                    except (ValueError, RecursionError) as e:  # not JSON, or a hostile server's deep nesting
                        raise EngineError(f"malformed response from {self.base_url}: {type(e).__name__}: "
                                          f"{str(e)[:200]}", type="ProviderError") from None
                text = resp.text[:500]
                if resp.status_code == 400 and self._extensions and any(k in text for k in EXTENSION_KEYS):
                    self._extensions = False
                    self.supports_tokens = False
                    attempt -= 1
                    continue
                error = EngineError(f"HTTP {resp.status_code} from {self.base_url}: {text}",
                                    type="ProviderError", status_code=resp.status_code,
                                    retryable=resp.status_code in RETRY_STATUS)
                retry_after = resp.headers.get("retry-after")
            if not error.retryable or attempt > self.max_retries:
                error.attempts = attempt  # type: ignore[attr-defined]
                raise error
            delay = self.backoff * 2 ** (attempt - 1) * (1 + random.random() * 0.25)
            try:
                delay = max(delay, float(retry_after)) if retry_after else delay
            except ValueError:
                pass
            await asyncio.sleep(min(delay, MAX_BACKOFF))

    def _parse(self, data: Any) -> GenerateResult:
        try:
            choice = data["choices"][0]
            msg = choice.get("message") or {}
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"malformed response from {self.base_url}: no choices", type="ProviderError") from None
        message: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
        if msg.get("tool_calls"):
            message["tool_calls"] = [
                {"id": c.get("id"), "type": c.get("type", "function"),
                 "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}"}}
                for c in msg["tool_calls"]]
        if msg.get("reasoning_content"):
            message["reasoning_content"] = msg["reasoning_content"]
        logprobs = token_ids = None
        content = ((choice.get("logprobs") or {}).get("content")) or None
        if content is not None:
            logprobs = [float(t["logprob"]) for t in content]
            tokens = [t.get("token", "") for t in content]
            if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                token_ids = [int(t.split(":", 1)[1]) for t in tokens]
        if choice.get("token_ids") is not None:
            token_ids = list(choice["token_ids"])
        prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
        usage = data.get("usage") or {}
        if token_ids is not None and logprobs is not None and len(token_ids) != len(logprobs):
            token_ids = logprobs = None  # inconsistent extension output: do not train on it
        routed = choice.get("routed_experts")
        if self.router_replay and (token_ids is None or not isinstance(routed, list) or len(routed) != len(token_ids)):
            raise EngineError(f"{self.base_url} returned no routed experts for the sampled tokens (router replay): "
                              "serve the model with `vf-serve --router-replay`", type="MissingRouting")
        return GenerateResult(
            message=message,
            finish_reason=choice.get("finish_reason") or "stop",
            usage=Usage(prompt_tokens=int(usage.get("prompt_tokens") or 0),
                        completion_tokens=int(usage.get("completion_tokens") or 0)),
            prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None,
            token_ids=token_ids,
            logprobs=logprobs,
            policy_version=data.get("policy_version"),
            model=data.get("model"),
            routed_experts=routed if self.router_replay else None,
        )

    async def close(self) -> None:
        await self._client.aclose()
