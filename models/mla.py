"""Multi-head latent attention (DeepSeek-V3 family) with a compact latent KV cache.

Shape legend: B batch, T new tokens, S keys, H hidden, nh heads, rq q_lora_rank, rkv kv_lora_rank,
dn qk_nope_head_dim, dr qk_rope_head_dim, dv v_head_dim, dq = dn + dr.
Parameters (native names under `layers.{i}.attn.`):
  qkv_a_proj [rq + rkv + dr, H]   q_a_proj and kv_a_proj_with_mqa fused (both read the hidden state);
                                  without q_lora_rank: q_proj [nh*dq, H] and kv_a_proj [rkv + dr, H]
  q_a_norm [rq], kv_a_norm [rkv]  RMSNorm with eps 1e-6 (transformers' default for these two)
  q_b_proj [nh*dq, rq]            kv_b_proj [nh*(dn + dv), rkv]       o_proj [H, nh*dv]
Per token the layer keeps only the normalised latent c [rkv] and the shared rope key k_r [dr]:
  q = q_b(norm(q_a(x))) -> per head (q_nope [dn], q_rope [dr]);   (c, k_r) = kv_a(x)
  per head (k_nope [dn], v [dv]) = kv_b(norm(c));  k = (k_nope, rope(k_r)) (k_r shared by all heads)
  scores = q·k · softmax_scale (1/sqrt(dq), times yarn's mscale(factor, mscale_all_dim)² when set)
Decoupled rope: only the dr dims rotate. DeepSeek checkpoints lay those dims out as interleaved
pairs (x0, x1), (x2, x3), ... (`rope_interleave`, transformers' `apply_rotary_pos_emb_interleave`);
rotating pairs equals de-interleaving to (x0, x2, ..., x1, x3, ...) and then the half-split
rotation, and q and k are permuted alike, so q·k is unchanged.
The engine cache stores the latent streams [(1, rkv), (1, dr)] (`cache.store`) and expands them
with kv_b each step: rkv + dr numbers per token and layer instead of nh*(dq + dv).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from vf.models.cache import attend_masked
from vf.models.config import ModelConfig
from vf.models.layers import RMSNorm, apply_rope, sdpa

LATENT_NORM_EPS = 1e-6


def softmax_scale(config: ModelConfig) -> float:
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    s = config.rope_scaling or {}
    if s.get("rope_type") == "yarn" and s.get("mscale_all_dim"):
        m = 0.1 * s["mscale_all_dim"] * math.log(s["factor"]) + 1.0 if s["factor"] > 1 else 1.0
        scale *= m * m
    return scale


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[..., d] pairs (x0, x1), (x2, x3), ... -> (x0, x2, ..., x1, x3, ...)."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


class MLAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        H, nh = config.hidden_size, config.num_heads
        self.nh, self.rq, self.rkv = nh, config.q_lora_rank, config.kv_lora_rank
        self.dn, self.dr, self.dv = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.interleave = config.rope_interleave
        dq, bias = self.dn + self.dr, config.attention_bias
        kv_a = self.rkv + self.dr
        if self.rq:
            self.qkv_a_proj = nn.Linear(H, self.rq + kv_a, bias=bias)
            self.q_a_norm = RMSNorm(self.rq, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(self.rq, nh * dq, bias=False)
        else:
            self.q_proj = nn.Linear(H, nh * dq, bias=False)
            self.kv_a_proj = nn.Linear(H, kv_a, bias=bias)
        self.kv_a_norm = RMSNorm(self.rkv, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(self.rkv, nh * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(nh * self.dv, H, bias=bias)
        # sdpa applies 1/sqrt(dq); q is pre-multiplied so the product is the model's softmax scale
        self.q_scale = softmax_scale(config) * math.sqrt(dq)

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        q, _, latent, k_rope = self.project(x, cos, sin)
        if cache is not None:
            (latent, k_rope), mask = cache.store(self.layer_idx, latent, k_rope)
        return self.attend(q, latent, k_rope, mask, causal_none=cache is None)

    def project(self, x, cos, sin):
        """x [B, T, H] -> q [B, nh, T, dq] (roped, pre-scaled), the normed q latent [B, T, rq] (None
        without q_lora_rank), the kv latent [B, 1, T, rkv] and the roped shared key [B, 1, T, dr]."""
        B, T, _ = x.shape
        q_lat = None
        if self.rq:
            q_lat, kv = self.qkv_a_proj(x).split([self.rq, self.rkv + self.dr], dim=-1)
            q_lat = self.q_a_norm(q_lat)
            q = self.q_b_proj(q_lat)
        else:
            q, kv = self.q_proj(x), self.kv_a_proj(x)
        q = q.view(B, T, self.nh, self.dn + self.dr).transpose(1, 2)  # [B, nh, T, dq]
        q_nope, q_rope = q.split([self.dn, self.dr], dim=-1)
        latent, k_rope = kv.split([self.rkv, self.dr], dim=-1)
        latent = self.kv_a_norm(latent)[:, None]  # [B, 1, T, rkv]
        k_rope = k_rope[:, None]  # [B, 1, T, dr]
        if self.interleave:
            q_rope, k_rope = deinterleave(q_rope), deinterleave(k_rope)
        q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1) * self.q_scale
        return q, q_lat, latent, apply_rope(k_rope, cos, sin)

    def attend(self, q, latent, k_rope, mask, causal_none: bool):
        """Expand the stored latents [B, 1, S, *] with kv_b and attend; `mask` None is plain causal
        (`causal_none`: through layers.sdpa, the uncached path), else bool [B|1, 1, T, S]."""
        B, _, T, _ = q.shape
        S = latent.shape[2]
        kv = self.kv_b_proj(latent[:, 0]).view(B, S, self.nh, self.dn + self.dv).transpose(1, 2)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)  # [B, nh, S, dn], [B, nh, S, dv]
        k = torch.cat((k_nope, k_rope.expand(B, self.nh, S, self.dr)), dim=-1)
        out = sdpa(q, k, v, mask) if causal_none else attend_masked(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.dv))
