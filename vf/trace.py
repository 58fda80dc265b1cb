"""The v1 trace format: one episode per line of `traces.jsonl`.

Field names follow verifiers 0.4 (Episode → traces → nodes/calls) so the two ecosystems can read
each other's runs. Every record carries `version` (the format version) and `producer`
(the tool and its version). Training fields live on assistant nodes (`token_ids`, `mask`,
`logprobs`) and on the trace (`policy.start` / `policy.end`: the policy version, i.e. trainer
step, of the weights that produced the first and the last reply).

    Episode ─┬─ task (TraceTask: type, data, key, hash)
             └─ traces[] ─┬─ nodes[]  (MessageNode: parent, message, token_ids, mask, logprobs)
                          ├─ calls[]  (ModelCall: one per engine call, with timing/usage/error)
                          └─ rewards{name: {score, weight}}, metrics{name: float}

A branch (root → leaf path through `nodes`) is one training sample: the concatenated
`token_ids` of its nodes are exactly the tokens the model saw and produced.

Readers tolerate unknown fields (kept on round trip) and report a corrupt line by file and
line number. Derived values (`reward`, `messages`, `last_reply`, `num_turns`) are computed, not
stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from vf.errors import UsageError
from vf.version import TRACE_VERSION, __version__


def new_id() -> str:
    return uuid.uuid4().hex


def producer() -> dict[str, str]:
    return {"name": "vf", "version": __version__}


class _Record(BaseModel):
    # Unknown fields are kept (and written back), so newer or foreign producers round-trip.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ErrorInfo(_Record):
    type: str
    message: str = ""
    status_code: int | None = None
    traceback: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        return cls(
            type=getattr(exc, "type", None) or type(exc).__name__,
            message=str(getattr(exc, "message", None) or exc) or type(exc).__name__,
            status_code=getattr(exc, "status_code", None),
        )


class TraceTask(_Record):
    type: str = "Task"
    data: dict[str, Any] = Field(default_factory=dict)
    key: str = ""
    hash: str = ""


class MessageNode(_Record):
    parent: int | None = None
    message: dict[str, Any]
    sampled: bool = False
    timestamp: float | None = None
    # Token-level training fields (None when the engine gave no tokens).
    token_ids: list[int] | None = None
    mask: list[int] | None = None
    logprobs: list[float] | None = None
    advantages: list[float] | None = None


class ModelCall(_Record):
    node: int | None = None
    model: str | None = None
    engine: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    endpoint: str | None = None
    finish_reason: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    time: dict[str, float] = Field(default_factory=dict)
    attempts: int = 1
    policy_version: int | None = None
    error: ErrorInfo | None = None


class RewardValue(_Record):
    score: float
    weight: float = 1.0


class Trace(_Record):
    version: int = TRACE_VERSION
    producer: dict[str, str] = Field(default_factory=producer)
    id: str = Field(default_factory=new_id)
    task: TraceTask = Field(default_factory=TraceTask)
    agent: dict[str, Any] = Field(default_factory=lambda: {"name": "agent", "trainable": True})
    tools: list[dict[str, Any]] = Field(default_factory=list)
    nodes: list[MessageNode] = Field(default_factory=list)
    calls: list[ModelCall] = Field(default_factory=list)
    rewards: dict[str, RewardValue | None] = Field(default_factory=dict)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)
    is_completed: bool = False
    ok: bool = True
    stop_condition: str | None = None
    is_timeout: bool = False
    errors: list[ErrorInfo] = Field(default_factory=list)
    timing: dict[str, Any] = Field(default_factory=dict)
    """start (epoch s); setup/agent/finalize/scoring: {start, end} spans; agent.model.duration."""
    policy: dict[str, int | None] = Field(default_factory=lambda: {"start": None, "end": None})
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_total_tokens: int = 0

    # Runtime-only state shared with tools and hooks; never serialised.
    _state: Any = PrivateAttr(default=None)

    # ---- derived views used by reward hooks -------------------------------------------------
    def branch(self, leaf: int | None = None) -> list[int]:
        """Node indices from the root to `leaf` (default: the last node)."""
        if not self.nodes:
            return []
        i = len(self.nodes) - 1 if leaf is None else leaf
        path = []
        while i is not None:
            path.append(i)
            i = self.nodes[i].parent
        return path[::-1]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation as the model last saw it plus its last reply (latest branch)."""
        return [self.nodes[i].message for i in self.branch()]

    @property
    def assistant_messages(self) -> list[dict[str, Any]]:
        return [n.message for n in self.nodes if n.message.get("role") == "assistant"]

    @property
    def last_reply(self) -> str:
        """Text of the last assistant message ('' when there is none)."""
        for n in reversed(self.nodes):
            if n.message.get("role") == "assistant":
                return content_text(n.message.get("content"))
        return ""

    @property
    def num_turns(self) -> int:
        return sum(1 for n in self.nodes if n.sampled)

    @property
    def reward(self) -> float:
        return sum(r.score * r.weight for r in self.rewards.values() if r is not None)

    @property
    def state(self) -> Any:
        return self._state

    def record_reward(self, name: str, score: float, weight: float = 1.0) -> None:
        self.rewards[name] = RewardValue(score=float(score), weight=float(weight))

    def record_metric(self, name: str, value: float) -> None:
        self.metrics[name] = float(value)

    def count_tokens(self) -> None:
        self.num_input_tokens = sum(int(c.usage.get("prompt_tokens", 0)) for c in self.calls)
        self.num_output_tokens = sum(int(c.usage.get("completion_tokens", 0)) for c in self.calls)
        self.num_total_tokens = self.num_input_tokens + self.num_output_tokens


class Episode(_Record):
    version: int = TRACE_VERSION
    producer: dict[str, str] = Field(default_factory=producer)
    id: str = Field(default_factory=new_id)
    env: dict[str, Any] = Field(default_factory=dict)
    task: TraceTask = Field(default_factory=TraceTask)
    group: dict[str, Any] | None = None
    run: dict[str, Any] = Field(default_factory=lambda: {"type": "eval"})
    # Which of the task's `num_rollouts` episodes this is (0-based); resume keys on it.
    rollout: int = 0
    ok: bool = True
    is_timeout: bool = False
    errors: list[ErrorInfo] = Field(default_factory=list)
    traces: list[Trace] = Field(default_factory=list)
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_total_tokens: int = 0

    @property
    def reward(self) -> float:
        return sum(t.reward for t in self.traces) / len(self.traces) if self.traces else 0.0

    @property
    def trace(self) -> Trace:
        return self.traces[0]

    def finish(self) -> Episode:
        for t in self.traces:
            t.count_tokens()
        self.num_input_tokens = sum(t.num_input_tokens for t in self.traces)
        self.num_output_tokens = sum(t.num_output_tokens for t in self.traces)
        self.num_total_tokens = self.num_input_tokens + self.num_output_tokens
        self.ok = not self.errors and all(t.ok for t in self.traces)
        return self

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


def content_text(content: Any) -> str:
    """Text of an OpenAI message content (a string, None, or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def task_hash(data: dict[str, Any]) -> str:
    """sha256 of the row's JSON (sorted keys, None dropped): a task's content identity."""
    clean = {k: v for k, v in data.items() if v is not None}
    return hashlib.sha256(json.dumps(clean, sort_keys=True, default=str).encode()).hexdigest()


# ---- reading and writing -------------------------------------------------------------------


class TraceFormatError(UsageError, ValueError):
    """A traces line that does not parse (bad input: exit 2), named by `path:lineno`."""

    def __init__(self, path: str | os.PathLike, lineno: int, reason: str):
        super().__init__(f"{path}:{lineno}: {reason}")
        self.path, self.lineno, self.reason = str(path), lineno, reason


def parse_episode(line: str, path: str | os.PathLike = "<string>", lineno: int = 0) -> Episode:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceFormatError(path, lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(raw, dict):
        raise TraceFormatError(path, lineno, "a line must hold one JSON object (an episode)")
    if "traces" not in raw:
        raise TraceFormatError(path, lineno, "not a v1 episode (no 'traces' field); try vf-migrate")
    try:
        return Episode.model_validate(raw)
    except Exception as e:  # pydantic.ValidationError: keep its first lines, they name the field
        first = str(e).splitlines()[:3]
        raise TraceFormatError(path, lineno, "invalid episode: " + " | ".join(first)) from None


def iter_episodes(path: str | os.PathLike, strict: bool = True) -> Iterator[tuple[int, Episode | TraceFormatError]]:
    """Yield (line number, episode) for each line. With strict=False a bad line yields
    (line number, TraceFormatError) instead of raising, so callers can count and skip it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, parse_episode(line, path, lineno)
            except TraceFormatError as e:
                if strict:
                    raise
                yield lineno, e


def read_episodes(path: str | os.PathLike) -> list[Episode]:
    """All episodes of a traces file; raises TraceFormatError (file:line) on a corrupt line."""
    return [ep for _, ep in iter_episodes(path, strict=True)]


def json_schema() -> dict[str, Any]:
    """The published JSON schema of one `traces.jsonl` line."""
    schema = Episode.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"vf-trace-v{TRACE_VERSION}"
    schema["title"] = "vf v1 episode (one line of traces.jsonl)"
    return schema


def load_traces(source: str | os.PathLike) -> Path:
    """Resolve a run dir or a traces file to the traces file path."""
    p = Path(source)
    return p / "traces.jsonl" if p.is_dir() else p


if __name__ == "__main__":  # python -m vf.trace > vf/schemas/trace-v1.schema.json
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
