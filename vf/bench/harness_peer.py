"""The `harness` suite's peer cases: one v1 taskset run by verifiers 0.4.0's `vf-eval` and by ours
against the same zero-latency server (`vf.bench.stub_server`), `-r 10 -c 32`.

The taskset (written twice, identical but for `import verifiers.v1 as vf` / `import vf`): ten
"say WORD" tasks rewarded when the reply contains WORD; the model `echo` repeats the prompt. The
MCP case adds a Toolset (`echo_repeat`) that the model `tool` calls once before answering with
its result; verifiers serves it as an MCP server per rollout (its default `ToolsetConfig`: a
subprocess), vf calls it in-process (vf's default, see `vf.toolset`).

Per-episode wall time = (last episode end − first episode start) ÷ episodes, read from each
side's own traces, so neither side's process start (imports, verifiers' harness install) counts;
the peer's whole command time is reported beside it. The peer is verifiers 0.4.0 in its own venv
(it pins an older `openai`): `VF_VERIFIERS_PYTHON=/path/to/venv/bin/python`, with `vf-eval` and
`uv` in the same bin folder; without it the cases are skipped, saying why.

Peer flags that an offline run needs (its defaults reach for Prime's cloud): `--no-push`,
`--env.agent.runtime.type subprocess`, `--env.agent.harness.id null`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TASKSET = '''IMPORT_LINE

WORDS = ["apple", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron", "inlet", "juniper",
         "kelp", "lotus", "maple", "nectar", "oasis", "pine", "quartz", "raven", "sage", "tulip"]


class EchoData(vf.TaskData):
    word: str


class EchoTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class EchoTask(vf.Task[EchoData, vf.State, EchoTaskConfig]):
    @vf.reward(weight=1.0)
    async def echoed(self, trace) -> float:
        return float(self.data.word in (trace.last_reply or ""))


class EchoConfig(vf.TasksetConfig):
    size: int = 10
    task: EchoTaskConfig = EchoTaskConfig()


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self):
        return [EchoTask(EchoData(prompt=f"say {w}", word=w), self.config.task) for w in WORDS[: self.config.size]]
'''

TOOLS = '''IMPORT_LINE


class EchoTools(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "echo"

    @vf.tool
    def repeat(self, text: str) -> str:
        """Return the text unchanged."""
        return text


if __name__ == "__main__":
    EchoTools.run()
'''

WIRE_TOOLS = '''
from PKG.tools import EchoTools  # noqa: E402

if isinstance(vf.Task.__dict__.get("toolsets"), list):  # a vf without Task.toolsets(config)
    EchoTask.toolsets = [EchoTools]
else:
    EchoTask.toolsets = classmethod(lambda cls, config: [EchoTools(config.tools)])
'''

IMPORTS = {"verifiers": "import verifiers.v1 as vf", "vf": "import vf"}


def write_package(root: Path, side: str, pkg: str, files: dict[str, str]) -> str:
    """Write package `pkg` for `side` ("vf" or "verifiers") under `root`: each file's IMPORT_LINE
    becomes that side's import of the v1 API, so both sides run the same source."""
    d = root / side / pkg
    d.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        (d / name).write_text(source.replace("IMPORT_LINE", IMPORTS[side]))
    return pkg


def write_taskset(root: Path, side: str, mcp: bool) -> str:
    """Write the bench taskset package for `side` under `root`; return its module name."""
    pkg = "vf_bench_echo_mcp" if mcp else "vf_bench_echo"
    files = {"__init__.py": TASKSET + (WIRE_TOOLS.replace("PKG", pkg) if mcp else "") + '\n__all__ = ["EchoTaskset"]\n'}
    if mcp:
        files["tools.py"] = TOOLS
    return write_package(root, side, pkg, files)


def peer_python() -> tuple[str | None, str | None]:
    """(python of the verifiers 0.4.0 venv, None) or (None, why it is not usable)."""
    py = os.environ.get("VF_VERIFIERS_PYTHON")
    if not py:
        return None, "set VF_VERIFIERS_PYTHON to the python of a venv with verifiers==0.4.0 (and uv)"
    bin_dir = Path(py).parent
    missing = [n for n in ("vf-eval", "uv") if not (bin_dir / n).exists()]
    if not Path(py).exists() or missing:
        return None, f"VF_VERIFIERS_PYTHON={py}: missing {', '.join(missing) or 'python'} in {bin_dir}"
    return py, None


def timing_figures(traces: list[dict[str, Any]], wall_s: float | None = None,
                   stages: tuple[str, ...] = ()) -> dict[str, Any]:
    """Per-episode wall time from trace timings: span ÷ episodes, and mean episode latency.
    `stages`: also the mean duration of these timing stages (e.g. "setup", "agent") as
    `<stage>_ms`. With `wall_s` (the whole command): `command_wall_s`, and `outside_span_s` =
    wall − span, the process's start-up (imports, config, server start) and shutdown."""
    starts, ends = [], []
    for t in traces:
        timing = t.get("timing") or {}
        ends_here = [v["end"] for v in timing.values() if isinstance(v, dict) and v.get("end")]
        if timing.get("start") and ends_here:
            starts.append(timing["start"])
            ends.append(max(ends_here))
    n = len(starts)
    span = max(ends) - min(starts) if n else None
    out = {"episodes": n, "span_s": round(span, 3) if span is not None else None,
           "ms_per_episode": round(1000 * span / n, 3) if n else None,
           "mean_latency_ms": round(1000 * statistics.mean(e - s for s, e in zip(starts, ends)), 1) if n else None,
           "mean_reward": round(statistics.mean(sum(r["score"] * r.get("weight", 1.0)
                                                    for r in (t.get("rewards") or {}).values() if r)
                                                for t in traces), 3) if traces else None}
    for stage in stages:
        spans = [s["end"] - s["start"] for t in traces
                 if isinstance(s := (t.get("timing") or {}).get(stage), dict) and s.get("start") and s.get("end")]
        out[f"{stage}_ms"] = round(1000 * statistics.mean(spans), 1) if spans else None
    if wall_s is not None:
        out["command_wall_s"] = round(wall_s, 2)
        if span is not None:
            out["outside_span_s"] = round(wall_s - span, 2)
    return out


def read_traces(out: Path) -> list[dict[str, Any]]:
    """Every trace of the newest traces.jsonl under a run's `-o` folder (vf writes it there,
    verifiers one folder down)."""
    files = sorted([*out.glob("traces.jsonl"), *out.glob("*/traces.jsonl")], key=lambda f: f.stat().st_mtime)
    if not files:
        return []
    episodes = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
    return [t for e in episodes for t in e.get("traces", [])]


def run_cli(cmd: list[str], out: Path, env: dict[str, str], cwd: Path, timeout: float, who: str,
            stages: tuple[str, ...] = (), stderr: Path | None = None) -> dict[str, Any]:
    """One whole `vf-eval` process (either side's); figures from the traces it wrote under `out`.
    `stderr`: also keep the process's whole stderr in this file."""
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd, check=False)
    wall = time.perf_counter() - t
    if stderr is not None:
        stderr.write_text(p.stderr)
    traces = read_traces(out)
    if p.returncode != 0 or not traces:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-12:])
        raise RuntimeError(f"{who} vf-eval failed (exit {p.returncode}):\n{tail}")
    errors = sum(1 for t in traces if not t.get("ok", True))
    return {**timing_figures(traces, wall, stages), "errors": errors}


def run_peer(py: str, root: Path, module: str, model: str, url: str, tasks: int, rollouts: int,
             concurrency: int, timeout: float, harness: str = "null", stages: tuple[str, ...] = (),
             out_name: str = "peer-out") -> dict[str, Any]:
    """verifiers' vf-eval on the bench taskset; figures from its traces.jsonl."""
    out = root / out_name
    cmd = [str(Path(py).parent / "vf-eval"), module.replace("_", "-"), "-n", str(tasks), "-r", str(rollouts),
           "-c", str(concurrency), "-m", model, "--client.base-url", url, "--client.api-key-var", "VF_BENCH_KEY",
           "--no-push", "--no-rich", "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", harness,
           "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root / "verifiers"), "VF_BENCH_KEY": "sk-bench",
           "PATH": f"{Path(py).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return run_cli(cmd, out, env, root, timeout, "verifiers", stages)


def run_ours(root: Path, module: str, model: str, url: str, tasks: int, rollouts: int,
             concurrency: int) -> dict[str, Any]:
    """Our eval path (the same calls as `vf-eval`, in this process) on the bench taskset."""
    import asyncio

    from vf.episode.loading import load_taskset
    from vf.episode.runner import make_engine, make_plan, make_spec, run_plan
    from vf.evaluate import open_run, resolve_config

    sys.path.insert(0, str(root / "vf"))
    over = {"taskset": {"id": module, "size": tasks}, "model": model, "engine": {"base_url": url},
            "select": {"limit": tasks}, "num_rollouts": rollouts, "max_concurrent": concurrency}
    config = resolve_config({"command": "eval"}, over)
    t = time.perf_counter()
    config, run, _, _ = open_run(config, over, str(root / "ours-out" / f"{module}-{time.time_ns()}"), None)
    loaded = load_taskset(module, config.taskset)
    plan = make_plan(loaded, config)
    engine = make_engine(config)
    spec = make_spec(engine, loaded, config, {"type": "eval", "id": "bench", "name": "bench"})
    episodes = []

    async def on_episode(ep):
        await run.commit(ep)
        episodes.append(ep)

    async def go():
        try:
            await run_plan(plan.owed, spec, concurrency, on_episode)
        finally:
            await engine.close()

    asyncio.run(go())
    wall = time.perf_counter() - t
    traces = [t.model_dump(mode="json") if hasattr(t, "model_dump") else t.to_dict()
              for e in episodes for t in e.traces]
    errors = sum(1 for e in episodes if not e.ok)
    return {**timing_figures(traces, wall), "errors": errors}


def measure(tasks: int, rollouts: int, concurrency: int, repeats: int, peer_timeout: float) -> dict[str, Any]:
    """(child) {"plain": {"ours", "peer"|"skipped"}, "mcp": {...}}."""
    from vf.bench.serve import free_port

    py, why = peer_python()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "vf.bench.stub_server", str(port)], stdout=subprocess.PIPE,
                              text=True)
    out: dict[str, Any] = {}
    try:
        assert server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/v1"
        with tempfile.TemporaryDirectory(prefix="vf-bench-harness-") as tmp:
            root = Path(tmp)
            for case, mcp, model in (("plain", False, "echo"), ("mcp", True, "tool")):
                module = write_taskset(root, "vf", mcp)
                write_taskset(root, "verifiers", mcp)
                runs = [run_ours(root, module, model, url, tasks, rollouts, concurrency) for _ in range(repeats + 1)]
                ours = min(runs[1:] or runs, key=lambda r: r["ms_per_episode"] or float("inf"))
                out[case] = {"ours": ours}
                if py is None:
                    out[case]["skipped"] = why
                    continue
                try:
                    out[case]["peer"] = run_peer(py, root, module, model, url, tasks, rollouts, concurrency,
                                                 peer_timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    out[case]["skipped"] = f"verifiers run failed: {e}"
        return out
    finally:
        server.terminate()
        server.wait(timeout=10)
