"""What every API dialect shares: the parsed call, the error an agent sees, and the contract.

A `Dialect` is one wire format an agent program speaks to its model provider. The interception
server picks it from the route the agent posted to, `parse`s the body into a `Call` (chat-shaped
typed messages + flat tools + the sampling knobs the agent set), asks the rollout's handler for a
`vf.types.Response`, and hands it back through `render` (one JSON body) or, for a streamed call,
a `Framer` (SSE frames written as the reply is generated; `stream` frames a whole reply with it).

Bodies come from programs we do not trust (an agent, or a model driving one): `parse` reads them
with vf.bounded's limits and answers anything malformed with `DialectError` (HTTP 400 in the
dialect's own error shape), never a 500.
"""

from __future__ import annotations

import json
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, Field, ValidationError

from vf.bounded import BoundsError, load_json
from vf.dialects.hosted import custom_names, functions_for_custom, screen
from vf.types import ImageUrlContentPart, ImageUrlSource, Request, Response, TextContentPart, content_text


class DialectError(Exception):
    """A request the dialect refuses: `status` (400 unless said) and a message the agent is shown."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
        self.message = message


class Call(BaseModel):
    """One parsed model call."""

    dialect: str
    request: Request
    model: str = ""
    stream: bool = False
    sampling: dict[str, Any] = {}
    """Canonical knobs the caller set, and only those: temperature, top_p, top_k, max_tokens (from
    max_tokens / max_completion_tokens / max_output_tokens), stop (a list), seed,
    frequency_penalty, presence_penalty, reasoning_effort."""
    dropped_tools: list[dict[str, Any]] = []
    """Tools the agent declared that the policy is not offered (vf.dialects.hosted): provider-hosted
    ones and the harness's disabled ones, each `{type, name, reason}`; `request.tools` holds the rest."""
    custom_tools: list[str] = []
    """The agent's custom (free-form) tools, offered to the policy as functions: its calls of them
    go back to the agent as custom calls (vf.dialects.hosted.restore)."""
    on_delta: Callable[[str], None] | None = Field(None, exclude=True, repr=False)
    """Set by the interception server on a streamed call: the policy tells it the reply's text as
    it is generated (`Rollout.call`); never set, the reply is framed whole when it ends."""


# --- reading untrusted JSON ----------------------------------------------------------------------

def expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """`value` when it is a `kind`, else DialectError naming `where` (bool is not a number here)."""
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        ok = False
    else:
        ok = isinstance(value, kind)
    if not ok:
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        names = names.replace("dict", "object").replace("list", "array").replace("str", "string")
        raise DialectError(f"{where} must be {names}, got {type(value).__name__.replace('NoneType', 'null')}")
    return value


def optional(obj: Mapping, key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = obj.get(key)
    return default if value is None else expect(value, kind, f"{where}.{key}" if where else key)


def text_or_parts(value: Any, where: str) -> str | list:
    """A content field that is a string or an array of objects (empty when null)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    expect(value, list, where)
    for i, part in enumerate(value):
        expect(part, dict, f"{where}[{i}]")
    return value


INLINE_IMAGE = "data:image/"


def image_part(url: Any, where: str) -> ImageUrlContentPart:
    """An image the agent sends: inline data (`data:image/...;base64,...`) only. A URL is refused
    (400), never fetched and never passed on: the provider behind the policy may fetch image URLs,
    and an agent could point it at the host's loopback services, a cloud metadata address, a
    `file://` path, or a server of its own to carry data out. Neither is the URL recorded."""
    expect(url, str, where)
    if not url:
        raise DialectError(f"{where} is empty")
    if url[:len(INLINE_IMAGE)].lower() != INLINE_IMAGE or ";base64," not in url[:200]:
        scheme = url.split(":", 1)[0][:20] if ":" in url[:21] else "no scheme"
        raise DialectError(f"{where}: an image by URL ({scheme!r}) is refused: this endpoint fetches nothing an "
                           "agent names and passes no URL on; send the image inline, as a "
                           "data:image/<type>;base64,<data> URL")
    return ImageUrlContentPart(image_url=ImageUrlSource(url=url))


def text_part(text: Any, where: str) -> TextContentPart:
    return TextContentPart(text=expect(text, str, where))


def simplify(parts: list) -> str | list:
    """Text-only parts read as one string (as a chat template expects); parts with images stay parts."""
    if all(isinstance(p, TextContentPart) for p in parts):
        return "\n".join(p.text for p in parts)
    return parts


NUMBER = (int, float)


def sampling_from(body: Mapping, keys: Mapping[str, tuple[str, type | tuple[type, ...]]]) -> dict[str, Any]:
    """The knobs in `body` (wire key -> (canonical key, type)), typed-checked; absent/null keys skipped."""
    out: dict[str, Any] = {}
    for wire, (canon, kind) in keys.items():
        value = body.get(wire)
        if value is None:
            continue
        expect(value, kind, wire)
        if canon == "stop":
            if isinstance(value, str):
                value = [value]
            for i, s in enumerate(value):
                expect(s, str, f"{wire}[{i}]")
        if canon == "max_tokens" and value < 1:
            raise DialectError(f"{wire} must be at least 1")
        out.setdefault(canon, value)
    return out


# --- writing -------------------------------------------------------------------------------------

def sse(data: Any, event: str | None = None) -> bytes:
    """One complete server-sent event (`event:` line when named)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def response_text(response: Response) -> str:
    return content_text(response.message.content)


def fresh_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def created(response: Response) -> int:
    return response.created or int(time.time())


def finish(response: Response) -> str:
    """The finish reason to report: the response's own, else tool_calls when it calls tools, else stop."""
    if response.finish_reason:
        return response.finish_reason
    return "tool_calls" if response.message.tool_calls else "stop"


class Dialect(ABC):
    """One native API's wire format (see the module docstring)."""

    name: ClassVar[str]
    routes: ClassVar[tuple[str, ...]]
    """POST paths below the endpoint base (which ends in /v1)."""

    def secret(self, headers: Mapping[str, str]) -> str | None:
        """The caller's key: an `Authorization: Bearer` token (OpenAI SDKs)."""
        return bearer(headers)

    def parse(self, body: bytes) -> Call:
        """The request body -> a `Call`; DialectError on anything malformed (bad JSON, wrong types,
        nesting past vf.bounded's limit, a feature this server cannot honour). Tools a Chat
        Completions provider cannot take are translated or dropped (vf.dialects.hosted)."""
        try:
            obj = load_json(body)
        except BoundsError as e:
            raise DialectError(f"request body: {e}") from None
        expect(obj, dict, "request body")
        try:
            call = self.parse_object(obj)
        except DialectError:
            raise
        except ValidationError as e:
            first = e.errors()[0] if e.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise DialectError(f"invalid request: {where}: {first.get('msg', 'invalid')}"[:500]) from None
        except (TypeError, KeyError, AttributeError, ValueError) as e:  # a shape no check above foresaw
            raise DialectError(f"invalid request: {type(e).__name__}: {str(e)[:300]}") from None
        call.custom_tools = custom_names(call.request.tools)
        call.request.tools, call.dropped_tools = screen(call.request.tools)
        call.request.messages = functions_for_custom(call.request.messages)
        return call

    @abstractmethod
    def parse_object(self, body: dict) -> Call:
        """`parse` after the JSON is read and known to be an object."""

    @abstractmethod
    def render(self, response: Response, call: Call) -> dict:
        """The non-streaming response body."""

    def stream(self, response: Response, call: Call) -> list[bytes]:
        """The whole response as complete SSE frames, the terminal one included: the incremental
        framing (`framer`) given the reply's text as one delta."""
        framer = self.framer(call, response.id, response.model or call.model, created(response))
        return [*framer.open(response), *framer.delta(response_text(response)),
                *framer.close(response)]

    @abstractmethod
    def framer(self, call: Call, response_id: str, model: str, created_at: int) -> Framer:
        """The SSE framing of one streamed reply (see `Framer`)."""

    @abstractmethod
    def error_body(self, status: int, message: str) -> dict:
        """An error in this dialect's shape (what its SDK raises from)."""


class Framer(ABC):
    """One streamed reply in a dialect's SSE frames, written as it is generated: `open` before the
    first text, `delta` per piece of text, `close` with the finished `Response` (what text it has
    beyond the deltas, its tool calls, finish reason and usage), or `error` when it fails after the
    stream began (the HTTP status is sent already). The frames of `Dialect.stream` are these too."""

    def __init__(self, call: Call, response_id: str, model: str, created_at: int):
        self.call, self.id, self.model, self.created = call, response_id, model, created_at
        self.sent = ""
        self.reasoning_sent = False

    def delta(self, text: str) -> list[bytes]:
        if not text:
            return []
        self.sent += text
        return self.text(text)

    def close(self, response: Response) -> list[bytes]:
        """The end: the reply's text past what was streamed (the deltas are a prefix of it, by the
        engine's contract: vf.engines.textstream), then the rest of the reply."""
        response = response.model_copy(update={"id": self.id})
        text = response_text(response)
        rest = text[len(self.sent):] if text.startswith(self.sent) else ""
        frames = self.delta(rest)
        if response.message.reasoning_content and not self.reasoning_sent:
            frames += self.reasoning(response.message.reasoning_content)
        return frames + self.finish(response)

    def open(self, known: Response | None = None) -> list[bytes]:
        """The frames before any text; `known`: the whole reply, when it has ended already
        (`Dialect.stream`): its reasoning comes first, and what the start says of it is exact."""
        frames = self.start(known)
        if known is not None and known.message.reasoning_content:
            self.reasoning_sent = True
            frames += self.reasoning(known.message.reasoning_content)
        return frames

    @abstractmethod
    def start(self, known: Response | None) -> list[bytes]:
        """The stream's first frames."""

    @abstractmethod
    def text(self, text: str) -> list[bytes]:
        """One piece of the reply's text."""

    @abstractmethod
    def reasoning(self, text: str) -> list[bytes]:
        """The reply's reasoning, whole."""

    @abstractmethod
    def finish(self, response: Response) -> list[bytes]:
        """Tool calls, finish reason, usage and the terminal frame."""

    @abstractmethod
    def error(self, status: int, message: str) -> list[bytes]:
        """A failure after the stream began, as the dialect's in-stream error event."""


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header by case-insensitive name (vf.serve.http lowercases them already)."""
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value


def bearer(headers: Mapping[str, str]) -> str | None:
    auth = header(headers, "authorization") or ""
    scheme, _, token = auth.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                      404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                      429: "rate_limit_error", 504: "timeout_error"}


def openai_error(status: int, message: str) -> dict:
    """OpenAI's error shape (the openai SDK reads `error.message`)."""
    kind = OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    code = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
