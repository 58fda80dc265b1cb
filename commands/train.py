"""vf-train: train a model with RL (IPO by default) or SFT; asynchronous, resumable."""

from __future__ import annotations

import typer
from vf.trainer.defaults import CKPT_EVERY, IPO_EPS, MAX_OFF_POLICY_STEPS

from vf import options
from vf.cli import console, dotted_args, entry, fancy, guarded, overrides

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]})

EPILOG = options.epilog(
    "With no argument but -o it runs the embedded default: the built-in random model (tiny-random) "
    "learns reverse-text (one word) on CPU — an SFT warm-up on gold replies, then IPO — in a few minutes.",
    "Any config key can be set as a dotted flag or in the YAML config: --optim.lr 1e-3, "
    "--async.deterministic (exact replay), --loss.params.kl-tau 0.01, --sampling.max-tokens 32, "
    "--drift.weight-noise 0.05, --warmup.steps 0, --eval.every 10 --eval.taskset ID -n 20.",
    "Writes RUN_DIR/config.yaml, version.json, metrics.jsonl, metrics.png, traces.jsonl (rollouts trained "
    "on), checkpoints/, evals/, summary.json.",
    "Exit codes: 0 ok, 1 runtime failure, 2 bad usage or config.",
    examples=[
        "vf-train -o runs/demo",
        "vf-train --loss icepop -o runs/ice",
        "vf-train --resume runs/demo",
        "vf-train --loss ipo --eps 0.3 -m tiny-random --taskset arithmetic --steps 200 -o runs/arith",
        "vf-train --taskset reverse-text:3 --taskset arithmetic:1 --group-size 4 -o runs/mix",
        "vf-train --orchestrator.refill --orchestrator.max-oversample 4 -o runs/full",
        "vf-train --loss sft --data runs/rollouts -o runs/sft",
        "vf-train --loss sft --data chats.jsonl -o runs/chat-sft",
        "vf-train --model.device cuda --model.dtype bfloat16 -o runs/gpu",
        "vf-train --lora.rank 16 --lora.alpha 32 -m tiny -o runs/lora",
        "vf-train --wandb.project my-proj --wandb.mode offline -o runs/demo",
        "vf-train --base-url http://127.0.0.1:8000/v1 -o runs/served",
        "OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m vf.commands.train -o runs/dp",
        "vf-train --role orchestrator -o runs/split",
        "vf-train --role trainer -o runs/split",
    ])


class StepPrinter:
    """Per-step progress on stderr: a rich bar on a TTY, one plain line per step otherwise."""

    def __init__(self, total: int):
        self.total = total
        self.bar = None
        if fancy():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=console)
            self.task = self.bar.add_task("train", total=total, stats="")
            self.bar.start()

    @staticmethod
    def stats(row: dict) -> str:
        def f(key, fmt):
            v = row.get(key)
            return "—" if v is None or v != v else format(v, fmt)  # NaN: undefined (no loss tokens)

        return (f"{row['phase']:<6} loss {f('loss', '.4f')}  reward {f('reward', '.3f')}  "
                f"masked {f('masked_fraction', '.3f')}  kl {f('mismatch_kl', '.2e')}  "
                f"stale {f('staleness', '.1f')}  {f('tokens_per_s', '.0f')} tok/s  {f('step_time', '.2f')}s"
                + (f"  eval {row['eval_reward']:.3f}" if row.get("eval_reward") is not None else ""))

    def step(self, row: dict) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=row["step"] + 1, stats=self.stats(row))
        else:
            console.print(f"[train] step {row['step'] + 1}/{self.total}  {self.stats(row)}", markup=False, soft_wrap=True)

    def event(self, msg: str) -> None:
        (self.bar.console if self.bar is not None else console).print(f"[train] {msg}", markup=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@app.command(epilog=EPILOG)
@guarded
def command(
    config_file: str | None = typer.Argument(None, metavar="[CONFIG.yaml]", help="YAML config; flags override it."),
    loss: str | None = typer.Option(None, "--loss", help="ipo (default), icepop, ppo, cispo, sft, or pkg.mod:fn."),
    eps: float | None = typer.Option(None, "--eps", help=f"IPO trust region |p − q| ≤ eps (default {IPO_EPS:g})."),
    model: options.Model = None,
    base_url: options.BaseUrl = None,
    api_key_var: options.ApiKeyVar = None,
    taskset: list[str] | None = typer.Option(
        None, "--taskset", help="Training taskset id; repeat it for a mixture, each ID:WEIGHT (its share of the "
        "batch; default 1): --taskset reverse-text:3 --taskset arithmetic:1. Per-taskset keys: --tasksets.N.KEY."),
    steps: int | None = typer.Option(None, "--steps", help="RL (or --data SFT) steps after the warm-up."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Rollouts per step (multiple of --group-size)."),
    group_size: int | None = typer.Option(None, "--group-size", help="Rollouts per task (the advantage baseline group)."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate (RL phase)."),
    max_inflight: int | None = typer.Option(None, "--max-inflight", help="Rollouts in flight, not yet trained on (default --batch-size)."),
    max_off_policy_steps: int | None = typer.Option(
        None, "--max-off-policy-steps", help="Cancel or drop groups started more than K policy versions back "
        f"(default {MAX_OFF_POLICY_STEPS})."),
    ckpt_every: int | None = typer.Option(None, "--ckpt-every", help="Checkpoint every N steps "
        f"(default {CKPT_EVERY}; always at the end)."),
    output: options.Output = None,
    config_opt: options.ConfigFile = None,
    as_json: options.Json = False,
    seed: int | None = typer.Option(None, "--seed", help="Seed (a CPU run with the same seed repeats exactly)."),
    resume: options.Resume = None,
    trust_run_dir: options.TrustRunDir = False,
    from_scratch: bool = typer.Option(False, "--from-scratch", help="With --resume, on a run with results but no "
                                      "checkpoint yet: start again from step 0, setting the old metrics and "
                                      "traces aside (not deleting them)."),
    data: str | None = typer.Option(None, "--data", help="Train with SFT on saved traces (a run dir) or a chat / "
                                    "prompt-completion dataset (.jsonl/.json/.parquet, a datasets dir, a Hub id) "
                                    "instead of rollouts; needs --loss sft."),
    num_eval: int | None = typer.Option(None, "-n", "--num-tasks", "--eval-tasks",
                                        help="Number of tasks per evaluation (eval.select.limit)."),
    convert_checkpoint: str | None = typer.Option(None, "--convert-checkpoint", metavar="RUN_DIR",
                                                  help="Rewrite RUN_DIR's old pickle checkpoints in the safe format, then exit."),
    trust_pickle: bool = typer.Option(False, "--trust-pickle", help="With --convert-checkpoint: also unpickle "
                                      "files outside torch's safe allow-list (runs their code; only for run dirs you made)."),
    role: str = typer.Option("both", "--role", metavar="ROLE", help="both (default: one process), trainer, or "
                             "orchestrator: the two halves as separate processes (machines) sharing the run dir; "
                             "give both the same flags (docs/multi-node.md)."),
):
    """Train a model: RL with IPO by default (icepop, ppo, cispo, sft), on the embedded engine or a server."""
    import json
    import os
    from pathlib import Path

    from vf.errors import UsageError

    if config_file and config_opt:
        raise UsageError("two config files: CONFIG.yaml and --config", hint="pass one of them")
    config_file = config_file or config_opt
    if role not in ROLES:
        raise UsageError(f"--role {role!r}: not one of {', '.join(ROLES)}",
                         hint="--role trainer and --role orchestrator run the two halves of one run as two processes")
    if convert_checkpoint is not None:
        from vf.trainer.checkpoint import convert

        done = convert(Path(convert_checkpoint), trust_pickle=trust_pickle)
        console.print(f"converted {len(done)} checkpoint(s) in {convert_checkpoint}", markup=False)
        return
    extra = dotted_args()
    # `--eval.taskset ID` names the held-out taskset; its fields follow as --eval.taskset.FIELD
    extra = ["--eval.taskset.id" if a == "--eval.taskset" else
             a.replace("--eval.taskset=", "--eval.taskset.id=", 1) for a in extra]
    one, mixture = taskset_flags(taskset)
    over = overrides(extra, {
        "loss.name": loss, "loss.params.eps": eps, "model.path": model, "engine.base_url": base_url,
        "engine.api_key_var": api_key_var, "taskset.id": one, "tasksets": mixture, "steps": steps,
        "orchestrator.batch_size": batch_size, "orchestrator.group_size": group_size, "optim.lr": lr,
        "async.max_inflight": max_inflight, "async.max_off_policy_steps": max_off_policy_steps, "ckpt.every": ckpt_every, "seed": seed,
        "data.path": data, "eval.select.limit": num_eval}, config_file)
    if mixture and not any(a.startswith("--taskset.") for a in extra):
        over.pop("taskset", None)  # the mixture on the command line replaces the config file's taskset
    if role == "orchestrator":
        serve(over, output, resume)
        return
    if from_scratch and resume is None:
        raise UsageError("--from-scratch restarts a run given with --resume RUN", hint="a new run: -o DIR")
    main_rank = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 writes the run dir
    config, run, run_dir = open_run_dir(over, output, resume, from_scratch, main_rank)

    from vf.trainer.loop import run as train

    from vf.imports import untrusted_config

    printer = StepPrinter(config.total_steps)
    # a run dir's config.yaml is data: the taskset code it names is imported only on the user's word
    source = f"run dir {resume} (config.yaml)" if resume is not None and not trust_run_dir else None
    try:
        with untrusted_config(source):
            summary = train(config, run_dir, resume=resume is not None, from_scratch=from_scratch,
                            on_step=printer.step, on_event=printer.event, role=role)
    except BaseException:
        if main_rank and run.discard():  # failed before any result: leave no run dir behind
            printer.event(f"removed {run_dir}: the run failed before writing any result")
        raise
    finally:
        printer.close()
    if not summary:  # a non-zero rank under torchrun
        return
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        console.print(
            f"done: {summary['steps']} steps in {summary['wall_time']:.0f}s  reward {fmt(summary['reward_before'])} → "
            f"{fmt(summary['reward_after'])}  masked {fmt(summary['masked_fraction'])}  → {run_dir}", markup=False)


ROLES = ("both", "trainer", "orchestrator")


def open_run_dir(over: dict, output: str | None, resume: str | None, from_scratch: bool, main_rank: bool):
    """(config, RunDir, path) of the run: a resumed one's saved config under `over` (refused
    before anything loads when it cannot resume), or a new run dir with its config written."""
    from pathlib import Path

    from vf.trainer.config import resolve

    from vf.errors import UsageError
    from vf.mixture import run_label
    from vf.rundir import RunDir, default_run_dir

    if resume is not None:
        if output is not None:
            raise UsageError("--resume continues in its own dir; drop -o")
        from vf.trainer.checkpoint import resume_point

        run = RunDir(resume)
        config = resolve(over, base=run.load_config())  # saved by the loop once the resumed run is set up
        resume_point(Path(resume), from_scratch)  # refused before anything loads
        return config, run, Path(resume)
    config = resolve(over)
    run_dir = Path(output) if output else default_run_dir(run_label(config))
    run = RunDir(run_dir)
    if main_rank:
        run.create()
        run.save_config(config.model_dump(mode="json"))
    return config, run, run_dir


def taskset_flags(values: list[str] | None) -> tuple[str | None, list[dict] | None]:
    """`--taskset` given once: that taskset's id (a weight alone means nothing); several times: a
    mixture, one {id, weight} entry each (vf.config.TasksetEntry)."""
    from vf.config import parse_taskset_spec

    if not values:
        return None, None
    if len(values) == 1:
        return parse_taskset_spec(values[0])["id"], None
    return None, [parse_taskset_spec(v) for v in values]


def serve(over: dict, output: str | None, resume: str | None) -> None:
    """`--role orchestrator`: the trainer (`--role trainer`, same flags) owns the run dir and its
    config.yaml; this process resolves the same config, checks it against the trainer's, and
    generates the trainer's batches until its run is complete."""
    import os
    from pathlib import Path

    from vf.trainer.config import resolve
    from vf.trainer.exchange import serve as orchestrate

    from vf.errors import UsageError
    from vf.rundir import RunDir

    if os.environ.get("WORLD_SIZE", "1") != "1":
        raise UsageError("--role orchestrator is one process", hint="run it without torchrun; the trainer takes torchrun")
    if (output is None) == (resume is None):
        raise UsageError("--role orchestrator needs the trainer's run dir: -o RUN (a new run) or --resume RUN")
    config = resolve(over, base=RunDir(resume).load_config()) if resume else resolve(over)
    orchestrate(config, Path(resume or output), say=lambda msg: console.print(f"[orchestrator] {msg}", markup=False))


def fmt(v) -> str:
    return "—" if v is None else f"{v:.3f}"


main = entry(app)


if __name__ == "__main__":
    main()
