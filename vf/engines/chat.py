"""Chat prompts to token ids, and generated text back to an OpenAI assistant message.

    render_prompt(tokenizer, messages, tools, images=False) -> list[int]   # via the tokenizer's chat template
    image_refs(messages) -> [url, ...];  expand_image_tokens(ids, image_token_id, counts) -> ids
    parse_tool_calls(text, next_id) -> (content | None, tool_calls)
Tool calls are the Hermes/Qwen convention: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks. A block whose body is not a JSON object with a string "name" stays in the content (the
model wrote something malformed; the harness shows it as text rather than inventing a call).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from vf.errors import EngineError

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TOOL_OPEN = "<tool_call>"


def _text(content: Any) -> str | None:
    """OpenAI content parts -> plain text; strings and None pass through. A part this text-only
    path cannot show the model (an image) is refused, never dropped silently."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        kinds = sorted({p.get("type", "text") for p in content if isinstance(p, dict)} - {"text"})
        if kinds:
            raise EngineError(
                f"this model reads text only and the request holds {', '.join(kinds)} content parts; "
                "send it to a provider whose model accepts them (--base-url)",
                type="UnsupportedContent", status_code=400)
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _parts(content: Any) -> Any:
    """Content for a model that sees images: text and image_url parts kept in order (the chat
    template renders each image as its placeholder), anything else refused."""
    if not isinstance(content, list):
        return _text(content)
    out = []
    for p in content:
        kind = p.get("type", "text") if isinstance(p, dict) else None
        if kind == "text":
            out.append({"type": "text", "text": str(p.get("text", ""))})
        elif kind == "image_url" and isinstance(p.get("image_url"), dict):
            out.append({"type": "image_url", "image_url": {"url": p["image_url"].get("url")}})
        else:
            raise EngineError(f"unsupported content part {p!r:.80}; text and image_url parts are read",
                              type="UnsupportedContent", status_code=400)
    return out


def image_refs(messages: list[dict[str, Any]]) -> list[str]:
    """The url of every image_url part, in the order the prompt shows them."""
    return [p["image_url"].get("url") for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, dict) and p.get("type") == "image_url" and isinstance(p.get("image_url"), dict)]


def expand_image_tokens(ids: list[int], image_token_id: int, counts: list[int]) -> list[int]:
    """Each image placeholder token (one per image, as the chat template writes it) repeated as
    many times as that image has tokens."""
    where = [i for i, t in enumerate(ids) if t == image_token_id]
    if len(where) != len(counts):
        raise EngineError(f"the chat template wrote {len(where)} image placeholder(s) for {len(counts)} image(s); "
                          "the model's chat template must render each image_url part", type="BadRequest", status_code=400)
    out, last = [], 0
    for i, n in zip(where, counts):
        out += ids[last:i] + [image_token_id] * n
        last = i + 1
    return out + ids[last:]


def render_multimodal(tokenizer, model, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                      roots=()) -> tuple[list[int], dict | None]:
    """A VL model's prompt: (token ids with each image's tokens in place, its image inputs or None).
    The inputs are `pixel_values`, `image_grid_thw` (tensors on the model's device) and
    `rope_delta` (see `vf.models.qwen3_vl`). Images are read from data URLs or files under `roots`."""
    ids = render_prompt(tokenizer, messages, tools, images=True)
    refs = image_refs(messages)
    if not refs:
        return ids, None
    mm = model.image_inputs(refs, roots)
    grids = mm["image_grid_thw"].tolist()
    ids = expand_image_tokens(ids, model.image_token_id, [model.image_tokens(g) for g in grids])
    mm["rope_delta"] = model.rope_delta(ids, grids)
    return ids, mm


def normalize_messages(messages: list[dict[str, Any]], images: bool = False) -> list[dict[str, Any]]:
    """Messages as the chat template gets them: content as text, or (`images`) as text and image parts."""
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise EngineError(f"each message needs a 'role'; got {m!r:.100}", type="BadRequest")
        m = dict(m)
        m["content"] = _parts(m.get("content")) if images else _text(m.get("content"))
        if m["content"] is None and m["role"] != "assistant":
            m["content"] = ""
        out.append(m)
    return out


def render_prompt(tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                  images: bool = False) -> list[int]:
    """Prompt token ids; with `images` (a model that sees them) image parts stay in the messages and
    come out as one placeholder token each (see `expand_image_tokens`)."""
    if not messages:
        raise EngineError("messages must not be empty", type="BadRequest")
    try:
        text = tokenizer.apply_chat_template(
            normalize_messages(messages, images), tools=tools or None, add_generation_prompt=True, tokenize=False
        )
    except EngineError:
        raise
    except Exception as e:  # noqa: BLE001 (a template error is the request's fault (bad roles/order))
        raise EngineError(f"the chat template rejected the messages: {e}", type="BadRequest") from None
    # the template already wrote any BOS/special tokens it wants
    return list(tokenizer.encode(text, add_special_tokens=False))


def parse_tool_calls(text: str, next_id: Callable[[], int]) -> tuple[str | None, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in TOOL_CALL_RE.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        args = body.get("arguments", body.get("parameters", {}))
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append({
            "id": f"call_{next_id()}",
            "type": "function",
            "function": {"name": body["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)},
        })
    if not calls:
        return text, []
    kept.append(text[last:])
    content = "".join(kept).strip()
    return (content or None), calls
