"""The v1 taskset API: the behaviour around a task row (`Task`), and the set that yields them
(`Taskset`). The row itself is `vf.rows`; what runs the hooks (calling, scoring) is the
episode core (vf.episode.hooks, vf.episode.scoring).

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

Generic parameters default as in verifiers: `Task[Data]` = `Task[Data, vf.State, vf.TaskConfig]`,
`Taskset[Task]` = `Taskset[Task, vf.TasksetConfig]`.

Hooks (`@reward`, `@metric`, `@stop`, `setup`, `finalize`) may be sync or async and receive
the arguments they name: `task` (the TaskData row), `trace`, `runtime` (the rollout's
`vf.runtime.Runtime`, made only when some hook or harness names it), `state` (= `trace.state`),
`config` (TaskConfig). A reward or metric returns a float or a mapping name → float; the total
reward is Σ score × weight. Hooks run by `priority` (higher first), ties by name; metrics run
before rewards, judges (`--env.taskset.task.judges`) after them.
"""

from __future__ import annotations

import copy
import itertools
import random
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Generic

from pydantic import BaseModel, ConfigDict, Field, field_validator
from typing_extensions import TypeVar

from vf.config import SelectConfig, TaskMatch
from vf.errors import ConfigError, UsageError
from vf.imports import import_function
from vf.judge import Judges, resolve_judges
from vf.rows import (  # noqa: F401 - the task row's names, importable from here as before
    MAX_ARTIFACT_BYTES,
    TaskData,
    TaskResources,
    TaskTimeout,
    WireTaskData,
    as_task_data,
    row_defaults,
)
from vf.types import to_wire

# ---- data and config ---------------------------------------------------------------------------


class FunctionConfig(BaseModel):
    """A config-plugged reward/metric/stop: `fn` = "pkg.mod:func" or "path/file.py:func".
    Without `fn` it only overrides the metadata of the task's decorated method of that name."""

    model_config = ConfigDict(extra="forbid")
    fn: str | None = None
    priority: int | None = None
    weight: float | None = None


class TaskConfig(BaseModel):
    """Run-time knobs for tasks (`--env.taskset.task.FIELD`). Authors subclass to add fields."""

    model_config = ConfigDict(extra="forbid")

    judges: Judges = Field(default_factory=list)
    """Judges run after the task's rewards (`--env.taskset.task.judges '[{"id": "reference", ...}]'`,
    see vf.judge); each entry is validated as its judge's own config type and adds a reward."""
    rewards: dict[str, FunctionConfig] = Field(default_factory=dict)
    metrics: dict[str, FunctionConfig] = Field(default_factory=dict)
    stops: dict[str, FunctionConfig] = Field(default_factory=dict)

    @field_validator("judges", mode="before")
    @classmethod
    def _resolve_judges(cls, value: Any) -> Any:
        # by id, to each judge's config type: a bad entry fails the config, not every rollout
        return resolve_judges(value) if isinstance(value, (list, tuple)) else value


class TasksetConfig(BaseModel):
    """Load-time knobs (`--env.taskset.FIELD`). Authors subclass to add fields (size, seed, ...)."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    task: TaskConfig = TaskConfig()
    system_prompt: str | None = None
    """Path to a file whose text replaces every task's system prompt."""


class State(BaseModel):
    """Typed mutable per-rollout state shared by hooks and tools; never serialised."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    artifacts: dict[str, Any] = Field(default_factory=dict)


# ---- decorators --------------------------------------------------------------------------------

HOOK_KINDS = ("reward", "metric", "stop", "intercept")


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
    """Mark a Task method as a stop condition, checked after every model reply; one with a
    `vf.Request` / `vf.Response` parameter runs at that boundary of each model call instead, after
    the `@intercept` hooks, on what they made (vf.episode.intercept)."""
    mark = _marker("stop", priority=priority, name=name)
    return mark(fn) if fn is not None else mark


def intercept(fn: Callable | None = None, *, priority: int = 0, name: str | None = None):
    """Mark a Task method that sees each intercepted model call: annotated with `vf.Request`, it
    gets the call's request and may return a replacement (only the new user and tool messages
    may change; an empty tool result is a call about to run, and filling it in denies the call);
    with `vf.Response`, the policy's reply before the agent gets it. None leaves it unchanged.
    Higher priority runs first. Every model call of every harness, in-process or a program (vf.episode.intercept)."""
    mark = _marker("intercept", priority=priority, name=name)
    return mark(fn) if fn is not None else mark


# ---- Task and Taskset --------------------------------------------------------------------------

D = TypeVar("D", bound=TaskData)
S = TypeVar("S", bound=State, default=State)
C = TypeVar("C", bound=TaskConfig, default=TaskConfig)


def concrete_type(cls: type, base: type, default: Any = None) -> Any:
    """The class given for a `base`-bounded parameter in `cls`'s generic bases (searching the
    MRO), e.g. `concrete_type(MyTask, State)` for `class MyTask(vf.Task[D, MyState])`.
    Parameters left out take their defaults, as in verifiers."""
    for klass in cls.__mro__:
        for orig in getattr(klass, "__orig_bases__", ()):
            for arg in typing.get_args(orig):
                if isinstance(arg, type) and issubclass(arg, base):
                    return arg
    return default


class Task(Generic[D, S, C]):
    """Behaviour around one TaskData row: rewards, metrics, stop conditions, tools, hooks.

    Generic in its row, state and config: `Task[Data]` = `Task[Data, vf.State, vf.TaskConfig]`.
    """

    def __init__(self, data: D, config: C | None = None):
        self.data = data
        self.config = config if config is not None else self.config_class()()

    @classmethod
    def data_class(cls) -> type[TaskData]:
        return concrete_type(cls, TaskData, TaskData)

    data_type = data_class

    @classmethod
    def state_class(cls) -> type[State]:
        return concrete_type(cls, State, State)

    @classmethod
    def config_class(cls) -> type[TaskConfig]:
        return concrete_type(cls, TaskConfig, TaskConfig)

    config_type = config_class

    @property
    def hash(self) -> str:
        return self.data.hash

    @property
    def key(self) -> str:
        return self.data.key

    def with_data(self, **update: Any) -> Task:
        """A copy whose row has `update` applied (e.g. `task.with_data(prompt=None)`)."""
        clone = copy.copy(self)
        clone.data = self.data.model_copy(update=update)
        return clone

    @classmethod
    def toolsets(cls, config: C) -> list:
        """Toolsets launched per rollout (override: `return [MyTools(config.tools)]`)."""
        return []

    def runtime_env(self) -> dict[str, str]:
        """Extra environment variables for commands this task's rollouts run (not traced)."""
        return {}

    # Optional hooks; override in subclasses. They receive what they name: task, trace,
    # runtime, state, config.
    async def setup(self, trace, runtime) -> None:  # noqa: D401 - hook
        """Called before the first model call."""

    async def finalize(self, trace, runtime) -> None:
        """Called after the last model call, before scoring."""

    def validate(self) -> str | bool | None:
        """Model-free gold check: return the gold reply (scored; must earn full reward),
        a bool verdict, or None for "no check"."""
        return None

    def hooks(self, kind: str) -> list[tuple[str, Callable, dict]]:
        """(name, bound callable, metadata) of every `kind` hook, decorated or plugged by config,
        highest priority first, ties by name. A plugged entry replaces the method of its name;
        one without `fn` overrides only its priority/weight."""
        found: dict[str, tuple[Callable, dict]] = {}
        for klass in reversed(type(self).__mro__):
            for attr, fn in vars(klass).items():
                meta = getattr(fn, "_vf_hook", None)
                if meta and meta["kind"] == kind:
                    found[meta["name"]] = (getattr(self, attr), meta)
        plugged = {"reward": self.config.rewards, "metric": self.config.metrics,
                   "stop": self.config.stops}.get(kind, {})
        for name, spec in plugged.items():
            base = found.get(name)
            if spec.fn:
                fn = import_function(spec.fn)
                meta = dict(getattr(fn, "_vf_hook", None) or {"kind": kind, "name": name})
            elif base is not None:
                fn, meta = base[0], dict(base[1])
            else:
                raise ConfigError([f"taskset.task.{kind}s.{name}: no `fn`, and the task has no "
                                   f"@vf.{kind} named {name!r} to override"])
            meta["name"] = name
            if spec.priority is not None:
                meta["priority"] = spec.priority
            if kind == "reward":
                meta["weight"] = float(spec.weight if spec.weight is not None else meta.get("weight", 1.0))
            found[name] = (fn, meta)
        hooks = [(name, fn, meta) for name, (fn, meta) in found.items()]
        return sorted(hooks, key=lambda h: (-h[2].get("priority", 0), h[0]))

    def messages(self) -> list[dict[str, Any]]:
        """The opening messages as provider dicts: the system prompt, then the prompt."""
        msgs: list[dict[str, Any]] = []
        if self.data.system_prompt:
            msgs.append({"role": "system", "content": self.data.system_prompt})
        prompt = self.data.prompt
        if isinstance(prompt, str):
            msgs.append({"role": "user", "content": prompt})
        elif prompt:
            msgs.extend(to_wire(m) for m in prompt)
        return msgs


T = TypeVar("T", bound=Task)
TC = TypeVar("TC", bound=TasksetConfig, default=TasksetConfig)


class Taskset(Generic[T, TC]):
    """Config in, tasks out. Implement `load()`; don't override `__init__`."""

    INFINITE: ClassVar[bool] = False
    """True for endless procedural sets: a run must then bound them (`-n`)."""
    ENV: ClassVar[type | None] = None
    """An `Env` subclass for multi-turn control flow; None = the module's exported Env, else
    `SingleAgentEnv`."""

    def __init__(self, config: TC | None = None):
        self.config = config if config is not None else self.config_class()()

    @classmethod
    def task_class(cls) -> type[Task]:
        return concrete_type(cls, Task, Task)

    task_type = task_class

    @classmethod
    def config_class(cls) -> type[TasksetConfig]:
        return concrete_type(cls, TasksetConfig, TasksetConfig)

    @classmethod
    def toolsets(cls, config: TC) -> list:
        """Toolsets shared by every rollout of a worker (override like `Task.toolsets`)."""
        return []

    # views (include/exclude/shuffle/skip/take/select): a shallow copy whose iteration runs
    # through `transform`, composed onto the parent's
    transform: ClassVar[Callable[[Iterator[Task]], Iterator[Task]] | None] = None
    _bounded: ClassVar[bool | None] = None
    _ordered: ClassVar[bool] = True

    @property
    def bounded(self) -> bool:
        """Whether iterating ends: `load()` is finite, or a view caps it (`take`, or `include`
        with only closed `idx` ranges)."""
        return not self.INFINITE if self._bounded is None else self._bounded

    def load(self) -> Iterable[TaskData | Task]:
        raise NotImplementedError(f"{type(self).__name__} must implement load()")

    def _stream(self) -> Iterator[Task]:
        """`load()` with each task's `idx` set to its position and the config's system prompt."""
        task_cls = self.task_class()
        override = None
        if self.config.system_prompt:
            override = Path(self.config.system_prompt).read_text()
        task_config = self.config.task
        for i, item in enumerate(self.load()):
            data = item.data if isinstance(item, Task) else item
            update = {"idx": i}
            if override is not None:
                update["system_prompt"] = override
            data = data.model_copy(update=update)
            yield task_cls(data, task_config) if not isinstance(item, Task) else type(item)(data, task_config)

    def tasks(self) -> Iterator[Task]:
        """The tasks, lazily, through this view's transform (the plain `load()` order if none)."""
        stream = self._stream()
        return stream if self.transform is None else self.transform(stream)

    __iter__ = tasks

    def _view(self, transform: Callable[[Iterator[Task]], Iterator[Task]]) -> Taskset:
        view = copy.copy(self)
        prev = self.transform
        view.transform = transform if prev is None else (lambda tasks: transform(prev(tasks)))
        return view

    def include(self, match: TaskMatch | None = None, **fields: Any) -> Taskset:
        """A view keeping the tasks `match` (or `idx=`/`ids=`/`keys=`/`names=`) names."""
        match = _task_match(match, fields)
        if not self.bounded and (match.ids or match.keys or match.names):
            raise UsageError(f"{type(self).__name__} is endless: including by ids, keys or names may never end",
                             hint="bound it first with closed idx ranges (--select.include.idx 0:1000)")
        stop = match.stop if self._ordered else None
        view = self._view(lambda tasks: _matching(tasks, match, True, stop))
        if match.stop is not None:
            view._bounded = True
        return view

    def exclude(self, match: TaskMatch | None = None, **fields: Any) -> Taskset:
        """A view dropping the tasks `match` names."""
        match = _task_match(match, fields)
        if not self.bounded and match.open_tail:
            raise UsageError(f"{type(self).__name__} is endless: excluding an open idx range drops every task after it",
                             hint="exclude a closed range (e.g. 10:20)")
        return self._view(lambda tasks: _matching(tasks, match, False, None))

    def shuffle(self, seed: int = 0) -> Taskset:
        """A view shuffled under `seed` (materialised on iteration; needs a bounded view)."""
        if not self.bounded:
            raise UsageError(f"{type(self).__name__} is an endless taskset and cannot be shuffled",
                             hint="drop the shuffle (its tasks are generated at random), or bound it first "
                                  "with closed include idx ranges (--select.include.idx 0:1000)")

        def shuffled(tasks: Iterator[Task]) -> Iterator[Task]:
            items = list(tasks)
            random.Random(seed).shuffle(items)
            return iter(items)

        view = self._view(shuffled)
        view._ordered = False
        return view

    def skip(self, n: int) -> Taskset:
        """A view without the first `n` tasks."""
        return self._view(lambda tasks: itertools.islice(tasks, n, None))

    def take(self, n: int) -> Taskset:
        """A lazy, always-finite view of the first `n` tasks (`list(ts.take(3))`)."""
        view = self._view(lambda tasks: itertools.islice(tasks, n))
        view._bounded = True
        return view

    def select(self, config: SelectConfig) -> Taskset:
        """The views `config` describes, in its fixed order: include, exclude, shuffle, skip, take."""
        view = self
        if not config.include.empty:
            view = view.include(config.include)
        if not config.exclude.empty:
            view = view.exclude(config.exclude)
        if config.shuffle:
            view = view.shuffle(config.seed)
        if config.skip:
            view = view.skip(config.skip)
        if config.limit is not None:
            view = view.take(config.limit)
        return view


def _task_match(match: TaskMatch | None, fields: dict[str, Any]) -> TaskMatch:
    return match if match is not None else TaskMatch(**fields)


def _matching(tasks: Iterator[Task], match: TaskMatch, keep: bool, stop: int | None) -> Iterator[Task]:
    """The tasks `match` names (keep) or does not name, reading no further than position `stop`."""
    ranges = match.ranges()
    ids, keys, names = set(match.ids), set(match.keys), set(match.names)
    for task in tasks:
        idx = task.data.idx
        if stop is not None and idx >= stop:
            return
        named = (any(idx in r for r in ranges) or task.data.id in ids or task.data.name in names
                 or (bool(keys) and task.key in keys))
        if named == keep:
            yield task
        if stop is not None and idx + 1 >= stop:  # do not generate one task more than needed
            return


def task_toolsets(task: Task) -> list:
    """The toolsets of one rollout of `task`: `toolsets(config)` (a classmethod, as in verifiers),
    or a class-level list of Toolset classes (the older form), instantiated here."""
    declared = type(task).toolsets
    items = declared(task.config) if callable(declared) else list(declared)
    return list(items)


