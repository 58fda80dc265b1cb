"""Whether two tool calls say the same thing: their arguments compared as parsed JSON, with what the
tool's schema lets an agent fill in normalised away.

An agent program re-sends its whole conversation on every call, and re-serialises the tool calls
the policy made on the way: Claude Code sends its earlier `Edit` calls back with its keys reordered
and `"replace_all": false` added; a JavaScript agent writes `1.0` back as `1` and `"\\u00e9"` as
`"é"`. Compared as strings, every such call reads as rewritten history and splits the episode
(a new branch, a token reset: vf.program). Compared as what they mean, they match.

What is normalised, and why each is safe (the rules are applied to both sides alike):

- formatting: key order, whitespace, string escapes, `1.0` vs `1` (parsed, then compared as
  canonical JSON; `true` stays distinct from `1`, and `0` from `false`);
- a key whose value equals the `default` its schema property declares: a tool runs the same with
  the default given or left out (that is what the schema says);
- `null` for a key the schema does not require: "not given" (OpenAI's strict mode writes optional
  fields as nullable, and agents send the null back);
- `false` for an optional boolean whose schema declares no default: absent flags read as false in
  the agents vf runs (Claude Code, Codex, mini-swe-agent); a tool whose absent flag means true
  must say `"default": true`, and then `false` is kept as a real difference.

The rules follow the schema into nested objects (`properties`) and arrays (`items`). Keys the
schema does not describe, and calls to a tool with no known schema, get formatting only.
Arguments that are not JSON (a custom tool's free-form input, a model's broken JSON) are compared
as the exact strings they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from vf.bounded import BoundsError, load_json
from vf.trace import flat_tool
from vf.types import ToolCall, content_text


def tool_schemas(tools: Iterable[Any] | None) -> dict[str, dict]:
    """Tool name -> its parameters schema, from tools in either shape (OpenAI's nested function
    schema, as the trace holds them in memory, or verifiers' flat one)."""
    out: dict[str, dict] = {}
    for tool in tools or ():
        flat = flat_tool(tool) if isinstance(tool, dict) else getattr(tool, "model_dump", dict)()
        name, params = flat.get("name"), flat.get("parameters")
        if isinstance(name, str) and isinstance(params, dict):
            out[name] = params
    return out


def _number(value: Any) -> Any:
    """An integral float as the int it equals (JSON has one number type; JS writes 1.0 as 1)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)
    return value


def _implied(value: Any, prop: Mapping, required: bool) -> bool:
    """Whether `value`, given for a property, says no more than leaving the key out would."""
    if "default" in prop:
        return _same_json(value, prop["default"])
    if required:
        return False
    if value is None:
        return True
    return value is False and prop.get("type") == "boolean"


def _same_json(a: Any, b: Any) -> bool:
    return json.dumps(normalise(a, None), sort_keys=True) == json.dumps(normalise(b, None), sort_keys=True)


def normalise(value: Any, schema: Mapping | None) -> Any:
    """`value` (parsed JSON) with the keys its `schema` makes implied dropped, recursively, and
    integral floats as ints; without a schema, numbers only."""
    schema = schema if isinstance(schema, Mapping) else {}
    if isinstance(value, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
        required = set(schema.get("required") or ()) if isinstance(schema.get("required"), list) else set()
        out = {}
        for key, item in value.items():
            prop = props.get(key)
            if isinstance(prop, Mapping) and _implied(item, prop, key in required):
                continue
            out[key] = normalise(item, prop if isinstance(prop, Mapping) else None)
        return out
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else None
        return [normalise(v, items) for v in value]
    return _number(value)


def canonical_arguments(arguments: str, schema: Mapping | None = None) -> str | None:
    """A tool call's arguments as canonical JSON (sorted keys, implied keys dropped: see the module
    docstring); None when they are not JSON (then only the exact string stands for them)."""
    try:
        value = load_json(arguments)
    except BoundsError:
        return None
    return json.dumps(normalise(value, schema), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def same_arguments(a: str, b: str, schema: Mapping | None = None) -> bool:
    """Whether two argument strings of one tool mean the same call."""
    if a == b:
        return True
    ca, cb = canonical_arguments(a, schema), canonical_arguments(b, schema)
    return ca is not None and ca == cb


def _calls(message: Mapping) -> list[ToolCall]:
    return [ToolCall.model_validate(c) for c in message.get("tool_calls") or []]


def same_message(a: Mapping[str, Any], b: Mapping[str, Any], tools: Iterable[Any] | None = None) -> bool:
    """Whether two chat messages (wire dicts) say the same thing: role, text (dialects differ in
    empty fields and trailing whitespace), tool_call_id, and each tool call's name and arguments
    (`same_arguments`, against the schema of the tool of that name in `tools`). Tool-call ids are
    not compared (an agent may mint its own)."""
    if (a.get("role"), a.get("tool_call_id")) != (b.get("role"), b.get("tool_call_id")):
        return False
    if content_text(a.get("content")).strip() != content_text(b.get("content")).strip():
        return False
    calls_a, calls_b = _calls(a), _calls(b)
    if [c.name for c in calls_a] != [c.name for c in calls_b]:
        return False
    schemas = tool_schemas(tools) if calls_a else {}
    return all(same_arguments(x.arguments, y.arguments, schemas.get(x.name)) for x, y in zip(calls_a, calls_b))
