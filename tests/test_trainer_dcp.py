"""Sharded (DCP) checkpoints under torchrun: every rank writes its own shards, a resumed 2-process
run repeats the losses it would have had, a 1-process run resumes the same checkpoint (DCP
reshards on load), and a 1-process (plain format) checkpoint resumes on 2 processes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PY = sys.executable
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
# 2 SFT warm-up steps, then 3 RL steps; a checkpoint after step 3 (mid-RL, with a weight snapshot)
ARGS = ["--warmup.steps", "2", "--warmup.batch-size", "8", "--batch-size", "8", "--group-size", "4",
        "--eval.at-start", "false", "--eval.at-end", "false", "--seed", "7", "--trainer.threads", "1",
        "--trainer.micro-batch-size", "1", "--trainer.seq-len", "96", "--steps", "3", "--ckpt-every", "3",
        "--async.deterministic"]  # exact repeats need the fixed-lag replay


class Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_dcp_metadata_is_read_without_running_code(tmp_path):
    import pickle

    from vf.trainer import checkpoint

    marker = tmp_path / "PWNED"
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Boom(marker)))
    with pytest.raises(pickle.UnpicklingError, match="not allowed in checkpoint metadata"):
        checkpoint.safe_reader(tmp_path).read_metadata()
    assert not marker.exists()


def launch(nproc: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ([str(Path(PY).parent / "torchrun"), "--standalone", "--nproc_per_node", str(nproc)] if nproc > 1
           else [PY]) + ["-m", "vf.commands.train", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, check=False)
    assert proc.returncode == 0 or not check, proc.stderr[-3000:]
    return proc


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def back_to(step: int, src: Path, dst: Path) -> None:
    """A copy of the run as a kill after the step-`step` checkpoint would have left it."""
    shutil.copytree(src, dst)
    for ck in (dst / "checkpoints").glob("step_*"):
        if int(ck.name.split("_")[1]) > step:
            shutil.rmtree(ck)


@pytest.mark.matrix
def test_sharded_checkpoint_resumes_with_the_same_and_another_world_size(tmp_path):
    full = tmp_path / "full"
    launch(2, "-o", str(full), *ARGS)
    want = losses(full)
    assert len(want) == 5
    ck = full / "checkpoints" / "step_3"
    shards = sorted(p.name for p in (ck / "dcp").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], shards
    trainer = json.loads((ck / "trainer.json").read_text())
    assert "model" not in trainer and "optimizer" not in trainer and trainer["sharded"] == {"world_size": 2, "ep": 1, "cp": 1}
    assert trainer["param_groups"][0]["params"][0] == "model.embed_tokens.weight"  # plain data, not in dcp/
    assert json.loads((ck / "rollout.json").read_text()), "the snapshot batch 3 is generated from"

    same = tmp_path / "same"
    back_to(3, full, same)
    launch(2, "--resume", str(same))
    assert losses(same) == pytest.approx(want, rel=1e-5, abs=1e-7)

    one = tmp_path / "one"
    back_to(3, full, one)
    proc = launch(1, "--resume", str(one), "--json", "--ckpt-every", "4")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["resumed_from"] == 3
    assert losses(one) == pytest.approx(want, rel=1e-4, abs=1e-6)  # 1 vs 2 processes: summation order
    plain = one / "checkpoints" / "step_4"
    assert "model" in json.loads((plain / "trainer.json").read_text()) and not (plain / "dcp").exists()

    mixed = tmp_path / "mixed"  # the plain (index-keyed optimizer) checkpoint on 2 processes
    back_to(4, one, mixed)
    launch(2, "--resume", str(mixed))
    assert losses(mixed) == pytest.approx(want, rel=1e-4, abs=1e-6)

    damaged = tmp_path / "damaged"
    back_to(3, full, damaged)
    (damaged / "checkpoints" / "step_3" / "dcp" / ".metadata").write_bytes(b"not a checkpoint")
    proc = launch(1, "--resume", str(damaged), check=False)
    assert proc.returncode == 2 and "cannot load the sharded checkpoint" in proc.stderr, proc.stderr[-2000:]
    assert "saved by 2 processes" in proc.stderr and "Traceback" not in proc.stderr
