"""Hostile files: random corruptions of traces.jsonl, config.yaml, taskset configs, checkpoints and
model dirs. Every reader answers a usage error (exit 2) naming the file, never a traceback or a
hang, and nothing already on disk is lost."""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vf.trainer import checkpoint

from vf.config import load_yaml
from vf.errors import VfError
from vf.rundir import CORRUPT_FILE, RunDir
from vf.trace import read_episodes

ENV_EXTRA = {"NO_COLOR": "1", "OMP_NUM_THREADS": "1"}


def corrupt(data: bytes, rng: random.Random) -> bytes:
    """One random damage: truncation, flipped bytes, inserted junk or syntax, a cut-out, or noise."""
    kind = rng.randrange(6)
    if kind == 0 or not data:
        return data[: rng.randrange(len(data) + 1)]
    b = bytearray(data)
    i = rng.randrange(len(b))
    if kind == 1:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 2:
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == 3:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    elif kind == 4:
        del b[i: rng.randrange(i, len(b) + 1)]
    else:
        b[i:i] = rng.choice([b"{", b"}", b'"', b"\n", b"[", b": ", b"null", b"\xff", b"- ", b"\r"])
    return bytes(b)


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    from conftest import run_cli

    run = tmp_path_factory.mktemp("hostile") / "run"
    run_cli("vf-eval", "reverse-text", "-n", "3", "-o", str(run), "--sampling.max-tokens", "8", check=True,
            env=ENV_EXTRA)
    return run


def fuzz(path: Path, read, n: int, seed: int) -> None:
    """Corrupt `path` n times; `read()` may succeed or raise a VfError, nothing else."""
    rng = random.Random(seed)
    original = path.read_bytes()
    for _ in range(n):
        path.write_bytes(corrupt(original, rng))
        try:
            read()
        except VfError:
            pass
    path.write_bytes(original)


def test_run_dir_readers_only_raise_usage_errors(eval_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(eval_run, run)
    fuzz(run / "config.yaml", lambda: RunDir(run).load_config(), 60, 1)
    fuzz(run / "traces.jsonl", lambda: read_episodes(run / "traces.jsonl"), 60, 2)
    (tmp_path / "taskset.yaml").write_text("taskset:\n  id: reverse-text\n  size: 4\nsampling: {max_tokens: 8}\n")
    fuzz(tmp_path / "taskset.yaml", lambda: load_yaml(tmp_path / "taskset.yaml"), 60, 3)


def test_resume_moves_unparsable_lines_aside_instead_of_deleting_them(eval_run, tmp_path):
    rng = random.Random(4)
    for attempt in range(20):
        run = tmp_path / f"run{attempt}"
        shutil.copytree(eval_run, run)
        lines = (run / "traces.jsonl").read_bytes().splitlines(keepends=True)
        k = rng.randrange(len(lines))
        lines[k] = corrupt(lines[k], rng).replace(b"\n", b" ").replace(b"\r", b" ") + b"\n"
        (run / "traces.jsonl").write_bytes(b"".join(lines))
        rd = RunDir(run)
        state = rd.read()
        rd.rewrite(state.kept)
        kept = len(read_episodes(run / "traces.jsonl"))
        aside = (run / CORRUPT_FILE).read_bytes().splitlines() if (run / CORRUPT_FILE).exists() else []
        assert kept + len(aside) == len(lines) - (1 if not lines[k].strip() else 0) - state.count("errored")
        assert all(a + b"\n" in lines or a == lines[k].rstrip(b"\n") for a in aside)


def test_checkpoint_and_model_readers_only_raise_usage_errors(tmp_path):
    from vf.models.checkpoint import load_model
    from vf.models.tiny import ensure_tiny_model

    model = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    step = checkpoint.save(tmp_path / "run", 1, model_state=model.state_dict(), optimizer_state=opt.state_dict(),
                           scheduler_state={"last_epoch": 1}, snapshots={0: model.state_dict()},
                           progress={"counters": {}})
    for i, name in enumerate(["trainer.json", "trainer.safetensors", "rollout.json", "rng.safetensors",
                              "progress.json"]):
        fuzz(step / name, lambda: checkpoint.load(step), 25, 10 + i)
    tiny = tmp_path / "tiny"
    shutil.copytree(ensure_tiny_model(), tiny)
    fuzz(tiny / "config.json", lambda: load_model(tiny), 25, 20)
    fuzz(tiny / "model.safetensors", lambda: load_model(tiny), 25, 21)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_every_command_that_reads_a_damaged_file_exits_2_naming_it(eval_run, tmp_path):
    from conftest import run_cli
    from vf.models.tiny import ensure_tiny_model

    run = tmp_path / "run"
    shutil.copytree(eval_run, run)
    lines = (run / "traces.jsonl").read_bytes().splitlines(keepends=True)
    (run / "traces.jsonl").write_bytes(lines[0] + b'{"torn": \xff\n' + b"".join(lines[1:]))
    bad_cfg = tmp_path / "badcfg"
    shutil.copytree(eval_run, bad_cfg)
    (bad_cfg / "config.yaml").write_bytes(b"taskset: {id: [reverse-text\n  size: 4\n")
    binary_cfg = tmp_path / "bincfg"
    shutil.copytree(eval_run, binary_cfg)
    (binary_cfg / "config.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "taskset.yaml").write_text("taskset:\n  id: reverse-text\n    size: 4\n")
    model = tmp_path / "model"
    shutil.copytree(ensure_tiny_model(), model)
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:300])

    cases = [
        (["vf-eval", "--score", str(run)], run / "traces.jsonl", "traces.jsonl:2"),
        (["vf-eval", "--resume", str(bad_cfg)], bad_cfg / "config.yaml", "config.yaml:2"),
        (["vf-rollout", "--resume", str(binary_cfg)], binary_cfg / "config.yaml", "config.yaml"),
        (["vf-train", "--resume", str(bad_cfg)], bad_cfg / "config.yaml", "config.yaml:2"),
        (["vf-train", "--loss", "sft", "--data", str(run), "-o", str(tmp_path / "sft")], run / "traces.jsonl",
         "traces.jsonl:2"),
        (["vf-eval", "--config", str(tmp_path / "taskset.yaml")], tmp_path / "taskset.yaml", "taskset.yaml:3"),
        ([sys.executable, "-m", "vf.commands.serve", str(model), "--port", "0"], model / "model.safetensors",
         "model.safetensors"),
    ]
    for args, damaged, needle in cases:
        before = digest(damaged)
        if args[0] == sys.executable:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
        else:
            proc = run_cli(*args, env=ENV_EXTRA, timeout=120)
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert needle in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        assert digest(damaged) == before, args  # reading never rewrote the damaged file
