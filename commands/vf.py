"""vf: the package's version (`vf --version`) and the list of its commands."""

import typer

from vf import options
from vf.cli import console, entry, guarded

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})

COMMANDS = {
    "vf-eval": "run a taskset against a model, score, summarise, resume, re-score",
    "vf-rollout": "the same episodes with token ids and log-probs, for training",
    "vf-train": "train a model: IPO by default (icepop, ppo, cispo, sft)",
    "vf-serve": "a model behind an OpenAI-compatible HTTP API",
    "vf-validate": "model-free check: every task's gold reply earns full reward",
    "vf-init": "scaffold a v1 environment package",
    "vf-migrate": "rewrite v0 environments, scripts, configs and run dirs to v1",
    "vf-bench": "performance and stability against references, as ratios",
}

EPILOG = options.epilog(
    "Every command takes --version and -h/--help. Reference: docs/cli.md.",
    examples=["vf --version", "vf-eval --version", "vf"])


@app.command(epilog=EPILOG)
@guarded
def command():
    """List vf's commands (each one's --help has the details)."""
    from vf.version import version_line

    console.print(version_line(), markup=False)
    for name, job in COMMANDS.items():
        console.print(f"  {name:<12} {job}", markup=False)


main = entry(app, dotted=False)


if __name__ == "__main__":
    main()
