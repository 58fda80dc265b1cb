"""The run monitor (trainer/monitor.py): the loop's hook as a recording monitor, the table rows it
decodes, no wandb import unless asked, and a real W&B offline run read back from its `.wandb` file."""

import glob
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from vf.trainer.monitor import Monitor, sample_rows
from vf.trainer.orchestrator import Batch
from vf.trainer.samples import Sample

PY = sys.executable
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
RL = ["--warmup.steps", "1", "--warmup.batch-size", "8", "--batch-size", "8", "--group-size", "4", "--steps", "1",
      "--eval.at-start", "false", "-n", "2", "--eval.num-rollouts", "1", "--seed", "7", "--trainer.threads", "1"]


def train(*args, env=ENV, timeout=240):
    proc = subprocess.run([PY, "-m", "vf.commands.train", *args, "--json"], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Tok:
    """Decodes token ids as letters (a=0, b=1, ...)."""

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


class Recording(Monitor):
    sample_limit = 2

    def __init__(self):
        self.calls = []

    def log(self, row, step):
        self.calls.append(("log", step, row["loss"]))

    def samples(self, step, rows):
        self.calls.append(("samples", step, rows))


def test_record_logs_the_row_then_evenly_spaced_samples():
    batch = Batch(3, [Sample([0, 1, 2, 3, 4], [0, 0, 1, 1, 0], [0.0] * 5, 0.5, {"reward": 1.0}),
                      Sample([5, 6], [0, 1], [0.0] * 2, -0.5, {"reward": 0.0}),
                      Sample([7, 8, 9], [0, 0, 1], [0.0] * 3, 0.25, {"reward": 0.5}),
                      Sample([1], [0], [0.0], 0.0, {})])
    m = Recording()
    m.record({"step": 3, "loss": 0.7}, batch, Tok())
    assert m.calls[0] == ("log", 3, 0.7)
    kind, step, rows = m.calls[1]
    assert (kind, step) == ("samples", 3)
    assert rows == [  # samples 0 and 2 of 4: one in every two
        {"step": 3, "prompt": "ab", "completion": "cde", "reward": 1.0, "advantage": 0.5, "loss_tokens": 2,
         "masked_tokens": 3},
        {"step": 3, "prompt": "hi", "completion": "j", "reward": 0.5, "advantage": 0.25, "loss_tokens": 1,
         "masked_tokens": 2}]
    assert sample_rows(0, batch, Tok(), 0) == []
    Monitor().record({"step": 0, "loss": 1.0}, batch, None)  # the no-op decodes nothing (no tokenizer needed)


class FakeRun:
    step = 0

    def __init__(self):
        self.logged = []

    def log(self, data, step):
        self.logged.append((step, data))


def test_wandb_monitor_flattens_and_never_logs_a_step_twice():
    from vf.trainer.wandb_monitor import WandbMonitor, flatten

    assert flatten({"a": 1, "b": None, "c": {"0": 2, "1": float("nan")}, "phase": "rl", "ok": True}) == \
        {"a": 1, "c/0": 2, "phase": "rl", "ok": True}
    assert flatten({"n": 3, "s": "x", "p": {"1": 0.5}}, "eval/after/", numbers_only=True) == \
        {"eval/after/n": 3, "eval/after/p/1": 0.5}
    run = FakeRun()
    m = WandbMonitor(run, wandb=None, sample_limit=0)
    for step in (0, 1, 1, 0, 2):  # a resumed run trains steps again: W&B keeps the first values
        m.log({"step": step, "loss": float(step)}, step)
    assert [s for s, _ in run.logged] == [0, 1, 2]
    m.samples(1, [{"step": 1}])  # not the step just logged: no table (nor a wandb call)
    assert len(run.logged) == 3


def test_no_wandb_import_without_project(tmp_path):
    """A poisoned `wandb` module first on the path: a run without --wandb.project never imports it."""
    poison = tmp_path / "poison"
    poison.mkdir()
    (poison / "wandb.py").write_text("raise ImportError('vf imported wandb without --wandb.project')\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(poison), ENV.get("PYTHONPATH", "")])}
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "completion": "hello"}) + "\n")
    s = train("--loss", "sft", "--data", str(data), "--steps", "1", "--batch-size", "1", "--eval.at-start", "false",
              "--eval.at-end", "false", "--trainer.threads", "1", "-o", str(tmp_path / "run"), env=env)
    assert s["steps"] == 1
    assert not (tmp_path / "run" / "wandb").exists() and not (tmp_path / "run" / "wandb.json").exists()


# ---- a real W&B offline run ----------------------------------------------------------------------------


def wandb_records(path):
    """The records of a `.wandb` file: a 7-byte header, then a LevelDB-style log of 32 KiB blocks
    (each record: crc32, length, type FULL/FIRST/MIDDLE/LAST, payload) holding `Record` protobufs.
    wandb 0.31 no longer ships a reader (`wandb.sdk.internal.datastore`)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:
            break
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def items(updates):
    return {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in updates}


def test_wandb_offline_run_holds_metrics_config_samples_and_evals(tmp_path):
    pytest.importorskip("wandb")
    out = tmp_path / "run"
    s = train(*RL, "--wandb.project", "vf-test", "--wandb.name", "offline-check", "--wandb.mode", "offline",
              "--wandb.samples", "3", "-o", str(out))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["warmup", "rl"]
    run_id = json.loads((out / "wandb.json").read_text())["id"]
    (run_dir,) = glob.glob(str(out / "wandb" / f"offline-run-*-{run_id}"))  # --wandb.dir defaults to the run dir

    history, summary, config, name = {}, {}, {}, None
    for rec in wandb_records(Path(run_dir) / f"run-{run_id}.wandb"):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            h = items(rec.history.item)
            history[h["_step"]] = h
        elif kind == "summary":
            summary.update(items(rec.summary.update))
        elif kind == "run":
            config, name = items(rec.run.config.update), rec.run.display_name
    assert name == "offline-check"
    # the config: the resolved TrainConfig, as config.yaml holds it
    assert config["orchestrator"]["batch_size"] == 8 and config["wandb"]["project"] == "vf-test"
    assert config["model"]["path"] == "tiny-random" and config["seed"] == 7
    # every metric of every metrics.jsonl row, at its step
    assert sorted(history) == [0, 1]
    for row in rows:
        h = history[row["step"]]
        for key, value in row.items():
            if isinstance(value, dict):
                for k, v in value.items():
                    assert h[f"{key}/{k}"] == v, (key, k)
            elif value is not None:
                assert h[key] == pytest.approx(value), key
    assert "mismatch_kl" in history[1] and "masked_fraction" in history[1] and history[1]["phase"] == "rl"
    # one sample table per step; the RL step's rows are rollouts with rewards and token counts
    tables = sorted(glob.glob(str(Path(run_dir) / "files" / "media" / "table" / "samples_*.table.json")))
    assert len(tables) == 2 and history[1]["samples/nrows"] == 3
    rl_table = json.loads(Path(next(t for t in tables if "/samples_1_" in t)).read_text())
    assert rl_table["columns"] == ["step", "prompt", "completion", "reward", "advantage", "loss_tokens",
                                   "masked_tokens"]
    assert len(rl_table["data"]) == 3
    for step, prompt, completion, reward, adv, loss_tokens, masked_tokens in rl_table["data"]:
        assert step == 1 and "<|im_start|>user" in prompt and completion
        assert 0.0 <= reward <= 1.0 and math.isfinite(adv)
        assert 0 < loss_tokens <= 24 and masked_tokens > 0  # at most --sampling.max-tokens sampled tokens
    # the evaluation's results
    assert summary["eval/after/mean_reward"] == pytest.approx(s["reward_after"])
    assert summary["eval/after/pass_at_k/1"] == s["pass_at_k_after"]["1"]
    assert summary["eval/after/num_episodes"] == 2
