"""A small asyncio HTTP/1.1 server: keep-alive, Content-Length or chunked request bodies,
JSON responses and chunked (SSE) streaming responses. Standard library only.

    handler(Request) -> Response                      (async)
    Response.body: bytes, or an async iterator of bytes (sent with Transfer-Encoding: chunked)
    await serve(handler, host, port) -> asyncio.Server

Why not http.server: streaming many concurrent SSE responses from one event loop (where the engine
futures resolve) is simpler without a thread per connection. A malformed request line/headers gets
HTTP 400 and the connection is closed; the server itself keeps running.
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
MAX_BODY = 64 * 1024 * 1024


class BadHTTP(Exception):
    pass


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


async def read_request(reader: asyncio.StreamReader) -> Request:
    line = await _read_line(reader)
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
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BadHTTP("malformed chunk size") from None
            if size == 0:
                while (await _read_line(reader)) not in (b"\r\n", b"\n"):
                    pass
                break
            total += size
            if total > MAX_BODY:
                raise BadHTTP("request body too large")
            parts.append(await reader.readexactly(size))
            await _read_line(reader)
        body = b"".join(parts)
    elif "content-length" in headers:
        try:
            n = int(headers["content-length"])
        except ValueError:
            raise BadHTTP("malformed Content-Length") from None
        if n < 0 or n > MAX_BODY:
            raise BadHTTP("request body too large")
        body = await reader.readexactly(n)
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


async def serve(handler: Handler, host: str, port: int) -> asyncio.Server:
    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    req = await read_request(reader)
                except EOFError:
                    break
                except (BadHTTP, asyncio.IncompleteReadError) as e:
                    msg = {"error": {"message": f"bad HTTP request: {e}", "type": "BadRequestError", "code": 400}}
                    await write_response(writer, json_response(msg, 400), keep_alive=False)
                    break
                keep = req.headers.get("connection", "").lower() != "close"
                resp = await handler(req)
                await write_response(writer, resp, keep)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            try:
                writer.close()
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    return await asyncio.start_server(on_conn, host, port, limit=MAX_HEADER_LINE, backlog=1024)
