"""Building blocks: RMSNorm, rotary embedding (default, llama3 and yarn scaling; partial rotary),
attention, gated MLP.

Shape legend: B batch, T tokens, H hidden, nh query heads, nkv kv heads, hd head_dim,
I intermediate size, S key length (cache), P = nh*hd + 2*nkv*hd (fused qkv width).
Native layout: q/k/v fused in `qkv_proj` [P, H] (rows: q, then k, then v); gate/up fused in
`gate_up_proj` [2I, H] (rows: gate, then up).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in fp32 and cast back (as transformers does)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_attention_factor(config: ModelConfig) -> float:
    """Factor yarn applies to cos/sin (1 for other rope types), as transformers computes it."""
    s = config.rope_scaling
    if not s or s.get("rope_type") != "yarn":
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor, mscale, mscale_all = s["factor"], s.get("mscale"), s.get("mscale_all_dim")
    if mscale and mscale_all:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
    return _yarn_mscale(factor)


def _yarn_inv_freq(config: ModelConfig, dim: int, device) -> torch.Tensor:
    """YaRN (arXiv 2309.00071): interpolate the low frequencies by `factor`, keep the high ones,
    with a linear ramp between the correction dims of beta_fast and beta_slow rotations."""
    s, base = config.rope_scaling, config.rope_theta
    factor, old_ctx = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(old_ctx / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(device)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_inv_freq(config: ModelConfig, device=None) -> torch.Tensor:
    """Inverse frequencies [rotary_dim/2]; llama3 scaling rescales the low frequencies and smooths
    the middle band; yarn see `_yarn_inv_freq`."""
    dim = config.rotary_dim
    s = config.rope_scaling
    if s and s.get("rope_type") == "yarn":
        return _yarn_inv_freq(config, dim, device)
    inv_freq = 1.0 / (
        config.rope_theta
        ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim)
    )
    if not s or s.get("rope_type", "default") == "default":
        return inv_freq
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / lo, old_ctx / hi
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    """cos/sin tables [B, T, rd] (rd = config.rotary_dim) for given position_ids [B, T] (computed in
    fp32, times yarn's attention factor, cast to the activations)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self._inv_freq: torch.Tensor | None = None  # lazily built on the activations' device

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self._inv_freq is None or self._inv_freq.device != position_ids.device:
            self._inv_freq = rope_inv_freq(self.config, position_ids.device)
        freqs = position_ids[..., None].float() * self._inv_freq  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, rd]
        cos, sin = emb.cos(), emb.sin()
        factor = rope_attention_factor(self.config)
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, hd]; cos/sin [B, T, rd]. Half-split rotation (HF `rotate_half` convention) of
    the first rd dims; the rest pass through (partial rotary)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rd], cos[:, 0], sin[:, 0]), x[..., rd:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Fused-qkv GQA attention with optional q/k RMSNorm (Qwen3). Without a cache it runs
    `F.scaled_dot_product_attention` with `mask` (None = plain causal); with a cache it hands
    q [B,nh,T,hd], k/v [B,nkv,T,hd] to `cache.attend(layer_idx, q, k, v)`, which stores k/v, repeats kv
    heads for GQA itself and returns [B,nh,T,hd]."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.nh, self.nkv, self.hd = config.num_heads, config.num_kv_heads, config.head_dim
        self.qkv_proj = nn.Linear(
            config.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(self.nh * self.hd, config.hidden_size, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # x [B, T, H] -> [B, T, H]
        B, T, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            out = cache.attend(self.layer_idx, q, k, v)
        else:
            out = sdpa(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))

    def project(self, x, cos, sin):
        """x [B, T, H] -> q [B, nh, T, hd], k/v [B, nkv, T, hd] (q/k-norm and rope applied)."""
        B, T, _ = x.shape
        qkv = self.qkv_proj(x)  # [B, T, P]
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(B, T, self.nh, self.hd)
        k = k.view(B, T, self.nkv, self.hd)
        v = v.view(B, T, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)  # [B, nh, T, hd]
        k = apply_rope(k.transpose(1, 2), cos, sin)  # [B, nkv, T, hd]
        return q, k, v


def sdpa(q, k, v, mask=None):
    """q [B,nh,T,hd], k/v [B,nkv,S,hd], mask None (causal, T == S) or bool [B|1,1,T,S] (True = attend)."""
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) with gate/up fused in `gate_up_proj` [2I, H]."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x):  # [..., H] -> [..., H]
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
