"""Hostile agents stay bounded (issue 33): what an agent program's calls can make the host hold is
capped per call, per rollout and per run, and a call past a budget is refused, recorded on the
trace, and ends the episode as `limit`.

The agent is `BigAgent` (written into the test's tmp dir with its taskset): a stdlib-only program
in the default sandbox that sends its model `calls` calls, each a system message and a fresh user
message of `size` bytes (a rewritten history: every call is a new branch, all of it new to the
trace), after one body of `big` bytes, over the server's `max_body_mb`. The budgets are set low
here (vf.interception.InterceptionConfig) so small payloads prove them; the defaults are
8 MiB per call, 64 MiB per rollout, 1 GiB per run.

Before (main at issue 33): every call was recorded whatever its size (three 34 MB calls gave
vf-eval 4.5 GB and a 316 MB trace line, and the episode counted as a success), the bridge left a
client that sent a body over the limit hanging until its own timeout, and a per-rollout key in
a tool's definition reached the policy and traces.jsonl.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_program_harness import secrets  # noqa: F401 - the fixture: every per-rollout secret handed out
from test_runtime_sandbox import needs_bwrap

from vf.trace import Episode

pytestmark = needs_bwrap

ENV = '''
import json

import vf
from vf.configs.harness import HarnessConfig
from vf.harness import Harness

AGENT = r"""
import json, os, sys, urllib.error, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
size, calls, big, key_in_tool, image = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command. key=" + key
          if key_in_tool else "Run a command.", "parameters": {"type": "object", "properties": {}}}}]

def post(body):
    request = urllib.request.Request(base + "/chat/completions", body,
                                     {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=20) as reply:
            reply.read()
            return [reply.status, ""]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode(errors="replace")[:600]]
    except OSError as e:
        return [0, repr(e)[:300]]

answers = []
if image:  # an image by URL: refused, never fetched nor passed on
    answers.append(post(json.dumps({"model": "p", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": image}}]}]}).encode()))
if big:  # one body over the server's max_body_mb
    answers.append(post(b'{"model": "p", "messages": [{"role": "user", "content": "' + b"y" * big + b'"}]}'))
for i in range(calls):  # each call a fresh history: all of it new to the trace
    text = (str(i % 10) * size)[:size]
    answers.append(post(json.dumps({"model": "p", "tools": tools, "messages": [
        {"role": "system", "content": "You are an agent."}, {"role": "user", "content": text}]}).encode()))
with open("answers.json", "w") as f:
    json.dump(answers, f)
print("statuses", [a[0] for a in answers])
"""


class BigAgentConfig(HarnessConfig):
    size: int = 1000
    calls: int = 1
    big: int = 0
    key_in_tool: bool = False
    image: str = ""


class BigAgent(Harness[BigAgentConfig]):
    NEEDS_CONTAINER = False

    async def setup(self, runtime) -> None:
        await runtime.write("agent.py", AGENT)

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        c = self.config
        env = {"OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        argv = ["python3", "agent.py", str(c.size), str(c.calls), str(c.big), "1" if c.key_in_tool else "0", c.image]
        return await runtime.run(argv, env, timeout=120)


class BigTask(vf.Task[vf.TaskData]):
    @vf.metric
    async def calls_answered(self, runtime) -> float:
        return float(len(json.loads(await runtime.read("answers.json"))))


class BigTaskset(vf.Taskset[BigTask]):
    def load(self):
        return [BigTask(vf.TaskData(prompt="Send your calls."))]


__all__ = ["BigAgent", "BigTaskset"]
'''


def write_env(folder: Path) -> Path:
    path = folder / "big_agent.py"
    path.write_text(ENV)
    return path


def config(env: Path, url: str, out: Path, budgets: dict | None = None, **harness) -> dict:
    """The run's config; `budgets`: its `interception` section (`--interception.max-body-mb` ...)."""
    return {"taskset": {"id": str(env)}, "model": "bash:true", "engine": {"base_url": url, "api_key_var": "FAKE_KEY",
            "max_retries": 0}, "env": {"agent": {"harness": {"id": f"{env}:BigAgent", **harness}}},
            "interception": budgets or {}}


def evaluate(over: dict, out: Path) -> Episode:
    from vf.evaluate import execute, open_run, resolve_config

    config_, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, str(out), None)
    execute(config_, run, kept)
    (line,) = (out / "traces.jsonl").read_text().splitlines()
    return Episode.model_validate_json(line)


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")




def test_a_call_past_the_rollouts_recorded_budget_is_refused_and_the_episode_stops_as_limit(stub, tmp_path):
    out = tmp_path / "run"
    episode = evaluate(config(write_env(tmp_path), stub.url, out, {"max_body_mb": 1, "max_recorded_mb": 2},
                              size=600_000, calls=6, big=3_000_000), out)
    trace = episode.traces[0]
    assert trace.stop_condition == "limit" and not trace.ok
    error = trace.errors[-1]
    assert error.type == "InterceptionLimitError" and "max_recorded_mb" in error.message
    assert [n.message["role"] for n in trace.nodes].count("user") == 3  # the refused call kept nothing
    recorded = sum(len(json.dumps(n.message)) for n in trace.nodes)
    assert recorded <= 2 << 20
    line = (out / "traces.jsonl").read_bytes()
    assert len(line) < (2 << 20) + 200_000  # the trace line holds the budget, not the agent's sends
    assert trace.metrics.get("calls_answered") is None  # errored: not scored


def test_the_agent_sees_why_each_call_was_refused(stub, tmp_path, monkeypatch):
    """The agent's own record of its answers: a readable 413 for the body over `max_body_mb`
    (through the sandbox's bridge: before, the client hung until its own timeout), 200 for what
    fits the budget, 413 naming the budget for the call past it, then 400: the episode is over."""
    captured: list = []
    from vf.runtime.subprocess import SubprocessRuntime

    run = SubprocessRuntime.run

    async def spy(self, command, env=None, **kw):
        result = await run(self, command, env, **kw)
        if isinstance(command, list) and command[:2] == ["python3", "agent.py"]:
            captured.append(json.loads((await self.read("answers.json")).decode()))
        return result

    monkeypatch.setattr(SubprocessRuntime, "run", spy)
    out = tmp_path / "run"
    evaluate(config(write_env(tmp_path), stub.url, out, {"max_body_mb": 1, "max_recorded_mb": 2},
                    size=600_000, calls=6, big=40_000_000), out)
    (answers,) = captured
    assert [status for status, _ in answers] == [413, 200, 200, 200, 413, 400, 400], answers
    assert "request body over 1048576 bytes" in answers[0][1]
    assert "max_recorded_mb" in answers[4][1] and "2.0 MiB budget" in answers[4][1]
    assert "the rollout has ended (limit)" in answers[5][1]


def test_the_runs_budget_caps_what_all_live_rollouts_hold(stub, tmp_path):
    out = tmp_path / "run"
    budgets = {"max_body_mb": 1, "max_recorded_mb": 64, "max_run_recorded_mb": 1}
    episode = evaluate(config(write_env(tmp_path), stub.url, out, budgets, size=400_000, calls=4), out)
    trace = episode.traces[0]
    assert trace.stop_condition == "limit"
    assert trace.errors[-1].type == "InterceptionLimitError" and "max_run_recorded_mb" in trace.errors[-1].message
    assert [n.message["role"] for n in trace.nodes].count("user") == 2


def test_an_image_by_url_is_refused_and_listed_on_the_trace(stub, tmp_path):
    url = "http://127.0.0.1:9/latest/meta-data/iam"
    before = len(stub.requests)
    out = tmp_path / "run"
    episode = evaluate(config(write_env(tmp_path), stub.url, out, size=10, calls=1, image=url), out)
    trace = episode.traces[0]
    assert trace.ok and trace.info["refused_calls_total"] == 1
    ((refused,),) = [trace.info["refused_calls"]]
    assert refused["status"] == 400 and "image by URL" in refused["message"]
    assert url not in (out / "traces.jsonl").read_text() and url not in json.dumps(stub.requests[before:])


def test_the_rollout_key_in_a_tool_definition_is_blanked(stub, tmp_path, secrets):  # noqa: F811
    before = len(stub.requests)
    out = tmp_path / "run"
    episode = evaluate(config(write_env(tmp_path), stub.url, out, size=10, calls=1, key_in_tool=True), out)
    (secret,) = secrets
    trace = episode.traces[0]
    assert trace.ok and trace.tools and "key=***" in json.dumps(trace.tools)
    assert secret not in (out / "traces.jsonl").read_text()
    assert secret not in json.dumps(stub.requests[before:]) and "key=***" in json.dumps(stub.requests[before:])


RSS_SCRIPT = textwrap.dedent('''
    import json, os, sys
    env, url, out, budgets = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    os.environ["FAKE_KEY"] = "sk-test"
    import vf.runner
    from vf.evaluate import execute, open_run, resolve_config

    def status(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ":"))

    over = {"interception": budgets or {}, "taskset": {"id": env}, "model": "bash:true", "max_turns": 64, "engine": {"base_url": url, "api_key_var": "FAKE_KEY",
            "max_retries": 0}, "env": {"agent": {"harness": {"id": env + ":BigAgent", "size": 3_500_000,
            "calls": 24, "big": 40_000_000}}}}
    config, run, kept, _ = open_run(resolve_config({"command": "eval"}, over), over, out, None)
    baseline = status("VmRSS")
    execute(config, run, kept)
    print(json.dumps({"baseline": baseline, "peak": status("VmHWM")}))
''')

PEAK_GROWTH = 160 << 20
"""What the run may add to vf's resident memory at its peak while the agent sends 24 calls of
3.5 MB and a 40 MB one, with budgets of 4 MiB per call and 16 MiB per rollout: the recorded
16 MiB, one call's body and its parsed copies, and the interpreter's own slack (67 MiB here).
On main at issue 33 (no budgets, 64 MiB bodies) the same agent grew vf by 244 MiB and left a
66 MB trace line."""


def test_host_memory_stays_bounded_while_an_agent_sends_oversized_calls(stub, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(write_env(tmp_path)), stub.url, str(out),
                           json.dumps({"max_body_mb": 4, "max_recorded_mb": 16})],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rss = json.loads(proc.stdout.strip().splitlines()[-1])
    (line,) = (out / "traces.jsonl").read_text().splitlines()
    trace = Episode.model_validate_json(line).traces[0]
    assert trace.stop_condition == "limit" and trace.errors[-1].type == "InterceptionLimitError"
    assert len(line) < 17 << 20
    growth = rss["peak"] - rss["baseline"]
    assert growth < PEAK_GROWTH, f"vf's peak resident memory grew {growth >> 20} MiB during the run"
