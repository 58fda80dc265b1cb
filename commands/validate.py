"""vf-validate: model-free check that each task's gold reply (`Task.validate()`) earns full reward."""


import typer

from vf import options
from vf.cli import console, entry, guarded

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})

EPILOG = options.epilog(
    "Each task's validate() gives its gold reply (or a True/False verdict, or None: no check). The "
    "gold reply is played through the real harness — setup, tools, stop conditions, scoring — with "
    "no model, and must score 1.0. Taskset fields are dotted flags: --taskset.size 5 "
    "(verifiers' --env.taskset.size works too).",
    "Exit codes: 0 every task passes, 2 bad usage or input, 3 a task failed its check.",
    examples=[
        "vf-validate reverse-text",
        "vf-validate wordle -n 5 --json",
        "vf-validate ./environments/my_env -n 3",
    ])


@app.command(epilog=EPILOG)
@guarded
def command(
    taskset: str | None = typer.Argument(None, help="Taskset id (built-in name, installed package, or path)."),
    num_tasks: options.NumTasks = None,
    config_file: options.ConfigFile = None,
    as_json: options.Json = False,
):
    """Check TASKSET without a model: every task's gold reply must earn full reward."""
    import asyncio
    import json

    from vf.cli import command_overrides
    from vf.episode.loading import load_taskset
    from vf.errors import GateFailed, UsageError
    from vf.validate import validate_taskset

    over, _, _ = command_overrides({"taskset.id": taskset}, config_file, None, None)
    fields = dict(over.get("taskset") or {})
    taskset_id = fields.get("id")
    if not taskset_id:
        raise UsageError("missing TASKSET", hint="e.g. vf-validate reverse-text")
    unknown = sorted(set(over) - {"taskset", "select"})
    if unknown:
        raise UsageError(f"vf-validate takes taskset keys only, got {', '.join(unknown)}",
                         hint="set taskset fields with --taskset.FIELD VALUE")
    limit = num_tasks if num_tasks is not None else (over.get("select") or {}).get("limit")
    loaded = load_taskset(taskset_id, fields)
    report = asyncio.run(validate_taskset(loaded, limit))
    result = {
        "taskset": loaded.id,
        "num_tasks": len(report.checks),
        "num_passed": sum(c.ok for c in report.checks),
        "failures": [{"task": c.task.data.id, "reward": c.reward, "reason": c.reason} for c in report.failures],
    }
    if as_json:
        print(json.dumps(result))
    for c in report.failures:
        console.print(f"FAIL {c.task.data.id}: {c.reason}", markup=False)
    console.print(f"{loaded.id}: {result['num_passed']}/{len(report.checks)} tasks pass their gold check", markup=False)
    if not report.ok:
        raise GateFailed(f"{len(report.failures)} task(s) failed validation",
                         hint="fix the task's validate() or its rewards (see the FAIL lines above)")


main = entry(app, compat=True)


if __name__ == "__main__":
    main()
