"""Manifold-constrained hyper-connections (mHC, DeepSeek-V4): the residual is n = hc_mult parallel
streams instead of one, mixed in and out of every attention / MLP block by weights computed from the
streams themselves.

Shape legend: B batch, T tokens, n hc_mult streams, H hidden. The residual h is [B, T, n, H]; the
embeddings enter as n copies (`expand`), and `HyperHead` collapses the streams before the final norm.
Per block (transformers' DeepseekV4HyperConnection; all weights computed in fp32):
  f = rmsnorm(flatten(h)) · fnᵀ               f [B, T, (2+n)·n], rmsnorm without weight, eps rms_norm_eps
  pre  = sigmoid(f_pre · scale0 + base_pre) + eps                 [B, T, n]
  post = 2 · sigmoid(f_post · scale1 + base_post)                 [B, T, n]
  comb = Sinkhorn(softmax(f_comb · scale2 + base_comb) + eps)     [B, T, n, n], rows then columns
         normalised `hc_sinkhorn_iters` times (first a column pass): close to doubly stochastic
  block input  x = Σ_j pre_j · h_j
  new streams  h'_k = post_k · block(x) + Σ_j comb[j, k] · h_j
Parameters (native `layers.{i}.attn_hc.*` / `layers.{i}.mlp_hc.*` = HF `model.layers.{i}.hc_attn_*` /
`hc_ffn_*`): fn [(2+n)·n, n·H], base [(2+n)·n], scale [3]; the head (`hc_head.*` = HF
`model.hc_head.hc_*`): fn [n, n·H], base [n], scale [1].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


def expand(x: torch.Tensor, n: int) -> torch.Tensor:
    """[B, T, H] -> the n residual streams [B, T, n, H] (copies)."""
    return x.unsqueeze(2).expand(-1, -1, n, -1).contiguous()


class HyperConnection(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        n = self.n = config.hc_mult
        self.iters, self.eps, self.norm_eps = config.hc_sinkhorn_iters, config.hc_eps, config.rms_norm_eps
        self.fn = nn.Parameter(torch.empty((2 + n) * n, n * config.hidden_size))
        self.base = nn.Parameter(torch.empty((2 + n) * n))
        self.scale = nn.Parameter(torch.empty(3))

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h [B, T, n, H] -> (block input [B, T, H], post [B, T, n] fp32, comb [B, T, n, n] fp32)."""
        n = self.n
        flat = unweighted_rms_norm(h.flatten(2).float(), self.norm_eps)
        pre_w, post_w, comb_w = F.linear(flat, self.fn.float()).split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.float().split([n, n, n * n])
        pre_s, post_s, comb_s = self.scale.float().unbind(0)
        pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.eps
        post = 2 * torch.sigmoid(post_w * post_s + post_b)
        comb = torch.softmax(comb_w.unflatten(-1, (n, n)) * comb_s + comb_b.view(n, n), dim=-1) + self.eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        x = (pre.unsqueeze(-1) * h).sum(dim=2).to(h.dtype)
        return x, post, comb

    @staticmethod
    def merge(h: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """The new streams from the old ones h [B, T, n, H] and the block's output [B, T, H]."""
        dtype = h.dtype
        return post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.to(dtype).transpose(-1, -2), h)


class HyperHead(nn.Module):
    """The final collapse of the streams: Σ_j (sigmoid(f_j · scale + base_j) + eps) · h_j."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        n = config.hc_mult
        self.eps, self.norm_eps = config.hc_eps, config.rms_norm_eps
        self.fn = nn.Parameter(torch.empty(n, n * config.hidden_size))
        self.base = nn.Parameter(torch.empty(n))
        self.scale = nn.Parameter(torch.empty(1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, T, n, H] -> [B, T, H]
        flat = unweighted_rms_norm(h.flatten(2).float(), self.norm_eps)
        pre = torch.sigmoid(F.linear(flat, self.fn.float()) * self.scale.float() + self.base.float()) + self.eps
        return (pre.unsqueeze(-1) * h).sum(dim=2).to(h.dtype)
