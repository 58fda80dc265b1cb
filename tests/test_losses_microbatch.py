"""Micro-batch invariance (docs/losses.md): Σ micro-batch `.loss` / global token count equals the
single-batch value, gives the same gradient, and `reduce_metrics` gives the same metrics."""

import math

import pytest
import torch
from vf.trainer import losses
from vf.trainer.losses import reduce_metrics


def batch(seed=0, n=60):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, generator=g) * 3.0
    logmu = logp + torch.randn(n, generator=g) * 0.4  # ratios roughly in [0.3, 3]
    adv = torch.randn(n, generator=g)
    mask = torch.rand(n, generator=g) > 0.25
    logmu[7] = float("nan")  # one invalid token too
    return logp, logmu, adv, mask


@pytest.mark.parametrize("name", losses.BUILTINS)
def test_three_micro_batches_match_one_batch(name):
    logp, logmu, adv, mask = batch()
    fn = losses.get(name)
    params = {"ipo": {"kl_tau": 1e-2}}.get(name, {})
    n_global = losses.loss_token_mask(None if name == "sft" else logmu, mask).sum()

    whole = logp.clone().requires_grad_(True)
    out = fn(whole, logmu, adv, mask, **params)
    (out.loss / n_global).backward()

    split = logp.clone().requires_grad_(True)
    outs = []
    for sl in (slice(0, 17), slice(17, 41), slice(41, None)):  # uneven sizes
        o = fn(split[sl], logmu[sl], adv[sl], mask[sl], **params)
        (o.loss / n_global).backward()
        outs.append(o)
    total = sum(o.loss.item() for o in outs) / n_global.item()

    assert math.isclose(total, out.loss.item() / n_global.item(), rel_tol=1e-5, abs_tol=1e-7)
    torch.testing.assert_close(split.grad, whole.grad, rtol=1e-6, atol=1e-7)
    one, many = out.metrics, reduce_metrics(outs)
    assert one.keys() == many.keys()
    for k in one:
        if math.isnan(one[k]):
            assert math.isnan(many[k]), k
        else:
            assert math.isclose(one[k], many[k], rel_tol=1e-5, abs_tol=1e-7), (k, one[k], many[k])
    assert many["num_loss_tokens"] == n_global.item()
    assert many["num_invalid_tokens"] == (1 if name != "sft" else 0) * int(mask[7])
