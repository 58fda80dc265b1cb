"""Red team, files vf reads back (issue 22): a run dir, a checkpoint, the exchange between the two
training roles and a model directory may be handed to us crafted. JSON nested 100k deep (Python's
json: RecursionError, a traceback and exit 1) or holding NaN is bad input: exit 2 naming the file,
or the line set aside as corrupt. And a model under --weights-root reads nothing outside it, on the
transformers fallback and in the image processor too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRAIN_ENV as ENV
from conftest import run_train

PY = sys.executable
DEEP = "[" * 100_000 + "]" * 100_000
SMALL = ["--warmup.steps", "1", "--warmup.batch-size", "4", "--batch-size", "4", "--group-size", "2",
         "--eval.at-start", "false", "--eval.at-end", "false", "--seed", "7", "--trainer.threads", "1",
         "--taskset", "reverse-text", "--taskset.size", "2", "--taskset.max-words", "1"]


train = run_train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """2 steps (1 warm-up, 1 RL), a checkpoint at the end."""
    run = tmp_path_factory.mktemp("trained") / "run"
    proc = train("-o", str(run), *SMALL, "--steps", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "checkpoints" / "step_2" / "progress.json").is_file()
    return run


def copy(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def refused(proc: subprocess.CompletedProcess, path: Path) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and str(path) in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("name", ["progress.json", "trainer.json"])
def test_resume_from_a_deep_checkpoint_json_exits_2_naming_it(trained, tmp_path, name):
    run = copy(trained, tmp_path)
    bad = run / "checkpoints" / "step_2" / name
    bad.write_text(DEEP)
    proc = train("--resume", str(run), "--steps", "2")
    refused(proc, bad)
    assert "nested deeper than" in proc.stderr


def test_a_deep_metrics_line_does_not_crash_resume(trained, tmp_path):
    """metrics.jsonl is read before anything loads (is there a result a restart would train over?)."""
    run = copy(trained, tmp_path)
    shutil.rmtree(run / "checkpoints")
    with open(run / "metrics.jsonl", "a") as f:
        f.write(DEEP + "\n" + '{"step": NaN}\n')
    proc = train("--resume", str(run))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "holds results (2 step(s) in metrics.jsonl)" in proc.stderr  # the two crafted lines: not steps


def test_a_deep_exchange_batch_is_a_usage_error_naming_it(trained, tmp_path):
    from vf.trainer.exchange import load_batch, read_json

    from vf.errors import UsageError

    step = tmp_path / "step_0"
    step.mkdir()
    (step / "batch.json").write_text(DEEP)
    (step / "traces.jsonl").write_text("")
    with pytest.raises(UsageError, match="batch.json.*nested deeper than"):
        load_batch(step)
    (step / "batch.json").write_text('{"step": 0, "metrics": {"reward": NaN}, "samples": [{"bogus": 1}]}')
    with pytest.raises(UsageError, match="not a batch the orchestrator wrote"):
        load_batch(step)
    for crafted in (DEEP, "[1, 2]", "{"):  # control files (heartbeat, session, READY): not there yet
        (step / "heartbeat.json").write_text(crafted)
        assert read_json(step / "heartbeat.json") is None


def test_trainer_role_given_a_deep_batch_exits_2_naming_it(tmp_path):
    """`vf-train --role trainer` reads RUN/rollouts/step_S/batch.json once READY names its session:
    one the orchestrator did not write (100k deep) is bad input, not a RecursionError."""
    import time

    run = tmp_path / "run"
    proc = subprocess.Popen([PY, "-m", "vf.commands.train", "--role", "trainer", "-o", str(run), *SMALL,
                             "--steps", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wanted, deadline = run / "exchange" / "wanted.json", time.time() + 120
        while not wanted.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        ask = json.loads(wanted.read_text())
        step = run / "rollouts" / f"step_{ask['step']}"
        step.mkdir(parents=True)
        (step / "batch.json").write_text(DEEP)
        (step / "traces.jsonl").write_text("")
        (step / "READY").write_text(json.dumps({"session": ask["session"], "step": ask["step"]}))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, "", err), step / "batch.json")


def test_a_crafted_traces_line_is_set_aside_not_averaged(tmp_path):
    """NaN is not JSON (vf writes null); a NaN reward would make summary.json and --json invalid."""
    from vf.trace import TraceFormatError, iter_episodes

    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"traces": [], "reward": NaN}\n' + DEEP + "\n")
    (_, nan), (_, deep) = iter_episodes(traces, strict=False)
    assert isinstance(nan, TraceFormatError) and "NaN is not a JSON number" in nan.reason
    assert isinstance(deep, TraceFormatError) and "nested deeper than" in deep.reason


def test_deep_tool_arguments_are_shown_to_the_model_as_bad_arguments():
    import asyncio

    from vf.episode.tools import ToolRunner
    from vf.toolset import ToolError

    runner = ToolRunner.__new__(ToolRunner)
    runner.functions, runner.timeouts, runner.timeout = {"f": lambda **kw: "ok"}, {}, 5
    with pytest.raises(ToolError, match="arguments for f: nested deeper than"):
        asyncio.run(runner._call("f", DEEP, {}))


# ---- model directories ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def phi3_dir(tmp_path_factory):
    """A tiny random phi3 (no native vf model: the transformers fallback loads it), under a root."""
    from transformers import Phi3Config, Phi3ForCausalLM

    path = tmp_path_factory.mktemp("models") / "root" / "phi3"
    Phi3ForCausalLM(Phi3Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                               pad_token_id=0)).save_pretrained(str(path))
    return path


def test_hf_fallback_shards_must_lie_under_the_weights_root(phi3_dir, tmp_path):
    """An index naming `sub/w.safetensors`, a link (in a subdirectory, which load_model's scan of the
    directory's entries does not open) to a real, loadable file outside the root: transformers
    loaded it. Refused now, with the same answer whether the target exists or not."""
    from safetensors import safe_open
    from vf.models import ModelLoadError, load_model

    root = tmp_path / "root"
    outside = tmp_path / "outside.safetensors"
    shutil.copy(phi3_dir / "model.safetensors", outside)
    with safe_open(str(outside), "pt") as f:
        names = list(f.keys())
    answers = []
    for name, target in (("exists", outside), ("absent", tmp_path / "absent.safetensors")):
        d = root / name
        shutil.copytree(phi3_dir, d)
        (d / "model.safetensors").unlink()
        (d / "sub").mkdir()
        (d / "sub" / "w.safetensors").symlink_to(target)
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {n: "sub/w.safetensors" for n in names}}))
        with pytest.raises(ModelLoadError, match="resolves outside the weights root") as e:
            load_model(d, impl="hf", root=root)
        answers.append(str(e.value).replace(name, "X"))
    assert answers[0] == answers[1]


def test_hf_fallback_and_image_processor_configs_are_bounded_and_under_the_root(phi3_dir, tmp_path):
    from vf.models import ModelLoadError
    from vf.models.hf_fallback import HFModel
    from vf.models.image_processor import ImageProcessor

    root = tmp_path / "root"
    shutil.copytree(phi3_dir, root / "m")
    (root / "m" / "config.json").write_text(DEEP)
    with pytest.raises(ModelLoadError, match="config.json: nested deeper than"):
        HFModel.load(root / "m")
    (root / "m" / "preprocessor_config.json").write_text(DEEP)
    with pytest.raises(ModelLoadError, match="preprocessor_config.json: nested deeper than"):
        ImageProcessor.from_dir(root / "m")
    (root / "m" / "preprocessor_config.json").unlink()
    (tmp_path / "elsewhere.json").write_text('{"patch_size": 14}')
    (root / "m" / "preprocessor_config.json").symlink_to(tmp_path / "elsewhere.json")
    assert ImageProcessor.from_dir(root / "m").patch_size == 14  # no root: a link may lead anywhere
    with pytest.raises(ModelLoadError, match="outside the weights root"):
        ImageProcessor.from_dir(root / "m", root.resolve())
