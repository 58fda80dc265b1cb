"""OpenAI Chat Completions (`POST /v1/chat/completions`): the openai SDK, litellm (mini-swe-agent),
Terminus-2, and most agent loops. The request is chat-shaped already; parsing types and checks it."""

from __future__ import annotations

from typing import Any

from vf.dialects.base import (
    NUMBER,
    Call,
    Dialect,
    DialectError,
    Framer,
    created,
    expect,
    finish,
    image_part,
    openai_error,
    optional,
    response_text,
    sampling_from,
    simplify,
    sse,
    text_or_parts,
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
    "max_completion_tokens": ("max_tokens", int),
    "max_tokens": ("max_tokens", int),
    "stop": ("stop", (str, list)),
    "seed": ("seed", int),
    "frequency_penalty": ("frequency_penalty", NUMBER),
    "presence_penalty": ("presence_penalty", NUMBER),
    "reasoning_effort": ("reasoning_effort", str),
}


def parse_content(value: Any, where: str, assistant: bool = False):
    """Chat content (a string or parts) -> a string or typed parts. Assistant content flattens to
    text (a refusal part counts as text); other roles keep image parts."""
    value = text_or_parts(value, where)
    if isinstance(value, str):
        return value
    parts = []
    for i, part in enumerate(value):
        kind, at = part.get("type"), f"{where}[{i}]"
        if kind == "text" or (assistant and kind == "refusal"):
            parts.append(text_part(part.get("text", part.get("refusal")), f"{at}.text"))
        elif kind == "image_url" and not assistant:
            image = part.get("image_url")
            parts.append(image_part(image.get("url") if isinstance(image, dict) else image, f"{at}.image_url.url"))
        else:
            raise DialectError(f"{at}: content part type {str(kind)[:40]!r} is not supported here")
    return simplify(parts)


def parse_tool_call(raw: Any, where: str) -> ToolCall:
    expect(raw, dict, where)
    kind = raw.get("type") or ("custom" if isinstance(raw.get("custom"), dict) else "function")
    if kind not in ("function", "custom"):
        raise DialectError(f"{where}.type {str(kind)[:40]!r} is not supported")
    native = expect(raw.get(kind), dict, f"{where}.{kind}")
    args = native.get("input" if kind == "custom" else "arguments")
    return ToolCall(id=expect(raw.get("id"), str, f"{where}.id"), type=kind,
                    name=expect(native.get("name"), str, f"{where}.{kind}.name"),
                    namespace=optional(native, "namespace", str, f"{where}.{kind}"),
                    arguments=expect(args, str, f"{where}.{kind}.arguments") if args is not None else "{}")


def parse_messages(raw: Any) -> list:
    expect(raw, list, "messages")
    if not raw:
        raise DialectError("messages must not be empty")
    out: list = []
    names: dict[str, str] = {}  # tool_call_id -> tool name, for tool messages that do not say it
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        expect(m, dict, where)
        role = m.get("role")
        if role in ("system", "developer"):
            out.append(SystemMessage(content=parse_content(m.get("content"), f"{where}.content")))
        elif role == "user":
            out.append(UserMessage(content=parse_content(m.get("content"), f"{where}.content")))
        elif role == "assistant":
            calls = [parse_tool_call(c, f"{where}.tool_calls[{j}]")
                     for j, c in enumerate(optional(m, "tool_calls", list, where, []))]
            names.update((c.id, c.name) for c in calls)
            text = parse_content(m.get("content"), f"{where}.content", assistant=True)
            reasoning = m.get("reasoning_content", m.get("reasoning"))
            out.append(AssistantMessage(content=text or None, tool_calls=calls or None,
                                        reasoning_content=reasoning if isinstance(reasoning, str) and reasoning
                                        else None))
        elif role == "tool":
            call_id = expect(m.get("tool_call_id"), str, f"{where}.tool_call_id")
            name = optional(m, "name", str, where) or names.get(call_id)
            out.append(ToolMessage(tool_call_id=call_id, name=name,
                                   content=parse_content(m.get("content"), f"{where}.content")))
        else:
            raise DialectError(f"{where}.role must be system, developer, user, assistant or tool, "
                               f"got {str(role)[:40]!r}")
    return out


def parse_tools(raw: Any) -> list[Tool] | None:
    tools = []
    for i, t in enumerate(expect(raw, list, "tools") if raw is not None else []):
        where = f"tools[{i}]"
        expect(t, dict, where)
        kind = t.get("type", "function")
        expect(kind, str, f"{where}.type")
        native = t.get(kind, t)
        expect(native, dict, f"{where}.{kind}")
        name = native.get("name") or kind
        expect(name, str, f"{where}.{kind}.name")
        fields = {k: v for k, v in native.items() if k not in ("type", "name")}
        if "parameters" in fields:
            expect(fields["parameters"], dict, f"{where}.{kind}.parameters")
        tools.append(Tool.model_validate({**fields, "type": kind, "name": name}))
    return tools or None


def tool_calls_wire(response: Response) -> list[dict]:
    return [{"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments}} if c.type == "custom"
            else {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in response.message.tool_calls or []]


def usage_wire(response: Response) -> dict:
    u = response.usage
    if u is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    out: dict[str, Any] = {"prompt_tokens": u.input_tokens, "completion_tokens": u.completion_tokens,
                           "total_tokens": u.total_tokens}
    if u.cached_input_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_input_tokens}
    if u.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning_tokens}
    return out


class ChatDialect(Dialect):
    name = "chat"
    routes = ("/chat/completions",)

    def parse_object(self, body: dict) -> Call:
        n = body.get("n")
        if n is not None and n != 1:
            raise DialectError("n must be 1: one completion per call")
        sampling = sampling_from(body, SAMPLING)
        return Call(dialect=self.name, model=optional(body, "model", str, ""),
                    stream=optional(body, "stream", bool, "", False), sampling=sampling,
                    request=Request(messages=parse_messages(body.get("messages")),
                                    tools=parse_tools(body.get("tools"))))

    def _message(self, response: Response) -> dict:
        calls = tool_calls_wire(response)
        message: dict[str, Any] = {"role": "assistant", "content": response_text(response) or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        if response.message.reasoning_content:
            message["reasoning_content"] = response.message.reasoning_content
        return message

    def render(self, response: Response, call: Call) -> dict:
        return {"id": response.id, "object": "chat.completion", "created": created(response),
                "model": response.model or call.model,
                "choices": [{"index": 0, "message": self._message(response), "logprobs": None,
                             "finish_reason": finish(response)}],
                "usage": usage_wire(response)}

    def framer(self, call: Call, response_id: str, model: str, created_at: int) -> Framer:
        return ChatFramer(call, response_id, model, created_at)

    def error_body(self, status: int, message: str) -> dict:
        return openai_error(status, message)


class ChatFramer(Framer):
    """`chat.completion.chunk` events: the role, content deltas, then tool calls and the finish
    chunk (carrying usage: clients that asked for it, `stream_options.include_usage`, find it, and
    none sees a chunk without choices it did not ask for), then `[DONE]`."""

    def chunk(self, delta: dict, finish_reason: str | None = None, **extra) -> bytes:
        return sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
                    **extra})

    def start(self, known: Response | None) -> list[bytes]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def text(self, text: str) -> list[bytes]:
        return [self.chunk({"content": text})]

    def reasoning(self, text: str) -> list[bytes]:
        return [self.chunk({"reasoning_content": text})]

    def finish(self, response: Response) -> list[bytes]:
        frames = [self.chunk({"tool_calls": [{"index": i, **c}]}) for i, c in enumerate(tool_calls_wire(response))]
        return [*frames, self.chunk({}, finish(response), usage=usage_wire(response)), b"data: [DONE]\n\n"]

    def error(self, status: int, message: str) -> list[bytes]:
        return [sse(openai_error(status, message)), b"data: [DONE]\n\n"]
