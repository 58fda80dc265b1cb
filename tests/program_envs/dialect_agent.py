"""A program harness that speaks each model-API dialect the way the real agents do, for the
interception tests (tests/test_hosted_tools.py, tests/test_provider_requests.py).

`DialectAgent`'s program is a stdlib-only script. With `dialect: responses` it sends what Codex
0.171 sends (`instructions`, `input` items, function tools, the free-form `apply_patch`, the hosted
`web_search`,
`reasoning`, `store: false`, `stream: true`); with `anthropic` what Claude Code sends (`system`
as cached text blocks, `Edit` with `replace_all` defaulting to false, the server tool
`web_search_20250305`, `stream: true`, `x-api-key`); with `chat` a plain Chat Completions call
with function tools. It runs the tool calls it gets ("ok" for each) and re-sends its history as
Claude Code does: each earlier `Edit` call's arguments with their keys reordered and
`"replace_all": false` added. It stops at the first reply without a tool call. With
`client_timeout`, it hangs up on a first call that takes longer and sends it again.
"""

from __future__ import annotations

import vf
from vf.configs.harness import HarnessConfig
from vf.harness import Harness
from vf.runtimes import ProgramResult

AGENT = r'''
import json, os, sys, urllib.error, urllib.request

base, key, dialect, prompt = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], sys.argv[1], sys.argv[2]
patience = [float(sys.argv[3])]  # the first call's client timeout; a call that times out is sent again
EDIT = {"type": "object", "additionalProperties": False, "required": ["file_path", "old_string", "new_string"],
        "$schema": "http://json-schema.org/draft-07/schema#",
        "properties": {"file_path": {"type": "string", "description": "The absolute path to the file"},
                       "old_string": {"type": "string"}, "new_string": {"type": "string"},
                       "replace_all": {"type": "boolean", "default": False,
                                       "description": "Replace all occurrences of old_string"}}}
SHELL = {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}},
                                          "workdir": {"type": "string"}, "timeout_ms": {"type": "number"}},
         "required": ["command"], "additionalProperties": False}


def resent(name, arguments):
    """An earlier call's arguments as Claude Code re-sends them: reordered, defaults filled in."""
    args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
    if name == "Edit":
        args = dict(reversed(list({**args, "replace_all": False}.items())))
    return args


def post(path, body, headers):
    request = urllib.request.Request(base + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=patience[0]) as reply:
            return reply.read().decode()
    except urllib.error.HTTPError as e:
        print("model call failed:", e.code, e.read().decode()[:500], file=sys.stderr)
        sys.exit(97)
    except TimeoutError:
        if patience[0] >= 120:
            raise
        print("model call timed out; sending it again", file=sys.stderr)
        patience[0] = 120
        return post(path, body, headers)


def events(text):
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def chat(messages):
    body = {"model": "policy", "messages": messages, "max_tokens": 64, "temperature": 0.2,
            "tools": [{"type": "function", "function": {"name": "Edit", "description": "Edit a file.",
                                                        "parameters": EDIT}}]}
    message = json.loads(post("/chat/completions", body, {"Authorization": "Bearer " + key}))["choices"][0]["message"]
    calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    if calls:
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(resent(n, a))}}
            for i, n, a in calls]})
        messages += [{"role": "tool", "tool_call_id": i, "content": "ok"} for i, _, _ in calls]
    return calls


def responses(items):
    body = {"model": "policy", "instructions": "You are Codex, a coding agent.", "input": items,
            "tools": [{"type": "function", "name": "shell", "description": "Runs a shell command.", "strict": False,
                       "parameters": SHELL},
                      {"type": "function", "name": "Edit", "description": "Edit a file.", "strict": False,
                       "parameters": EDIT},
                      {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
                       "format": {"type": "grammar", "syntax": "lark", "definition": "start: patch"}},
                      {"type": "web_search", "external_web_access": False}],
            "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False, "stream": True, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "abc"}
    done = [e for e in events(post("/responses", body, {"Authorization": "Bearer " + key}))
            if e.get("type") == "response.completed"]
    calls = [(o["call_id"], o["name"], o["arguments"]) for o in done[0]["response"]["output"]
             if o["type"] == "function_call"]
    for i, n, a in calls:
        items.append({"type": "function_call", "call_id": i, "name": n, "arguments": json.dumps(resent(n, a))})
        items.append({"type": "function_call_output", "call_id": i, "output": "ok"})
    return calls


def anthropic(messages):
    body = {"model": "policy", "max_tokens": 32000, "temperature": 1, "stream": True,
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "messages": messages, "metadata": {"user_id": "user_1"},
            "tools": [{"name": "Edit", "description": "Edit a file.", "input_schema": EDIT},
                      {"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
                      {"type": "bash_20250124", "name": "bash"}]}
    blocks = {}
    for e in events(post("/messages", body, {"x-api-key": key, "anthropic-version": "2023-06-01"})):
        if e["type"] == "content_block_start":
            blocks[e["index"]] = {**e["content_block"], "json": ""}
        elif e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            blocks[e["index"]]["json"] += e["delta"]["partial_json"]
    calls = [(b["id"], b["name"], b["json"] or "{}") for b in blocks.values() if b["type"] == "tool_use"]
    if calls:
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": n,
                                                           "input": resent(n, a)} for i, n, a in calls]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": "ok"}
                                                     for i, _, _ in calls]})
    return calls


if dialect == "chat":
    step, history = chat, [{"role": "system", "content": "You edit files."}, {"role": "user", "content": prompt}]
elif dialect == "responses":
    step, history = responses, [{"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": prompt}]}]
else:
    step, history = anthropic, [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
for turn in range(4):
    if not step(history):
        break
print("agent finished after", turn + 1, "calls")
'''


class DialectAgentConfig(HarnessConfig):
    dialect: str = "chat"
    client_timeout: float = 120
    """Seconds the agent waits for its first call's answer; past it, it hangs up and sends it again."""


class DialectAgent(Harness[DialectAgentConfig]):
    NEEDS_CONTAINER = False

    async def setup(self, runtime) -> None:
        await runtime.write("dialect_agent.py", AGENT)

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> ProgramResult:
        _, prompt = self.resolve_text_prompt(data)
        env = {**self.config.resolved_env, "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        argv = ["python3", "dialect_agent.py", self.config.dialect, prompt or "", str(self.config.client_timeout)]
        return await runtime.run(argv, env, timeout=120)


class Data(vf.TaskData):
    expected: str = ""


class EditTask(vf.Task[Data]):
    @vf.metric
    async def model_calls(self, trace) -> float:
        return float(len(trace.calls))


class EditTaskset(vf.Taskset[EditTask]):
    def load(self):
        return [EditTask(Data(prompt="Change x to 2 in /w/a.py."))]


__all__ = ["DialectAgent", "EditTaskset"]
