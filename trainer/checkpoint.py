"""Checkpoints: everything needed to continue a killed run exactly where it stopped.

    RUN/checkpoints/step_N/          N = optimizer steps completed (the model is policy version N)
      trainer.json + .safetensors   model (full state dict), optimizer, scheduler
      dcp/                          under torchrun instead: model + optimizer as a
                                    torch.distributed.checkpoint (each rank writes its own FSDP
                                    shards, no full optimizer state on one rank); trainer.* then
                                    holds the scheduler and the saving world size. DCP reshards on
                                    load, so a run may resume with another number of processes.
      rollout.json + .safetensors   weight snapshots of older versions that batches ≥ N will still be
                                    generated from (async_level / drift.stale_steps > 0), so a resumed
                                    run regenerates them from the very same weights
      rng.json + .safetensors       python / torch RNG states
      progress.json                 step, cumulative counters, before-training eval reward

Nothing here is a pickle: each part is a JSON tree whose tensors live in the safetensors file next
to it (`{"$tensor": key}`; tuples and non-string-keyed dicts are tagged too), so loading a run dir
someone sent you reads data and never runs code. Checkpoints from before this format (`*.pt`
pickles) are refused with a hint; `convert()` (`vf-train --convert-checkpoint RUN_DIR`) rewrites
them once, reading each pickle with `torch.load(weights_only=True)` (torch's allow-list of plain
containers and tensors) and only with `trust_pickle=True` as a full pickle.

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

from vf.errors import UsageError

CKPT_DIR = "checkpoints"
DONE = "progress.json"
PARTS = ("trainer", "rollout", "rng")
SHARDED = "dcp"
"""Under torchrun: the model + optimizer as a torch.distributed.checkpoint directory."""
CONVERT_HINT = "convert it once with: vf-train --convert-checkpoint RUN_DIR (reads it without running code)"


def root(run_dir: Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def latest(run_dir: Path) -> Path | None:
    found = []
    for p in root(run_dir).glob("step_*"):
        if p.is_dir() and (p / DONE).exists() and ((p / "trainer.json").exists() or (p / "trainer.pt").exists()):
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
    """A single-process checkpoint: the full model and optimizer states in trainer.*."""
    tmp = _begin(run_dir, step)
    trainer = {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler_state}
    return _finish(run_dir, step, tmp, trainer, snapshots, progress, keep_last)


def _begin(run_dir: Path, step: int) -> Path:
    base = root(run_dir)
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _finish(run_dir: Path, step: int, tmp: Path, trainer: dict, snapshots: dict[int, dict],
            progress: dict[str, Any], keep_last: int) -> Path:
    """Write the rank-0 parts into `tmp`, make them durable, rename into place, prune old ones."""
    base = root(run_dir)
    final = base / f"step_{step}"
    _save_tree(tmp, "trainer", trainer)
    _save_tree(tmp, "rollout", snapshots)
    _save_tree(tmp, "rng", rng_state())
    (tmp / DONE).write_text(json.dumps({**progress, "step": step}, indent=2))
    for f in tmp.rglob("*"):  # durable before the rename makes it visible
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    done = sorted((int(p.name.split("_")[1]), p) for p in base.glob("step_*") if p.is_dir())
    for _, p in done[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def save_run(run_dir: Path, version: int, learner, state, rollouts, keep_last: int) -> None:
    """Checkpoint a run after `version` steps: the learner, the weight snapshots the rollouts still
    need, the run state's progress (collective under torchrun: every rank writes its own shards)."""
    from vf.trainer import distributed

    d = learner.d
    snapshots = rollouts.snapshots(version) if rollouts and d.is_main else {}
    if d.enabled:
        save_sharded(run_dir, version, learner, snapshots, state.progress(), keep_last)
        return
    opt_state = distributed.optimizer_state(learner.policy, learner.optimizer, d)
    model_state = state.weights if state.weights is not None else learner.full_state()
    if not d.is_main:
        return
    save(run_dir, version, model_state=model_state, optimizer_state=opt_state,
         scheduler_state=learner.scheduler.state_dict(), snapshots=snapshots, progress=state.progress(), keep_last=keep_last)


def save_sharded(run_dir: Path, step: int, learner, snapshots: dict[int, dict], progress: dict[str, Any],
                 keep_last: int) -> Path:
    """Under torchrun: model and optimizer as a DCP checkpoint (`SHARDED/`), each rank writing
    its own FSDP shards (no full state on one rank); rank 0 adds the rest as usual. The run dir
    must be on a filesystem every rank sees (one machine, or a shared mount across nodes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from vf.trainer import distributed

    d = learner.d
    tmp = root(run_dir) / f".step_{step}.tmp"
    if d.is_main:
        tmp = _begin(run_dir, step)
    distributed.barrier(d)
    model_state, optim_state = get_state_dict(learner.policy, learner.optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(tmp / SHARDED))
    final = root(run_dir) / f"step_{step}"
    if d.is_main:
        trainer = {"scheduler": learner.scheduler.state_dict(), "sharded": {"world_size": d.world_size}}
        _finish(run_dir, step, tmp, trainer, snapshots, progress, keep_last)
    distributed.barrier(d)
    return final


def load_sharded(path: Path, learner, saved_world_size: int) -> None:
    """Load a DCP checkpoint's model and optimizer into `learner` (collective under torchrun).

    DCP reshards on load, so the world size may differ from the one that saved it (tested from 2
    processes to 1 and to 2); a failure says what happened and how to go on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(learner.policy, learner.optimizer)  # also creates AdamW's state
    state = {"model": model_state, "optimizer": optim_state}
    try:
        dcp.load(state, checkpoint_id=str(Path(path) / SHARDED))
    except Exception as e:  # noqa: BLE001 - DCP raises many types (CheckpointException, RuntimeError, ...)
        d = learner.d
        raise UsageError(f"cannot load the sharded checkpoint {path} (saved by {saved_world_size} processes) "
                         f"into {d.world_size}: {str(e).splitlines()[0][:300]}",
                         hint=f"resume with the same number of processes (torchrun --nproc_per_node {saved_world_size})"
                         if saved_world_size != d.world_size else
                         "the checkpoint is damaged; resume from an older one (delete this step dir)") from None
    set_state_dict(learner.policy, learner.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


def load(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not (path / "trainer.json").exists() and (path / "trainer.pt").exists():
        raise UsageError(f"checkpoint {path} is in the old pickle format, which can run code when loaded",
                         hint=CONVERT_HINT)
    return {
        "path": path,
        **_load_tree(path, "trainer"),
        "snapshots": _load_tree(path, "rollout"),
        "rng": _load_tree(path, "rng"),
        "progress": _read_json(path / DONE),
    }


def convert(run_dir: Path, trust_pickle: bool = False) -> list[Path]:
    """Rewrite every old-format (pickle) checkpoint of `run_dir` in the safe format; returns them.

    Each pickle is read with torch's `weights_only=True` allow-list; one holding anything else (which
    could run code) is refused unless `trust_pickle`."""
    import pickle

    import torch

    done = []
    for step in sorted(root(run_dir).glob("step_*")):
        if not (step / "trainer.pt").exists():
            continue
        for part in PARTS:
            f = step / f"{part}.pt"
            try:
                obj = torch.load(f, weights_only=True, map_location="cpu")
            except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError) as e:
                if not trust_pickle:
                    raise UsageError(f"{f} holds objects outside torch's safe allow-list; refusing to load it "
                                     f"(it could run code): {str(e).splitlines()[0]}",
                                     hint="only if you trust where this run dir came from: add --trust-pickle") from None
                obj = torch.load(f, weights_only=False, map_location="cpu")
            _save_tree(step, part, obj)
        for part in PARTS:
            (step / f"{part}.pt").unlink()
        done.append(step)
    return done


# -- a JSON + safetensors tree: containers in JSON, tensors by key in safetensors ------------------

def _save_tree(directory: Path, name: str, obj: Any) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    seen: set[int] = set()

    def enc(x):
        import torch

        if isinstance(x, torch.Tensor):
            key = str(len(tensors))
            t = x.detach().cpu().contiguous()
            if t.untyped_storage().data_ptr() in seen and t.numel():  # tied weights: safetensors wants one owner
                t = t.clone()
            seen.add(t.untyped_storage().data_ptr())
            tensors[key] = t
            return {"$tensor": key}
        if isinstance(x, tuple):
            return {"$tuple": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: enc(v) for k, v in x.items()}
            return {"$dict": [[enc(k), enc(v)] for k, v in x.items()]}
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        raise TypeError(f"cannot checkpoint a {type(x).__name__} without pickle")

    tree = enc(obj)
    save_file(tensors, str(directory / f"{name}.safetensors"))
    (directory / f"{name}.json").write_text(json.dumps(tree))


def _read_json(f: Path) -> Any:
    try:
        return json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{f} is unreadable or not valid JSON: {e}",
                         hint="the checkpoint is damaged; resume from an older one (delete this step dir)") from None


def _load_tree(directory: Path, name: str) -> Any:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    f = directory / f"{name}.safetensors"
    tree = _read_json(directory / f"{name}.json")
    try:
        tensors = load_file(str(f))
    except (OSError, SafetensorError) as e:
        raise UsageError(f"{f} is unreadable: {e}",
                         hint="the checkpoint is damaged; resume from an older one (delete this step dir)") from None

    def dec(x):
        if isinstance(x, list):
            return [dec(v) for v in x]
        if isinstance(x, dict):
            if "$tensor" in x:
                return tensors[x["$tensor"]]
            if "$tuple" in x:
                return tuple(dec(v) for v in x["$tuple"])
            if "$dict" in x:
                return {dec(k): dec(v) for k, v in x["$dict"]}
            return {k: dec(v) for k, v in x.items()}
        return x

    try:
        return dec(tree)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{directory / (name + '.json')} does not match {f.name} ({type(e).__name__}: {e})",
                         hint="the checkpoint is damaged; resume from an older one (delete this step dir)") from None

