"""A taskset and a program harness for the interception tests.

`ScriptAgent` is a real agent program in miniature: a stdlib-only Python script, written into the
runtime in `setup()` and run there in `launch()`, that talks to its model only through the
OpenAI-compatible endpoint it is given (`OPENAI_BASE_URL`, key `OPENAI_API_KEY`). It offers one
`bash` tool, runs the commands the model asks for, and stops at the first reply without a tool
call (or after `max_calls`). With `compact: true` it then sends one more call whose history is
rewritten (system + a fresh user message), as an agent that compacts its context does.
"""

from __future__ import annotations

import json

import vf
from vf.configs.harness import HarnessConfig
from vf.harness import Harness
from vf.runtimes import ProgramResult

AGENT = r'''
import json, os, subprocess, sys, urllib.error, urllib.request

base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
prompt, max_calls, compact, hang = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def chat(messages):
    body = json.dumps({"model": "policy", "messages": messages, "tools": tools, "max_tokens": 24}).encode()
    request = urllib.request.Request(base + "/chat/completions", body,
                                     {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return json.load(reply)["choices"][0]["message"]
    except urllib.error.HTTPError as e:
        print("model call failed:", e.code, e.read().decode()[:300], file=sys.stderr)
        sys.exit(97)


messages = [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": prompt}]
for _ in range(max_calls):
    reply = chat(messages)
    if hang:  # a stuck agent, with a background child that would outlive it
        subprocess.Popen(["/bin/sh", "-c", "sleep 3600 # " + hang], start_new_session=True)
        while True:
            pass
    messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": reply.get("tool_calls")}
                    if reply.get("tool_calls") else {"role": "assistant", "content": reply.get("content") or ""})
    if not reply.get("tool_calls"):
        break
    for call in reply["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
if compact:
    chat([messages[0], {"role": "user", "content": "Summary so far: done. Anything else?"}])
print("agent finished after", sum(m["role"] == "assistant" for m in messages), "replies")
'''


class ScriptAgentConfig(HarnessConfig):
    max_calls: int = 4
    compact: bool = False
    hang: str = ""
    """Non-empty: after its first reply the agent spins forever, with a `sleep` child (whose
    command line carries this marker) in a session of its own."""


class ScriptAgent(Harness[ScriptAgentConfig]):
    NEEDS_CONTAINER = False

    async def setup(self, runtime) -> None:
        await runtime.write("agent.py", AGENT)

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> ProgramResult:
        _, prompt = self.resolve_text_prompt(data)
        env = {**self.config.resolved_env, "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        argv = ["python3", "agent.py", prompt or "", str(self.config.max_calls), "1" if self.config.compact else "0",
                self.config.hang]
        return await runtime.run(argv, env, timeout=120)


class Data(vf.TaskData):
    expected: str


class FileTask(vf.Task[Data]):
    @vf.reward
    async def wrote_file(self, task, runtime) -> float:
        try:
            return float((await runtime.read("out.txt")).decode().strip() == task.expected)
        except Exception:  # noqa: BLE001 - no file: no reward
            return 0.0

    @vf.metric
    async def model_calls(self, trace) -> float:
        return float(len(trace.calls))


class FileTaskset(vf.Taskset[FileTask]):
    def load(self):
        return [FileTask(Data(prompt="Write hi into out.txt.", expected="hi")),
                FileTask(Data(prompt="Write bye into out.txt.", expected="bye"))]


__all__ = ["FileTaskset", "ScriptAgent"]

if __name__ == "__main__":  # the agent script, for reading
    print(json.dumps(AGENT))
