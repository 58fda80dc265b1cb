"""SFT: masked negative log-likelihood of the target tokens.

    ℓ_t = −logπ_t

Detach rule: none; ∂ℓ_t/∂logπ_t = −1 on every valid loss token. `inference_logprobs` and
`advantages` are ignored (SFT data need not have them), so the ratio metrics read r = 1.
A token whose trainer log-prob is NaN/inf is dropped and counted in `num_invalid_tokens`.

Normalisation: `loss` is the SUM of ℓ_t over valid loss tokens; the training loop divides by the
global loss-token count of the step (token-mean NLL over the global batch).

No parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .common import LossOutput, finish, prepare

NAME = "sft"
PER_TOKEN = True  # each ℓ_t depends on logπ_t alone: the trainer fuses it into the LM head
DEFAULTS: dict = {}


def validate(params: dict) -> dict:
    return {}


def loss(logprobs: Tensor, inference_logprobs: Tensor | None, advantages: Tensor | None,
         loss_mask: Tensor) -> LossOutput:
    p = prepare(logprobs, None, None, loss_mask, needs_inference=False)
    return finish(p, -p.logp, p.mask, torch.zeros_like(p.mask))
