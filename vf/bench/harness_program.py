"""The `harness` suite's program case: a real agent program per episode, its model calls through
the interception server, on vf and on verifiers 0.4.0, each as a whole `vf-eval` process.

The work (both sides, `-n 10 -r 3 -c 32` at quick size, against `vf.bench.stub_server`'s model
`bash:echo hi > out.txt && cat out.txt`): ten tasks "Write hi into out.txt for WORD."; the
program offers a `bash` tool, the model calls it once, the program runs the command in its
runtime and relays the output, the model repeats it; the task rewards a last reply of "hi". So
each episode is: runtime up, program installed and started, two model calls through the
interception server, one shell command, scoring, run-dir append.
- vf: `BenchAgent` below (a stdlib-only Python program, as tests/program_envs/script_agent.py's
  `ScriptAgent`; shipped here so an installed vf can run the bench) in vf's default runtime,
  `sandbox` (bubblewrap).
- verifiers: its `bash` harness (its PEP 723 chat program: `uv sync --script` in `setup`, then
  the program with openai/mcp/httpx) in its `subprocess` runtime (its default needs Prime's
  cloud sandboxes).

Figures per side, from one process: `ms_per_episode` = (last episode end − first start) ÷
episodes from its traces (start-up excluded); `command_wall_s` = the whole process (a CI user's
run, start-up included); `outside_span_s` = the difference; `setup_ms` / `agent_ms` = the mean
stages (where each side spends an episode). (No CPU figure: the processes of vf's sandbox runtime
are not in its parent's RUSAGE_CHILDREN, so a process tree's CPU time would leave them out.)
vf: best of `repeats` runs after a warm-up run, alternating with as many runs of the bare
program (`run_bare`, the floor under any harness that runs it). verifiers: best of
`max(1, repeats)` runs; its uv cache must already hold the program's dependencies (offline, uv
cannot fetch them).

`no_torch` check: one more vf run, under `PYTHONPROFILEIMPORTTIME`, imports no `torch` module:
`vf-eval` against a remote endpoint must not pay torch's import (seconds) at start-up.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from vf.bench.harness_peer import peer_python, run_cli, run_peer, write_package
from vf.bench.serve import free_port
from vf.configs.harness import HarnessConfig
from vf.harness import Harness
from vf.runtime import ProgramResult

MODEL = "bash:echo hi > out.txt && cat out.txt"
STAGES = ("setup", "agent")
TORCH_IMPORT = re.compile(r"\|\s*torch(\.|\s*$)", re.MULTILINE)  # an importtime line naming torch or torch.*

AGENT = r'''
import json, os, subprocess, sys, urllib.request

base, key, prompt, max_calls = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], sys.argv[1], int(sys.argv[2])
model = os.environ.get("OPENAI_MODEL", "policy")  # the interception server answers as the seat's model anyway
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": prompt}]
for _ in range(max_calls):
    body = json.dumps({"model": model, "messages": messages, "tools": tools, "max_tokens": 64}).encode()
    request = urllib.request.Request(base + "/chat/completions", body,
                                     {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        reply = json.load(response)["choices"][0]["message"]
    calls = reply.get("tool_calls") or []
    messages.append({"role": "assistant", "content": reply.get("content") or "", **({"tool_calls": calls} if calls else {})})
    if not calls:
        break
    for call in calls:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
'''

TASKSET = '''IMPORT_LINE

WORDS = ["apple", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron", "inlet", "juniper"]


class ShellData(vf.TaskData):
    word: str


class ShellTask(vf.Task[ShellData]):
    @vf.reward(weight=1.0)
    async def relayed(self, trace) -> float:
        return float((trace.last_reply or "").strip() == "hi")


class ShellConfig(vf.TasksetConfig):
    size: int = 10


class ShellTaskset(vf.Taskset[ShellTask, ShellConfig]):
    def load(self):
        return [ShellTask(ShellData(prompt=f"Write hi into out.txt for {w}.", word=w)) for w in WORDS[: self.config.size]]


__all__ = ["ShellTaskset"]
'''
PACKAGE = "vf_bench_shell"


class BenchAgentConfig(HarnessConfig):
    max_calls: int = 4


class BenchAgent(Harness[BenchAgentConfig]):
    """The bench's agent program: `AGENT`, written into the runtime once per rollout."""

    async def setup(self, runtime) -> None:
        await runtime.write("agent.py", AGENT)

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data) -> ProgramResult:
        _, prompt = self.resolve_text_prompt(data)
        env = {**self.config.resolved_env, "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        return await runtime.run(["python3", "agent.py", prompt or "", str(self.config.max_calls)], env, timeout=120)


def vf_eval() -> list[str]:
    """Our `vf-eval` as a user runs it: the console script beside this python, else `-m`."""
    script = Path(sys.executable).parent / "vf-eval"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vf.commands.eval"]


def run_ours(root: Path, url: str, tasks: int, rollouts: int, concurrency: int, timeout: float,
             name: str, extra_env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """One whole `vf-eval` process on the bench taskset with `BenchAgent`: (figures, its stderr)."""
    out = root / name
    cmd = [*vf_eval(), PACKAGE, "-n", str(tasks), "-r", str(rollouts), "-c", str(concurrency), "-m", MODEL,
           "--client.base-url", url, "--client.api-key-var", "VF_BENCH_KEY",
           "--env.agent.harness.id", f"{__name__}:BenchAgent", "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root / "vf"), os.environ.get("PYTHONPATH")) if p),
           "VF_BENCH_KEY": "sk-bench", "NO_COLOR": "1", **(extra_env or {})}
    stderr = root / f"{name}.stderr"
    figures = run_cli(cmd, out, env, root, timeout, "vf", STAGES, stderr=stderr)
    return figures, stderr.read_text()


def run_bare(root: Path, url: str, episodes: int, concurrency: int) -> dict[str, Any]:
    """The agent program alone, the floor under any harness that runs it: `episodes` runs of
    `AGENT` straight against the server (no runtime, no interception, no trace), each in a
    folder of its own, `concurrency` at a time; `ms_per_episode` = wall ÷ episodes."""
    import asyncio
    import time

    script = root / "bare-agent.py"
    script.write_text(AGENT)
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else shutil.which("python3") or "python3"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-bench",
           "OPENAI_MODEL": MODEL}

    async def go() -> list[int]:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> int:
            folder = root / "bare" / str(i)
            folder.mkdir(parents=True)
            async with sem:
                p = await asyncio.create_subprocess_exec(python, str(script), "Write hi into out.txt.", "4", cwd=folder,
                                                         env=env, stdout=subprocess.DEVNULL)
                return await p.wait()
        return await asyncio.gather(*[one(i) for i in range(episodes)])

    t = time.perf_counter()
    codes = asyncio.run(go())
    wall = time.perf_counter() - t
    ok = sum(c == 0 and (root / "bare" / str(i) / "out.txt").read_text().strip() == "hi"
             for i, c in enumerate(codes))
    shutil.rmtree(root / "bare", ignore_errors=True)
    return {"episodes": episodes, "ok": ok, "wall_s": round(wall, 3), "ms_per_episode": round(1000 * wall / episodes, 3)}


def torch_imports(importtime_stderr: str) -> list[str]:
    """The importtime lines that name torch or a torch submodule."""
    return [line for line in importtime_stderr.splitlines() if TORCH_IMPORT.search(line)]


def measure(tasks: int, rollouts: int, concurrency: int, repeats: int, peer_timeout: float) -> dict[str, Any]:
    """(child) {"ours", "bare", "peer" | "skipped": why, "no_torch": bool, "torch_lines": [...]}."""
    py, why = peer_python()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "vf.bench.stub_server", str(port)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/v1"
        with tempfile.TemporaryDirectory(prefix="vf-bench-program-") as tmp:
            root = Path(tmp)
            for side in ("vf", "verifiers"):
                write_package(root, side, PACKAGE, {"__init__.py": TASKSET})
            runs, bares = [], []
            for i in range(repeats + 1):  # alternating, so a burst of load on a shared machine hits both
                runs.append(run_ours(root, url, tasks, rollouts, concurrency, peer_timeout, f"ours-{i}")[0])
                shutil.rmtree(root / f"ours-{i}", ignore_errors=True)
                bares.append(run_bare(root, url, tasks * rollouts, concurrency))
            out: dict[str, Any] = {"ours": min(runs[1:] or runs, key=lambda r: r["ms_per_episode"]),
                                   "bare": min(bares[1:] or bares, key=lambda r: r["ms_per_episode"])}
            _, stderr = run_ours(root, url, 1, 1, 1, peer_timeout, "ours-importtime", {"PYTHONPROFILEIMPORTTIME": "1"})
            lines = torch_imports(stderr)
            # a run whose import log lacks vf's own modules proves nothing about torch
            out["no_torch"] = not lines and "vf.episode.program" in stderr
            out["torch_lines"] = lines[:5]
            if py is None:
                out["skipped"] = why
                return out
            try:
                peers = [run_peer(py, root, PACKAGE, MODEL, url, tasks, rollouts, concurrency, peer_timeout,
                                  harness="bash", stages=STAGES, out_name=f"peer-{i}") for i in range(max(1, repeats))]
                out["peer"] = min(peers, key=lambda r: r["ms_per_episode"])
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                out["skipped"] = f"verifiers run failed: {e}"
        return out
    finally:
        server.terminate()
        server.wait(timeout=10)
