"""vf.dialects.tool_args: tool-call arguments compared as what they mean, so an agent that
re-serialises its history (Claude Code's `Edit` with `replace_all: false` added, keys reordered)
does not read as having rewritten it, and a real difference still does."""

from __future__ import annotations

import json

import pytest

from vf.dialects.tool_args import canonical_arguments, same_arguments, same_message, tool_schemas
from vf.types import Tool

# Claude Code's Edit tool, as it declares it (zod: `replace_all` defaults to false)
EDIT = {"type": "object", "additionalProperties": False, "required": ["file_path", "old_string", "new_string"],
        "properties": {"file_path": {"type": "string"}, "old_string": {"type": "string"},
                       "new_string": {"type": "string"},
                       "replace_all": {"type": "boolean", "default": False}}}
SAMPLED = '{"file_path": "/w/a.py", "old_string": "x = 1", "new_string": "x = 2"}'
RESENT = '{"replace_all":false,"new_string":"x = 2","old_string":"x = 1","file_path":"/w/a.py"}'


def call(name: str, arguments: str, call_id: str = "toolu_1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(*calls: dict, content=None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


NESTED = [{"type": "function", "function": {"name": "Edit", "parameters": EDIT}}]


def test_claude_codes_resent_edit_is_the_same_call_and_a_real_change_is_not():
    assert RESENT != SAMPLED and same_arguments(SAMPLED, RESENT, EDIT)
    assert same_message(assistant(call("Edit", SAMPLED)), assistant(call("Edit", RESENT)), NESTED)
    # the flag set, or any value changed, is another call
    assert not same_arguments(SAMPLED, RESENT.replace("false", "true"), EDIT)
    assert not same_arguments(SAMPLED, RESENT.replace("x = 2", "x = 3"), EDIT)
    assert not same_message(assistant(call("Edit", SAMPLED)), assistant(call("Edit", RESENT.replace("false", "true"))),
                            NESTED)


@pytest.mark.parametrize("prop, required, a, b, same", [
    # a declared default: given or left out reads the same; its opposite does not
    ({"type": "boolean", "default": True}, False, {}, {"f": True}, True),
    ({"type": "boolean", "default": True}, False, {}, {"f": False}, False),
    ({"type": "integer", "default": 10}, False, {}, {"f": 10}, True),
    ({"type": "integer", "default": 10}, False, {}, {"f": 10.0}, True),
    ({"type": "integer", "default": 10}, False, {}, {"f": 11}, False),
    ({"type": "integer", "default": 0}, False, {}, {"f": False}, False),  # false is not 0
    ({"type": "boolean", "default": False}, False, {}, {"f": 0}, False),
    ({"type": "object", "default": {"a": 1, "b": [1, 2]}}, False, {}, {"f": {"b": [1, 2.0], "a": 1}}, True),
    ({"type": "string", "default": ""}, True, {}, {"f": ""}, True),  # declared: holds even when required
    # no default: an optional flag's false and an optional key's null are "not given"
    ({"type": "boolean"}, False, {}, {"f": False}, True),
    ({"type": "boolean"}, False, {}, {"f": True}, False),
    ({"type": "boolean"}, True, {}, {"f": False}, False),  # a required flag is never implied
    ({"type": "string"}, False, {}, {"f": None}, True),
    ({"type": "string"}, True, {}, {"f": None}, False),
    ({"type": "string"}, False, {}, {"f": ""}, False),  # only null and false are "not given"
    ({"type": "integer"}, False, {}, {"f": 0}, False),
    ({"type": ["boolean", "null"]}, False, {}, {"f": False}, False),  # not plainly a boolean: kept
])
def test_what_a_schema_makes_implied(prop, required, a, b, same):
    schema = {"type": "object", "properties": {"f": prop, "g": {"type": "string"}},
              "required": ["f"] if required else []}
    a, b = json.dumps({"g": "x", **a}), json.dumps({**b, "g": "x"})
    assert same_arguments(a, b, schema) is same
    assert same_arguments(b, a, schema) is same  # symmetric


def test_formatting_never_matters_and_types_always_do():
    assert same_arguments('{"a": 1, "b": "\\u00e9"}', '{ "b" : "é" ,\n "a" : 1.0 }')
    assert same_arguments('[1, 2.0, {"x": 3.0}]', '[1.0, 2, {"x": 3}]')
    assert not same_arguments('{"a": 1}', '{"a": true}')
    assert not same_arguments('{"a": 0}', '{"a": false}')
    assert not same_arguments('{"a": 1.5}', '{"a": 1}')
    assert not same_arguments('{"a": [1, 2]}', '{"a": [2, 1]}')  # arrays are ordered
    assert not same_arguments('{"a": "1"}', '{"a": 1}')
    # without a schema nothing is implied: an added key is a difference
    assert not same_arguments('{"a": 1}', '{"a": 1, "b": false}')
    assert not same_arguments('{"a": 1}', '{"a": 1, "b": null}')
    assert canonical_arguments('{"b": 1.0, "a": [true, null]}') == '{"a":[true,null],"b":1}'


def test_the_rules_follow_the_schema_into_nested_objects_and_arrays():
    schema = {"type": "object", "properties": {
        "edits": {"type": "array", "items": {"type": "object", "required": ["old"], "properties": {
            "old": {"type": "string"}, "all": {"type": "boolean", "default": False}}}},
        "opts": {"type": "object", "properties": {"dry": {"type": "boolean"}}}}}
    a = json.dumps({"edits": [{"old": "a"}, {"old": "b", "all": True}], "opts": {}})
    b = json.dumps({"opts": {"dry": False}, "edits": [{"all": False, "old": "a"}, {"all": True, "old": "b"}]})
    assert same_arguments(a, b, schema)
    assert not same_arguments(a, b.replace('"all": true', '"all": false'), schema)
    # a key the schema does not describe gets formatting only
    assert not same_arguments(a, json.dumps({**json.loads(a), "extra": False}), schema)


def test_arguments_that_are_not_json_compare_as_exact_strings():
    assert same_arguments("*** Begin Patch\n", "*** Begin Patch\n")  # a custom tool's free-form input
    assert not same_arguments("*** Begin Patch\n", "*** Begin Patch")
    assert not same_arguments('{"a": 1', '{"a":1')  # a model's broken JSON: no guessing
    assert not same_arguments('{"a": 1}', '{"a": 1')
    assert canonical_arguments("not json") is None and canonical_arguments("NaN") is None
    # hostile nesting does not blow the stack: it is just not JSON here
    deep = "[" * 100_000 + "]" * 100_000
    assert canonical_arguments(deep) is None and same_arguments(deep, deep) and not same_arguments(deep, deep + " ")


def test_weird_schemas_do_not_break_the_comparison():
    for schema in ({}, {"properties": None}, {"properties": {"f": True}}, {"properties": {"f": "x"}, "required": "f"},
                   {"items": 3}, None):
        assert same_arguments('{"f": false, "g": 1}', '{"g": 1, "f": false}', schema)
        assert not same_arguments('{"f": 1}', '{"f": 2}', schema)


def test_same_message_compares_roles_text_ids_and_each_calls_name_and_arguments():
    base = assistant(call("Edit", SAMPLED, "toolu_1"), content="Fixing it.")
    assert same_message(base, assistant(call("Edit", RESENT, "toolu_other"), content="Fixing it.  "), NESTED)
    assert not same_message(base, assistant(call("Write", RESENT), content="Fixing it."), NESTED)
    assert not same_message(base, assistant(call("Edit", RESENT), content="Fixed it."), NESTED)
    assert not same_message(base, assistant(call("Edit", RESENT), call("Edit", RESENT), content="Fixing it."), NESTED)
    assert not same_message(base, {"role": "user", "content": "Fixing it."}, NESTED)
    # without the tool's schema the added default is a difference (as vf compared before, minus order)
    assert not same_message(base, assistant(call("Edit", RESENT), content="Fixing it."), [])
    tool = {"role": "tool", "tool_call_id": "toolu_1", "content": "ok"}
    assert same_message(tool, {**tool, "content": [{"type": "text", "text": "ok"}]})
    assert not same_message(tool, {**tool, "tool_call_id": "toolu_2"})
    # verifiers' flat calls and flat tools, and vf.types.Tool, read the same as OpenAI's nested ones
    flat = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "t", "type": "function", "name": "Edit", "arguments": RESENT}]}
    for tools in (NESTED, [{"type": "function", "name": "Edit", "parameters": EDIT}],
                  [Tool(name="Edit", parameters=EDIT)]):
        assert same_message(assistant(call("Edit", SAMPLED)), flat, tools)
    assert tool_schemas([{"type": "web_search"}, {"type": "function", "function": {"name": "x"}}]) == {}
