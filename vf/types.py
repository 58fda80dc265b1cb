"""Chat messages and content parts, typed as verifiers v1 types them (`vf.UserMessage`, ...).

Traces store messages as the plain OpenAI dicts they are on the wire; reward code reads them
through these classes (`trace.messages`, `trace.assistant_messages`). Each class also answers
dict-style access (`m["content"]`, `m.get("tool_calls")`), so code written either way works.

A model call crossing the interception boundary is typed as verifiers types it: `Request`
(messages + flat `Tool`s) in, `Response` (one assistant message, finish reason, `Usage`) out.

A tool call reads flat (`call.name`, `call.arguments`) as in verifiers; the OpenAI wire form
(`{"function": {"name", "arguments"}}`) is accepted and written back unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _DictLike(BaseModel):
    model_config = ConfigDict(extra="allow")

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, default)
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        return getattr(self, key, None) is not None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):  # a message equals its wire dict
            return self.wire() == other
        return super().__eq__(other)

    def wire(self) -> dict[str, Any]:
        """The OpenAI-compatible dict (None fields dropped)."""
        return self.model_dump(mode="json", exclude_none=True)


class TextContentPart(_DictLike):
    type: Literal["text"] = "text"
    text: str


class ImageUrlSource(_DictLike):
    url: str
    """An `https://` URL or a `data:image/...;base64,` URL (see `vf.utils.image.image_data_url`)."""


class ImageUrlContentPart(_DictLike):
    type: Literal["image_url"] = "image_url"
    image_url: ImageUrlSource


ContentPart = Annotated[TextContentPart | ImageUrlContentPart, Field(discriminator="type")]
MessageContent = str | list[ContentPart]


class ToolCall(_DictLike):
    id: str
    type: Literal["function", "custom"] = "function"
    name: str
    namespace: str | None = None
    """Provider namespace qualifying the tool name, when sent separately (Responses tool groups)."""
    arguments: str = "{}"
    """The raw JSON string the model produced (a custom tool's free-form input)."""

    @model_validator(mode="before")
    @classmethod
    def _flatten_openai(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("function"), dict):
            fn = data["function"]
            data = {k: v for k, v in data.items() if k != "function"}
            data.setdefault("name", fn.get("name", ""))
            data.setdefault("arguments", fn.get("arguments") or "{}")
        return data

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class SystemMessage(_DictLike):
    role: Literal["system"] = "system"
    content: MessageContent


class UserMessage(_DictLike):
    role: Literal["user"] = "user"
    content: MessageContent


class AssistantMessage(_DictLike):
    role: Literal["assistant"] = "assistant"
    content: str | list[ContentPart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None

    def wire(self) -> dict[str, Any]:
        out = super().wire()
        if self.tool_calls:
            out["tool_calls"] = [c.wire() for c in self.tool_calls]
        return out


class ToolMessage(_DictLike):
    role: Literal["tool"] = "tool"
    tool_call_id: str | None = None
    content: MessageContent = ""
    name: str | None = None


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]
Messages = list[Message]

_BY_ROLE = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage, "tool": ToolMessage}


def parse_message(message: dict[str, Any] | BaseModel) -> BaseModel:
    """A wire dict (or a typed message) as its typed class."""
    if isinstance(message, _DictLike):
        return message
    if isinstance(message, BaseModel):
        message = message.model_dump(mode="json", exclude_none=True)
    cls = _BY_ROLE.get(message.get("role", ""))
    if cls is None:
        raise ValueError(f"a message needs a role of {sorted(_BY_ROLE)}, got {message.get('role')!r}")
    return cls.model_validate(message)


def to_wire(message: dict[str, Any] | BaseModel) -> dict[str, Any]:
    """A typed message (or a dict) as the OpenAI-compatible dict a provider receives."""
    if isinstance(message, _DictLike):
        return message.wire()
    if isinstance(message, BaseModel):
        return message.model_dump(mode="json", exclude_none=True)
    return dict(message)


def content_text(content: Any) -> str:
    """Text of a message content (a string, None, or a list of parts); images are dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for p in content:
        if isinstance(p, TextContentPart):
            texts.append(p.text)
        elif isinstance(p, dict) and p.get("type", "text") == "text":
            texts.append(p.get("text", ""))
    return "\n".join(texts)


def has_images(messages: list[dict[str, Any]]) -> bool:
    """Whether any message carries an image part."""
    return any(isinstance(m.get("content"), list)
               and any(isinstance(p, dict) and p.get("type") == "image_url" for p in m["content"])
               for m in messages)


class Tool(BaseModel):
    """A tool declaration in verifiers' flat shape (`{type, name, description, parameters}`), whichever
    dialect declared it; native extras (a custom tool's `format`, `cache_control`, ...) are kept."""

    model_config = ConfigDict(extra="allow")

    type: str = "function"
    name: str
    namespace: str | None = None
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool | None = None


class Request(BaseModel):
    """The typed conversation about to cross a model boundary (what an agent sent, in chat shape)."""

    messages: Messages
    tools: list[Tool] | None = None


FinishReason = Literal["stop", "length", "tool_calls"] | None


class Usage(BaseModel):
    """Token accounting of one model call. `prompt_tokens` excludes cache reads (`cached_input_tokens`);
    `input_tokens` adds them back. Reasoning tokens are a part of `completion_tokens`."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost: float | None = None

    @property
    def input_tokens(self) -> int:
        return self.prompt_tokens + (self.cached_input_tokens or 0)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.completion_tokens


class Response(BaseModel):
    """One model call's answer: a single assistant message (text and/or tool calls)."""

    id: str
    created: int
    model: str
    message: AssistantMessage
    finish_reason: FinishReason = None
    usage: Usage | None = None
