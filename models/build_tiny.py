"""Rebuild the trained built-in model (`tiny`) from the random one (`tiny-random`) with vf-train.

    python -m vf.models.build_tiny [--out models/tiny_trained] [--run-dir DIR]

The recipe is `vf-train`'s own embedded default (an SFT warm-up on gold replies, then IPO), on
reverse-text with one to three words — the shape `vf-eval reverse-text` asks for — drawn from a
different seed than vf-eval's default tasks, so the README's main job scores held-out texts.
Seeded, CPU, fp32, about 5 minutes on 2 idle cores. The SFT warm-up repeats bit for bit; in the
IPO phase the embedded engine batches rollouts as they arrive, so batch composition (and with it
the last bits of the inference log-probs) depends on timing: a rebuild matches in behaviour, not
in bytes (two builds: reward after 0.802 and 0.792, identical for the first 401 of 440 steps).
The output is an HF directory
(weights in fp32, ~2 MB, plus the tokenizer of the random model) and `build.json`, which records
the recipe, the package version/commit that built it and the rewards measured before and after.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

OUT = Path(__file__).parent / "tiny_trained"

RECIPE: dict = {
    "taskset": {"id": "reverse-text", "size": 400, "seed": 1, "min_words": 1, "max_words": 3},
    "sampling": {"max_tokens": 32},
    "warmup": {"steps": 400, "lr": 3e-3, "batch_size": 32},
    "steps": 40,
    "optim": {"lr": 1e-3},
    "orchestrator": {"batch_size": 64, "group_size": 8},
    "eval": {"taskset": {"id": "reverse-text"}, "select": {"limit": 20}, "num_rollouts": 2},
    "seed": 0,
}
"""Overrides on top of vf-train's embedded default (`vf.trainer.config.resolve`)."""


def build(out: Path = OUT, run_dir: Path | None = None, on_step=None) -> dict:
    """Train `tiny-random` with RECIPE and write the result into `out`; returns build.json's content."""
    import torch
    from vf.models import load_model
    from vf.models.checkpoint import save_hf
    from vf.models.tiny import TOKENIZER_FILES, ensure_tiny_model
    from vf.trainer import checkpoint
    from vf.trainer.config import resolve
    from vf.trainer.loop import run

    from vf.rundir import RunDir
    from vf.version import version_info

    config = resolve({**RECIPE, "model": {"path": "tiny-random"}})
    tmp = None
    if run_dir is None:
        run_dir = Path(tmp := tempfile.mkdtemp(prefix="vf-build-tiny-"))
    try:
        RunDir(run_dir).create()
        RunDir(run_dir).save_config(config.model_dump(mode="json"))
        summary = run(config, Path(run_dir), on_step=on_step)
        base = ensure_tiny_model()
        model = load_model(base, dtype=torch.float32)
        model.load_state_dict(checkpoint.load(checkpoint.latest(Path(run_dir)))["model"])
        staging = Path(tempfile.mkdtemp(prefix=".tiny_trained.", dir=Path(out).parent))
        save_hf(model, staging)
        for name in TOKENIZER_FILES:
            shutil.copy(base / name, staging / name)
        info = {
            "recipe": RECIPE,
            "base": base.name,
            "built_by": version_info(),
            "torch": torch.__version__,
            "reward_before": summary.get("reward_before"),
            "reward_after": summary.get("reward_after"),
            "steps": summary.get("steps"),
            "wall_time_s": round(summary.get("wall_time") or 0.0, 1),
        }
        (staging / "build.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        staging.chmod(0o755)
        for f in staging.iterdir():
            f.chmod(0o644)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
        return info
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m vf.models.build_tiny", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT, help=f"output HF dir (default {OUT})")
    p.add_argument("--run-dir", type=Path, default=None, help="keep the training run dir here (default: temp)")
    args = p.parse_args()

    def step(row):
        print(f"step {row['step'] + 1} {row['phase']} loss {row.get('loss')} reward {row.get('reward')}", flush=True)

    info = build(args.out, args.run_dir, on_step=step)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
