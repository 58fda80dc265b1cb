"""Serve a Toolset as a streamable-HTTP MCP server (official `mcp` package).

Used by `Toolset.run()` (standalone) and by the server processes `vf.mcp.client` starts:

    python -m vf.mcp.server pkg.module:MyToolset      # VF_CONFIG = the toolset config as JSON

The server binds its port (`MCP_PORT`, default: a free one), prints `vf-mcp-port N` on stdout,
and serves `/mcp` (stateless, JSON responses) until killed; started by vf it dies with its parent.

Tools are registered under their own names; the client adds the prefix (`prefix_name`). The
calling rollout's state travels in the call's `_meta["vf/state"]` and comes back changed in the
result's `_meta`, so one server can serve many rollouts, each seeing its own state.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import socket
import sys
import typing
from typing import Any

from vf.toolset import INJECTED, Toolset, _call_state, _setup, state_view, tool_content

STATE_META = "vf/state"


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
    main(sys.argv[1:])

