"""Tools the model may call, run in-process through OpenAI-style function calling.

    class Calculator(vf.Toolset):
        @vf.tool
        def add(self, a: float, b: float) -> float:
            '''Add two numbers.'''
            return a + b

A toolset is instantiated once per episode (so it may keep per-episode state on `self`) and
gets the episode's `state` as `self.state`. A tool method may also name `state`, `trace` or
`task` as parameters: those are injected and hidden from the model's schema. The JSON schema
each tool advertises comes from its signature and docstring.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from typing import Any

from vf.taskset import call_hook

INJECTED = ("state", "trace", "task", "self")

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def tool(fn: Callable | None = None, *, name: str | None = None):
    """Mark a Toolset method as a tool the model can call."""

    def mark(f: Callable) -> Callable:
        f._vf_tool = {"name": name or f.__name__}
        return f

    return mark(fn) if fn is not None else mark


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


class ToolError(Exception):
    """A tool call the model got wrong (unknown tool, bad arguments); reported back to it."""


class Toolset:
    """A group of @tool methods. Subclass it; don't override __init__ (use `setup`)."""

    TOOL_PREFIX: str | None = None

    def __init__(self, state: Any = None):
        self.state = state

    def setup(self) -> None:
        """Called once per episode after construction."""

    def tools(self) -> dict[str, Callable]:
        """Bound tool methods by advertised name."""
        out = {}
        for attr in dir(type(self)):
            fn = getattr(type(self), attr, None)
            meta = getattr(fn, "_vf_tool", None)
            if meta:
                name = f"{self.TOOL_PREFIX}{meta['name']}" if self.TOOL_PREFIX else meta["name"]
                out[name] = getattr(self, attr)
        return out

    def schemas(self) -> list[dict[str, Any]]:
        return [tool_schema(getattr(type(self), fn.__name__), name) for name, fn in self.tools().items()]


class ToolRunner:
    """All tools of one episode: their schemas, and execution of the model's tool calls."""

    def __init__(self, toolsets: list[Toolset]):
        self.functions: dict[str, Callable] = {}
        self.schemas: list[dict[str, Any]] = []
        for ts in toolsets:
            for name, fn in ts.tools().items():
                if name in self.functions:
                    raise ValueError(f"two toolsets define the tool {name!r}; set TOOL_PREFIX on one")
                self.functions[name] = fn
            self.schemas.extend(ts.schemas())

    async def call(self, name: str, arguments: str | dict, context: dict[str, Any]) -> str:
        """Run one tool call; return the text the model sees. Model mistakes become messages."""
        fn = self.functions.get(name)
        if fn is None:
            raise ToolError(f"unknown tool {name!r}; available: {sorted(self.functions)}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as e:
                raise ToolError(f"arguments for {name} are not valid JSON: {e.msg}") from None
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments for {name} must be a JSON object")
        params = inspect.signature(fn).parameters
        unknown = [k for k in arguments if k not in params or k in INJECTED]
        if unknown:
            raise ToolError(f"{name} got unexpected arguments {unknown}")
        try:
            result = await call_hook(fn, {**{k: v for k, v in context.items() if k in params}, **arguments})
        except TypeError as e:
            raise ToolError(f"bad call to {name}: {e}") from None
        return result if isinstance(result, str) else json.dumps(result)
