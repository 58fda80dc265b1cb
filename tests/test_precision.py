"""Mixed precision (trainer/precision.py): bf16 compute over fp32 master weights, gradients and
optimizer state. The bf16 run's weight update follows the fp32 run's at lr 1e-5; pure bf16 (the
only bf16 before issue 31) loses most of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from vf.models import load_model
from vf.models.tiny import builtin_model_path
from vf.trainer import checkpoint, precision
from vf.trainer.config import resolve
from vf.trainer.loop import run

from vf.errors import ConfigError

STEPS = 12


def train(out: Path, dtype: str, master: str) -> tuple[dict, list[dict]]:
    """STEPS SFT steps on reverse-text's gold replies at lr 1e-5 (deterministic)."""
    out.mkdir()
    config = resolve({"model": {"dtype": dtype, "master_dtype": master}, "steps": 0, "seed": 3,
                      "warmup": {"steps": STEPS, "batch_size": 4, "lr": 1e-5}, "optim": {"lr": 1e-5},
                      "eval": {"at_start": False, "at_end": False}, "ckpt": {"every": 0},
                      "trainer": {"micro_batch_size": 2, "seq_len": 64}, "async": {"deterministic": True}})
    run(config, out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return checkpoint.load(checkpoint.latest(out))["model"], rows


def update(state: dict, start: dict) -> torch.Tensor:
    return torch.cat([(state[k].double() - start[k].double()).flatten() for k in start])


def test_bf16_with_fp32_masters_follows_the_fp32_update(tmp_path):
    start = load_model(builtin_model_path("tiny-random")).state_dict()
    ref_state, ref_rows = train(tmp_path / "fp32", "float32", "float32")
    mixed_state, mixed_rows = train(tmp_path / "mixed", "bfloat16", "float32")
    pure_state, pure_rows = train(tmp_path / "pure", "bfloat16", "bfloat16")
    ref, mixed = update(ref_state, start), update(mixed_state, start)
    pure = update(pure_state, {k: v.bfloat16() for k, v in start.items()})  # from the weights it started with
    cos = float(ref @ mixed / ref.norm() / mixed.norm())
    assert cos > 0.99 and 0.95 < float(mixed.norm() / ref.norm()) < 1.05  # measured: 0.9999, 1.000
    assert float((mixed != 0).double().mean()) > 0.99  # every weight moves
    assert float(ref @ pure / ref.norm() / pure.norm()) < 0.6  # pure bf16: measured 0.31
    assert all(v.dtype == torch.float32 for v in mixed_state.values())  # the checkpoint keeps the masters
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(ref_rows, mixed_rows)) < 5e-3
    # memory per parameter: fp32 AdamW 16 B; + the bf16 compute copy 18 B; pure bf16 8 B
    assert [r[0]["mem_bytes_per_param"] for r in (ref_rows, mixed_rows, pure_rows)] == [16.0, 18.0, 8.0]


def test_micro_batches_accumulate_in_fp32():
    """Two backward passes: the master's gradient is the fp32 sum of the two bf16 gradients (a bf16
    accumulator would round it), the bf16 gradient is freed as it arrives, and a gradient added by
    hand after backward (the tied embedding's rows) is swept in by `collect`."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64, bias=False)
    masters = precision.MasterWeights(layer, torch.bfloat16)
    (master,) = masters.parameters()
    assert layer.weight.dtype == torch.bfloat16 and master.dtype == torch.float32
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    for scale in (1.0, 1e-3):
        (layer(x * scale).float().pow(2).sum()).backward()
        assert layer.weight.grad is None  # freed as soon as it reached the master
    g1 = torch.autograd.grad(layer(x).float().pow(2).sum(), layer.weight)[0].float()
    g2 = torch.autograd.grad(layer(x * 1e-3).float().pow(2).sum(), layer.weight)[0].float()
    assert torch.equal(master.grad, g1 + g2)
    assert not torch.equal((g1.bfloat16() + g2.bfloat16()).float(), g1 + g2)  # what bf16 accumulation loses
    layer.weight.grad = torch.ones_like(layer.weight)
    masters.collect()
    assert layer.weight.grad is None and torch.equal(master.grad, g1 + g2 + 1)
    with torch.no_grad():
        master.add_(1e-4)  # below bf16's resolution for most weights: only the master keeps it
    masters.sync()
    assert torch.equal(layer.weight, master.bfloat16())


def test_master_dtype_narrower_than_compute_is_refused():
    with pytest.raises(ConfigError, match="master_dtype bfloat16 is narrower"):
        resolve({"model": {"dtype": "float32", "master_dtype": "bfloat16"}})
    with pytest.raises(ConfigError, match="master_dtype float16 with model.dtype bfloat16"):
        resolve({"model": {"dtype": "bfloat16", "master_dtype": "float16"}})


def test_tf32_is_set_for_cuda_and_left_alone_on_cpu():
    before = torch.get_float32_matmul_precision()
    try:
        precision.configure_matmul("cpu", True)
        assert torch.get_float32_matmul_precision() == before
        precision.configure_matmul("cuda:0", True)
        assert torch.get_float32_matmul_precision() == "high"
        precision.configure_matmul("cuda", False)
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)
