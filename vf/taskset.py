"""The v1 taskset API: typed task rows, the behaviour around them, and the loader.

Names follow verifiers v1 so an environment written for it ports by changing its import line:

    import vf

    class ReverseData(vf.TaskData):
        answer: str

    class ReverseTask(vf.Task[ReverseData, vf.State, vf.TaskConfig]):
        @vf.stop
        def one_turn(self, trace) -> bool:
            return trace.num_turns >= 1

        @vf.reward(weight=1.0)
        def lcs(self, task, trace) -> float:
            ...

    class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
        def load(self):
            yield ReverseData(prompt="...", answer="...")

Hooks (`@reward`, `@metric`, `@stop`, `setup`, `finalize`) may be sync or async and receive
the arguments they name: `task` (the TaskData row), `trace`, `state`, `config` (TaskConfig).
A reward returns a float or a mapping name → float; the total reward is Σ score × weight.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from vf.trace import task_hash

# ---- data and config ---------------------------------------------------------------------------


class TaskData(BaseModel):
    """One task row: the only part of a task that is serialised onto traces.

    Authors subclass it to add fields (`answer`, `info`, ...)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    idx: int = 0
    """Position in the taskset's `load()` stream (set by the loader)."""
    id: str | None = None
    """Durable id from the source, if it has one."""
    name: str | None = None
    prompt: str | list[dict[str, Any]] | None = None
    """A user message (str) or a list of chat messages."""
    system_prompt: str | None = None

    @property
    def hash(self) -> str:
        return task_hash(self.model_dump(mode="json"))

    @property
    def key(self) -> str:
        return self.id or self.hash


class TaskConfig(BaseModel):
    """Run-time knobs for tasks (`--taskset.task.FIELD`). Authors subclass to add fields."""

    model_config = ConfigDict(extra="forbid")


class TasksetConfig(BaseModel):
    """Load-time knobs (`--taskset.FIELD`). Authors subclass to add fields (size, seed, ...)."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    task: TaskConfig = TaskConfig()
    system_prompt: str | None = None
    """Path to a file whose text replaces every task's system prompt."""


class State(BaseModel):
    """Typed mutable per-episode state shared by hooks and tools; never serialised."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)


# ---- decorators --------------------------------------------------------------------------------

HOOK_KINDS = ("reward", "metric", "stop")


def _marker(kind: str, **meta: Any) -> Callable:
    def mark(fn: Callable) -> Callable:
        fn._vf_hook = {"kind": kind, "name": meta.pop("name", None) or fn.__name__, **meta}
        return fn

    return mark


def reward(fn: Callable | None = None, *, weight: float = 1.0, priority: int = 0, name: str | None = None):
    """Mark a Task method as a reward. Usable bare (`@reward`) or with arguments."""
    mark = _marker("reward", weight=float(weight), priority=priority, name=name)
    return mark(fn) if fn is not None else mark


def metric(fn: Callable | None = None, *, priority: int = 0, name: str | None = None):
    """Mark a Task method as a metric (recorded, never weighted into the reward)."""
    mark = _marker("metric", priority=priority, name=name)
    return mark(fn) if fn is not None else mark


def stop(fn: Callable | None = None, *, priority: int = 0, name: str | None = None):
    """Mark a Task method as a stop condition, checked after every model reply."""
    mark = _marker("stop", priority=priority, name=name)
    return mark(fn) if fn is not None else mark


async def call_hook(fn: Callable, available: dict[str, Any]) -> Any:
    """Call `fn` with the arguments it names (sync or async)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = dict(available)
    else:
        missing = [n for n, p in params.items()
                   if n not in available and p.default is p.empty and p.kind is not p.VAR_POSITIONAL]
        if missing:
            raise TypeError(
                f"hook {fn.__qualname__} asks for {missing}; hooks may name: {sorted(available)}")
        kwargs = {n: available[n] for n in params if n in available}
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


# ---- Task and Taskset --------------------------------------------------------------------------

D = TypeVar("D", bound=TaskData)
S = TypeVar("S", bound=State)
C = TypeVar("C", bound=TaskConfig)


def _generic_arg(cls: type, base: type, position: int, default: Any) -> Any:
    """The class given at `position` in `base[...]` somewhere in cls's MRO."""
    for klass in cls.__mro__:
        for orig in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(orig) is base:
                args = typing.get_args(orig)
                if len(args) > position and isinstance(args[position], type):
                    return args[position]
    return default


class Task(Generic[D, S, C]):
    """Behaviour around one TaskData row: rewards, metrics, stop conditions, tools, hooks."""

    toolsets: ClassVar[list[type]] = []
    """Toolset classes instantiated per episode; their @tool methods are offered to the model."""

    def __init__(self, data: D, config: C | None = None):
        self.data = data
        self.config = config if config is not None else self.config_class()()

    @classmethod
    def data_class(cls) -> type[TaskData]:
        return _generic_arg(cls, Task, 0, TaskData)

    @classmethod
    def state_class(cls) -> type[State]:
        return _generic_arg(cls, Task, 1, State)

    @classmethod
    def config_class(cls) -> type[TaskConfig]:
        return _generic_arg(cls, Task, 2, TaskConfig)

    # Optional hooks; override in subclasses. They receive what they name.
    async def setup(self, trace, state) -> None:  # noqa: D401 - hook
        """Called before the first model call."""

    async def finalize(self, trace, state) -> None:
        """Called after the last model call, before scoring."""

    def validate(self) -> str | bool | None:
        """Model-free gold check: return the gold reply (scored; must earn full reward),
        a bool verdict, or None for "no check"."""
        return None

    @classmethod
    def hooks(cls, kind: str) -> list[tuple[str, Callable, dict]]:
        """(name, unbound function, metadata) of every hook of `kind`, highest priority first."""
        found = {}
        for klass in reversed(cls.__mro__):
            for attr, fn in vars(klass).items():
                meta = getattr(fn, "_vf_hook", None)
                if meta and meta["kind"] == kind:
                    found[meta["name"]] = (attr, meta)
        hooks = [(name, getattr(cls, attr), meta) for name, (attr, meta) in found.items()]
        return sorted(hooks, key=lambda h: (-h[2].get("priority", 0), h[0]))

    def messages(self) -> list[dict[str, Any]]:
        """The opening messages: the system prompt, then the prompt."""
        msgs: list[dict[str, Any]] = []
        if self.data.system_prompt:
            msgs.append({"role": "system", "content": self.data.system_prompt})
        prompt = self.data.prompt
        if isinstance(prompt, str):
            msgs.append({"role": "user", "content": prompt})
        elif prompt:
            msgs.extend(dict(m) for m in prompt)
        return msgs


T = TypeVar("T", bound=Task)
TC = TypeVar("TC", bound=TasksetConfig)


class Taskset(Generic[T, TC]):
    """Config in, tasks out. Implement `load()`; don't override `__init__`."""

    INFINITE: ClassVar[bool] = False
    """True for endless procedural sets: a run must then bound them (`-n`)."""
    ENV: ClassVar[type | None] = None
    """An `Env` subclass for multi-turn control flow; None = single agent, no scripted user."""

    def __init__(self, config: TC | None = None):
        self.config = config if config is not None else self.config_class()()

    @classmethod
    def task_class(cls) -> type[Task]:
        return _generic_arg(cls, Taskset, 0, Task)

    @classmethod
    def config_class(cls) -> type[TasksetConfig]:
        return _generic_arg(cls, Taskset, 1, TasksetConfig)

    def load(self) -> Iterable[TaskData | Task]:
        raise NotImplementedError(f"{type(self).__name__} must implement load()")

    def tasks(self) -> Iterable[Task]:
        """Iterate tasks with `idx` set to their position in the stream."""
        task_cls = self.task_class()
        override = None
        if self.config.system_prompt:
            from pathlib import Path

            override = Path(self.config.system_prompt).read_text()
        task_config = self.config.task
        for i, item in enumerate(self.load()):
            data = item.data if isinstance(item, Task) else item
            update = {"idx": i}
            if override is not None:
                update["system_prompt"] = override
            data = data.model_copy(update=update)
            yield task_cls(data, task_config) if not isinstance(item, Task) else type(item)(data, task_config)

    def take(self, n: int) -> list[Task]:
        out = []
        for t in self.tasks():
            if len(out) >= n:
                break
            out.append(t)
        return out
