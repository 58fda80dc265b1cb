"""Which of an agent's declared tools may be offered to the policy: the rest are dropped, and what
was dropped is recorded on the `Call` (`Call.dropped_tools`) for the trace.

Every call vf answers goes to its policy as a Chat Completions request, whose `tools` vLLM and
OpenAI accept only as `function` tools (OpenAI: `custom` too). Agents also offer tools their
provider runs itself: Codex's `{"type": "web_search"}` (and the Responses API's `file_search`,
`code_interpreter`, `image_generation`, `mcp`, `local_shell`, ...), Anthropic's server tools
(`web_search_20250305`, `web_fetch_*`, `code_execution_*`). Forwarded, each makes the provider
answer 400 and the episode fail on its first call; vf's policy runs no such tool, so it is dropped.

A `custom` tool (free-form input: Codex's `apply_patch` for some models) is one OpenAI takes and
vLLM does not, so it too is translated: a function tool of the same name whose one string parameter
`input` carries the free-form text (its grammar, if any, goes in the description: a Chat provider
cannot constrain to it). Earlier custom calls in the conversation are sent as calls of that
function, and the policy's calls of it are given back to the agent as custom calls (`restore`):
the agent sees its own tool kind, the policy one kind throughout.

Anthropic's schema-less client tools, which the agent runs itself from a `tool_use` the model
writes, have a faithful translation: Anthropic fixes their input schema, so `bash_*` and
`text_editor_*` become function tools of the same name with that schema (the policy's call to
them renders as the `tool_use` block the agent expects). `computer_*` (screenshots) and
`memory_*` are dropped.

A harness's `disabled_tools` (`--env.agent.harness.disabled-tools`) names tools, hosted or not,
that are never offered, whatever the program declares (`withhold`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from vf.bounded import BoundsError, load_json
from vf.types import AssistantMessage, Response, Tool, ToolCall

CUSTOM_INPUT = "input"
"""The one parameter of the function a custom tool is offered as."""

BASH_SCHEMA = {"type": "object", "properties": {
    "command": {"type": "string", "description": "The bash command to run."},
    "restart": {"type": "boolean", "description": "Restart the bash session."}}}
EDITOR_SCHEMA = {"type": "object", "required": ["command", "path"], "properties": {
    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
    "path": {"type": "string", "description": "Absolute path to the file or directory."},
    "file_text": {"type": "string", "description": "The file's content (create)."},
    "old_str": {"type": "string", "description": "The text to replace (str_replace)."},
    "new_str": {"type": "string", "description": "The new text (str_replace, insert)."},
    "insert_line": {"type": "integer", "description": "Insert after this line (insert)."},
    "view_range": {"type": "array", "items": {"type": "integer"}, "description": "[start, end] lines (view)."}}}
ANTHROPIC_CLIENT_TOOLS = {
    "bash": ("Run a command in a persistent bash session.", BASH_SCHEMA),
    "text_editor": ("View, create and edit files.", EDITOR_SCHEMA),
}
"""Anthropic's versioned client tools (`bash_20250124`, `text_editor_20250728`, ...) with the input
schema Anthropic documents for them."""
VERSIONED = re.compile(r"([a-z_]+?)_(\d{8})")


def dropped(tool: Tool, reason: str) -> dict:
    """What the trace records of a dropped tool: its type, name and why (not its whole definition)."""
    return {"type": tool.type, "name": tool.name, "reason": reason}


def custom_as_function(tool: Tool) -> Tool:
    """A custom (free-form) tool as the function tool that carries its input as one string."""
    fmt = (tool.model_extra or {}).get("format")
    description = tool.description
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        description += (f"\n\nThe `{CUSTOM_INPUT}` string must follow this {fmt.get('syntax') or ''} grammar:\n"
                        f"{fmt['definition']}")
    return Tool(type="function", name=tool.name, namespace=tool.namespace, description=description.strip(),
                parameters={"type": "object", "required": [CUSTOM_INPUT], "additionalProperties": False,
                            "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's input."}}})


def custom_call_as_function(call: ToolCall) -> ToolCall:
    """An earlier custom call as the call of the function its tool is offered as."""
    return call.model_copy(update={"type": "function", "arguments": json.dumps({CUSTOM_INPUT: call.arguments},
                                                                                ensure_ascii=False)})


def translate(tool: Tool) -> Tool | None:
    """`tool` as a Chat Completions function tool: itself when it is one, the function a custom
    tool or a versioned Anthropic client tool stands for, else None (a provider-hosted tool)."""
    if tool.type == "function":
        return tool
    if tool.type == "custom":
        return custom_as_function(tool)
    versioned = VERSIONED.fullmatch(tool.type)
    if versioned and versioned.group(1) in ANTHROPIC_CLIENT_TOOLS:
        description, schema = ANTHROPIC_CLIENT_TOOLS[versioned.group(1)]
        return Tool(type="function", name=tool.name, description=tool.description or description,
                    parameters=tool.parameters or schema)
    return None


def screen(tools: list[Tool] | None, disabled: Iterable[str] = ()) -> tuple[list[Tool] | None, list[dict]]:
    """`tools` as the policy may be offered them, and a record of each one dropped: provider-hosted
    ones (`reason: "hosted"`) and those named in `disabled` (`reason: "disabled"`, by name, or by
    type for a hosted tool: `web_search` names Codex's)."""
    disabled = set(disabled)
    kept: list[Tool] = []
    record: list[dict] = []
    for tool in tools or []:
        if tool.name in disabled or tool.type in disabled:
            record.append(dropped(tool, "disabled"))
        elif (chat := translate(tool)) is None:
            record.append(dropped(tool, "hosted"))
        else:
            kept.append(chat)
    return kept or None, record


def custom_names(tools: list[Tool] | None) -> list[str]:
    return [t.name for t in tools or [] if t.type == "custom"]


def functions_for_custom(messages: list) -> list:
    """The conversation with each earlier custom call as the function call the policy made."""
    out = []
    for m in messages:
        if isinstance(m, AssistantMessage) and any(c.type == "custom" for c in m.tool_calls or []):
            calls = [custom_call_as_function(c) if c.type == "custom" else c for c in m.tool_calls]
            m = m.model_copy(update={"tool_calls": calls})
        out.append(m)
    return out


def restore(response: Response, custom: Iterable[str]) -> Response:
    """The policy's reply with its calls of a translated custom tool given back as custom calls
    (their `input` argument as the free-form text); a call whose arguments are not that shape
    stays a function call (the agent then reports the bad call to the model)."""
    custom = set(custom)
    calls = response.message.tool_calls or []
    if not custom or not any(c.name in custom and c.type == "function" for c in calls):
        return response
    restored = []
    for c in calls:
        try:
            args = load_json(c.arguments) if c.name in custom and c.type == "function" else None
        except BoundsError:
            args = None
        if isinstance(args, dict) and isinstance(args.get(CUSTOM_INPUT), str):
            c = c.model_copy(update={"type": "custom", "arguments": args[CUSTOM_INPUT]})
        restored.append(c)
    return response.model_copy(update={"message": response.message.model_copy(update={"tool_calls": restored})})
