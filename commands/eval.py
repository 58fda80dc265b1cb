"""vf-eval: evaluate a taskset against a model, score, summarise; resume; re-score."""


from typing import Optional

import typer

from vf.cli import console, dotted_args, guarded, overrides, run_app

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})

EPILOG = (
    "Any config key can be set as a dotted flag: --sampling.temperature 0.7, --sampling.max-tokens 64, "
    "--taskset.size 50, --engine.timeout 30, --select.shuffle true. "
    "Examples: vf-eval reverse-text -n 10 -r 2 (embedded tiny model, CPU);  "
    "vf-eval reverse-text -m my-model --base-url http://127.0.0.1:8000/v1 -n 20 -r 3 -o runs/rt;  "
    "vf-eval --resume runs/rt;  vf-eval --score runs/rt --json.  "
    "Exit codes: 0 ok, 1 runtime failure, 2 bad usage or input, 3 --min-reward not met."
)


def print_table(summary: dict) -> None:
    from rich.table import Table

    t = Table(title=f"{summary.get('taskset')} · {summary.get('model')}", show_header=False)
    def fmt(v):
        return "—" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))
    t.add_row("mean reward", fmt(summary["mean_reward"]))
    for k, v in summary["rewards"].items():
        t.add_row(f"  reward {k}", fmt(v))
    for k, v in summary["metrics"].items():
        t.add_row(f"  metric {k}", fmt(v))
    for k, v in summary["pass_at_k"].items():
        t.add_row(f"pass@{k}", fmt(v))
    t.add_row("episodes", f"{summary['num_episodes']} ({summary['num_errors']} errors)")
    t.add_row("tokens in / out", f"{summary['input_tokens']} / {summary['output_tokens']}")
    if summary.get("wall_time") is not None:
        t.add_row("time", f"{summary['wall_time']:.1f}s")
    if summary.get("run_dir"):
        t.add_row("run dir", summary["run_dir"])
    console.print(t)


@app.command(epilog=EPILOG)
@guarded
def command(
    taskset: Optional[str] = typer.Argument(None, help="Taskset id (built-in name, installed package, or path)."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="Model: a local HF dir, 'tiny' (built-in), or the server's model name."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible server; omit to run the embedded engine."),
    api_key_var: Optional[str] = typer.Option(None, "--api-key-var", help="Env var holding the API key."),
    num_tasks: Optional[int] = typer.Option(None, "-n", "--num-tasks", help="Number of tasks (default: all)."),
    rollouts: Optional[int] = typer.Option(None, "-r", "--rollouts", help="Rollouts per task."),
    concurrency: Optional[int] = typer.Option(None, "-c", "--concurrency", help="Episodes in flight."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Model replies per episode."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Run dir (must be new or empty)."),
    config_file: Optional[str] = typer.Option(None, "--config", help="YAML config; flags override it."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue the run in this dir."),
    score: Optional[str] = typer.Option(None, "--score", help="Re-score saved traces (run dir, file, or -) without a model."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object on stdout."),
    min_reward: Optional[float] = typer.Option(None, "--min-reward", help="Exit 3 when the mean reward is below this."),
):
    """Evaluate TASKSET against a model and write a run dir (config.yaml, traces.jsonl, summary.json)."""
    from vf.errors import GateFailed, UsageError
    from vf.evaluate import execute, open_run, print_summary_json, rescore, resolve_config
    from vf.summary import summarize

    over = overrides(dotted_args(), {
        "taskset.id": taskset, "model": model, "engine.base_url": base_url, "engine.api_key_var": api_key_var,
        "select.limit": num_tasks, "num_rollouts": rollouts, "max_concurrent": concurrency,
        "max_turns": max_turns}, config_file)
    if score is not None:
        episodes, ts_id = rescore(score, taskset, over.get("taskset", {}))
        r = max((e.rollout for e in episodes), default=0) + 1
        summary = summarize(episodes, r, taskset=ts_id, model=None, command="score", run_dir=None)
    else:
        if resume is None and not taskset and "id" not in over.get("taskset", {}):
            raise UsageError("missing TASKSET", hint="e.g. vf-eval reverse-text -n 10, or vf-eval --resume DIR")
        if resume is not None and output is not None:
            raise UsageError("--resume continues in its own dir; drop -o")
        config = None if resume else resolve_config({"command": "eval"}, over)
        config, run, kept, dropped = open_run(config, over, output, resume)
        if resume and any(dropped.values()):
            console.print(f"resume: dropped {dropped['errored']} errored, {dropped['corrupt']} torn/corrupt, "
                          f"{dropped['duplicate']} duplicate line(s)")
        summary = execute(config, run, kept, label="eval")
        if resume and summary["num_owed"] == 0:
            console.print(f"nothing to resume: all {summary['num_episodes']} episodes are complete")
    if as_json:
        print_summary_json(summary)
    else:
        print_table(summary)
    if summary["num_episodes"] and summary["num_errors"] == summary["num_episodes"]:
        raise SystemExit(1)
    if min_reward is not None and (summary["mean_reward"] is None or summary["mean_reward"] < min_reward):
        raise GateFailed(f"mean reward {summary['mean_reward']} is below --min-reward {min_reward}")


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
