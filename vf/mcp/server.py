"""Serve a Toolset as a streamable-HTTP MCP server (official `mcp` package).

Used by `Toolset.run()` (standalone) and by the server processes `vf.mcp.client` starts:

    python -m vf.mcp.server pkg.module:MyToolset      # VF_CONFIG = the toolset config as JSON

The server binds its port (`MCP_PORT`, default: a free one), prints `vf-mcp-port N` on stdout,
and serves `/mcp` (stateless, JSON responses) until killed; started by vf it dies with its parent.

Below `vf.toolset` (as verifiers' `ServerBase` is below its `Toolset`): what serving a tool call
means (the rollout's state bound for the call, `state_view`; the result as message content,
`tool_content`) is here, and `Toolset` and the episode core's in-process runner build on it.

Tools are registered under their own names; the client adds the prefix (`prefix_name`). The
calling rollout's state travels in the call's `_meta["vf/state"]` and comes back changed in the
result's `_meta`, so one server can serve many rollouts, each seeing its own state.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import importlib
import inspect
import json
import logging
import os
import socket
import sys
import typing
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from vf.taskset import State

if TYPE_CHECKING:
    from vf.toolset import Toolset

STATE_META = "vf/state"

# ---- how a tool call is served, in-process or over MCP (vf.toolset builds on these) -------------------

INJECTED = ("state", "trace", "task", "self", "runtime")
"""Parameters of a @tool method vf fills in, never the model (left out of the schema). `runtime`
(the rollout's vf.runtime.Runtime) reaches in-process toolsets only (`Toolset.needs_runtime`)."""


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


_call_state: contextvars.ContextVar[State | None] = contextvars.ContextVar("vf_tool_state", default=None)


def state_view(cls: type[State], data: dict[str, Any]) -> State:
    """A toolset's typed view of the rollout's state (the fields `cls` declares)."""
    if cls.model_config.get("extra") != "allow":
        data = {k: v for k, v in data.items() if k in cls.model_fields}
    return cls.model_validate(data)


async def _setup(ts: Toolset) -> None:
    result = ts.setup()
    if inspect.isawaitable(result):
        await result


# ---- the MCP server --------------------------------------------------------------------------------


def _mcp_blocks(content: str | list[dict[str, Any]]) -> list[Any]:
    from mcp.types import ImageContent, TextContent

    if isinstance(content, str):
        return [TextContent(type="text", text=content)]
    blocks = []
    for part in content:
        if part["type"] == "image_url":
            head, _, data = part["image_url"]["url"].partition(",")
            mime = head.removeprefix("data:").split(";")[0] or "image/png"
            blocks.append(ImageContent(type="image", data=data, mime_type=mime))
        else:
            blocks.append(TextContent(type="text", text=part.get("text", "")))
    return blocks


def _wrap(ts: Toolset, fn: Any, context_cls: type) -> Any:
    """An MCP tool function around one @tool method: binds the rollout's state for the call and
    returns the state it leaves behind in the result's `_meta`."""
    from mcp.types import CallToolResult, TextContent

    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = [p.replace(annotation=hints.get(n, p.annotation)) for n, p in sig.parameters.items()
              if n not in INJECTED]
    wants_state = "state" in sig.parameters
    state_cls = ts.state_class()

    async def call(vf_ctx, **arguments):
        meta = vf_ctx.request_context.meta
        meta = meta.model_dump(by_alias=True) if hasattr(meta, "model_dump") else dict(meta or {})
        incoming = meta.get(STATE_META)
        state = state_view(state_cls, incoming) if isinstance(incoming, dict) else None
        token = _call_state.set(state) if state is not None else None
        try:
            if wants_state:
                arguments["state"] = ts.state
            if inspect.iscoroutinefunction(fn):
                result = await fn(**arguments)
            else:  # a blocking tool must not stall the other rollouts this server serves
                result = await asyncio.to_thread(fn, **arguments)
            out = CallToolResult(content=_mcp_blocks(tool_content(result)))
        except Exception as e:  # noqa: BLE001 - tool code is user code; the model sees the error
            out = CallToolResult(content=[TextContent(type="text", text=f"{type(e).__name__}: {e}")], is_error=True)
        finally:
            if token is not None:
                _call_state.reset(token)
        if state is not None:
            out.meta = {STATE_META: state.model_dump(mode="json")}
        return out

    ctx = inspect.Parameter("vf_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=context_cls)
    call.__signature__ = sig.replace(parameters=[*params, ctx], return_annotation=inspect.Signature.empty)
    call.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not p.empty}
    call.__annotations__["vf_ctx"] = context_cls
    call.__name__ = fn.__name__
    return call


def build_app(ts: Toolset):
    """The ASGI app serving `ts` at /mcp."""
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.transport_security import TransportSecuritySettings

    server = MCPServer(ts.server_name or type(ts).__name__)
    for name, fn in ts.tool_methods().items():
        doc = (inspect.getdoc(fn) or "").split("\n\n")[0].strip()
        server.add_tool(_wrap(ts, fn, Context), name=name, description=doc or None, structured_output=False)
    # Reached over loopback or a configured URL, never from a browser: no DNS-rebinding guard.
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return server.streamable_http_app(json_response=True, stateless_http=True, transport_security=security)


def _die_with_parent() -> None:
    """On Linux, a server vf started must not outlive vf (even after `kill -9`)."""
    import ctypes
    import signal

    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve_forever(cls: type[Toolset], config: Any = None, *, host: str | None = None, port: int | None = None) -> None:
    import uvicorn

    if config is None:
        raw = os.environ.get("VF_CONFIG")
        config = cls.config_class().model_validate_json(raw) if raw else None
    ts = cls(config)
    host = host or os.environ.get("MCP_HOST", "127.0.0.1")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this: without it a reply written in two segments waits for
    # the client's delayed ACK (~40 ms a call).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port if port is not None else int(os.environ.get("MCP_PORT", "0"))))
    sock.listen(128)  # before the port is announced: a program's first call queues, never is refused

    async def main() -> None:
        logging.getLogger("mcp").setLevel(logging.WARNING)  # not a log line per request
        await _setup(ts)
        app = build_app(ts)
        server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
        print(f"vf-mcp-port {sock.getsockname()[1]}", flush=True)
        print(f"serving {ts.server_name or cls.__name__} at http://{host}:{sock.getsockname()[1]}/mcp",
              file=sys.stderr, flush=True)
        await server.serve(sockets=[sock])

    asyncio.run(main())


def import_ref(ref: str) -> Any:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj


def main(argv: list[str]) -> None:
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m vf.mcp.server pkg.module:ToolsetClass  (VF_CONFIG = config JSON)", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("VF_PARENT_PID"):
        _die_with_parent()
        if os.getppid() != int(os.environ["VF_PARENT_PID"]):  # parent died before prctl took effect
            sys.exit(1)
    serve_forever(import_ref(argv[0]))


if __name__ == "__main__":
    # `python -m vf.mcp.server` runs this file as __main__, a second copy of the module: serve
    # through the copy vf.toolset imports, so a call's state is bound where `Toolset.state` reads it
    from vf.mcp import server  # noqa: PLW0406 - the imported copy, not this __main__ one

    server.main(sys.argv[1:])

