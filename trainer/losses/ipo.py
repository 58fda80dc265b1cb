"""IPO: importance-weighted policy gradient with a probability-difference trust region (default loss).

    keep_t = 1[ |exp(logπ_t) − exp(logμ_t)| ≤ eps ]            (no grad; independent of sign(A))
    r_t    = exp(logπ_t − logμ_t)                              (anchor: inference policy μ)
    ℓ_t    = −keep_t · A_t · r_t  +  kl_tau · (log r_t)²       (KL term on ALL loss tokens)

Detach rule: r is NOT detached inside the trust region, so ∂ℓ_t/∂logπ_t = −keep_t·A_t·r_t
+ 2·kl_tau·log r_t; the keep decision carries no gradient. Tokens outside the region contribute
nothing to the policy term (their log-ratio is replaced by 0 before the exp, so an overflowing r
can never turn into 0·inf = NaN); they still feel the KL term when kl_tau > 0.

Normalisation: `loss` is the SUM of ℓ_t over valid loss tokens; the training loop divides by the
global loss-token count of the step (token mean over the global batch).

Defaults (`trainer/defaults.py`): eps = 0.3 (absolute probability difference, not a ratio), kl_tau = 0 (KL term off).
Note that a probability-difference region rarely masks rare tokens (p, q ≪ eps) even when r is
huge; `ratio_max` shows it. Definitions: docs/losses.md; history:
prime-rl `ipo_loss_fn` (PRs #1930, #2798, #3418, #3586).
"""

from __future__ import annotations

import torch
from torch import Tensor
from vf.trainer.defaults import IPO_EPS, IPO_KL_TAU

from .common import LossOutput, check_range, finish, masked_stats, prepare

NAME = "ipo"
PER_TOKEN = True  # each ℓ_t depends on logπ_t alone: the trainer fuses it into the LM head
DEFAULTS = {"eps": IPO_EPS, "kl_tau": IPO_KL_TAU}
"""The accepted parameters and their defaults (`trainer/defaults.py`)."""


def validate(params: dict) -> dict:
    return {
        "eps": check_range("ipo.eps", params["eps"], low=0.0, low_open=True),
        "kl_tau": check_range("ipo.kl_tau", params["kl_tau"], low=0.0),
    }


def loss(logprobs: Tensor, inference_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor, *,
         eps: float = IPO_EPS, kl_tau: float = IPO_KL_TAU) -> LossOutput:
    """Validated by its caller (`losses.get("ipo")` checks the parameters with `validate`)."""
    p = prepare(logprobs, inference_logprobs, advantages, loss_mask)
    with torch.no_grad():
        keep = p.mask & ((torch.exp(p.logp) - torch.exp(p.logmu)).abs() <= eps)
    ratio = torch.exp(torch.where(keep, p.log_ratio, torch.zeros_like(p.log_ratio)))
    per_token = torch.where(keep, -p.adv * ratio, torch.zeros_like(ratio))
    if kl_tau > 0:
        per_token = per_token + kl_tau * p.log_ratio.square()
    with torch.no_grad():
        k3 = torch.exp(p.log_ratio) - p.log_ratio - 1.0
        extra = {**masked_stats("masked_mismatch_kl", k3, p.mask & ~keep),
                 **masked_stats("unmasked_mismatch_kl", k3, keep)}
    return finish(p, per_token, keep, ~keep, extra)
