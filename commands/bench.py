"""vf-bench: performance and stability, our code vs a reference on the same work, as ratios."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer

from vf import options
from vf.cli import console, entry, guarded

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})

EPILOG = options.epilog(
    "Suites: trainer, loss, engine, serve, harness, stability, stability_real, parallel, or all. "
    "The stability suite also writes a PNG next to --out (else in the temp dir).",
    "--model.size tiny|100m|600m (engine suite): a random Qwen3 checkpoint built in the run and cached, no "
    "download (100m: hidden 1024, 8 layers of Qwen3-0.6B's layer shape; 600m: Qwen3-0.6B's shape).",
    "--parallel.cp N --parallel.cp-style ring|ulysses --parallel.ep N (parallel suite; vf-train's flags): the "
    "layouts measured against 1 process (default: cp 2 with both styles, ep 2).",
    "Exit codes: 0 ok, 1 a suite failed, 2 bad usage, 3 a ratio regressed beyond --threshold.",
    examples=[
        "vf-bench loss --quick",
        "vf-bench all --quick --json > now.json",
        "vf-bench trainer --json --out benchmarks/baseline-cpu.json",
        "vf-bench all --quick --compare benchmarks/baseline-cpu-quick.json --threshold 0.15",
        "vf-bench --results now.json --compare benchmarks/baseline-cpu-quick.json",
    ])


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _figures(d: dict[str, Any]) -> str:
    keys = [k for k in d if not k.startswith("_") and not isinstance(d[k], (dict, list))]
    return "\n".join(f"{k}={_fmt(d[k])}" for k in keys[:8])


def print_suite(res: dict[str, Any]) -> None:
    from rich.table import Table

    title = f"{res['suite']} ({res['config'].get('size', '?')}, {res.get('wall_s') or 0:.0f}s)"
    if res.get("skipped") or res.get("error"):
        console.print(f"[bold]{title}[/]: {'skipped' if res.get('skipped') else 'FAILED'} — "
                      f"{res.get('skipped') or res.get('error')}", markup=True)
        return
    if res["suite"] in ("stability", "stability_real"):
        return print_stability(res, title)
    t = Table(title=title, title_justify="left")
    for col in ("case", "ours", "reference", "ratios (ours vs reference)"):
        t.add_column(col, overflow="fold")
    for c in res["cases"]:
        rs = []
        for name, r in c["ratios"].items():
            s = f"{name} {_fmt(r['value'])}×"
            if r.get("target") is not None:
                s += f" ({'≥' if r['better'] == 'higher' else '≤'}{r['target']:g} {'ok' if r['met'] else 'MISSED'})"
            rs.append(s)
        rs += [f"{k}: {'ok' if v else 'FAILED'}" for k, v in (c.get("checks") or {}).items()]
        t.add_row(c["name"], f"{c['ours_label']}\n{_figures(c['ours'])}", f"{c['ref_label']}\n{_figures(c['ref'])}",
                  "\n".join(rs))
    _tables().print(t)

    for note in res.get("notes") or []:
        console.print(f"  note: {note}", markup=False)


def _tables():
    """stderr console for tables: rich assumes 80 columns off a terminal, too narrow for these."""
    from rich.console import Console

    return console if console.is_terminal else Console(stderr=True, highlight=False, width=160)


def print_stability(res: dict[str, Any], title: str) -> None:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("loss", "drift", "final reward", "masked frac", "mismatch KL", "staleness", "diverged",
                "reward vs no-mask", "checks"):
        t.add_column(col)
    for c in res["cases"]:
        loss, _, drift = c["name"].rstrip("]").partition(" [")
        o = c["ours"]
        r = c["ratios"].get("reward_vs_nomask", {}).get("value")
        checks = ", ".join(f"{k}: {'ok' if v else 'FAILED'}" for k, v in (c.get("checks") or {}).items())
        t.add_row(loss, drift, _fmt(o.get("final_reward")), _fmt(o.get("masked_fraction")),
                  _fmt(o.get("mismatch_kl")), _fmt(o.get("staleness")), "YES" if o.get("diverged") else "no", _fmt(r),
                  checks)
    _tables().print(t)

    for note in res.get("notes") or []:
        console.print(f"  note: {note}", markup=False)
    if res.get("plot"):
        console.print(f"  plot: {res['plot']}", markup=False)


def print_compare(cmp: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"compare (threshold {cmp['threshold']:.0%})", title_justify="left")
    for col in ("suite", "case", "ratio", "baseline", "now", "change", ""):
        t.add_column(col)
    for r in cmp["compared"]:
        t.add_row(r["suite"], r["case"], r["ratio"], _fmt(r["baseline"]), _fmt(r["value"]),
                  f"{r['change']:+.1%}", "REGRESSED" if r["regressed"] else "ok")
    _tables().print(t)

    if cmp["config_changed"]:
        console.print(f"  note: not compared, the baseline measured a different config: "
                      f"{', '.join(cmp['config_changed'])}")


@app.command(epilog=EPILOG)
@guarded
def command(
    suites: Optional[list[str]] = typer.Argument(None, help="Suite name(s): trainer, loss, engine, serve, harness, stability, stability_real, parallel, all."),
    quick: bool = typer.Option(False, "--quick", help="Small sizes: 1-10 minutes per suite on 2 CPU cores (trainer the longest)."),
    size: Optional[str] = typer.Option(None, "--size", help="full | quick | tiny (tiny: seconds, for tests; overrides --quick)."),
    as_json: options.Json = False,
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the JSON results to this file."),
    compare_to: Optional[Path] = typer.Option(None, "--compare", help="Baseline results JSON; exit 3 if a ratio regressed."),
    threshold: float = typer.Option(0.10, "--threshold", help="Allowed ratio regression as a fraction (0.10 = 10%)."),
    model: str = typer.Option("tiny", "--model", help="Model for the engine and serve suites: 'tiny' or a local HF dir."),
    results: Optional[Path] = typer.Option(None, "--results", help="Use these saved results (with --compare or --markdown) instead of running suites."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the results as Markdown tables on stdout."),
):
    """Run benchmark SUITES; print tables on stderr, the JSON results on stdout with --json."""
    from vf.bench import SIZES, SUITES
    from vf.errors import GateFailed, UsageError

    if results is not None and (suites or (compare_to is None and not markdown)):
        raise UsageError("--results compares or renders saved results: give --compare BASELINE or --markdown, "
                         "and no suite names")
    if results is None and not suites:
        raise UsageError("missing SUITE", hint=f"one or more of: {', '.join(SUITES)}, or all")
    suites = suites or []
    names = list(SUITES) if "all" in suites else suites
    unknown = [s for s in names if s not in SUITES]
    if unknown:
        raise UsageError(f"unknown suite(s): {', '.join(unknown)}",
                         hint=f"choose from: {', '.join(SUITES)}, or all")
    size = size or ("quick" if quick else "full")
    if size not in SIZES:
        raise UsageError(f"unknown --size {size!r}", hint=f"choose from: {', '.join(SIZES)}")
    if not 0 <= threshold < 10:
        raise UsageError(f"--threshold {threshold} is out of range", hint="a fraction, e.g. 0.1 for 10%")
    baseline = _read_results(compare_to, "baseline") if compare_to is not None else None
    if out is not None and out.parent and not out.parent.exists():
        raise UsageError(f"--out {out}: folder {out.parent} does not exist")

    import tempfile

    plot = str(out.with_name(out.stem + "-stability.png") if out is not None
               else Path(tempfile.gettempdir()) / "vf-bench-stability.png")
    model_size, parallel = _dotted()
    if parallel is not None:
        from vf.bench.parallel import layouts

        if "parallel" not in names:
            raise UsageError("--parallel.* sets the layouts of the parallel suite", hint="vf-bench parallel --parallel.cp 4")
        layouts(parallel, size)  # exit 2 now for a split the suite's models cannot take
    if model_size is not None:
        from vf.bench.engine import MODEL_SIZES

        if model_size not in MODEL_SIZES:
            raise UsageError(f"unknown --model.size {model_size!r}", hint=f"choose from: {', '.join(MODEL_SIZES)}")
        if model != "tiny":
            raise UsageError("give --model or --model.size, not both")
    doc = (_read_results(results, "results") if results is not None
           else run_all(names, size, model, plot, model_size, parallel))
    code = 0
    if any(r.get("error") for r in doc["suites"].values()):
        code = 1
    if baseline is not None:
        from vf.bench.common import compare

        doc["compare"] = compare(doc, baseline, threshold)
        print_compare(doc["compare"])
    text = json.dumps(doc, indent=2)
    if out is not None:
        out.write_text(text + "\n")
        console.print(f"results written to {out}")
    if as_json:
        print(text)
    if markdown:
        from vf.bench.common import to_markdown

        print(to_markdown(doc))
    if baseline is not None and doc["compare"]["regressions"]:
        bad = doc["compare"]["regressions"]
        raise GateFailed(f"{len(bad)} ratio(s) regressed beyond {threshold:.0%}: " + ", ".join(
            f"{r['suite']}/{r['case']}/{r['ratio']} {r['baseline']:.3g}→{r['value']:.3g}" for r in bad))
    if code:
        raise SystemExit(code)


def _dotted() -> tuple[str | None, dict[str, Any] | None]:
    """The dotted flags vf-bench takes: `--model.size` (engine suite) and vf-train's `--parallel.*`
    (parallel suite), as (size or None, the parallel section as given or None)."""
    from vf.cli import Invocation
    from vf.config import parse_dotted_args
    from vf.errors import UsageError

    given = parse_dotted_args(list(Invocation.dotted or []))
    model, parallel = given.pop("model", {}), given.pop("parallel", None)
    if given or not isinstance(model, dict) or set(model) - {"size"} or not isinstance(parallel, (dict, type(None))):
        raise UsageError(f"unknown option(s): {' '.join(Invocation.dotted)}",
                         hint="vf-bench takes --model.size tiny|100m|600m and vf-train's --parallel.* flags")
    return (None if model.get("size") is None else str(model["size"])), parallel


def _read_results(path: Path, what: str) -> dict[str, Any]:
    from vf.bounded import load_json
    from vf.errors import UsageError

    try:
        doc = load_json(path.read_bytes(), allow_nan=True)  # BoundsError is a ValueError
        if not isinstance(doc, dict) or not isinstance(doc.get("suites"), dict):
            raise ValueError("it has no 'suites' object")
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read the {what} file {path}: {e}",
                         hint="pass a file written by vf-bench --json or --out") from None
    return doc


def run_all(names: list[str], size: str, model: str, plot: str | None = None,
            model_size: str | None = None, parallel: dict[str, Any] | None = None) -> dict[str, Any]:
    """Machine facts, then each suite in turn (a failing suite is recorded, the rest still run)."""
    from vf.bench import run_suite
    from vf.bench.common import SCHEMA, ChildFailed, config_hash, machine, run_child, versions

    console.print(f"vf-bench: {', '.join(names)} ({size})")
    peak: dict[str, Any] = {}
    if size != "tiny":  # tiny is for the CLI's tests: no MFU, so no peak measurement either
        console.print("measuring the machine's peak FLOP/s …")
        peak = run_child("vf.bench.common:measure_peak_flops", {})
        peak.pop("_child_peak_rss_mib", None)
    doc: dict[str, Any] = {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "size": size,
                           "machine": machine(peak), "versions": versions(), "suites": {}}
    for name in names:
        console.print(f"[bold]{name}[/] …", markup=True)
        t = time.perf_counter()
        try:
            res = run_suite(name, size=size, model=model, peak=peak, plot_path=plot, model_size=model_size,
                            parallel=parallel)
        except ChildFailed as e:
            res = {"suite": name, "config": {"size": size}, "config_hash": None, "cases": [], "notes": [],
                   "skipped": None, "error": str(e), "wall_s": round(time.perf_counter() - t, 1)}
        doc["suites"][name] = res
        print_suite(res)
    doc["config_hash"] = config_hash({n: r.get("config_hash") for n, r in doc["suites"].items()})
    return doc


main = entry(app)


if __name__ == "__main__":
    main()
