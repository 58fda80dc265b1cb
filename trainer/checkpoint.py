"""Checkpoints: everything needed to continue a killed run exactly where it stopped.

    RUN/checkpoints/step_N/          N = optimizer steps completed (the model is policy version N)
      trainer.pt      model (full state dict), optimizer, scheduler
      rollout.pt      weight snapshots of older versions that batches ≥ N will still be generated
                      from (async_level / drift.stale_steps > 0), so a resumed run regenerates
                      them from the very same weights
      rng.pt          python / torch RNG states
      progress.json   step, cumulative counters, before-training eval reward

A checkpoint is written into `.step_N.tmp/` and renamed into place, so a `kill -9` leaves either
the whole directory or none; `latest()` only considers complete ones. Old ones beyond
`keep_last` are deleted after a new one lands.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

CKPT_DIR = "checkpoints"
DONE = "progress.json"


def root(run_dir: Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def latest(run_dir: Path) -> Path | None:
    found = []
    for p in root(run_dir).glob("step_*"):
        if p.is_dir() and (p / DONE).exists() and (p / "trainer.pt").exists():
            try:
                found.append((int(p.name.split("_", 1)[1]), p))
            except ValueError:
                continue
    return max(found)[1] if found else None


def rng_state() -> dict[str, Any]:
    import torch

    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save(run_dir: Path, step: int, *, model_state: dict, optimizer_state: dict, scheduler_state: dict,
         snapshots: dict[int, dict], progress: dict[str, Any], keep_last: int = 2) -> Path:
    import torch

    base = root(run_dir)
    base.mkdir(parents=True, exist_ok=True)
    final = base / f"step_{step}"
    tmp = base / f".step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save({"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler_state},
               tmp / "trainer.pt")
    torch.save(snapshots, tmp / "rollout.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / DONE).write_text(json.dumps({**progress, "step": step}, indent=2))
    for f in tmp.iterdir():  # durable before the rename makes it visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    done = sorted((int(p.name.split("_")[1]), p) for p in base.glob("step_*") if p.is_dir())
    for _, p in done[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def load(path: Path) -> dict[str, Any]:
    import torch

    path = Path(path)
    trainer = torch.load(path / "trainer.pt", weights_only=False)
    return {
        **trainer,
        "snapshots": torch.load(path / "rollout.pt", weights_only=False),
        "rng": torch.load(path / "rng.pt", weights_only=False),
        "progress": json.loads((path / DONE).read_text()),
    }
