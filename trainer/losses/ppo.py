"""PPO clipped surrogate, anchored on the inference policy.

    r_t = exp(logπ_t − logμ_t)                                 (anchor: inference policy μ)
    ℓ_t = −min( r_t·A_t,  clip(r_t, 1 − eps_low, 1 + eps_high)·A_t )

Equivalently ℓ_t = −A_t·r_t except on *clipped* tokens, (A_t > 0 and r_t > 1 + eps_high) or
(A_t < 0 and r_t < 1 − eps_low), where ℓ_t is the constant −A_t·(1 ± eps) with zero gradient.

Detach rule: nothing is detached explicitly; ∂ℓ_t/∂logπ_t = −A_t·r_t on unclipped tokens and 0 on
clipped ones (the min picks the constant branch). The clipped branch is selected first and its
log-ratio replaced by 0 before the exp, so an overflowing r never becomes 0·inf = NaN.
`masked_fraction` is the fraction of clipped (zero-gradient) tokens.

Normalisation: `loss` is the SUM of ℓ_t over valid loss tokens; the training loop divides by the
global loss-token count of the step. There are no PPO epochs: one optimizer step per batch, so r
only measures train/inference mismatch and staleness.

Defaults: eps_low = 0.2, eps_high = 0.2 (effective band [0.8, 1.2]). Both are deltas from 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import LossOutput, check_range, finish, prepare

NAME = "ppo"
PER_TOKEN = True  # each ℓ_t depends on logπ_t alone: the trainer fuses it into the LM head
DEFAULTS = {"eps_low": 0.2, "eps_high": 0.2}


def validate(params: dict) -> dict:
    return {
        "eps_low": check_range("ppo.eps_low", params["eps_low"], low=0.0),
        "eps_high": check_range("ppo.eps_high", params["eps_high"], low=0.0),
    }


def loss(logprobs: Tensor, inference_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor, *,
         eps_low: float = 0.2, eps_high: float = 0.2) -> LossOutput:
    eps_low, eps_high = validate({"eps_low": eps_low, "eps_high": eps_high}).values()
    p = prepare(logprobs, inference_logprobs, advantages, loss_mask)
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    with torch.no_grad():
        r = torch.exp(p.log_ratio.detach())
        clipped = p.mask & (((p.adv > 0) & (r > hi)) | ((p.adv < 0) & (r < lo)))
        bound = torch.where(p.adv > 0, torch.full_like(r, hi), torch.full_like(r, lo))
    ratio = torch.exp(torch.where(clipped, torch.zeros_like(p.log_ratio), p.log_ratio))
    per_token = -p.adv * torch.where(clipped, bound, ratio)
    return finish(p, per_token, ~clipped, clipped)
