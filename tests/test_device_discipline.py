"""Every tensor on the device that uses it: a whole vf-train run on a stand-in accelerator
(tests/stand_in_device.py), where any op that mixes the model's device with a host tensor raises as
CUDA would, gives exactly the CPU run's numbers.

Before issue 31 the first training step failed here: `collate` builds micro-batches on the host and
the learner fed them to the model unmoved (the embedding lookup raised); the step then summed
device losses into a host float64 tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from stand_in_device import DeviceMismatch, stand_in_accelerator
from vf.trainer import checkpoint
from vf.trainer.config import resolve
from vf.trainer.loop import run
from vf.trainer.samples import MicroBatch

RUN = {"warmup": {"steps": 1, "batch_size": 4}, "steps": 1, "seed": 5,
       "orchestrator": {"batch_size": 4, "group_size": 2}, 
       "eval": {"at_start": False, "at_end": True, "select": {"limit": 2}},
       "trainer": {"micro_batch_size": 2, "seq_len": 64}, "async": {"deterministic": True}}


def train(out: Path, device: str, dtype: str = "float32", **more) -> list[dict]:
    out.mkdir(exist_ok=True)
    summary = run(resolve({**RUN, **more, "model": {"device": device, "dtype": dtype}}), out)
    assert summary["errored_rollouts"] == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_stand_in_device_catches_what_cuda_refuses():
    with stand_in_accelerator() as device:
        emb = torch.nn.Embedding(10, 4).to(device)
        with pytest.raises(DeviceMismatch):
            emb(torch.tensor([1, 2]))  # host indices into device weights
        loss = emb(torch.tensor([1, 2], device=device)).sum()
        total = torch.zeros((), dtype=torch.float64)
        with pytest.raises(DeviceMismatch):
            total += loss.detach().double()  # a device loss added into a host accumulator
        scaled = loss * torch.tensor(2.0)  # a host 0-dim scalar may be read, as on CUDA
        assert scaled.device == device and float(scaled) == pytest.approx(2 * float(loss))
        assert isinstance(loss.tolist(), float) and loss.cpu().device.type == "cpu"


def test_micro_batch_moves_every_tensor():
    with stand_in_accelerator() as device:
        mb = MicroBatch(*(torch.zeros(1, 3) for _ in range(6)), routed_experts=torch.zeros(1, 3, 1, 1))
        moved = mb.to(device)
        assert all(getattr(moved, f).device == device for f in
                   ("input_ids", "position_ids", "targets", "loss_mask", "inference_logprobs", "advantages",
                    "routed_experts"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_whole_run_on_the_device_equals_the_cpu_run(tmp_path, dtype):
    """SFT warm-up, rollouts on the embedded engine (on the device too), an RL step, the weight push,
    an evaluation and a checkpoint; bfloat16 with its fp32 master weights on the device."""
    cpu = train(tmp_path / "cpu", "cpu", dtype)
    with stand_in_accelerator() as device:
        dev = train(tmp_path / "dev", str(device), dtype)
    # equal up to rounding: off the CPU some layers take their device kernels (the tile math, not the CPU
    # flash kernel) in the same arithmetic; in bf16 the RL loss itself is ~1e-7 (advantages sum to 0)
    rel, atol = (1e-5, 1e-8) if dtype == "float32" else (1e-3, 1e-5)
    assert [r["loss"] for r in dev] == pytest.approx([r["loss"] for r in cpu], rel=rel, abs=atol)
    # the RL step's gradient is a sum of near-cancelling terms: in bf16 its norm is rounding-sized
    compared = dev if dtype == "float32" else dev[:1]
    assert [r["grad_norm"] for r in compared] == pytest.approx([r["grad_norm"] for r in cpu[:len(compared)]],
                                                               rel=100 * rel)
    if dtype == "float32":  # in bf16 a rounding flips a sampled token and the episodes part ways
        assert dev[-1]["eval_reward"] == pytest.approx(cpu[-1]["eval_reward"], abs=1e-6)
    assert 0 <= dev[-1]["eval_reward"] <= 1  # the evaluation ran on the device
    state = checkpoint.load(checkpoint.latest(tmp_path / "dev"))["model"]
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in state.values())  # fp32 masters


def test_resume_on_the_device_continues_the_cpu_checkpoint(tmp_path):
    """A checkpoint written on one device loads onto another (here CPU → the stand-in)."""
    more = {"ckpt": {"every": 1}, "eval": {"at_start": False, "at_end": False}}
    whole = train(tmp_path / "whole", "cpu", **more)
    cut = {**more, "warmup": {"steps": 1, "batch_size": 4}, "steps": 0}
    train(tmp_path / "cut", "cpu", **cut)
    config = resolve({**RUN, **more, "model": {"device": "meta"}})
    with stand_in_accelerator():
        run(config, tmp_path / "cut", resume=True)
    resumed = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in whole], rel=1e-5, abs=1e-8)
    # the RL step's loss is ~0 (advantages sum to 0): the weights show that the resumed run started from
    # the checkpoint (not from the model it was first loaded with: the warm-up moved every weight ~lr)
    ends = [checkpoint.load(checkpoint.latest(tmp_path / d))["model"] for d in ("whole", "cut")]
    assert max(float((ends[0][k] - ends[1][k]).abs().max()) for k in ends[0]) < 1e-5


MECHANISMS = {  # one family per mechanism: builder module, family
    "moe_grouped_gemm": ("test_models_families", "glm4_moe"),
    "mla_dsa": ("test_models_families", "glm_moe_dsa"),
    "sinks_sliding_window": ("test_models_families", "gpt_oss"),
    "recurrent_hybrid": ("test_models_hybrid", "qwen3_next"),
    "mamba2_hybrid": ("test_models_hybrid", "nemotron_h"),
}


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_each_mechanism_trains_on_the_device(mechanism, tmp_path):
    """A packed-row forward and backward through the fused loss, the model loaded onto the device:
    log-probs and gradients equal the CPU model's (every tensor the layers make follows the device)."""
    import importlib

    from vf.models import load_model
    from vf.trainer.step import PolicyLogprobs

    module, family = MECHANISMS[mechanism]
    builders = importlib.import_module(module)
    (builders.build_family if hasattr(builders, "build_family") else builders.build_hybrid)(family, tmp_path)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(10), torch.arange(14)]).expand(2, 24)  # two documents per row

    def grads(device):
        model = load_model(tmp_path, device=device, moe_impl="grouped" if "moe" in mechanism else None)
        policy = PolicyLogprobs(model, fused_loss=False)
        logp = policy(ids.to(device), pos.to(device), ids.roll(-1, 1).to(device))
        logp.sum().backward()
        return logp.detach().cpu(), {k: p.grad.cpu() for k, p in model.named_parameters() if p.grad is not None}

    ref_logp, ref = grads("cpu")
    with stand_in_accelerator() as device:
        logp, got = grads(device)
    assert (logp - ref_logp).abs().max() < 1e-5
    assert got.keys() == ref.keys()
    assert max(float((got[k] - ref[k]).abs().max()) for k in ref) < 1e-5
