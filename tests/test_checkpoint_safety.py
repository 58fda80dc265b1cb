"""Checkpoints hold no pickles: resuming never runs code from the run dir; old pickle checkpoints
convert once, through torch's weights-only allow-list unless the user vouches for them."""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path

import pytest
import torch
from conftest import run_train
from vf.trainer import checkpoint

from vf.errors import UsageError

SMALL = ["--warmup.steps", "1", "--steps", "1", "--warmup.batch-size", "2", "--batch-size", "2", "--group-size", "2",
         "--eval.at-start", "false", "--eval.at-end", "false", "--trainer.threads", "1", "--seed", "3"]


def train(*args, timeout=300):
    return run_train(*args, timeout=timeout)


class Boom:
    """Unpickling this runs `open(marker, 'w')`: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_tree_round_trip_restores_optimizer_rng_and_tied_weights(tmp_path):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.9))
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    random.seed(5)
    torch.manual_seed(5)
    shared = torch.randn(6)
    obj = {"model": {"a": shared, "b": shared}, "optimizer": opt.state_dict(), "rng": checkpoint.rng_state(),
           "snaps": {3: {"w": torch.ones(2)}}, "misc": (1, [2.5, None], "s", {"$odd": True})}
    checkpoint._save_tree(tmp_path, "t", obj)
    expect = (random.random(), torch.rand(3))
    back = checkpoint._load_tree(tmp_path, "t")
    assert not list(tmp_path.glob("*.pt"))
    assert torch.equal(back["model"]["a"], shared) and torch.equal(back["model"]["b"], shared)
    assert back["snaps"][3]["w"].tolist() == [1.0, 1.0] and back["misc"] == (1, [2.5, None], "s", {"$odd": True})
    checkpoint.set_rng_state(back["rng"])
    assert (random.random(), torch.rand(3).tolist()) == (expect[0], expect[1].tolist())
    opt2 = torch.optim.AdamW(model.parameters(), lr=0.1)
    opt2.load_state_dict(back["optimizer"])
    assert opt2.state_dict()["param_groups"][0]["betas"] == (0.8, 0.9)
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("ckpt") / "run"
    proc = train("-o", str(run), *SMALL)
    assert proc.returncode == 0, proc.stderr
    return run


def as_old_format(step: Path) -> None:
    """Rewrite a checkpoint the way vf wrote them before (pickles), honestly."""
    state = checkpoint.load(step)
    torch.save({k: state[k] for k in ("model", "optimizer", "scheduler")}, step / "trainer.pt")
    torch.save(state["snapshots"], step / "rollout.pt")
    torch.save(state["rng"], step / "rng.pt")
    for part in checkpoint.PARTS:
        (step / f"{part}.json").unlink()
        (step / f"{part}.safetensors").unlink()


@pytest.mark.slow
def test_malicious_pickle_in_a_run_dir_is_never_run(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    step = checkpoint.latest(run)
    assert step is not None and not list(step.glob("*.pt"))
    as_old_format(step)
    marker = tmp_path / "PWNED"
    with open(step / "trainer.pt", "wb") as f:
        pickle.dump({"model": Boom(marker)}, f)

    resumed = train("--resume", str(run), "--steps", "2")
    assert resumed.returncode == 2 and "old pickle format" in resumed.stderr and "--convert-checkpoint" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    converted = train("--convert-checkpoint", str(run))
    assert converted.returncode == 2 and "trainer.pt" in converted.stderr and "--trust-pickle" in converted.stderr
    assert not marker.exists()
    assert (step / "trainer.pt").exists()  # refused files are left as they were


@pytest.mark.slow
def test_old_checkpoint_converts_once_then_resumes(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    step = checkpoint.latest(run)
    before = checkpoint.load(step)
    as_old_format(step)
    with pytest.raises(UsageError, match="old pickle format"):
        checkpoint.load(step)
    proc = train("--convert-checkpoint", str(run))
    assert proc.returncode == 0 and "converted 1 checkpoint" in proc.stderr + proc.stdout, proc.stderr
    after = checkpoint.load(step)
    assert not list(step.glob("*.pt"))
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    assert after["rng"]["python"] == before["rng"]["python"]
    resumed = train("--resume", str(run), "--steps", "2", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["resumed_from"] == 2


def test_damaged_checkpoint_files_are_usage_errors_naming_the_file(tmp_path):
    checkpoint._save_tree(tmp_path, "trainer", {"w": torch.ones(3)})
    (tmp_path / "trainer.safetensors").write_bytes(b"\x00" * 5)
    with pytest.raises(UsageError, match="trainer.safetensors"):
        checkpoint._load_tree(tmp_path, "trainer")
    checkpoint._save_tree(tmp_path, "trainer", {"w": torch.ones(3)})
    (tmp_path / "trainer.json").write_text('{"w": {"$tensor": "7"}}')
    with pytest.raises(UsageError, match="trainer.json"):
        checkpoint._load_tree(tmp_path, "trainer")
