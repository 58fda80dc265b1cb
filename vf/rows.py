"""Task rows: the typed data of one task (`vf.TaskData`), the only part of a task a trace carries.

Below both the taskset API (`vf.taskset`: the behaviour around a row) and the trace format
(`vf.trace`: `TraceTask.data` is a row), so neither has to import the other. Fields and defaults
are verifiers v1's, so a row hashes the same in both (`task_hash`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from vf.types import Message, content_text

MAX_ARTIFACT_BYTES = 32 * 1024 * 1024


class TaskTimeout(BaseModel):
    """Per-task timeout overrides in seconds (None = the run's)."""

    model_config = ConfigDict(frozen=True)
    setup: float | None = None
    agent: float | None = None
    finalize: float | None = None
    scoring: float | None = None


class TaskResources(BaseModel):
    """Resource requests (cpu cores, memory GB, gpu "A100:2", disk GB), honoured where a runtime can."""

    model_config = ConfigDict(frozen=True)
    cpu: float | None = None
    memory: float | None = None
    gpu: str | None = None
    disk: float | None = None


class TaskData(BaseModel):
    """One task row: the only part of a task that is serialised onto traces.

    Authors subclass it to add fields (`answer`, `info`, ...). The fields and their defaults
    are verifiers v1's, so a row hashes the same in both."""

    model_config = ConfigDict(frozen=True)

    idx: int | None = None
    """Position in the taskset's `load()` stream (set by the loader)."""
    id: str | None = None
    """Durable id from the source, if it has one."""
    name: str | None = None
    description: str | None = None
    prompt: str | list[Message] | None = None
    """A user message (str), a list of chat messages (content may hold image parts), or None
    when the env's first `turn(message)` opens the conversation."""
    system_prompt: str | None = None
    image: str | None = None
    """Container image for runtimes that use one (docker)."""
    workdir: str | None = None
    agent_user: str | None = None
    skills: list[Any] = Field(default_factory=list)
    network_allow: list[str] = Field(default_factory=lambda: ["*"])
    network_block: list[str] = Field(default_factory=list)
    artifacts: list[Any] = Field(default_factory=list)
    artifact_max_bytes: int = Field(MAX_ARTIFACT_BYTES, gt=0)
    timeout: TaskTimeout = TaskTimeout()
    resources: TaskResources = TaskResources()

    @property
    def hash(self) -> str:
        return task_hash(self.model_dump(mode="json", exclude_none=True))

    @property
    def key(self) -> str:
        return self.id or self.hash

    @property
    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n\n".join(t for t in (content_text(m.content) for m in self.prompt or []) if t)

    # Read like the dict vf's `trace.task.data` was before it was typed (`data["idx"]`).
    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class WireTaskData(TaskData):
    """A row read without its taskset's TaskData class (a run dir, another producer's traces):
    the framework fields typed, every other field kept and readable as an attribute
    (`trace.task.data.answer`), as verifiers' `WireTaskData`."""

    model_config = ConfigDict(extra="allow")
    _keys: tuple[str, ...] = PrivateAttr(default=())
    """The row's keys in the order it was read (so `wire()` writes it back as it came)."""

    @model_validator(mode="wrap")
    @classmethod
    def _remember_keys(cls, value: Any, handler: Any) -> Any:
        data = handler(value)
        if isinstance(value, Mapping) and isinstance(data, WireTaskData):
            data._keys = tuple(value)
        return data

    def wire(self) -> dict[str, Any]:
        """The row's JSON as it was read: the fields it came with, in their order."""
        out = self.model_dump(mode="json", exclude_unset=True)
        return {**{k: out[k] for k in self._keys if k in out}, **out}


def as_task_data(data: TaskData | Mapping[str, Any], cls: type[TaskData]) -> TaskData:
    """`data` as an instance of `cls` (a taskset's TaskData class): kept if it is one, else its
    JSON fields validated (a `WireTaskData` read from a run dir, or a dict)."""
    if isinstance(data, cls):
        return data
    return cls.model_validate(data.model_dump(mode="json") if isinstance(data, TaskData) else data)


@functools.cache
def _row_defaults() -> dict[str, Any]:
    return TaskData().model_dump(mode="json", exclude_none=True)


def row_defaults() -> dict[str, Any]:
    """The JSON of TaskData's framework fields at their defaults (None fields left out)."""
    return dict(_row_defaults())


def task_hash(data: dict[str, Any]) -> str:
    """sha256 of the row's JSON (sorted keys, None dropped): a task's content identity. Fields the
    row leaves out take TaskData's defaults, so a plain dict hashes like the TaskData it dumps
    to (as verifiers hashes rows)."""
    clean = {k: v for k, v in {**row_defaults(), **data}.items() if v is not None}
    return hashlib.sha256(json.dumps(clean, sort_keys=True, default=str).encode()).hexdigest()
