"""The one async interface the harness calls to get a model reply.

    request : messages (OpenAI chat shape) + tools (OpenAI function schemas) + sampling
    result  : assistant message + prompt/completion token ids + per-token log-probs
              + finish reason + usage (+ the policy version that produced it)

Implementations: `local` (embedded native-model engine), `openai` (any OpenAI-compatible
server: vLLM, vf-serve, a provider), `vllm` (in-process, GPU extra). Each records nothing on
traces itself; the harness wraps every call into a `ModelCall` record.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class Sampling:
    """Sampling parameters. `None` means "the engine's default" and is not sent to servers."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = True  # ask for per-token log-probs of the sampled tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def is_full_distribution(self) -> bool:
        """True when nothing truncates the distribution (what training rollouts need)."""
        return self.top_p >= 1.0 and self.top_k <= 0 and self.min_p <= 0.0


@dataclass
class GenerateRequest:
    messages: list[dict[str, Any]]
    sampling: Sampling = field(default_factory=Sampling)
    tools: list[dict[str, Any]] | None = None
    model: str | None = None


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class GenerateResult:
    """One assistant reply.

    `message` is an OpenAI-shape assistant message: {"role": "assistant", "content": str | None,
    "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": str}}]}.
    `prompt_token_ids`/`token_ids`/`logprobs` are None when the engine cannot give them.
    `logprobs[i]` is the log-prob of `token_ids[i]` under the sampling temperature.
    `policy_version` is the policy version the reply started from (its prompt was processed by),
    `policy_version_end` the version that sampled its last token (None: the same as the start);
    they differ when weights were updated while the request was in flight.
    `endpoint` is the server that produced it, when the engine spreads requests over several.
    `routed_experts` (router replay, MoE models, engines asked for it): per token of `token_ids`,
    [L][k] — for each of the L MoE layers, the k expert ids of the forward whose logits sampled
    that token (the previous token's position; the first token's is the last prompt token's).
    """

    message: dict[str, Any]
    finish_reason: str = "stop"  # stop | length | tool_calls
    usage: Usage = field(default_factory=Usage)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: int | None = None
    policy_version_end: int | None = None
    model: str | None = None
    endpoint: str | None = None
    routed_experts: list[list[list[int]]] | None = None


@runtime_checkable
class Engine(Protocol):
    """What the harness needs from any engine."""

    name: str
    # True when results carry token ids and log-probs (required by vf-rollout / vf-train).
    supports_tokens: bool

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...
    # An engine that streams also takes `on_delta` (keyword): `generate(request, on_delta=fn)` calls
    # `fn(text)` with the reply's content as it is produced, the deltas adding up to a prefix of
    # the final `message["content"]` (the rest, and tool calls, come with the result). Callers pass
    # it only to an engine that `streams`, so engines that do not stream need not take it.

    async def close(self) -> None: ...


def streams(engine: Any) -> bool:
    """Whether `engine.generate` takes `on_delta` (see `Engine`): the local and openai engines do;
    wrappers and test engines that take only the request are called without it."""
    try:
        return "on_delta" in inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):  # a builtin or an object without a readable signature
        return False
