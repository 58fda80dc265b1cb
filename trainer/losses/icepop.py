"""IcePop: importance-weighted policy gradient with a two-sided ratio mask (INTELLECT-3 form).

    r_t    = exp(logπ_t − logμ_t)                              (anchor: inference policy μ)
    keep_t = 1[ low ≤ r_t ≤ high ]                             (no grad; inclusive band)
    ℓ_t    = −keep_t · A_t · r_t

Detach rule: r is NOT detached inside the band, so ∂ℓ_t/∂logπ_t = −keep_t·A_t·r_t; the mask
decision carries no gradient. The band test runs in log space and masked tokens' log-ratio is
replaced by 0 before the exp, so an out-of-band r that overflows never produces 0·inf = NaN.
No PPO clip, no KL term.

Normalisation: `loss` is the SUM of ℓ_t over valid loss tokens; the training loop divides by the
global loss-token count of the step.

Defaults: low = 0.5, high = 5.0 (ratio space). Extra metrics: `masked_fraction_low` (r < low),
`masked_fraction_high` (r > high). Definitions: docs/losses.md
(Ring-1T arXiv 2510.18855; INTELLECT-3 arXiv 2512.16144 eq. 1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .common import LossConfigError, LossOutput, Stat, check_range, finish, masked_stats, prepare

NAME = "icepop"
PER_TOKEN = True  # each ℓ_t depends on logπ_t alone: the trainer fuses it into the LM head
DEFAULTS = {"low": 0.5, "high": 5.0}


def validate(params: dict) -> dict:
    low = check_range("icepop.low", params["low"], low=0.0)
    high = check_range("icepop.high", params["high"], low=0.0, low_open=True)
    if low >= high:
        raise LossConfigError(f"icepop needs low < high, got low={low:g}, high={high:g}",
                              hint="the kept band is low ≤ r ≤ high, e.g. low=0.5, high=5.0")
    return {"low": low, "high": high}


def loss(logprobs: Tensor, inference_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor, *,
         low: float = 0.5, high: float = 5.0) -> LossOutput:
    low, high = validate({"low": low, "high": high}).values()
    p = prepare(logprobs, inference_logprobs, advantages, loss_mask)
    with torch.no_grad():
        lr = p.log_ratio.detach()
        too_low = lr < (math.log(low) if low > 0 else -math.inf)
        too_high = lr > math.log(high)
        keep = p.mask & ~too_low & ~too_high
    ratio = torch.exp(torch.where(keep, p.log_ratio, torch.zeros_like(p.log_ratio)))
    per_token = torch.where(keep, -p.adv * ratio, torch.zeros_like(ratio))
    with torch.no_grad():
        k3 = torch.exp(lr) - lr - 1.0
        extra = {
            "masked_fraction_low": Stat((too_low & p.mask).sum(), p.mask.sum(), "mean"),
            "masked_fraction_high": Stat((too_high & p.mask).sum(), p.mask.sum(), "mean"),
            **masked_stats("masked_mismatch_kl", k3, p.mask & ~keep),
            **masked_stats("unmasked_mismatch_kl", k3, keep),
        }
    return finish(p, per_token, keep, ~keep, extra)
