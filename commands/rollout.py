"""vf-rollout: generate groups of rollouts with tokens and inference log-probs, for training."""


from typing import Optional

import typer

from vf.cli import console, dotted_args, guarded, overrides, run_app

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})

EPILOG = (
    "Every episode carries token ids and per-token log-probs (an engine that cannot give them is "
    "refused). Examples: vf-rollout reverse-text -n 8 -r 4 -o runs/roll;  "
    "vf-rollout arithmetic -n 4 -r 2 -o - | jq -c '.traces[0].rewards';  vf-rollout --resume runs/roll. "
    "Dotted flags set any key: --sampling.max-tokens 64 --taskset.size 100."
)


@app.command(epilog=EPILOG)
@guarded
def command(
    taskset: Optional[str] = typer.Argument(None, help="Taskset id (built-in name, installed package, or path)."),
    model: Optional[str] = typer.Option(None, "-m", "--model", help="Model: a local HF dir, 'tiny', or the server's model name."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible server that returns token ids (vf-serve, vLLM)."),
    api_key_var: Optional[str] = typer.Option(None, "--api-key-var", help="Env var holding the API key."),
    num_tasks: Optional[int] = typer.Option(None, "-n", "--num-tasks", help="Number of tasks (default: all)."),
    rollouts: Optional[int] = typer.Option(None, "-r", "--rollouts", help="Rollouts per task (group size)."),
    concurrency: Optional[int] = typer.Option(None, "-c", "--concurrency", help="Episodes in flight."),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", help="Model replies per episode."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Run dir, or - to stream JSONL to stdout."),
    config_file: Optional[str] = typer.Option(None, "--config", help="YAML config; flags override it."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue the run in this dir."),
):
    """Generate rollouts of TASKSET (groups of -r per task) with tokens and log-probs."""
    from vf.errors import UsageError
    from vf.evaluate import execute, open_run, resolve_config

    over = overrides(dotted_args(), {
        "taskset.id": taskset, "model": model, "engine.base_url": base_url, "engine.api_key_var": api_key_var,
        "select.limit": num_tasks, "num_rollouts": rollouts, "max_concurrent": concurrency,
        "max_turns": max_turns}, config_file)
    if resume is None and not taskset and "id" not in over.get("taskset", {}):
        raise UsageError("missing TASKSET", hint="e.g. vf-rollout reverse-text -n 8 -r 4 -o runs/roll")
    if resume is not None and output is not None:
        raise UsageError("--resume continues in its own dir; drop -o")
    config = None if resume else resolve_config({"command": "rollout"}, over)
    config, run, kept, _ = open_run(config, over, output, resume)
    summary = execute(config, run, kept, label="rollout")
    where = summary["run_dir"] or "stdout"
    console.print(f"{summary['num_episodes']} episodes ({summary['num_errors']} errors) → {where}")
    if summary["num_episodes"] and summary["num_errors"] == summary["num_episodes"]:
        raise SystemExit(1)


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
