"""OpenAI Responses (`POST /v1/responses`): Codex and the openai SDK's `client.responses`.

The request's `instructions` become a system message and its `input` items chat messages: each run
of assistant-side items (reasoning, an assistant message, function calls) folds into one assistant
message, a `function_call_output` becomes a role "tool" message with the same `call_id`, and
`input_image` parts become image_url parts. The server keeps no state between calls, so a request
must carry its whole conversation: `previous_response_id` (server-side history) is refused with 400
(Codex sends the full input with `store: false`).
"""

from __future__ import annotations

import json
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
    "max_output_tokens": ("max_tokens", int),
    "seed": ("seed", int),
}
ASSISTANT_ITEMS = ("reasoning", "function_call", "custom_tool_call")
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


def parse_content(value: Any, where: str, assistant: bool = False):
    value = text_or_parts(value, where)
    if isinstance(value, str):
        return value
    parts = []
    for i, part in enumerate(value):
        kind, at = part.get("type"), f"{where}[{i}]"
        if kind in ("input_text", "output_text", "text") or (assistant and kind == "refusal"):
            parts.append(text_part(part.get("text", part.get("refusal")), f"{at}.text"))
        elif kind == "input_image" and not assistant:
            if part.get("file_id"):
                raise DialectError(f"{at}: input_image by file_id is not supported; send image_url (a data URL)")
            parts.append(image_part(part.get("image_url"), f"{at}.image_url"))
        else:
            raise DialectError(f"{at}: content part type {str(kind)[:40]!r} is not supported here")
    return simplify(parts)


def fold_assistant(items: list[tuple[dict, str]]) -> AssistantMessage:
    """A run of assistant-side input items -> one assistant message."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for item, where in items:
        kind = item.get("type") or "message"
        if kind == "reasoning":
            for key in ("summary", "content"):
                for j, s in enumerate(optional(item, key, list, where, [])):
                    expect(s, dict, f"{where}.{key}[{j}]")
                    reasoning.append(expect(s.get("text", ""), str, f"{where}.{key}[{j}].text"))
        elif kind in ("function_call", "custom_tool_call"):
            args = item.get("input" if kind == "custom_tool_call" else "arguments")
            calls.append(ToolCall(id=expect(item.get("call_id"), str, f"{where}.call_id"),
                                  type="custom" if kind == "custom_tool_call" else "function",
                                  name=expect(item.get("name"), str, f"{where}.name"),
                                  namespace=optional(item, "namespace", str, where),
                                  arguments=expect(args, str, f"{where}.arguments") if args is not None else "{}"))
        else:
            content = parse_content(item.get("content"), f"{where}.content", assistant=True)
            texts.append(content if isinstance(content, str) else "\n".join(p.text for p in content))
    return AssistantMessage(content="".join(texts) or None,
                            reasoning_content="\n".join(r for r in reasoning if r) or None,
                            tool_calls=calls or None)


def parse_input(body: dict) -> list:
    out: list = []
    instructions = optional(body, "instructions", str, "")
    if instructions:
        out.append(SystemMessage(content=instructions))
    raw = body.get("input")
    if raw is None:
        raise DialectError("input is required")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else expect(raw, list, "input")
    run: list[tuple[dict, str]] = []
    names: dict[str, str] = {}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        expect(item, dict, where)
        kind = item.get("type") or "message"
        role = item.get("role")
        assistant = kind in ASSISTANT_ITEMS or (kind == "message" and role == "assistant")
        if run and not assistant:
            out.append(fold_assistant(run))
            run = []
        if assistant:
            run.append((item, where))
            if kind in ("function_call", "custom_tool_call") and isinstance(item.get("call_id"), str):
                names[item["call_id"]] = item.get("name") if isinstance(item.get("name"), str) else None
        elif kind in OUTPUT_ITEMS:
            call_id = expect(item.get("call_id"), str, f"{where}.call_id")
            output = item.get("output")
            content = (parse_content(output, f"{where}.output") if isinstance(output, (str, list))
                       else json.dumps(output))
            out.append(ToolMessage(tool_call_id=call_id, name=names.get(call_id), content=content))
        elif kind == "message":
            content = parse_content(item.get("content"), f"{where}.content")
            if role in ("system", "developer"):
                out.append(SystemMessage(content=content))
            elif role == "user":
                out.append(UserMessage(content=content))
            else:
                raise DialectError(f"{where}.role must be user, assistant, system or developer, got {str(role)[:40]!r}")
        else:
            raise DialectError(f"{where}: input item type {str(kind)[:40]!r} is not supported")
    if run:
        out.append(fold_assistant(run))
    if not out:
        raise DialectError("input must not be empty")
    return out


def parse_tools(raw: Any) -> list[Tool] | None:
    tools: list[Tool] = []

    def add(t: Any, where: str, namespace: str | None) -> None:
        expect(t, dict, where)
        kind = t.get("type", "function")
        expect(kind, str, f"{where}.type")
        if kind == "namespace":
            group = expect(t.get("name"), str, f"{where}.name")
            for j, inner in enumerate(expect(t.get("tools"), list, f"{where}.tools")):
                add(inner, f"{where}.tools[{j}]", group)
            return
        name = t.get("name") or kind
        expect(name, str, f"{where}.name")
        if t.get("parameters") is not None:
            expect(t["parameters"], dict, f"{where}.parameters")
        fields = {k: v for k, v in t.items() if k not in ("type", "name", "namespace") and v is not None}
        tools.append(Tool.model_validate({**fields, "type": kind, "name": name, "namespace": namespace}))

    for i, t in enumerate(expect(raw, list, "tools") if raw is not None else []):
        add(t, f"tools[{i}]", None)
    return tools or None


def usage_wire(response: Response) -> dict:
    u = response.usage
    cached = (u.cached_input_tokens or 0) if u else 0
    reasoning = (u.reasoning_tokens or 0) if u else 0
    return {"input_tokens": u.input_tokens if u else 0, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": u.completion_tokens if u else 0, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": u.total_tokens if u else 0}


class ResponsesDialect(Dialect):
    name = "responses"
    routes = ("/responses",)

    def parse_object(self, body: dict) -> Call:
        if body.get("previous_response_id") is not None:
            raise DialectError("previous_response_id is not supported: this endpoint keeps no conversation "
                               "state; send the whole conversation in `input` (store: false)")
        sampling = sampling_from(body, SAMPLING)
        reasoning = optional(body, "reasoning", dict, "", {})
        if reasoning.get("effort") is not None:
            sampling["reasoning_effort"] = expect(reasoning["effort"], str, "reasoning.effort")
        return Call(dialect=self.name, model=optional(body, "model", str, ""),
                    stream=optional(body, "stream", bool, "", False), sampling=sampling,
                    request=Request(messages=parse_input(body), tools=parse_tools(body.get("tools"))))

    def output_items(self, response: Response) -> list[dict]:
        """The response's `output`: a reasoning item, a message item, then one item per tool call.
        Item ids derive from the response id, so the streamed and the final objects agree."""
        items: list[dict] = []
        m = response.message
        if m.reasoning_content:
            items.append({"type": "reasoning", "id": f"rs_{response.id}", "status": "completed",
                          "summary": [{"type": "summary_text", "text": m.reasoning_content}]})
        text = response_text(response)
        if text or not m.tool_calls:
            items.append({"type": "message", "id": f"msg_{response.id}", "status": "completed", "role": "assistant",
                          "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
        for i, c in enumerate(m.tool_calls or []):
            if c.type == "custom":
                items.append({"type": "custom_tool_call", "id": f"ctc_{response.id}_{i}", "status": "completed",
                              "call_id": c.id, "name": c.name, "input": c.arguments})
            else:
                items.append({"type": "function_call", "id": f"fc_{response.id}_{i}", "status": "completed",
                              "call_id": c.id, "name": c.name, "arguments": c.arguments})
        return items

    def render(self, response: Response, call: Call) -> dict:
        length = finish(response) == "length"
        return {"id": response.id, "object": "response", "created_at": created(response),
                "model": response.model or call.model, "status": "incomplete" if length else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if length else None, "error": None,
                "instructions": None, "metadata": {}, "output": self.output_items(response),
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "temperature": call.sampling.get("temperature"), "top_p": call.sampling.get("top_p"),
                "max_output_tokens": call.sampling.get("max_tokens"), "usage": usage_wire(response)}

    def framer(self, call: Call, response_id: str, model: str, created_at: int) -> Framer:
        return ResponsesFramer(self, call, response_id, model, created_at)

    def error_body(self, status: int, message: str) -> dict:
        return openai_error(status, message)


class ResponsesFramer(Framer):
    """Responses events: `response.created` / `in_progress`; the message item opened at the first
    text and its `output_text.delta`s; at the end its `done` events, the reasoning and tool-call
    items, and `response.completed` whose `output` lists the items in the order they were sent.
    `response.completed` ends even a reply cut at max_output_tokens (its status still says
    "incomplete"): the openai SDK's stream helper accepts no other terminal event, and Codex ends a
    turn on it (a stream that stops without it is a failed call there), where a truncated turn
    should stand as the policy's answer."""

    def __init__(self, dialect: ResponsesDialect, *args):
        super().__init__(*args)
        self.dialect = dialect
        self.n = 0
        self.items: list[dict] = []
        self.message: dict | None = None  # the open message item

    def event(self, kind: str, **data) -> bytes:
        frame = sse({"type": kind, "sequence_number": self.n, **data}, event=kind)
        self.n += 1
        return frame

    def envelope(self, response: Response | None = None) -> dict:
        blank = Response(id=self.id, created=self.created, model=self.model, message=AssistantMessage(content=None))
        final = self.dialect.render(response or blank, self.call)
        if response is None:
            final.update(status="in_progress", output=[], incomplete_details=None, usage=None)
        return final

    def start(self, known: Response | None) -> list[bytes]:
        head = self.envelope()
        return [self.event("response.created", response=head), self.event("response.in_progress", response=head)]

    def add(self, item: dict, pending: dict | None = None) -> bytes:
        self.items.append(item)
        return self.event("response.output_item.added", output_index=len(self.items) - 1, item=pending or item)

    def done(self, item: dict) -> bytes:
        return self.event("response.output_item.done", output_index=self.items.index(item), item=item)

    def text(self, text: str) -> list[bytes]:
        frames = []
        if self.message is None:
            self.message = {"type": "message", "id": f"msg_{self.id}", "status": "completed", "role": "assistant",
                            "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
            frames.append(self.add(self.message, {**self.message, "status": "in_progress", "content": []}))
            frames.append(self.event("response.content_part.added", output_index=len(self.items) - 1,
                                     item_id=self.message["id"], content_index=0, part=self.message["content"][0]))
        at = {"output_index": self.items.index(self.message), "item_id": self.message["id"], "content_index": 0}
        return [*frames, self.event("response.output_text.delta", **at, delta=text, logprobs=[])]

    def reasoning(self, text: str) -> list[bytes]:
        item = {"type": "reasoning", "id": f"rs_{self.id}", "status": "completed",
                "summary": [{"type": "summary_text", "text": text}]}
        return [self.add(item), self.done(item)]

    def finish(self, response: Response) -> list[bytes]:
        frames: list[bytes] = []
        if self.message is None and not response.message.tool_calls:  # an empty reply is an empty message
            frames += self.text("")
        if self.message is not None:
            part = {**self.message["content"][0], "text": self.sent}
            self.message["content"] = [part]
            at = {"output_index": self.items.index(self.message), "item_id": self.message["id"], "content_index": 0}
            frames += [self.event("response.output_text.done", **at, text=self.sent, logprobs=[]),
                       self.event("response.content_part.done", **at, part=part), self.done(self.message)]
        for item in self.dialect.output_items(response):
            if item["type"] == "function_call":
                frames.append(self.add(item, {**item, "status": "in_progress", "arguments": ""}))
                at = {"output_index": len(self.items) - 1, "item_id": item["id"]}
                frames += [self.event("response.function_call_arguments.delta", **at, delta=item["arguments"]),
                           self.event("response.function_call_arguments.done", **at, name=item["name"],
                                      arguments=item["arguments"]), self.done(item)]
            elif item["type"] == "custom_tool_call":
                frames += [self.add(item), self.done(item)]
        return [*frames, self.event("response.completed", response={**self.envelope(response), "output": self.items})]

    def error(self, status: int, message: str) -> list[bytes]:
        failed = {**self.envelope(), "status": "failed", "output": self.items,
                  "error": {"code": "server_error", "message": message}}
        return [self.event("error", code="server_error", message=message, param=None),
                self.event("response.failed", response=failed)]

