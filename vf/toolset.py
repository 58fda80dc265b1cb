"""Toolsets: tools the model may call, served as MCP (verifiers v1's `vf.Toolset`).

    class Calculator(vf.Toolset[vf.ToolsetConfig]):
        TOOL_PREFIX = "calc"            # tools reach the model as calc_add, ...

        @vf.tool
        def add(self, a: float, b: float) -> float:
            '''Add two numbers.'''
            return a + b

    if __name__ == "__main__":
        Calculator.run()                # serve it standalone (streamable-HTTP MCP)

Naming, as verifiers has it: a tool reaches the model as `<prefix>_<name>` (`prefix_name`), where
the prefix is `TOOL_PREFIX`, or the snake-cased class name when `TOOL_PREFIX` is "" (the
default); `TOOL_PREFIX = None` advertises bare names.

Where a toolset runs is its `ToolsetConfig` (`SharedToolsetConfig` for one server per run):
- default (no `runtime`, or `colocated`): in the harness's process. vf's harness runs in-process,
  so calls are plain method calls — same names, arguments, results and state semantics as a
  served toolset, without a process and a protocol round trip per rollout.
- `runtime` set (e.g. `{"type": "subprocess"}`): an MCP server process per rollout (per run
  for a shared toolset) started by `vf.mcp`, killed when the rollout ends.
- `url`: an MCP server already running elsewhere (streamable HTTP); nothing is started.

State: `self.state` is the calling rollout's typed state (`Toolset[Config, State]`), also when
one toolset instance serves every rollout: it is bound per call, and a served toolset gets it
with the call and sends changes back, so the task's rewards see what tools wrote.

Results: a string, any JSON-able value (sent as its JSON text), or MCP content (text and image
blocks, or a list of them); an image reaches the trace as an `image_url` part of the tool
message. A tool that raises or runs past its timeout is answered with `error: ...`, recorded in
`trace.info["tool_errors"]`, and the episode goes on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import inspect
import json
import re
import time
import typing
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, ClassVar, Generic

from pydantic import BaseModel, ConfigDict
from typing_extensions import TypeVar

from vf.bounded import BoundsError, load_json
from vf.errors import VfError
from vf.runtime import RuntimeConfig
from vf.taskset import State, concrete_type

INJECTED = ("state", "trace", "task", "self")
TOOL_TIMEOUT = 600.0
"""Seconds one tool call may take (verifiers' `tool_timeout` default); `Toolset.TOOL_TIMEOUT`
overrides it per toolset."""

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


# ---- config ------------------------------------------------------------------------------------


class ToolsetConfig(BaseModel):
    """Where a per-rollout toolset runs (see the module docstring). Authors subclass it to add
    their toolset's own knobs."""

    model_config = ConfigDict(extra="forbid")

    colocated: bool = False
    """Run beside the harness (in vf: in its process) even when `runtime` is set."""
    runtime: RuntimeConfig | None = None
    """Own runtime for the toolset's MCP server; None = in the harness's process."""
    url: str | None = None
    """A remote streamable-HTTP MCP server (`http://host:port/mcp`); nothing is started."""

    @property
    def served(self) -> bool:
        """True when calls go over MCP to another process."""
        return bool(self.url) or (self.runtime is not None and not self.colocated)


class SharedToolsetConfig(BaseModel):
    """Where a taskset-wide (one per run) toolset runs; rollouts still see their own state."""

    model_config = ConfigDict(extra="forbid")

    runtime: RuntimeConfig | None = None
    url: str | None = None

    @property
    def served(self) -> bool:
        return bool(self.url) or self.runtime is not None


# ---- decorator and schemas ---------------------------------------------------------------------


def tool(fn: Callable | None = None, *, name: str | None = None):
    """Mark a Toolset method as a tool the model can call (its docstring is the description)."""

    def mark(f: Callable) -> Callable:
        f._vf_tool = {"name": name or f.__name__}
        return f

    return mark(fn) if fn is not None else mark


def prefix_name(prefix: str | None, name: str) -> str:
    """The name the model sees: `<prefix>_<name>`, or the bare name without a prefix."""
    return f"{prefix}_{name}" if prefix else name


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _json_type(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        (item,) = typing.get_args(annotation)[:1] or (str,)
        return {"type": "array", "items": _json_type(item)}
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(args[0]) if args else {"type": "string"}
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _JSON_TYPES.get(type(values[0]), "string"), "enum": values}
    return {"type": _JSON_TYPES.get(annotation, "string")}


def tool_schema(fn: Callable, name: str) -> dict[str, Any]:
    """OpenAI function-calling schema from a function's signature and docstring."""
    hints = typing.get_type_hints(fn)
    props, required = {}, []
    for pname, p in inspect.signature(fn).parameters.items():
        if pname in INJECTED or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        props[pname] = _json_type(hints.get(pname, str))
        if p.default is p.empty:
            required.append(pname)
    doc = inspect.getdoc(fn) or ""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": doc.split("\n\n")[0].strip(),
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


# ---- results -----------------------------------------------------------------------------------


def _block(item: Any) -> dict[str, Any] | None:
    """An MCP content block (pydantic object or its JSON dict, or MCPServer's Image helper) as
    an OpenAI content part; None when `item` is no content block."""
    if hasattr(item, "to_image_content"):  # mcp.server.mcpserver.Image
        item = item.to_image_content()
    if isinstance(item, BaseModel) and getattr(item, "type", None) in ("text", "image"):
        item = item.model_dump(by_alias=True, mode="json")
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind == "text" and isinstance(item.get("text"), str):
        return {"type": "text", "text": item["text"]}
    if kind == "image" and "data" in item:
        mime = item.get("mimeType") or item.get("mime_type") or "image/png"
        data = item["data"]
        data = base64.b64encode(data).decode() if isinstance(data, bytes) else data
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}
    if kind == "image_url" and isinstance(item.get("image_url"), dict):
        return {"type": "image_url", "image_url": dict(item["image_url"])}
    return None


def tool_content(result: Any) -> str | list[dict[str, Any]]:
    """What the tool message carries: text, or content parts when an image is among them.

    Mirrors verifiers' MCP → chat conversion: all-text blocks join with newlines; other values
    are sent as their JSON text (a str as itself)."""
    if isinstance(result, str):
        return result
    items = result if isinstance(result, (list, tuple)) else [result]
    parts = [_block(x) for x in items]
    if items and all(p is not None for p in parts):
        if all(p["type"] == "text" for p in parts):
            return "\n".join(p["text"] for p in parts)
        return parts
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    try:
        return json.dumps(result)
    except TypeError:
        return str(result)


# ---- Toolset -----------------------------------------------------------------------------------

ConfigT = TypeVar("ConfigT", bound=BaseModel, default=ToolsetConfig)
StateT = TypeVar("StateT", bound=State, default=State)

# The state of the rollout whose tool call is running: one toolset instance may serve many
# rollouts at once (a shared toolset), and each call must see only its own rollout's state.
_call_state: contextvars.ContextVar[State | None] = contextvars.ContextVar("vf_tool_state", default=None)


class ToolError(Exception):
    """A tool call that failed (unknown tool, bad arguments, the tool raised or timed out);
    its message is shown to the model, its `kind` recorded on the trace."""

    def __init__(self, message: str, kind: str = "BadToolCall"):
        super().__init__(message)
        self.kind = kind


class ToolsetError(VfError):
    """A served toolset that could not start or answer (the rollout errors; the run goes on)."""


class Toolset(Generic[ConfigT, StateT]):
    """A group of @tool methods. Subclass it; put one-time preparation in `setup()` (sync or
    async), not in `__init__`."""

    TOOL_PREFIX: ClassVar[str | None] = ""
    """Name prefix: "" = the snake-cased class name, None = bare tool names."""
    TOOL_TIMEOUT: ClassVar[float | None] = None
    """Seconds one call may take; None = the runner's default (600)."""

    def __init__(self, config: ConfigT | None = None, state: StateT | None = None):
        if isinstance(config, State):  # vf's first API: Toolset(state)
            config, state = None, config
        self.config = config if config is not None else self.config_class()()
        self._state = state

    @classmethod
    def config_class(cls) -> type[BaseModel]:
        return concrete_type(cls, BaseModel, ToolsetConfig)

    @classmethod
    def state_class(cls) -> type[State]:
        return concrete_type(cls, State, State)

    @property
    def state(self) -> StateT:
        current = _call_state.get()
        if current is not None:
            return current  # type: ignore[return-value]
        if self._state is None:
            self._state = self.state_class()()
        return self._state  # type: ignore[return-value]

    @state.setter
    def state(self, value: StateT) -> None:
        self._state = value

    @property
    def server_name(self) -> str:
        """The prefix of this toolset's tool names ("" = bare)."""
        if self.TOOL_PREFIX is None:
            return ""
        return self.TOOL_PREFIX or snake_case(type(self).__name__)

    def setup(self) -> Any:
        """Called once before the first tool call (per rollout, or per run when shared)."""

    def tool_methods(self) -> dict[str, Callable]:
        """Bound tool methods by their own (unprefixed) name."""
        out = {}
        for attr in dir(type(self)):
            meta = getattr(getattr(type(self), attr, None), "_vf_tool", None)
            if meta:
                out[meta["name"]] = getattr(self, attr)
        return out

    def tools(self) -> dict[str, Callable]:
        """Bound tool methods by the name the model sees."""
        return {prefix_name(self.server_name, n): fn for n, fn in self.tool_methods().items()}

    def schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(fn.__func__, name) for name, fn in self.tools().items()]

    @classmethod
    def run(cls, config: ConfigT | None = None, *, host: str | None = None, port: int | None = None) -> None:
        """Serve this toolset standalone as a streamable-HTTP MCP server at `/mcp` until killed.

        Config comes from `config`, else the `VF_CONFIG` environment variable (JSON); the
        address from the arguments, else `MCP_HOST` / `MCP_PORT` (default 127.0.0.1, a free port)."""
        from vf.mcp.server import serve_forever

        serve_forever(cls, config, host=host, port=port)


# ---- running tool calls ------------------------------------------------------------------------


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


def state_view(cls: type[State], data: dict[str, Any]) -> State:
    """A toolset's typed view of the rollout's state (the fields `cls` declares)."""
    if cls.model_config.get("extra") != "allow":
        data = {k: v for k, v in data.items() if k in cls.model_fields}
    return cls.model_validate(data)


def apply_state(state: State, values: dict[str, Any]) -> None:
    """Write a toolset's view of the state back onto the rollout's state."""
    for k, v in values.items():
        if getattr(state, k, None) != v:
            setattr(state, k, v)


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


async def _setup(ts: Toolset) -> None:
    result = ts.setup()
    if inspect.isawaitable(result):
        await result


@contextlib.asynccontextmanager
async def open_tools(toolsets: Iterable[Toolset | type[Toolset]], state: State | None = None, *,
                     shared: SharedTools | None = None, timeout: float = TOOL_TIMEOUT) -> AsyncIterator[ToolRunner]:
    """Bring up one rollout's tools and yield their runner; everything started is stopped on
    exit, however the rollout ends.

    `toolsets` are the task's (classes are instantiated with the rollout's state); `shared` are
    the run's shared toolsets from `open_shared_tools`. A served toolset that cannot start or
    list its tools raises `ToolsetError` (an errored rollout; the run goes on)."""
    from vf.mcp.client import serve_toolset

    runner = ToolRunner(timeout=timeout)
    async with contextlib.AsyncExitStack() as stack:
        for item in [*(shared.toolsets if shared else []), *toolsets]:
            ts = item(state=state) if isinstance(item, type) else item
            if shared and item in shared.toolsets:
                remote = shared.remote.get(id(ts))
            elif ts.config.served:
                remote = await stack.enter_async_context(serve_toolset(ts))
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
async def open_shared_tools(toolsets: Iterable[Toolset]) -> AsyncIterator[SharedTools]:
    """Start the taskset's shared toolsets once for a run (`Taskset.toolsets(config)`); each
    rollout's `open_tools(..., shared=...)` then reaches them with its own state."""
    from vf.mcp.client import serve_toolset

    shared = SharedTools(list(toolsets))
    async with contextlib.AsyncExitStack() as stack:
        for ts in shared.toolsets:
            if ts.config.served:
                shared.remote[id(ts)] = await stack.enter_async_context(serve_toolset(ts))
            else:
                await _setup(ts)
        yield shared
