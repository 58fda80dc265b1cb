"""Anthropic Messages (`POST /v1/messages`): Claude Code and the anthropic SDK.

Auth is `x-api-key` (an `ANTHROPIC_AUTH_TOKEN` arrives as a Bearer token instead). The top-level
`system` becomes a system message (the only one: a `system` turn inside `messages` is a user
message, as in verifiers 0.4.0); an assistant turn's blocks fold into one assistant message
(text -> content, thinking -> reasoning, tool_use -> tool calls with the block's id and its input
as a JSON string); a user turn's tool_result blocks become role "tool" messages carrying the
tool_use_id, the rest one user message; base64 image blocks become data-URL image parts.
"""

from __future__ import annotations

import json
from typing import Any

from vf.bounded import BoundsError, load_json
from vf.dialects.base import (
    NUMBER,
    Call,
    Dialect,
    DialectError,
    Framer,
    bearer,
    expect,
    finish,
    fresh_id,
    header,
    image_part,
    optional,
    response_text,
    sampling_from,
    simplify,
    sse,
    text_part,
)
from vf.types import (
    AssistantMessage,
    Request,
    Response,
    SystemMessage,
    Tool,
    ToolCall,
    ToolMessage,
    UserMessage,
)

SAMPLING = {
    "temperature": ("temperature", NUMBER),
    "top_p": ("top_p", NUMBER),
    "top_k": ("top_k", int),
    "max_tokens": ("max_tokens", int),
    "stop_sequences": ("stop", list),
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error",
               529: "overloaded_error"}


def parse_blocks(value: Any, where: str):
    """User-side content (a string, or text and image blocks) -> a string or typed parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    parts = []
    for i, block in enumerate(expect(value, list, where)):
        at = f"{where}[{i}]"
        expect(block, dict, at)
        kind = block.get("type")
        if kind == "text":
            parts.append(text_part(block.get("text"), f"{at}.text"))
        elif kind == "image":
            source = expect(block.get("source"), dict, f"{at}.source")
            if source.get("type") == "base64":
                media = expect(source.get("media_type"), str, f"{at}.source.media_type")
                data = expect(source.get("data"), str, f"{at}.source.data")
                parts.append(image_part(f"data:{media};base64,{data}", f"{at}.source"))
            elif source.get("type") == "url":
                parts.append(image_part(source.get("url"), f"{at}.source.url"))
            else:
                raise DialectError(f"{at}.source.type must be base64 or url, got {str(source.get('type'))[:40]!r}")
        elif kind == "document":  # a plain-text document reads as its text; PDFs need a reader we lack
            source = expect(block.get("source"), dict, f"{at}.source")
            if source.get("type") == "text":
                parts.append(text_part(source.get("data"), f"{at}.source.data"))
            elif source.get("type") == "content":
                inner = parse_blocks(source.get("content"), f"{at}.source.content")
                parts.extend([text_part(inner, f"{at}.source.content")] if isinstance(inner, str) else inner)
            else:
                raise DialectError(f"{at}: only text documents are supported, not {str(source.get('type'))[:40]!r}")
        else:
            raise DialectError(f"{at}: content block type {str(kind)[:40]!r} is not supported here")
    return simplify(parts)


def parse_system(value: Any) -> str:
    """`system`: a string or text blocks (Claude Code sends several, with cache_control), as one string."""
    content = parse_blocks(value, "system")
    if not isinstance(content, str):
        raise DialectError("system may hold text blocks only")
    return content


def parse_assistant(content: Any, where: str) -> AssistantMessage:
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else expect(content, list, where)
    texts, reasoning, calls = [], [], []
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        expect(block, dict, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(expect(block.get("text"), str, f"{at}.text"))
        elif kind == "thinking":
            reasoning.append(expect(block.get("thinking", ""), str, f"{at}.thinking"))
        elif kind == "redacted_thinking":
            continue  # opaque provider state; nothing a local policy can read
        elif kind == "tool_use":
            calls.append(ToolCall(id=expect(block.get("id"), str, f"{at}.id"),
                                  name=expect(block.get("name"), str, f"{at}.name"),
                                  arguments=json.dumps(optional(block, "input", dict, at, {}), ensure_ascii=False)))
        else:
            raise DialectError(f"{at}: assistant block type {str(kind)[:40]!r} is not supported")
    return AssistantMessage(content="".join(texts) or None, reasoning_content="".join(reasoning) or None,
                            tool_calls=calls or None)


def parse_messages(body: dict) -> list:
    out: list = []
    if body.get("system") is not None and (system := parse_system(body["system"])):
        out.append(SystemMessage(content=system))
    raw = expect(body.get("messages"), list, "messages")
    if not raw:
        raise DialectError("messages must not be empty")
    names: dict[str, str] = {}
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        expect(m, dict, where)
        role, content = m.get("role"), m.get("content")
        if role == "assistant":
            message = parse_assistant(content, f"{where}.content")
            names.update((c.id, c.name) for c in message.tool_calls or [])
            out.append(message)
        elif role in ("user", "system"):
            # a `system` turn inside `messages` (Claude Code 2.1.x puts its environment notes there)
            # is the user's, as verifiers 0.4.0 reads it: the Messages API has one system prompt, at
            # the top, and chat templates refuse a system message after the first turn
            if isinstance(content, str):
                out.append(UserMessage(content=content))
                continue
            rest = []
            for j, block in enumerate(expect(content, list, f"{where}.content")):
                at = f"{where}.content[{j}]"
                expect(block, dict, at)
                if block.get("type") == "tool_result":
                    call_id = expect(block.get("tool_use_id"), str, f"{at}.tool_use_id")
                    result = parse_blocks(block.get("content"), f"{at}.content")
                    out.append(ToolMessage(tool_call_id=call_id, name=names.get(call_id), content=result))
                else:
                    rest.append(block)
            if rest:
                out.append(UserMessage(content=parse_blocks(rest, f"{where}.content")))
        else:
            raise DialectError(f"{where}.role must be user, assistant or system, got {str(role)[:40]!r}")
    return out


def parse_tools(raw: Any) -> list[Tool] | None:
    tools = []
    for i, t in enumerate(expect(raw, list, "tools") if raw is not None else []):
        where = f"tools[{i}]"
        expect(t, dict, where)
        kind = t.get("type")
        name = expect(t.get("name") or kind, str, f"{where}.name")
        schema = optional(t, "input_schema", dict, where, {})
        fields = {k: v for k, v in t.items() if k not in ("type", "name", "input_schema") and v is not None}
        kind = "function" if kind in (None, "custom") else expect(kind, str, f"{where}.type")
        tools.append(Tool.model_validate({**fields, "name": name, "parameters": schema, "type": kind}))
    return tools or None


def tool_input(arguments: str) -> dict:
    """A tool call's JSON arguments as the object a tool_use block carries ({} when the model's
    arguments are not a JSON object: the agent then reports the missing parameters to the model)."""
    try:
        value = load_json(arguments or "{}")
    except BoundsError:
        return {}
    return value if isinstance(value, dict) else {}


def usage_wire(response: Response, output: bool = True) -> dict:
    u = response.usage
    return {"input_tokens": u.prompt_tokens if u else 0,
            "output_tokens": (u.completion_tokens if u else 0) if output else 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": (u.cached_input_tokens or 0) if u else 0}


class AnthropicDialect(Dialect):
    name = "anthropic"
    routes = ("/messages",)

    def secret(self, headers) -> str | None:
        return (header(headers, "x-api-key") or "").strip() or bearer(headers)

    def parse_object(self, body: dict) -> Call:
        sampling = sampling_from(body, SAMPLING)
        effort = optional(body, "output_config", dict, "", {}).get("effort")
        if effort is not None:
            sampling["reasoning_effort"] = expect(effort, str, "output_config.effort")
        return Call(dialect=self.name, model=optional(body, "model", str, ""),
                    stream=optional(body, "stream", bool, "", False), sampling=sampling,
                    request=Request(messages=parse_messages(body), tools=parse_tools(body.get("tools"))))

    def blocks(self, response: Response) -> list[dict]:
        out: list[dict] = []
        m = response.message
        if m.reasoning_content:
            out.append({"type": "thinking", "thinking": m.reasoning_content, "signature": ""})
        if text := response_text(response):
            out.append({"type": "text", "text": text})
        for c in m.tool_calls or []:
            out.append({"type": "tool_use", "id": c.id or fresh_id("toolu_"), "name": c.name,
                        "input": tool_input(c.arguments)})
        return out

    def render(self, response: Response, call: Call) -> dict:
        return {"id": response.id, "type": "message", "role": "assistant", "model": response.model or call.model,
                "content": self.blocks(response), "stop_reason": STOP_REASONS[finish(response)], "stop_sequence": None,
                "usage": usage_wire(response)}

    def framer(self, call: Call, response_id: str, model: str, created_at: int) -> Framer:
        return AnthropicFramer(call, response_id, model, created_at)

    def error_body(self, status: int, message: str) -> dict:
        kind = ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}


class AnthropicFramer(Framer):
    """Messages events: `message_start` (its input tokens known only when the reply has ended: else
    they come with `message_delta`); a text block opened at the first text, its `text_delta`s;
    at the end the block's stop, a thinking block (when the reasoning was not known at the start),
    one block per tool call, `message_delta` (stop reason, usage) and `message_stop`."""

    def __init__(self, *args):
        super().__init__(*args)
        self.blocks = 0
        self.open_text: int | None = None  # the index of the text block being written

    def block(self, start: dict, delta: dict | None) -> list[bytes]:
        i, self.blocks = self.blocks, self.blocks + 1
        frames = [sse({"type": "content_block_start", "index": i, "content_block": start}, "content_block_start")]
        if delta is not None:
            frames.append(sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta"))
        return [*frames, sse({"type": "content_block_stop", "index": i}, "content_block_stop")]

    def end_text(self) -> list[bytes]:
        if self.open_text is None:
            return []
        i, self.open_text = self.open_text, None
        return [sse({"type": "content_block_stop", "index": i}, "content_block_stop")]

    def start(self, known: Response | None) -> list[bytes]:
        usage = usage_wire(known, output=False) if known is not None else {
            "input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        head = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": usage}
        return [sse({"type": "message_start", "message": head}, "message_start")]

    def text(self, text: str) -> list[bytes]:
        frames = []
        if self.open_text is None:
            self.open_text, self.blocks = self.blocks, self.blocks + 1
            frames.append(sse({"type": "content_block_start", "index": self.open_text,
                               "content_block": {"type": "text", "text": ""}}, "content_block_start"))
        delta = {"type": "text_delta", "text": text}
        return [*frames, sse({"type": "content_block_delta", "index": self.open_text, "delta": delta},
                             "content_block_delta")]

    def reasoning(self, text: str) -> list[bytes]:
        return [*self.end_text(), *self.block({"type": "thinking", "thinking": "", "signature": ""},
                                              {"type": "thinking_delta", "thinking": text})]

    def finish(self, response: Response) -> list[bytes]:
        frames = self.end_text()
        for c in response.message.tool_calls or []:
            start = {"type": "tool_use", "id": c.id or fresh_id("toolu_"), "name": c.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(tool_input(c.arguments), ensure_ascii=False)}
            frames += self.block(start, delta)
        usage = usage_wire(response)
        stop = {"stop_reason": STOP_REASONS[finish(response)], "stop_sequence": None}
        return [*frames, sse({"type": "message_delta", "delta": stop,
                              "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}},
                             "message_delta"),
                sse({"type": "message_stop"}, "message_stop")]

    def error(self, status: int, message: str) -> list[bytes]:
        kind = ERROR_TYPES.get(status, "api_error")
        return [sse({"type": "error", "error": {"type": kind, "message": message}}, "error")]
