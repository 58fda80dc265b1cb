"""Gated residual streams (Qwen3.8 Flash Next, transformers' `Qwen4ExpTextGatedResidual`): the
residual is n = hc_count streams, as in DeepSeek-V4's hyper-connections (hyper_connections.py), but
the mixing is other math: a low-rank sigmoid gate per feature instead of Sinkhorn-normalised
stream mixing, and a zero-centred RMSNorm per stream (with weight) instead of an unweighted one.

Shape legend: B batch, T tokens, n streams, H hidden, r hc_lowrank. The streams travel flat,
h [B, T, n·H] (transformers' layout; the model starts from n copies of the embeddings).
Per block (`GatedResidual`, parameters named as transformers'):
  hn   = hc_norm(h)                  RMSNorm per stream (groups of H), y = x/rms · (1 + w), fp32 inside
  w    = sigmoid(up(silu(down(hn) / n)))                  [B, T, n·H]   down [r, n·H], up [n·H, r]
  x    = mean_k (w_k · hn_k)                              block input [B, T, H]
  inj  = 2 · sigmoid(block_inject(hn) / n)                [B, T, n]     block_inject [n, n·H]
  h'   = h + concat_k (inj_k · block(x))                  (`inject`)
The model's final mixer is the same module without `block_inject` (`combine=False`): it returns x,
which goes straight to the LM head (this family has no final norm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GroupRMSNorm(nn.Module):
    """Zero-centred RMSNorm over groups of `group` features (one per stream): y = x/rms · (1 + w),
    computed in fp32 and cast back (transformers' Qwen4ExpTextRMSNorm with group_size)."""

    def __init__(self, dim: int, group: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.group, self.eps = group, eps
        self.zero_centered = True  # init_weights: zeros

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        g = x.float().unflatten(-1, (-1, self.group))
        g = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)
        return (g * (1.0 + self.weight.float())).to(dtype)


class GatedResidual(nn.Module):
    def __init__(self, n: int, hidden: int, rank: int, eps: float, combine: bool = True):
        super().__init__()
        self.n, self.hidden = n, hidden
        self.hc_norm = GroupRMSNorm(n * hidden, hidden, eps)
        self.input_mix_weight_down = nn.Linear(n * hidden, rank, bias=False)
        self.input_mix_weight_up = nn.Linear(rank, n * hidden, bias=False)
        self.block_inject_weight = nn.Linear(n * hidden, n, bias=False) if combine else None

    def forward(self, h: torch.Tensor):
        """h [B, T, n·H] -> block input x [B, T, H] (and, with combine, the injection weights [B, T, n])."""
        hn = self.hc_norm(h)
        w = torch.sigmoid(self.input_mix_weight_up(F.silu(self.input_mix_weight_down(hn) / self.n)))
        x = (w.unflatten(-1, (self.n, self.hidden)) * hn.unflatten(-1, (self.n, self.hidden))).mean(dim=-2)
        if self.block_inject_weight is None:
            return x
        return x, 2 * torch.sigmoid(self.block_inject_weight(hn) / self.n)

    @staticmethod
    def inject(h: torch.Tensor, out: torch.Tensor, inj: torch.Tensor) -> torch.Tensor:
        """The streams after a block: h [B, T, n·H] plus its output [B, T, H] weighted per stream."""
        return h + (out.unsqueeze(-2) * inj.unsqueeze(-1)).flatten(-2)
