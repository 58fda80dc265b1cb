"""The v1 trace format: one episode per line of `traces.jsonl`.

Field names follow verifiers 0.4 (Episode → traces → nodes/calls) so the two ecosystems can read
each other's runs. Every record carries `version` (the format version) and `producer`
(the tool and its version). Training fields live on assistant nodes (`token_ids`, `mask`,
`logprobs`, and `expert_ids` with router replay) and on the trace (`policy.start` / `policy.end`: the policy version, i.e. trainer
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

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    WithJsonSchema,
    field_serializer,
    field_validator,
)

from vf.bounded import BoundsError, load_json
from vf.errors import UsageError
from vf.rows import TaskData, WireTaskData, task_hash  # noqa: F401 - task_hash, content_text re-exported
from vf.types import content_text, parse_message
from vf.version import TRACE_VERSION, __version__


def _plain(value: Any) -> Any:
    """A judge's parsed verdict as JSON (a pydantic object as its dump)."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


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
    """The task a trace ran: its Task class name, row, key and content hash.

    `data` is the row typed, as in verifiers: the taskset's own TaskData subclass where vf built
    the task (`trace.task.data.idx`, `.prompt`, the author's fields), a `WireTaskData` where it
    was read from a file (framework fields typed, the rest kept as attributes). On disk it is the
    row's JSON with every field, nulls included (`TaskData.model_dump(mode="json")`); a
    `WireTaskData` goes back with the fields it was read with."""

    type: str = "Task"
    data: Annotated[Any, WithJsonSchema({"type": "object", "additionalProperties": True, "title": "Data"})] = (
        Field(default_factory=dict, validate_default=True))
    key: str = ""
    hash: str = ""

    @field_validator("data", mode="before")
    @classmethod
    def _typed(cls, value: Any) -> Any:
        if isinstance(value, TaskData):
            return value
        if not isinstance(value, dict):
            raise ValueError("task data must be an object")
        return WireTaskData.model_validate(value)

    @field_serializer("data")
    def _row(self, data: Any) -> dict[str, Any]:
        # a row read from a file goes back as it came (an old or foreign producer's row is not
        # padded with defaults nor reordered); a taskset's row with all its fields
        return data.wire() if isinstance(data, WireTaskData) else data.model_dump(mode="json")


class MessageNode(_Record):
    parent: int | None = None
    message: dict[str, Any]
    """The message in OpenAI's shape in memory (what engines send), with an assistant's
    `tool_calls` flat on disk as verifiers writes them (`{id, type, name, arguments}`); both read."""
    sampled: bool = False
    timestamp: float | None = None
    # Token-level training fields (None when the engine gave no tokens).
    token_ids: list[int] | None = None
    mask: list[int] | None = None
    logprobs: list[float] | None = None
    advantages: list[float] | None = None
    expert_ids: list[list[list[int]]] | None = None
    """Router replay (MoE, `--model.router-replay`): per token of `token_ids`, one list per MoE
    layer of the k expert ids the engine's forward that sampled the token chose (absent otherwise).
    Not named `routed_experts`: verifiers 0.4's node reserves that name for a numpy array it keeps
    off disk (its JSON reader rejects a list there)."""
    token_reset: bool | None = Field(None, description=(
        "True on the prompt-side node where a new training sample starts: its token_ids hold its call's whole "
        "prompt, not a delta (vf.trainer.samples splits the branch there). Absent elsewhere."))
    """True on the prompt-side node where a new training sample starts: this node's `token_ids`
    hold the whole prompt of its call, not a delta, because that prompt does not extend the
    previous call's prompt + completion (the chat template re-rendered history, or a program
    rewrote or resent it; vf.episode.rollout). A trainer splits a branch's tokens there
    (vf.trainer.samples). Absent (None) everywhere else; a vf extension verifiers ignores."""

    @field_validator("message", mode="before")
    @classmethod
    def _nested_calls(cls, message: Any) -> Any:
        return _map_tool_calls(message, nested_tool_call)

    @field_serializer("message")
    def _flat_calls(self, message: dict[str, Any]) -> dict[str, Any]:
        return _map_tool_calls(message, flat_tool_call)


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


class AgentInfo(_Record):
    """Which seat produced a trace: `name` (`agent` for single-agent envs), `trainable` (False =
    trainers never learn from it), plus the seat's resolved config, engine and runtime.
    Readable as attributes (`trace.agent.name`, as in verifiers) or as a dict."""

    name: str = "agent"
    trainable: bool = True

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


# ---- wire shapes: OpenAI's nested function objects in memory, verifiers' flat ones on disk -------


def flat_tool_call(call: Any) -> Any:
    """`{id, type, function: {name, arguments}}` → `{id, type, name, arguments}` (verifiers' wire)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if isinstance(fn, dict) and "name" not in call:
        return {**{k: v for k, v in call.items() if k != "function"}, **fn}
    return call


def nested_tool_call(call: Any) -> Any:
    """`{id, type, name, arguments}` → `{id, type, function: {name, arguments}}` (what engines send)."""
    if isinstance(call, dict) and "function" not in call and "name" in call:
        fn = {k: call[k] for k in ("name", "arguments") if k in call}
        return {**{k: v for k, v in call.items() if k not in fn}, "function": fn}
    return call


def _map_tool_calls(message: Any, convert) -> Any:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return message
    return {**message, "tool_calls": [convert(c) for c in calls]}


def flat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's nested function schema → verifiers' flat wire shape (`{type, name, description,
    parameters, ...}`: the function's keys lifted beside `type`). Anything else is kept as it is."""
    fn = tool.get("function")
    if isinstance(fn, dict) and tool.get("type", "function") == "function" and "name" not in tool:
        return {**{k: v for k, v in tool.items() if k != "function"}, "type": "function", **fn}
    return tool


def nested_tool(tool: Any) -> Any:
    """verifiers' flat wire shape → OpenAI's nested function schema (what the engines send); a
    nested one (vf's traces before the flat shape) is kept as it is."""
    if (isinstance(tool, dict) and "function" not in tool and isinstance(tool.get("name"), str)
            and tool.get("type", "function") == "function"):
        return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
    return tool


def _empty(value: Any) -> bool:
    return not value


class InterceptRecord(_Record):
    """One change an `@vf.intercept` hook made to a model call (verifiers 0.4's `InterceptRecord`)."""

    handler: str
    """The hook's name."""


class RewardValue(_Record):
    score: float
    weight: float = 1.0


class Trace(_Record):
    version: int = TRACE_VERSION
    producer: dict[str, str] = Field(default_factory=producer)
    id: str = Field(default_factory=new_id)
    task: TraceTask = Field(default_factory=TraceTask)
    agent: AgentInfo = Field(default_factory=AgentInfo)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """The tools offered, in memory in OpenAI's nested function schema (what engines send:
    `{"type": "function", "function": {name, description, parameters}}`), on disk in verifiers'
    flat wire shape (`{type, name, description, parameters}`); both shapes are read."""
    nodes: list[MessageNode] = Field(default_factory=list)
    calls: list[ModelCall] = Field(default_factory=list)
    rewards: dict[str, RewardValue | None] = Field(default_factory=dict)
    metrics: dict[str, float | None] = Field(default_factory=dict)
    request_rewrites: list[InterceptRecord] = Field(default_factory=list, exclude_if=_empty)
    """Request changes made by `@vf.intercept` hooks, in execution order (one per hook that
    changed a call's request, a tool gate's included), as verifiers records them. Written only
    when there are some, so a trace without hooks reads and rewrites as before."""
    response_rewrites: list[InterceptRecord] = Field(default_factory=list, exclude_if=_empty)
    """Response changes made by `@vf.intercept` hooks, in execution order (written only when some)."""
    info: dict[str, Any] = Field(default_factory=dict)
    extra_usage: list[dict[str, Any]] = Field(default_factory=list)
    """Token usage of calls that are not the seat's own turns (judges)."""
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

    @field_validator("tools", mode="before")
    @classmethod
    def _nested_tools(cls, tools: Any) -> Any:
        return [nested_tool(t) for t in tools] if isinstance(tools, list) else tools

    @field_serializer("tools")
    def _flat_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [flat_tool(t) for t in tools]

    # ---- derived views used by reward hooks (verifiers v1's trace API) -------------------------
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

    def wire_messages(self) -> list[dict[str, Any]]:
        """The latest branch as provider dicts (what the model is sent next)."""
        return [self.nodes[i].message for i in self.branch()]

    @property
    def messages(self) -> list[Any]:
        """The conversation on the latest branch, typed (`vf.UserMessage`, ...; dict access works)."""
        return [parse_message(m) for m in self.wire_messages()]

    @property
    def assistant_messages(self) -> list[Any]:
        """Every model reply, in order (prompt-supplied assistant messages excluded)."""
        return [parse_message(n.message) for n in self.nodes
                if n.sampled and n.message.get("role") == "assistant"]

    @property
    def tool_messages(self) -> list[Any]:
        return [parse_message(n.message) for n in self.nodes if n.message.get("role") == "tool"]

    @property
    def last_reply(self) -> str:
        """Text of the last model reply, stripped ('' when there is none)."""
        for n in reversed(self.nodes):
            if n.sampled and n.message.get("role") == "assistant":
                return content_text(n.message.get("content")).strip()
        return ""

    @property
    def transcript(self) -> str:
        """The latest branch as text, verifiers' format (what a `full_trace` judge reads): one
        block per message, `[role]` (`[tool NAME]`) then its text, an assistant's tool calls as
        `[tool_call NAME(ARGS)]` lines; blocks separated by a blank line."""
        blocks = []
        for m in self.messages:
            lines = [f"[{m.role}]"]
            if m.role == "tool" and m.name:
                lines[0] = f"[tool {m.name}]"
            if m.role == "assistant":
                if m.content:
                    lines.append(content_text(m.content))
                for call in m.tool_calls or []:
                    namespace = getattr(call, "namespace", None)
                    lines.append(f"[tool_call {namespace + '.' if namespace else ''}{call.name}({call.arguments})]")
            elif text := content_text(m.content):
                lines.append(text)
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def record_judge_call(self, *, name: str, request: dict[str, Any], response: Any) -> None:
        """One judge exchange in `info["judge_calls"]` (request; reply message, parsed verdict and
        usage), its usage in `extra_usage`, as verifiers records them. `response` is a
        `vf.JudgeResponse` (text, parsed, usage)."""
        usage = response.usage.model_dump() if response.usage is not None else None
        self.info.setdefault("judge_calls", []).append({
            "name": name,
            "request": json.loads(json.dumps(request, default=str)),
            "response": {"message": {"role": "assistant", "content": response.text, "reasoning_content": None,
                                     "tool_calls": None, "provider_state": None},
                         "parsed": _plain(response.parsed), "usage": usage}})
        if usage is not None:
            self.extra_usage.append({k: v for k, v in usage.items() if v is not None})

    @property
    def num_turns(self) -> int:
        return sum(1 for n in self.nodes if n.sampled)

    @property
    def has_error(self) -> bool:
        return not self.ok or bool(self.errors)

    @property
    def reward(self) -> float:
        return sum(r.score * r.weight for r in self.rewards.values() if r is not None)

    @property
    def trainable(self) -> bool:
        return bool(self.agent.trainable)

    @property
    def state(self) -> Any:
        """The rollout's typed State (never serialised)."""
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        self._state = value

    def record_reward(self, name: str, score: float, weight: float = 1.0) -> None:
        self.rewards[name] = RewardValue(score=float(score), weight=float(weight))

    def record_metric(self, name: str, value: float) -> None:
        self.metrics[name] = float(value)

    def record_metrics(self, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.record_metric(name, value)

    @property
    def last_message(self) -> Any:
        """The most recently stored message, typed."""
        if not self.nodes:
            raise ValueError("trace has no messages")
        return parse_message(self.nodes[-1].message)

    @property
    def last_error(self) -> ErrorInfo | None:
        return self.errors[-1] if self.errors else None

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
    def scored_traces(self) -> list[Trace]:
        """The traces whose rewards count: the trainable seats' (all seats when none is)."""
        return [t for t in self.traces if t.trainable] or list(self.traces)

    @property
    def reward(self) -> float:
        """Mean reward over the trainable seats' traces (verifiers' headline reward)."""
        scored = self.scored_traces
        return sum(t.reward for t in scored) / len(scored) if scored else 0.0

    @property
    def trace(self) -> Trace:
        return self.traces[0]

    def by_agent(self) -> dict[str, list[Trace]]:
        out: dict[str, list[Trace]] = {}
        for t in self.traces:
            out.setdefault(t.agent.name, []).append(t)
        return out

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


# ---- reading and writing -------------------------------------------------------------------


class TraceFormatError(UsageError, ValueError):
    """A traces line that does not parse (bad input: exit 2), named by `path:lineno`."""

    def __init__(self, path: str | os.PathLike, lineno: int, reason: str):
        super().__init__(f"{path}:{lineno}: {reason}")
        self.path, self.lineno, self.reason = str(path), lineno, reason


def parse_episode(line: str, path: str | os.PathLike = "<string>", lineno: int = 0) -> Episode:
    try:
        raw = load_json(line)  # a crafted line may nest 100k deep or hold NaN (vf writes null)
    except BoundsError as e:
        raise TraceFormatError(path, lineno, str(e)) from None
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
