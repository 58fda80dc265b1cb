"""A small asyncio HTTP/1.1 server: keep-alive, Content-Length or chunked request bodies,
JSON responses and chunked (SSE) streaming responses. Standard library only.

    handler(Request) -> Response                      (async)
    Response.body: bytes, or an async iterator of bytes (sent with Transfer-Encoding: chunked)
    await serve(handler, host, port) -> asyncio.Server
    await serve_unix(handler, path) -> asyncio.Server       (the same, on a Unix socket)

Why not http.server: streaming many concurrent SSE responses from one event loop (where the engine
futures resolve) is simpler without a thread per connection. A malformed request line/headers gets
HTTP 400, a body over `max_body` bytes 413, a request whose head and body do not arrive within
`request_timeout` seconds 408 (slow clients cannot hold a connection open byte by byte), and a
keep-alive connection idle for `idle_timeout` seconds is closed; in each case the connection is
closed and the server itself keeps running. Past `max_connections` open connections, new ones are
answered 503 and closed at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

MAX_HEADER_LINE = 16 * 1024
MAX_HEADERS = 100
MAX_BODY = 16 * 1024 * 1024
IDLE_TIMEOUT = 60.0
REQUEST_TIMEOUT = 30.0
MAX_CONNECTIONS = 2048


class BadHTTP(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


@dataclass
class Response:
    status: int = 200
    body: bytes | AsyncIterator[bytes] = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(obj, ensure_ascii=False).encode(), headers or {})


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise BadHTTP("header line too long") from None
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise BadHTTP("connection closed mid-request") from None
        raise EOFError from None
    return line


async def read_request(reader: asyncio.StreamReader, max_body: int = MAX_BODY, idle_timeout: float = IDLE_TIMEOUT,
                       request_timeout: float = REQUEST_TIMEOUT) -> Request:
    """Wait up to `idle_timeout` for a request to start, then `request_timeout` for all of it."""
    try:
        first = await asyncio.wait_for(_read_line(reader), idle_timeout)
    except TimeoutError:
        raise EOFError from None  # an idle keep-alive connection: just close it
    try:
        return await asyncio.wait_for(_read_rest(reader, first, max_body), request_timeout)
    except TimeoutError:
        raise BadHTTP(f"request not received within {request_timeout:g}s", 408) from None


async def _read_rest(reader: asyncio.StreamReader, line: bytes, max_body: int) -> Request:
    while line in (b"\r\n", b"\n"):  # tolerate stray blank lines between requests
        line = await _read_line(reader)
    try:
        method, target, version = line.decode("latin-1").strip().split(" ")
    except ValueError:
        raise BadHTTP(f"malformed request line {line[:80]!r}") from None
    if not version.startswith("HTTP/1."):
        raise BadHTTP(f"unsupported protocol {version!r}")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        h = await _read_line(reader)
        if h in (b"\r\n", b"\n"):
            break
        name, sep, value = h.decode("latin-1").partition(":")
        if not sep:
            raise BadHTTP(f"malformed header {h[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    else:
        raise BadHTTP("too many headers")
    if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    body = b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        total = 0
        while True:
            size_line = await _read_line(reader)
            size_text = size_line.split(b";")[0].strip()
            try:  # hex digits only: int() would also take "-5", "+5" and "0x5"
                size = int(size_text, 16) if size_text and all(c in b"0123456789abcdefABCDEF" for c in size_text) else -1
            except ValueError:
                size = -1
            if size < 0:
                raise BadHTTP(f"malformed chunk size {size_text[:20]!r}")
            if size == 0:
                while (await _read_line(reader)) not in (b"\r\n", b"\n"):
                    pass
                break
            total += size
            if total > max_body:
                raise BadHTTP(f"request body over {max_body} bytes", 413)
            parts.append(await reader.readexactly(size))
            await _read_line(reader)
        body = b"".join(parts)
    elif "content-length" in headers:
        try:
            n = int(headers["content-length"])
        except ValueError:
            raise BadHTTP("malformed Content-Length") from None
        if n < 0:
            raise BadHTTP("malformed Content-Length")
        if n > max_body:
            raise BadHTTP(f"request body over {max_body} bytes", 413)
        body = await reader.readexactly(n)
    if any(c < " " or c == "\x7f" for c in target):  # NUL and other controls never reach a handler
        raise BadHTTP(f"control character in request target {target[:80]!r}")
    url = urlsplit(target)
    return Request(method.upper(), url.path, parse_qs(url.query), headers, body)


def _head(status: int, headers: dict[str, str]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def write_response(writer: asyncio.StreamWriter, resp: Response, keep_alive: bool) -> None:
    headers = {"Content-Type": resp.content_type, **resp.headers,
               "Connection": "keep-alive" if keep_alive else "close"}
    if isinstance(resp.body, (bytes, bytearray)):
        headers["Content-Length"] = str(len(resp.body))
        writer.write(_head(resp.status, headers) + resp.body)
        await writer.drain()
        return
    headers["Transfer-Encoding"] = "chunked"
    headers.setdefault("Cache-Control", "no-cache")
    writer.write(_head(resp.status, headers))
    body = resp.body
    try:
        async for chunk in body:
            if chunk:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    finally:
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            await aclose()  # a client that went away cancels the generation behind the stream


Handler = Callable[[Request], Awaitable[Response]]
DRAIN_BYTES, DRAIN_SECONDS = 1 << 30, 10.0


async def discard(reader: asyncio.StreamReader, limit: int, seconds: float) -> None:
    """Read and drop up to `limit` bytes for at most `seconds` (a refused body, never kept)."""
    try:
        async with asyncio.timeout(seconds):
            while limit > 0 and (chunk := await reader.read(min(limit, 1 << 16))):
                limit -= len(chunk)
    except (TimeoutError, ConnectionError):
        pass


def connection_handler(handler: Handler, *, max_body: int = MAX_BODY, idle_timeout: float = IDLE_TIMEOUT,
                       request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                       connections: set[asyncio.StreamWriter] | None = None):
    """The per-connection coroutine `serve` and `serve_unix` run. `connections`, when given, holds the
    open connections' writers, so an owner can close them on shutdown (Python 3.11's Server.close
    leaves accepted keep-alive connections running)."""
    open_connections = 0

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_connections
        open_connections += 1
        if connections is not None:
            connections.add(writer)
        try:
            if open_connections > max_connections:
                msg = {"error": {"message": "too many open connections; retry later", "type": "ServiceUnavailable",
                                 "code": 503}}
                await asyncio.wait_for(write_response(writer, json_response(msg, 503), keep_alive=False), 5)
                return
            while True:
                try:
                    req = await read_request(reader, max_body, idle_timeout, request_timeout)
                except EOFError:
                    break
                except (BadHTTP, asyncio.IncompleteReadError) as e:
                    status = getattr(e, "status", 400)
                    kind = {408: "RequestTimeout", 413: "RequestTooLarge"}.get(status, "BadRequestError")
                    msg = {"error": {"message": f"bad HTTP request: {e}", "type": kind, "code": status}}
                    await asyncio.wait_for(write_response(writer, json_response(msg, status), keep_alive=False), 5)
                    if status == 413:  # the client sends its whole body before it reads: let it, then it reads this
                        await discard(reader, DRAIN_BYTES, DRAIN_SECONDS)
                    break
                keep = req.headers.get("connection", "").lower() != "close"
                resp = await handler(req)
                await write_response(writer, resp, keep)
                if not keep:
                    break
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            open_connections -= 1
            try:
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), 5)
            except (TimeoutError, ConnectionError, OSError):
                writer.transport.abort()  # a peer that stopped reading must not pin the connection
            finally:
                if connections is not None:
                    connections.discard(writer)

    return on_conn


async def serve(handler: Handler, host: str, port: int, *, max_body: int = MAX_BODY,
                idle_timeout: float = IDLE_TIMEOUT, request_timeout: float = REQUEST_TIMEOUT,
                max_connections: int = MAX_CONNECTIONS,
                connections: set[asyncio.StreamWriter] | None = None) -> asyncio.Server:
    on_conn = connection_handler(handler, max_body=max_body, idle_timeout=idle_timeout,
                                 request_timeout=request_timeout, max_connections=max_connections,
                                 connections=connections)
    return await asyncio.start_server(on_conn, host, port, limit=MAX_HEADER_LINE, backlog=1024)


async def serve_unix(handler: Handler, path: str, *, max_body: int = MAX_BODY,
                     idle_timeout: float = IDLE_TIMEOUT, request_timeout: float = REQUEST_TIMEOUT,
                     max_connections: int = MAX_CONNECTIONS,
                     connections: set[asyncio.StreamWriter] | None = None) -> asyncio.Server:
    """The same server on a Unix socket at `path` (a sandbox without network reaches it through a
    bind mount of that one file). The caller owns the path: it is neither removed first nor after."""
    on_conn = connection_handler(handler, max_body=max_body, idle_timeout=idle_timeout,
                                 request_timeout=request_timeout, max_connections=max_connections,
                                 connections=connections)
    return await asyncio.start_unix_server(on_conn, path=path, limit=MAX_HEADER_LINE, backlog=1024)
