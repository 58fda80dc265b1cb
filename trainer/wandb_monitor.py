"""The W&B monitor (`--wandb.project NAME`; `pip install 'vf[wandb]'`): a copy of the run dir's
record in a W&B run. wandb is imported only when it is asked for (`WandbMonitor.open`).

    config          the resolved TrainConfig (what config.yaml holds)
    history         every metric of every metrics.jsonl row at its step (nested dicts such as
                    `off_policy/hist` flattened to `off_policy/hist/LAG`; nulls left out)
    samples         a table per step of up to `--wandb.samples` rollouts trained on: prompt,
                    completion, reward, advantage, loss/masked token counts
    summary         each evaluation's numbers as `eval/LABEL/KEY` (LABEL: before, after_warmup,
                    step_N, after), besides the last value of every history metric

`--wandb.mode offline` writes the run under `--wandb.dir` (default: the run dir) with no network,
for `wandb sync` later; tests use it. The W&B run's id is kept in RUN/wandb.json, so `vf-train
--resume` continues the same W&B run (steps it logged before the checkpoint it resumes from are not
logged again: W&B keeps a step's first values). W&B prints and console capture stay off: vf-train's
own output is unchanged.
"""

from __future__ import annotations

import json
import math
import secrets
from pathlib import Path
from typing import Any

from vf.trainer.monitor import Monitor

from vf.config import flatten as flatten_sections
from vf.errors import UsageError

ID_FILE = "wandb.json"
SAMPLE_COLUMNS = ("step", "prompt", "completion", "reward", "advantage", "loss_tokens", "masked_tokens")


class WandbMonitor(Monitor):
    def __init__(self, run, wandb, sample_limit: int):
        self.run, self.wandb, self.sample_limit = run, wandb, sample_limit
        self.last_step = (getattr(run, "step", 0) or 0) - 1  # a resumed W&B run continues after its last step
        self.accepted: int | None = None

    @classmethod
    def open(cls, config, run_dir: Path, say=lambda _msg: None) -> WandbMonitor:
        try:
            import wandb
        except ImportError:
            raise UsageError("--wandb.project logs to W&B, and the wandb package is not installed",
                             hint="pip install 'vf[wandb]' (or drop --wandb.project)") from None
        w = config.wandb
        out = Path(w.dir).expanduser() if w.dir else run_dir
        out.mkdir(parents=True, exist_ok=True)
        id_file = run_dir / ID_FILE
        run_id = json.loads(id_file.read_text())["id"] if id_file.exists() else secrets.token_hex(4)
        try:
            run = wandb.init(project=w.project, name=w.name or run_dir.name, entity=w.entity, mode=w.mode,
                             dir=str(out), id=run_id, resume="allow", config=config.model_dump(mode="json"),
                             settings=wandb.Settings(silent=True, console="off", x_save_requirements=False))
        except Exception as e:  # noqa: BLE001 (login, network, permissions: W&B's own error types)
            raise UsageError(f"W&B run could not start: {type(e).__name__}: {e}",
                             hint="run `wandb login` (or set WANDB_API_KEY), or use --wandb.mode offline") from None
        id_file.write_text(json.dumps({"id": run_id, "project": w.project, "mode": w.mode}) + "\n")
        if w.mode != "disabled":
            say(f"W&B ({w.mode}): {run.dir if w.mode == 'offline' else run.url}")
        return cls(run, wandb, w.samples)

    def log(self, row: dict[str, Any], step: int) -> None:
        if step <= self.last_step:  # W&B refuses steps that go back (a resumed run re-trains a few)
            self.accepted = None
            return
        self.last_step = self.accepted = step
        self.run.log(flatten(row), step=step)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not rows or step != self.accepted:  # with the step's metrics, or not at all
            return
        data = [[r.get(c) for c in SAMPLE_COLUMNS] for r in rows]
        self.run.log({"samples": self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=data)}, step=step)

    def eval(self, label: str, summary: dict[str, Any]) -> None:
        if summary:
            self.run.summary.update(flatten(summary, f"eval/{label}/", numbers_only=True))

    def close(self, ok: bool = True) -> None:
        self.run.finish(exit_code=0 if ok else 1)


def flatten(d: dict[str, Any], prefix: str = "", numbers_only: bool = False) -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a/b": 1}; None and non-finite numbers left out (W&B plots no nulls)."""
    return {k: v for k, v in flatten_sections(d, prefix, "/").items()
            if isinstance(v, bool) or (isinstance(v, (int, float)) and math.isfinite(v))
            or (isinstance(v, str) and not numbers_only)}
