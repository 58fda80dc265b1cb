"""A taskset and a program harness for the reliability tests (tests/test_program_reliability.py):
an agent program that misbehaves the way real ones do, by its task's `mode`.

`HostileAgent` runs a stdlib-only Python script, like tests/program_envs/script_agent.py's (one
`bash` tool, talks to its model only through `OPENAI_BASE_URL` with key `OPENAI_API_KEY`, stops at
the first reply without a tool call). Before that loop, by mode:

    normal     nothing
    fork       detaches a `sleep 300` (double fork, setsid, stdio to /dev/null) whose argv[0]
               carries the marker
    disk       writes `disk_files` files of 1 MB into its working directory, and tries to write
               beside it and into the host's /tmp (`escaped-<marker>`)
    flood      sends `flood` identical calls at once; a 429 among the answers ends it (exit 97,
               a model transport failure, as agents without retries give up)
    malformed  sends broken requests first (bad JSON, wrong shapes, no key, a wrong method), then
               goes on as `normal`
    leak       prints its key to stderr (a debug log of its request headers) and exits 1

The statuses the server answered the flood or the broken requests are put in the agent's first
user message (`statuses: [...]`) and in `statuses.json`, which the task's `answered_<status>`
metrics count, so they are on the trace. The harness's `marker` is in every
agent process's argv (and so in its sandbox's), for tests that look for survivors in /proc.
Tasks: the taskset's `modes`, one task each, all asking for `hi` in out.txt.
"""

from __future__ import annotations

import json

from pydantic import Field

import vf
from vf.configs.harness import HarnessConfig
from vf.harness import Harness
from vf.runtimes import ProgramResult

AGENT = r'''
import json, os, subprocess, sys, threading, time, urllib.error, urllib.request

base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
prompt, mode, marker, flood, disk_files = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def post(body, headers=None, method="POST", path="/chat/completions"):
    """(status, parsed body) of one request to the endpoint."""
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"} if headers is None else headers
    request = urllib.request.Request(base + path, body, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def call(messages):
    return json.dumps({"model": "policy", "messages": messages, "tools": tools, "max_tokens": 24}).encode()


def chat(messages):
    status, body = post(call(messages))
    if status != 200:
        print("model call failed:", status, json.dumps(body)[:300], file=sys.stderr)
        sys.exit(97)
    return body["choices"][0]["message"]


statuses = []
if mode == "fork":  # a detached daemon: double fork, new session, argv[0] carries the marker
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # as daemons do (unsandboxed, one that kept the pipes would hold run() to its timeout)
                os.dup2(null, fd)
            os.execv("/bin/sleep", ["sleep-" + marker, "300"])
        os._exit(0)
    os.wait()
elif mode == "disk":
    for i in range(disk_files):
        with open(f"fill{i}", "wb") as f:
            f.write(b"x" * 1000000)
    for path in (os.path.join(os.path.dirname(os.getcwd()), "escaped-" + marker), "/tmp/escaped-" + marker):
        try:
            with open(path, "w") as f:
                f.write("out")
        except OSError:
            pass
elif mode == "flood":
    first = call([{"role": "user", "content": prompt}])
    threads = [threading.Thread(target=lambda: statuses.append(post(first)[0])) for _ in range(flood)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses.sort()
    with open("statuses.json", "w") as f:
        json.dump(statuses, f)
    if 429 in statuses:
        print("model call failed: 429 after statuses", statuses, file=sys.stderr)
        sys.exit(97)
elif mode == "malformed":
    good = call([{"role": "user", "content": "x"}])
    statuses = [post(b"{not json")[0], post(b"[1, 2]")[0], post(b'{"messages": "hello"}')[0],
                post(b'{"messages": []}')[0], post(call([{"role": "wizard", "content": "x"}]))[0],
                post(good, headers={"Content-Type": "application/json"})[0],
                post(good, headers={"Authorization": "Bearer " + key[::-1]})[0],
                post(None, method="GET")[0], post(good, path="/nowhere")[0]]
    with open("statuses.json", "w") as f:
        json.dump(statuses, f)
elif mode == "leak":
    print("debug: POST", base, "Authorization: Bearer " + key, file=sys.stderr)
    sys.exit(1)

first = prompt + (f" statuses: {statuses}" if statuses else "")
messages = [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": first}]
for _ in range(4):
    reply = chat(messages)
    messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": reply.get("tool_calls")}
                    if reply.get("tool_calls") else {"role": "assistant", "content": reply.get("content") or ""})
    if not reply.get("tool_calls"):
        break
    for c in reply["tool_calls"]:
        command = json.loads(c["function"]["arguments"])["command"]
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": done.stdout + done.stderr})
print("agent finished")
'''


class HostileAgentConfig(HarnessConfig):
    marker: str = "vf-hostile"
    """In every agent process's argv (tests find survivors by it)."""
    flood: int = 24
    """Calls the `flood` modes send at once."""
    disk_files: int = 6
    """1 MB files the `disk` mode writes."""


class HostileAgent(Harness[HostileAgentConfig]):
    NEEDS_CONTAINER = False

    async def setup(self, runtime) -> None:
        await runtime.write("agent.py", AGENT)

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> ProgramResult:
        _, prompt = self.resolve_text_prompt(data)
        env = {**self.config.resolved_env, "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        c = self.config
        argv = ["python3", "agent.py", prompt or "", data.mode, c.marker, str(c.flood), str(c.disk_files)]
        return await runtime.run(argv, env, timeout=60)


class Data(vf.TaskData):
    mode: str


class HostileTask(vf.Task[Data]):
    @vf.reward
    async def wrote_hi(self, runtime) -> float:
        try:
            return float((await runtime.read("out.txt")).decode().strip() == "hi")
        except Exception:  # noqa: BLE001 - no file: no reward
            return 0.0


    @vf.metric
    async def answered_200(self, runtime) -> float:
        return await answered(runtime, 200)

    @vf.metric
    async def answered_400(self, runtime) -> float:
        return await answered(runtime, 400)

    @vf.metric
    async def answered_429(self, runtime) -> float:
        return await answered(runtime, 429)


async def answered(runtime, status: int) -> float:
    """How many of the agent's flood or malformed requests the server answered `status`."""
    try:
        return float(json.loads(await runtime.read("statuses.json")).count(status))
    except FileNotFoundError:
        return 0.0


class HostileConfig(vf.TasksetConfig):
    modes: list[str] = Field(default_factory=lambda: ["normal", "normal"])


class HostileTaskset(vf.Taskset[HostileTask, HostileConfig]):
    def load(self):
        return [HostileTask(Data(prompt=f"Task {i}: write hi into out.txt.", mode=mode))
                for i, mode in enumerate(self.config.modes)]


__all__ = ["HostileAgent", "HostileTaskset"]
