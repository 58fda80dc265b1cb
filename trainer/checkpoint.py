"""Checkpoints: everything needed to continue a killed run exactly where it stopped.

    RUN/checkpoints/step_N/          N = optimizer steps completed (the model is policy version N)
      trainer.json + .safetensors   model (full state dict), optimizer, scheduler
      dcp/                          under torchrun instead: model + optimizer tensors as a
                                    torch.distributed.checkpoint (each rank writes its own FSDP
                                    shards, no full optimizer state on one rank); trainer.* then
                                    holds the scheduler, the optimizer's param_groups and the
                                    saving world size. DCP reshards on load, so a run may resume
                                    with another number of processes. Read with `safe_reader`
                                    (DCP's own reader unpickles).
      rollout.json + .safetensors   weight snapshots of older versions that batches ≥ N will still be
                                    generated from in deterministic replay (async.level /
                                    drift.stale_steps > 0), so a resumed run regenerates them
                                    from the very same weights; empty in continuous mode
      rng.json + .safetensors       python / torch RNG states
      progress.json                 step, cumulative counters, before-training eval reward
    RUN/adapter/                    LoRA (`--lora.rank`): the latest checkpoint's adapters in PEFT's format;
                                    trainer.* (or dcp/) then hold the adapters and their optimizer
                                    state only, the frozen base is read from --model.path again
    RUN/merged/                     LoRA with `--lora.merge`: the merged model, written at the end

Nothing here is a pickle: each part is a JSON tree whose tensors live in the safetensors file next
to it (`{"$tensor": key}`; tuples and non-string-keyed dicts are tagged too), so loading a run dir
someone sent you reads data and never runs code. (Under torchrun, DCP's `.metadata` and shard
records are pickles; they are read with allow-lists: `safe_reader`, `torch.load(weights_only=True)`.)
Checkpoints from before this format (`*.pt`
pickles) are refused with a hint; `convert()` (`vf-train --convert-checkpoint RUN_DIR`) rewrites
them once, reading each pickle with `torch.load(weights_only=True)` (torch's allow-list of plain
containers and tensors) and only with `trust_pickle=True` as a full pickle.

A checkpoint is written into `.step_N.tmp/` and renamed into place, so a `kill -9` leaves either
the whole directory or none; `latest()` only considers complete ones. Old ones beyond
`keep_last` are deleted after a new one lands.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

from vf.bounded import BoundsError, load_json
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


def resume_point(run_dir: Path, from_scratch: bool = False) -> Path | None:
    """The checkpoint `--resume` continues from; None: start from step 0. A run that holds results
    but no checkpoint yet (killed before its first) is not trained again over them unless
    `from_scratch` (its results are then set aside, `run_state.RunFiles`); `from_scratch` never
    abandons a checkpoint. Needs no torch: the command calls it before anything is loaded."""
    from vf.trainer.metrics import MetricsLog

    from vf.rundir import RunDir

    ck = latest(run_dir)
    if ck is not None and from_scratch:
        raise UsageError(f"{run_dir} has a checkpoint ({ck.name}): --from-scratch would abandon it",
                         hint=f"continue from it with --resume {run_dir}, or start a new run with -o DIR")
    if ck is None and not from_scratch:
        done = len(MetricsLog(run_dir).read())
        if done or RunDir(run_dir).has_results():
            raise UsageError(f"{run_dir} holds results ({done} step(s) in metrics.jsonl) but no checkpoint yet: "
                             "resuming would train again from step 0",
                             hint=f"vf-train --resume {run_dir} --from-scratch starts over and sets the old results "
                                  "aside (metrics.after-step-0.jsonl, traces.after-step-0.jsonl); or start a new run "
                                  "with -o DIR")
    return ck


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
    else:
        opt_state = distributed.optimizer_state(learner.policy, learner.optimizer, d)
        model_state = learner.full_state()  # one process: a copy of its own parameters (LoRA: the adapters)
        save(run_dir, version, model_state=model_state, optimizer_state=opt_state,
             scheduler_state=learner.scheduler.state_dict(), snapshots=snapshots, progress=state.progress(),
             keep_last=keep_last)
    if learner.config.lora.rank:
        learner.save_adapter(run_dir, version)


def save_sharded(run_dir: Path, step: int, learner, snapshots: dict[int, dict], progress: dict[str, Any],
                 keep_last: int) -> Path:
    """Under torchrun: model and optimizer tensors as a DCP checkpoint (`SHARDED/`), each rank
    writing its own FSDP shards (no full state on one rank); rank 0 adds the rest as usual, with
    the optimizer's param_groups (plain numbers) in trainer.json, so the DCP part holds tensors
    only (see `SafeReader`). The run dir must be on a filesystem every rank sees (one machine, or a
    shared mount across nodes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from vf.trainer import distributed

    d = learner.d
    tmp = root(run_dir) / f".step_{step}.tmp"
    if d.is_main:
        tmp = _begin(run_dir, step)
    distributed.barrier(d)
    model_state, optim_state = get_state_dict(learner.policy, learner.optimizer, options=_options(learner))
    view = learner.mesh.checkpoint_view  # expert blocks as DTensors over ep: a later run may use another ep
    dcp.save({"model": view(model_state), "optimizer": {"state": view(optim_state["state"])}},
             checkpoint_id=str(tmp / SHARDED))
    final = root(run_dir) / f"step_{step}"
    if d.is_main:
        layout = learner.mesh.layout
        trainer = {"scheduler": learner.scheduler.state_dict(), "param_groups": optim_state["param_groups"],
                   "sharded": {"world_size": d.world_size, "ep": layout.ep, "cp": layout.cp}}
        _finish(run_dir, step, tmp, trainer, snapshots, progress, keep_last)
    distributed.barrier(d)
    return final


def load_sharded(path: Path, learner, restore: dict[str, Any]) -> None:
    """Load a DCP checkpoint's model and optimizer into `learner` (collective under torchrun).

    DCP reshards on load, so the world size may differ from the one that saved it (tested from 2
    processes to 1); a failure says what happened and how to go on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = _options(learner)
    model_state, optim_state = get_state_dict(learner.policy, learner.optimizer, options=options)  # creates AdamW's state
    view = learner.mesh.checkpoint_view  # DTensor views of the expert blocks: DCP reshards them in place
    saved_world, d = restore["sharded"]["world_size"], learner.d
    reader = safe_reader(Path(path) / SHARDED)
    try:
        with _quiet_dcp():
            saved = set(reader.read_metadata().state_dict_metadata)
            # a parameter that never had a gradient (DSA's indexer: a hard selection) has no AdamW
            # state in the checkpoint; it keeps the zeros just created (what it would have had)
            moments = {k: v for k, v in optim_state["state"].items()
                       if any(key.startswith(f"optimizer.state.{k}.") for key in saved)}
            state = {"model": view(model_state), "optimizer": {"state": view(moments)}}
            dcp.load(state, storage_reader=reader)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps every rank's failure
        lines = [line for line in str(e).splitlines() if line.strip()]
        raise UsageError(f"cannot load the sharded checkpoint {path} (saved by {saved_world} processes) into "
                         f"{d.world_size}: {(lines[-1] if lines else type(e).__name__)[:300]}",
                         hint="if the checkpoint is damaged, resume from an older one (delete this step dir)"
                         + (f"; else resume with the number of processes that saved it (torchrun --nproc_per_node "
                            f"{saved_world})" if saved_world != d.world_size else "")) from None
    set_state_dict(learner.policy, learner.optimizer, model_state_dict=model_state,
                   optim_state_dict={"state": optim_state["state"], "param_groups": restore["param_groups"]},
                   options=options)


def _options(learner):
    """DCP state-dict options: with LoRA the frozen base is left out (the adapters are the model
    state; loading does not ask for the base, which the model path provides)."""
    if not learner.config.lora.rank:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False)


@contextlib.contextmanager
def _quiet_dcp():
    """DCP logs each failed metadata read with its traceback (the error raised after says it all)
    and warns that a load without a process group is a single-process load (it is)."""
    log = logging.getLogger()  # DCP's loader logs to the root logger
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            yield
    finally:
        log.setLevel(level)


def _safe_reader():
    import pickle

    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import metadata as md

    allowed = {("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("torch", "Size"),
               ("torch.serialization", "_get_layout"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
    allowed |= {("torch.distributed.checkpoint.metadata", n) for n in
                ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                 "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in allowed or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")

    class SafeReader(FileSystemReader):
        """DCP's FileSystemReader, without running code from the checkpoint: DCP writes its
        metadata as a pickle and loads non-tensor entries with `torch.load(weights_only=False)`.
        Here the metadata is unpickled with an allow-list of DCP's own metadata classes, and a
        checkpoint with anything but tensors is refused (ours hold tensors only); the tensors
        themselves DCP already reads with `torch.load(weights_only=True)`."""

        def read_metadata(self, *args, **kwargs):
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                metadata = Unpickler(f).load()
            if not isinstance(metadata, md.Metadata):
                raise pickle.UnpicklingError(f"{path} is not DCP metadata")
            odd = [k for k, v in metadata.state_dict_metadata.items() if not isinstance(v, md.TensorStorageMetadata)]
            if odd:
                raise pickle.UnpicklingError(f"non-tensor entries (refused: loading them can run code): {odd[:3]}")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = md.StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader


def safe_reader(path: Path):
    """A `SafeReader` of the DCP checkpoint at `path` (the class is built on first use: torch
    is imported lazily)."""
    return _safe_reader()(str(path))


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
        return load_json(f.read_bytes(), allow_nan=True)
    except (OSError, BoundsError) as e:
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

