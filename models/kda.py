"""Kimi Delta Attention (KDA) as GLM-5.3 runs it (transformers' Glm5NextTextLinearAttention): the gated
delta rule of deltanet.py with one decay per key channel instead of one per head, a low-rank forget
gate and a sigmoid-gated output norm. The chunked / recurrent kernels, the short convolution and the
packed-document layout are deltanet.py's and recurrent.py's.

Shape legend: B batch, T tokens, H hidden, nh heads, d head dim (keys = values), D = nh·d, K conv kernel.
Parameters (native names under `layers.{i}.attn.`, HF `...self_attn.*`):
  q_proj, k_proj, v_proj [D, H]      conv_weight [3D, 1, K]  depthwise causal conv over q, k, v + SiLU
                                     (HF q_conv1d / k_conv1d / v_conv1d, concatenated)
  f_a_proj [d, H], f_b_proj [D, d]   forget gate f = f_b(f_a(x)) + dt_bias  [nh, d]
  dt_bias [D], A_log [nh]            g = lower_bound · sigmoid(exp(A_log) · f)   (linear_lower_bound set)
                                       = -exp(A_log) · softplus(f)              (linear_lower_bound null)
  b_proj [nh, H]                     beta = sigmoid(b_proj(x))
  g_a_proj [d, H], g_b_proj [D, d]   output gate;  o_norm.weight [d]: rmsnorm(o) · w · sigmoid(gate)
  o_proj [H, D]
Per head (state S [d, d] fp32, q and k L2-normalised, q scaled by d^-1/2):
  S = diag(exp(g_t)) S;  S = S + k (beta (v - Sᵀk))ᵀ;  o = Sᵀq
Engine cache: the conv's last K-1 inputs and S (`state_shapes`), as the gated DeltaNet's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig
from vf.models.deltanet import GatedRMSNorm, delta_scan
from vf.models.layers import Documents, refuse_context_parallel
from vf.models.recurrent import causal_conv


class KimiDeltaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        H, nh, d = config.hidden_size, config.linear_num_key_heads, config.linear_key_head_dim
        self.nh, self.d, D = nh, d, nh * d
        self.lower_bound = config.linear_lower_bound
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(H, D, bias=False) for _ in range(3))
        self.conv_weight = nn.Parameter(torch.empty(3 * D, 1, config.linear_conv_kernel))
        self.f_a_proj = nn.Linear(H, d, bias=False)
        self.f_b_proj = nn.Linear(d, D, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(D))
        self.A_log = nn.Parameter(torch.empty(nh))
        self.b_proj = nn.Linear(H, nh, bias=False)
        self.g_a_proj = nn.Linear(H, d, bias=False)
        self.g_b_proj = nn.Linear(d, D, bias=False)
        self.o_norm = GatedRMSNorm(d, config.rms_norm_eps, act="sigmoid")
        self.o_proj = nn.Linear(D, H, bias=False)

    def state_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype | None]]:
        """Per-row cache state: the conv's last K-1 inputs (model dtype) and S per head (fp32)."""
        return [((self.conv_weight.shape[0], self.conv_weight.shape[-1] - 1), None),
                ((self.nh, self.d, self.d), torch.float32)]

    def decay(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] -> log decay g [B, T, nh, d] fp32 (<= 0)."""
        f = (self.f_b_proj(self.f_a_proj(x)).float() + self.dt_bias.float()).unflatten(-1, (self.nh, self.d))
        rate = self.A_log.float().exp()[:, None]
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(rate * f)
        return -rate * F.softplus(f)

    def forward(self, x, cos=None, sin=None, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        refuse_context_parallel(mask, "Kimi Delta Attention (KDA)")
        B, T, _ = x.shape
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        state = cache.get_state(self.layer_idx) if cache is not None else None
        lengths = getattr(cache, "valid_lengths", None) if cache is not None else None
        docs = mask if isinstance(mask, Documents) and not mask.single and cache is None else None
        mixed, conv_state = causal_conv(mixed, self.conv_weight, None, None if docs is None else docs.spans,
                                        None if state is None else state[0], lengths)
        q, k, v = (t.reshape(B, T, self.nh, self.d) for t in mixed.split(self.nh * self.d, dim=-1))
        g, beta = self.decay(x), torch.sigmoid(self.b_proj(x))
        out, S = delta_scan(q, k, v, g, beta, None if state is None else state[1], docs, lengths)
        if cache is not None:
            cache.set_state(self.layer_idx, conv_state, S)
        gate = self.g_b_proj(self.g_a_proj(x)).reshape(B, T, self.nh, self.d)
        return self.o_proj(self.o_norm(out, gate).reshape(B, T, self.nh * self.d))
