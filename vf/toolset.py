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
- `command`: a stdio MCP server program (argv, `command_env` for its variables) that vf starts on
  the host for the rollout (for the run, shared) and stops after: a server of the environment's
  author, as v0's MCPEnv ran them. Its tools are the ones it lists; no state is sent to it.

Runtime: a @tool method with a `runtime` parameter gets the rollout's `vf.runtime.Runtime` (the
rollout makes one, a bubblewrap sandbox by default) and runs its commands there, as harness tools
do; the model never sees or sets it. Such a toolset runs in-process (served, it is refused).

State: `self.state` is the calling rollout's typed state (`Toolset[Config, State]`), also when
one toolset instance serves every rollout: it is bound per call, and a served toolset gets it
with the call and sends changes back, so the task's rewards see what tools wrote.

Results: a string, any JSON-able value (sent as its JSON text), or MCP content (text and image
blocks, or a list of them); an image reaches the trace as an `image_url` part of the tool
message. A tool that raises or runs past its timeout is answered with `error: ...`, recorded in
`trace.info["tool_errors"]`, and the episode goes on.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Generic

from pydantic import BaseModel, ConfigDict
from typing_extensions import TypeVar

from vf.errors import VfError
from vf.mcp.server import (  # noqa: F401 - served-call helpers, importable from here as before
    INJECTED,
    _call_state,
    _setup,
    serve_forever,
    state_view,
    tool_content,
)
from vf.runtime import RuntimeConfig
from vf.taskset import State, concrete_type

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
    command: list[str] | None = None
    """A stdio MCP server program (argv) vf starts and stops: its listed tools are the toolset's."""
    command_env: dict[str, str] | None = None
    """Variables for `command` on top of MCP's default few (PATH, HOME, ...): no host secret leaks in."""

    @property
    def served(self) -> bool:
        """True when calls go over MCP to another process."""
        return bool(self.url) or bool(self.command) or (self.runtime is not None and not self.colocated)


class SharedToolsetConfig(BaseModel):
    """Where a taskset-wide (one per run) toolset runs; rollouts still see their own state."""

    model_config = ConfigDict(extra="forbid")

    runtime: RuntimeConfig | None = None
    url: str | None = None
    command: list[str] | None = None
    command_env: dict[str, str] | None = None

    @property
    def served(self) -> bool:
        return bool(self.url) or bool(self.command) or self.runtime is not None


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


# ---- Toolset -----------------------------------------------------------------------------------

ConfigT = TypeVar("ConfigT", bound=BaseModel, default=ToolsetConfig)
StateT = TypeVar("StateT", bound=State, default=State)

# The state of the rollout whose tool call is running: one toolset instance may serve many
# rollouts at once (a shared toolset), and each call must see only its own rollout's state.


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

    @classmethod
    def needs_runtime(cls) -> bool:
        """Whether a @tool method names `runtime` (so the rollout makes one and the tool runs its
        commands there). Such a toolset runs in the rollout's process: it cannot be served."""
        return any("runtime" in inspect.signature(getattr(cls, attr)).parameters for attr in dir(cls)
                   if getattr(getattr(cls, attr, None), "_vf_tool", None))

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
        serve_forever(cls, config, host=host, port=port)


# ---- running tool calls ------------------------------------------------------------------------


def apply_state(state: State, values: dict[str, Any]) -> None:
    """Write a toolset's view of the state back onto the rollout's state."""
    for k, v in values.items():
        if getattr(state, k, None) != v:
            setattr(state, k, v)


