"""Batched token sampling by inverse CDF, one uniform per row.

Shape legend: N active rows, V vocab.
    sample(logits [N,V] fp32, params: RowParams, uniforms [N]) -> (tokens [N] int64, logprobs [N] fp32)

Per row: temperature T (<= 0 means greedy), top_k (0 = off), top_p (1 = off), min_p (0 = off).
Reported log-prob = log_softmax(logits / T) at the chosen token, over the *full* (untruncated)
distribution, so it equals what the trainer computes; greedy rows report T = 1.

Why inverse CDF: `torch.multinomial` is ~20x slower on CPU at batch 16 x 32k vocab than
`cumsum` + `searchsorted` with one uniform per row. `searchsorted(..., right=True)` returns the
first index whose cumulative mass exceeds u, so zero-probability tokens are never chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowParams:
    """Per-row sampling parameters as tensors (all [N]) plus flags that let the hot path skip work."""

    temperature: torch.Tensor  # fp32
    top_k: torch.Tensor  # int64
    top_p: torch.Tensor  # fp32
    min_p: torch.Tensor  # fp32
    any_greedy: bool
    all_greedy: bool
    any_truncation: bool


def make_params(temps: list[float], top_k: list[int], top_p: list[float], min_p: list[float],
                device="cpu") -> RowParams:
    t = torch.tensor(temps, dtype=torch.float32, device=device)
    k = torch.tensor(top_k, dtype=torch.int64, device=device)
    p = torch.tensor(top_p, dtype=torch.float32, device=device)
    m = torch.tensor(min_p, dtype=torch.float32, device=device)
    greedy = [x <= 0 for x in temps]
    trunc = any(kk > 0 for kk in top_k) or any(pp < 1.0 for pp in top_p) or any(mm > 0 for mm in min_p)
    return RowParams(t, k, p, m, any(greedy), all(greedy) and len(greedy) > 0, trunc)


def sample(logits: torch.Tensor, params: RowParams, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits.float()
    t = params.temperature
    if params.all_greedy:
        tokens = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
        return tokens, logp.gather(1, tokens[:, None])[:, 0]
    t_eff = torch.where(t > 0, t, torch.ones_like(t))
    logp = torch.log_softmax(logits / t_eff[:, None], dim=-1)  # [N, V]
    probs = logp.exp()
    if params.any_truncation:
        tokens = _sample_truncated(probs, params, uniforms)
    else:
        cdf = probs.cumsum(dim=-1)
        u = (uniforms * cdf[:, -1]).unsqueeze(1)
        tokens = torch.searchsorted(cdf, u, right=True)[:, 0].clamp_(max=probs.shape[1] - 1)
    if params.any_greedy:
        tokens = torch.where(t > 0, tokens, logits.argmax(dim=-1))
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def _sample_truncated(probs: torch.Tensor, params: RowParams, uniforms: torch.Tensor) -> torch.Tensor:
    """Sample in descending-probability order after zeroing what top-k / top-p / min-p exclude."""
    sorted_p, order = probs.sort(dim=-1, descending=True)  # [N, V]
    V = probs.shape[1]
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    rank = torch.arange(V, device=probs.device)[None, :]
    k = params.top_k
    keep &= (k[:, None] <= 0) | (rank < k[:, None])
    # top-p: keep the smallest prefix whose mass reaches p (mass *before* a token must be < p)
    before = sorted_p.cumsum(dim=-1) - sorted_p
    keep &= before < params.top_p[:, None]
    keep &= sorted_p >= params.min_p[:, None] * sorted_p[:, :1]
    keep[:, 0] = True  # the most likely token always survives
    masked = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    cdf = masked.cumsum(dim=-1)
    u = (uniforms * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, u, right=True).clamp_(max=V - 1)  # [N, 1]
    return order.gather(1, idx)[:, 0]
