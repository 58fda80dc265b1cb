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
import functools
import inspect
import itertools
import random
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from typing_extensions import TypeVar

from vf.errors import ConfigError, UsageError
from vf.judge import Judges, resolve_judges
from vf.trace import task_hash
from vf.types import Message, content_text, to_wire

if TYPE_CHECKING:
    from vf.config import SelectConfig, TaskMatch

# ---- data and config ---------------------------------------------------------------------------

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
    the `@intercept` hooks, on what they made (vf.intercept)."""
    mark = _marker("stop", priority=priority, name=name)
    return mark(fn) if fn is not None else mark


def intercept(fn: Callable | None = None, *, priority: int = 0, name: str | None = None):
    """Mark a Task method that sees each intercepted model call: annotated with `vf.Request`, it
    gets the call's request and may return a replacement (only the new user and tool messages
    may change; an empty tool result is a call about to run, and filling it in denies the call);
    with `vf.Response`, the policy's reply before the agent gets it. None leaves it unchanged.
    Higher priority runs first. Every model call of every harness, in-process or a program (vf.intercept)."""
    mark = _marker("intercept", priority=priority, name=name)
    return mark(fn) if fn is not None else mark


async def call_hook(fn: Callable, available: dict[str, Any]) -> Any:
    """Call `fn` with the arguments it names (sync or async). A parameter with a default that is
    not available keeps its default; one without is an error naming what hooks may ask for."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = dict(available)
    else:
        missing = [n for n, p in params.items()
                   if n not in available and p.default is p.empty
                   and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if missing:
            raise TypeError(
                f"hook {fn.__qualname__} asks for {missing}; hooks may name: {sorted(available)}")
        kwargs = {n: available[n] for n in params if n in available}
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def needs_runtime(fn: Callable) -> bool:
    """Whether a hook names `runtime` (so the rollout must provide one)."""
    try:
        return "runtime" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def import_function(spec: str) -> Callable:
    """`pkg.mod:func`, `pkg.mod.func` or `path/file.py:func` → the function."""
    import importlib

    target, sep, attr = spec.rpartition(":")
    if not sep:
        target, _, attr = spec.rpartition(".")
    if target.endswith(".py"):
        from vf.loading import import_path

        module = import_path(Path(target))
    else:
        module = importlib.import_module(target)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError([f"{spec}: {module.__name__} has no {attr!r}"]) from None


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
    from vf.config import TaskMatch

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


async def call_validate(task: Task) -> str | bool | None:
    """`task.validate` with the arguments it names (`runtime`: a fresh subprocess runtime,
    closed afterwards; `task`, `config`)."""
    available: dict[str, Any] = {"task": task.data, "config": task.config}
    runtime = None
    if needs_runtime(task.validate):
        from vf.runtime import make_runtime

        runtime = available["runtime"] = make_runtime()
    try:
        return await call_hook(task.validate, available)
    finally:
        if runtime is not None:
            await runtime.close()


def task_toolsets(task: Task) -> list:
    """The toolsets of one rollout of `task`: `toolsets(config)` (a classmethod, as in verifiers),
    or a class-level list of Toolset classes (the older form), instantiated here."""
    declared = type(task).toolsets
    items = declared(task.config) if callable(declared) else list(declared)
    return list(items)


async def score(task: Task, trace, runtime=None) -> None:
    """Metrics, then rewards, then judges, as verifiers scores. Every expected name is seeded
    with None first, so a trace shows which signals should have run; a hook that raises is
    recorded as an error (type, message) and leaves its value None."""
    import traceback as tb

    from vf.trace import ErrorInfo, RewardValue

    args = {"task": task.data, "trace": trace, "state": trace.state, "config": task.config, "runtime": runtime}
    for kind in ("metric", "reward"):
        hooks = task.hooks(kind)
        target = trace.rewards if kind == "reward" else trace.metrics
        for name, _, _ in hooks:
            target.setdefault(name, None)
        for name, fn, meta in hooks:
            try:
                value = await call_hook(fn, args)
            except Exception as e:  # noqa: BLE001 - hook code is user code
                trace.errors.append(ErrorInfo(type=type(e).__name__, message=f"{kind} {name!r}: {e}",
                                              traceback=tb.format_exc(limit=5)))
                trace.ok = False
                continue
            values = value if isinstance(value, Mapping) else {name: value}
            if name not in values:  # a hook that reports several signals replaces its own name
                target.pop(name, None)
            for k, v in values.items():
                if kind == "reward":
                    target[k] = None if v is None else RewardValue(score=float(v), weight=meta.get("weight", 1.0))
                else:
                    target[k] = None if v is None else float(v)
    if task.config.judges:
        from vf.judge import run_judges

        await run_judges(task, trace, args)
