"""One rollout's tools: the runner that executes the model's tool calls against the task's
toolsets, in-process (a plain method call with the rollout's state bound) or served over MCP
(vf.episode.served_tools), and the run's shared toolsets, started once.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from vf.bounded import BoundsError, load_json
from vf.episode.served_tools import serve_toolset
from vf.taskset import State
from vf.toolset import (
    INJECTED,
    TOOL_TIMEOUT,
    ToolError,
    Toolset,
    ToolsetError,
    _call_state,
    _setup,
    apply_state,
    state_view,
    tool_content,
    tool_schema,
)


@contextlib.contextmanager
def _bound_state(cls: type[State], state: State | None):
    """Bind the calling rollout's state as `ts.state` for one call. A toolset whose state class
    differs from the rollout's gets a copy of the fields it declares, written back afterwards
    (what a served toolset does over the wire)."""
    if state is None:
        yield
        return
    if isinstance(state, cls):
        token = _call_state.set(state)
        try:
            yield
        finally:
            _call_state.reset(token)
        return
    view = state_view(cls, state.model_dump())
    token = _call_state.set(view)
    try:
        yield
    finally:
        _call_state.reset(token)
        apply_state(state, view.model_dump())


class _LocalTool:
    """One in-process @tool method: checks the model's argument names, binds state, calls it."""

    def __init__(self, toolset: Toolset, fn: Callable):
        self.toolset, self.fn = toolset, fn
        self.params = inspect.signature(fn).parameters
        self.state_cls = toolset.state_class()

    async def __call__(self, name: str, arguments: dict[str, Any], context: dict[str, Any]) -> Any:
        unknown = [k for k in arguments if k not in self.params or k in INJECTED]
        if unknown:
            raise ToolError(f"{name} got unexpected arguments {unknown}", "BadArguments")
        kwargs = {k: v for k, v in context.items() if k in self.params}
        kwargs.update(arguments)
        with _bound_state(self.state_cls, context.get("state")):
            try:
                result = self.fn(**kwargs)
            except TypeError as e:
                raise ToolError(f"bad call to {name}: {e}", "BadArguments") from None
            return await result if inspect.isawaitable(result) else result


class ToolRunner:
    """All tools of one rollout: their schemas, and execution of the model's tool calls.

    `ToolRunner(toolsets)` takes in-process toolsets; `open_tools()` also brings up served ones."""

    def __init__(self, toolsets: Iterable[Toolset] = (), *, timeout: float = TOOL_TIMEOUT):
        self.functions: dict[str, Callable] = {}
        self.schemas: list[dict[str, Any]] = []
        self.timeouts: dict[str, float] = {}
        self.timeout = timeout
        for ts in toolsets:
            for name, fn in ts.tools().items():
                self.add(name, _LocalTool(ts, fn), tool_schema(fn.__func__, name), ts.TOOL_TIMEOUT)

    def add(self, name: str, call: Callable, schema: dict[str, Any], timeout: float | None = None) -> None:
        if name in self.functions:
            raise ValueError(f"two toolsets define the tool {name!r}; set TOOL_PREFIX on one")
        self.functions[name] = call
        self.schemas.append(schema)
        if timeout is not None:
            self.timeouts[name] = timeout

    async def call(self, name: str, arguments: str | dict, context: dict[str, Any]) -> str | list[dict[str, Any]]:
        """Run one tool call; return the tool message's content. Anything that goes wrong is a
        ToolError (recorded in `trace.info["tool_errors"]` when the context has the trace)."""
        try:
            return tool_content(await self._call(name, arguments, context))
        except ToolError as e:
            _record(context, name, e.kind, str(e))
            raise

    async def _call(self, name: str, arguments: str | dict, context: dict[str, Any]) -> Any:
        fn = self.functions.get(name)
        if fn is None:
            raise ToolError(f"unknown tool {name!r}; available: {sorted(self.functions)}", "UnknownTool")
        if isinstance(arguments, str):
            try:
                arguments = load_json(arguments or "{}")  # model output: may nest 100k deep
            except BoundsError as e:
                raise ToolError(f"arguments for {name}: {e}", "BadArguments") from None
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments for {name} must be a JSON object", "BadArguments")
        timeout = self.timeouts.get(name, self.timeout)
        try:
            async with asyncio.timeout(timeout):  # no extra task per call, unlike wait_for
                return await fn(name, arguments, context)
        except ToolError:
            raise
        except TimeoutError:
            raise ToolError(f"{name} timed out after {timeout:g}s", "ToolTimeout") from None
        except Exception as e:  # noqa: BLE001 - tool code is user code; the model sees the error
            raise ToolError(f"{name} failed: {type(e).__name__}: {e}", type(e).__name__) from None


def _record(context: dict[str, Any], name: str, kind: str, message: str) -> None:
    trace = context.get("trace")
    info = getattr(trace, "info", None)
    if isinstance(info, dict):
        info.setdefault("tool_errors", []).append({"tool": name, "type": kind, "message": message,
                                                   "time": time.time()})


@contextlib.asynccontextmanager
async def open_tools(toolsets: Iterable[Toolset | type[Toolset]], state: State | None = None, *,
                     shared: SharedTools | None = None, timeout: float = TOOL_TIMEOUT,
                     max_reply_bytes: int | None = None) -> AsyncIterator[ToolRunner]:
    """Bring up one rollout's tools and yield their runner; everything started is stopped on
    exit, however the rollout ends.

    `toolsets` are the task's (classes are instantiated with the rollout's state); `shared` are
    the run's shared toolsets from `open_shared_tools`. A served toolset that cannot start or
    list its tools raises `ToolsetError` (an errored rollout; the run goes on). `max_reply_bytes`:
    what one reply of a served toolset's server may carry (vf.episode.served_tools.RemoteTools)."""
    runner = ToolRunner(timeout=timeout)
    async with contextlib.AsyncExitStack() as stack:
        for item in [*(shared.toolsets if shared else []), *toolsets]:
            ts = item(state=state) if isinstance(item, type) else item
            if shared and item in shared.toolsets:
                remote = shared.remote.get(id(ts))
            elif ts.config.served:
                if ts.needs_runtime():
                    raise ToolsetError(f"toolset {type(ts).__name__} has tools that take the rollout's `runtime`: "
                                       "they run in the rollout's process, so it cannot be served (unset its "
                                       "config's `runtime`, `url` and `command`)")
                remote = await stack.enter_async_context(serve_toolset(ts, max_reply_bytes=max_reply_bytes))
            else:
                if ts._state is None:
                    ts._state = state
                await _setup(ts)
                remote = None
            if remote is None:
                for name, fn in ts.tools().items():
                    runner.add(name, _LocalTool(ts, fn), tool_schema(fn.__func__, name), ts.TOOL_TIMEOUT)
            else:
                for name, call, schema in remote.tools():
                    runner.add(name, call, schema, ts.TOOL_TIMEOUT)
        yield runner


class SharedTools:
    """The run's shared toolsets, up for the whole run (from `open_shared_tools`)."""

    def __init__(self, toolsets: list[Toolset]):
        self.toolsets = toolsets
        self.remote: dict[int, Any] = {}


@contextlib.asynccontextmanager
async def open_shared_tools(toolsets: Iterable[Toolset], max_reply_bytes: int | None = None) -> AsyncIterator[SharedTools]:
    """Start the taskset's shared toolsets once for a run (`Taskset.toolsets(config)`); each
    rollout's `open_tools(..., shared=...)` then reaches them with its own state."""
    shared = SharedTools(list(toolsets))
    async with contextlib.AsyncExitStack() as stack:
        for ts in shared.toolsets:
            if ts.config.served:
                shared.remote[id(ts)] = await stack.enter_async_context(serve_toolset(ts, max_reply_bytes=max_reply_bytes))
            else:
                await _setup(ts)
        yield shared
