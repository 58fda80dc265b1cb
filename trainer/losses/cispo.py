"""CISPO: clipped, detached importance weight times log-probability (MiniMax-M1, arXiv 2506.13585).

    r_t = exp(logπ_t − logμ_t)                                 (anchor: inference policy μ)
    w_t = sg( clip(r_t, 1 − eps_low, 1 + eps_high) )           (stop-gradient)
    ℓ_t = −w_t · A_t · logπ_t

Detach rule: the weight is detached, so ∂ℓ_t/∂logπ_t = −clip(r_t)·A_t for EVERY loss token,
including tokens whose r lies outside the interval (unlike PPO, which zeroes their gradient).
Nothing is masked: `masked_fraction` is always 0; `clip_fraction` is the fraction of tokens whose
weight was clipped (r outside the interval).

Normalisation: `loss` is the SUM of ℓ_t over valid loss tokens; the training loop divides by the
global loss-token count of the step (token mean, as in the paper).

Defaults: eps_low = 1.0, eps_high = 4.0, both deltas from 1: the effective interval is [0, 5]
(lower bound effectively off, as MiniMax tuned only the upper one). Mind the unit pitfall across
frameworks (docs/losses.md, CISPO): the tests assert the interval.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import LossOutput, Stat, check_range, finish, prepare

NAME = "cispo"
PER_TOKEN = True  # each ℓ_t depends on logπ_t alone: the trainer fuses it into the LM head
DEFAULTS = {"eps_low": 1.0, "eps_high": 4.0}


def validate(params: dict) -> dict:
    return {
        "eps_low": check_range("cispo.eps_low", params["eps_low"], low=0.0),
        "eps_high": check_range("cispo.eps_high", params["eps_high"], low=0.0),
    }


def loss(logprobs: Tensor, inference_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor, *,
         eps_low: float = 1.0, eps_high: float = 4.0) -> LossOutput:
    eps_low, eps_high = validate({"eps_low": eps_low, "eps_high": eps_high}).values()
    p = prepare(logprobs, inference_logprobs, advantages, loss_mask)
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    with torch.no_grad():
        r = torch.exp(p.log_ratio.detach())
        weight = r.clamp(min=lo, max=hi)
        out_of_band = p.mask & ((r < lo) | (r > hi))
    per_token = -weight * p.adv * p.logp
    extra = {"clip_fraction": Stat(out_of_band.sum(), p.mask.sum(), "mean")}
    return finish(p, per_token, p.mask, torch.zeros_like(p.mask), extra)
