"""Reach a served toolset: start its MCP server process (`ToolsetConfig.runtime`) or connect to
its URL (`ToolsetConfig.url`), list its tools, and call them with the rollout's state.

A server vf starts runs in its runtime's working directory, in its own process group, and
dies with vf (PR_SET_PDEATHSIG; `vf.reaper` for what it started); leaving `serve_toolset` kills the group and removes the
working directory, however the rollout ended. Its stderr goes to `vf_tool_<name>.log` there,
whose tail is quoted when it fails to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from vf import reaper
from vf.runtime import make_runtime
from vf.runtime.resources import warn_once
from vf.toolset import TOOL_TIMEOUT, ToolError, Toolset, ToolsetError, apply_state, prefix_name

STARTUP_TIMEOUT = 60.0
"""Seconds a started server may take to report its port (Python start + imports + setup())."""
STATE_META = "vf/state"  # same key as vf.mcp.server.STATE_META (not imported: that pulls in mcp's server side)


@contextlib.asynccontextmanager
async def serve_toolset(ts: Toolset, timeout: float = TOOL_TIMEOUT,
                        max_reply_bytes: int | None = None) -> AsyncIterator[RemoteTools]:
    """Yield the tools of a served toolset; stop what was started on exit. `max_reply_bytes`:
    the most one HTTP reply of its server may carry (None: no cap; see `RemoteTools`)."""
    async with contextlib.AsyncExitStack() as stack:
        if ts.config.command:  # a stdio server of the env's: its own tools, no vf state
            remote = RemoteTools(ts, stdio_server(ts.config.command, ts.config.command_env), send_state=False,
                                 timeout=timeout)
            await stack.enter_async_context(remote)
            yield remote
            return
        url = ts.config.url or await stack.enter_async_context(start_server(ts))
        remote = RemoteTools(ts, url, send_state=not ts.config.url, timeout=timeout, max_reply_bytes=max_reply_bytes)
        await stack.enter_async_context(remote)
        yield remote


def stdio_server(argv: list[str], env: dict[str, str] | None) -> Any:
    """MCP's parameters for a stdio server program: `argv`, `env` on top of MCP's default variables."""
    from mcp.client.stdio import StdioServerParameters, get_default_environment

    return StdioServerParameters(command=argv[0], args=list(argv[1:]), env={**get_default_environment(), **(env or {})})


@contextlib.asynccontextmanager
async def start_server(ts: Toolset) -> AsyncIterator[str]:
    """Start `python -m vf.mcp.server` for `ts` in its runtime; yield its /mcp URL."""
    cls = type(ts)
    name = ts.server_name or cls.__name__
    async with make_runtime(ts.config.runtime) as runtime:
        log_path = runtime.workdir / f"vf_tool_{name}.log"
        env = {**os.environ, "VF_CONFIG": ts.config.model_dump_json(), "VF_PARENT_PID": str(os.getpid()),
               "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path), "MCP_PORT": "0"}
        with open(log_path, "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "vf.mcp.server", f"{cls.__module__}:{cls.__qualname__}",
                cwd=str(runtime.workdir), env=env, stdout=asyncio.subprocess.PIPE, stderr=log,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        reaper.watch(proc.pid)
        try:
            port = await _read_port(proc, name, log_path)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            await _kill_group(proc)
            reaper.forget(proc.pid)


async def _read_port(proc: asyncio.subprocess.Process, name: str, log_path) -> int:
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), STARTUP_TIMEOUT)
    except TimeoutError:
        line = b""
    text = line.decode(errors="replace").strip()
    if text.startswith("vf-mcp-port "):
        return int(text.split()[1])
    tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
    raise ToolsetError(f"tool server {name!r} did not start (exit code {proc.returncode}): {tail.strip()}",
                       hint="run the toolset's module standalone (Toolset.run()) to see its error")


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        if proc.returncode is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), wait)
    with contextlib.suppress(ProcessLookupError):  # anything the server itself started
        os.killpg(proc.pid, signal.SIGKILL)


class RemoteTools:
    """One MCP client session to a served toolset (an async context manager).

    The session lives in its own task: when the server dies, the `mcp` client tears down its
    task group, and that must end this session, not the rollout that was waiting on a call."""

    def __init__(self, ts: Toolset, url: Any, *, send_state: bool, timeout: float = TOOL_TIMEOUT,
                 max_reply_bytes: int | None = None):
        """`url`: the server's streamable-HTTP URL, or the `stdio_server` parameters of a program."""
        self.ts, self.url, self.send_state, self.timeout = ts, url, send_state, timeout
        self.name = ts.server_name or type(ts).__name__
        self.listed: list[Any] = []
        self.max_reply_bytes = max_reply_bytes
        """The most one HTTP reply of the server may carry (a tool result is one): the client stops
        reading past it, so a server that answers with gigabytes costs vf at most this much; the call
        is refused (`ToolOutputLimit`). None: no cap."""
        self.over: int | None = None
        """Bytes of the reply that passed `max_reply_bytes` (None: none did)."""

    async def __aenter__(self) -> RemoteTools:
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future = loop.create_future()
        self._closing = asyncio.Event()
        self._owner = asyncio.create_task(self._own())
        try:
            self.client = await asyncio.wait_for(asyncio.shield(self._ready), STARTUP_TIMEOUT)
        except BaseException as e:
            await self.__aexit__(None, None, None)
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            where = self.url if isinstance(self.url, str) else shlex.join([self.url.command, *self.url.args])
            raise ToolsetError(f"tool server {self.name!r} at {where} did not answer: {detail}") from None
        return self

    async def _own(self) -> None:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        try:
            async with contextlib.AsyncExitStack() as stack:
                if not isinstance(self.url, str):  # a stdio program: MCP starts it, and ends it on exit
                    client = await stack.enter_async_context(Client(self.url, read_timeout_seconds=self.timeout))
                    self.listed = (await client.list_tools()).tools
                    self._ready.set_result(client)
                    await self._closing.wait()
                    return
                timeout = httpx2.Timeout(self.timeout, connect=5.0)
                http = await stack.enter_async_context(
                    create_mcp_http_client(timeout=timeout) if self.max_reply_bytes is None else
                    httpx2.AsyncClient(timeout=timeout, transport=_capped_transport(self)))
                client = await stack.enter_async_context(Client(streamable_http_client(self.url, http_client=http)))
                self.listed = (await client.list_tools()).tools
                self._ready.set_result(client)
                await self._closing.wait()
        except BaseException as e:  # noqa: BLE001 - delivered to whoever waits on the session
            if not self._ready.done():
                self._ready.set_exception(e if isinstance(e, Exception) else ConnectionError(str(e)))

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._owner, 10)
        if not self._owner.done():
            self._owner.cancel()

    def tools(self) -> list[tuple[str, Callable, dict[str, Any]]]:
        """(name the model sees, call, OpenAI schema) of every tool the server lists."""
        out = []
        for tool in self.listed:
            full = prefix_name(self.ts.server_name, tool.name)
            schema = {"type": "function", "function": {"name": full, "description": tool.description or "",
                                                       "parameters": tool.input_schema}}
            out.append((full, self._caller(tool.name), schema))
        return out

    async def _request(self, raw: str, arguments: dict[str, Any], meta: dict | None) -> Any:
        """One call, abandoned if the session dies while it waits."""
        if self._owner.done():
            raise ToolError(f"tool server {self.name!r} is gone", "ToolServerGone")
        call = asyncio.ensure_future(self.client.call_tool(raw, arguments, meta=meta))
        try:
            await asyncio.wait({call, self._owner}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not call.done():
                call.cancel()
        if not call.done() or call.cancelled():
            raise ToolError(f"tool server {self.name!r} closed the connection", "ToolServerGone")
        return call.result()

    def _caller(self, raw: str) -> Callable:
        async def call(name: str, arguments: dict[str, Any], context: dict[str, Any]) -> Any:
            state = context.get("state") if self.send_state else None
            meta = None
            if state is not None:
                try:
                    meta = {STATE_META: state.model_dump(mode="json")}
                except Exception:  # noqa: BLE001 - a state that is not JSON stays on this side
                    state = None
            self.over = None
            try:
                result = await self._request(raw, arguments, meta)
            except Exception:
                if self.over is not None:
                    raise ToolError(self._over_message(name), "ToolOutputLimit") from None
                raise
            if self.over is not None:
                raise ToolError(self._over_message(name), "ToolOutputLimit")
            back = (result.meta or {}).get(STATE_META) if state is not None else None
            if isinstance(back, dict):
                apply_state(state, back)
            if result.is_error:
                text = " ".join(getattr(b, "text", "") for b in result.content).strip()
                raise ToolError(f"{name} failed: {text or 'the server reported an error'}", "ToolServerError")
            return list(result.content)

        return call

    def _over_message(self, name: str) -> str:
        return (f"{name}: the tool server's reply passed {self.max_reply_bytes / (1 << 20):.1f} MiB (four times "
                "max_tool_result_mb); vf stopped reading it and the call is refused")


def _capped_transport(remote: RemoteTools):
    """An httpx2 transport whose replies stop at `remote.max_reply_bytes`, each counted on its own.
    A call's reply (a POST: it ends when the server has answered) is read whole up to the cap; one
    that passes it is closed unread and answered, to the MCP client, with a JSON-RPC error for that
    request (the session goes on), and `remote.over` set. A GET (the server's notification stream)
    that passes it raises in the client."""
    import httpx2

    cap = remote.max_reply_bytes

    class Replay(httpx2.AsyncByteStream):
        def __init__(self, chunks: list[bytes]):
            self.chunks = chunks

        async def __aiter__(self):
            for chunk in self.chunks:
                yield chunk

    class Capped(httpx2.AsyncByteStream):
        def __init__(self, inner):
            self.inner = inner

        async def __aiter__(self):
            seen = 0
            async for chunk in self.inner:
                seen += len(chunk)
                if seen > cap:
                    remote.over = seen
                    raise httpx2.ReadError(f"reply over {cap} bytes")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class Transport(httpx2.AsyncBaseTransport):
        def __init__(self):
            self.inner = httpx2.AsyncHTTPTransport()

        async def handle_async_request(self, request):
            response = await self.inner.handle_async_request(request)
            if request.method != "POST":
                return httpx2.Response(response.status_code, headers=response.headers, stream=Capped(response.stream),
                                       extensions=response.extensions, request=request)
            chunks, seen = [], 0
            try:
                async for chunk in response.stream:
                    seen += len(chunk)
                    if seen > cap:
                        remote.over = seen
                        break
                    chunks.append(chunk)
            finally:
                await response.stream.aclose()
            if seen <= cap:
                return httpx2.Response(response.status_code, headers=response.headers, stream=Replay(chunks),
                                       extensions=response.extensions, request=request)
            try:
                ident = json.loads(request.content).get("id")
            except (ValueError, AttributeError, httpx2.RequestNotRead):
                ident = None
            keep = {k: v for k, v in response.headers.items() if k.lower().startswith("mcp-")}
            return httpx2.Response(200, headers=keep, request=request, json={
                "jsonrpc": "2.0", "id": ident, "error": {"code": -32603, "message": f"reply over {cap} bytes"}})

        async def aclose(self) -> None:
            await self.inner.aclose()

    return Transport()


@contextlib.asynccontextmanager
async def program_tool_urls(toolsets: list[Toolset | type[Toolset]], runtime) -> AsyncIterator[dict[str, str]]:
    """`{server_name: url}` of a rollout's toolsets for a program harness (verifiers' `mcp_urls`):
    a toolset with a `url` is passed as it is; any other is started as an MCP server process on the
    host's loopback (`start_server`), stopped on exit. Each URL is as the program in `runtime` sees
    it (`Runtime.host_url`); a runtime with no route to the host gets none, with a warning.

    Not carried: the rollout's typed state. A program's own calls reach the server without vf in
    between, so what a tool writes to `self.state` stays in the server (verifiers relays it over
    its interception server's `/task` channel)."""
    async with contextlib.AsyncExitStack() as stack:
        urls: dict[str, str] = {}
        for item in toolsets:
            ts = item() if isinstance(item, type) else item  # a class-level list names classes (open_tools)
            name = ts.server_name or type(ts).__name__
            if name in urls:
                raise ToolsetError(f"two toolsets are named {name!r}; give one a distinct TOOL_PREFIX")
            url = ts.config.url or await stack.enter_async_context(start_server(ts))
            seen = runtime.host_url(url)
            if seen is None:
                warn_once(runtime.type, "mcp", message=f"runtime {runtime.type!r} has no route to the host, so "
                          "program harnesses get no MCP tool servers (use subprocess, or network_allow)")
                continue
            urls[name] = seen
        yield urls
