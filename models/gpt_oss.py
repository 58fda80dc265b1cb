"""GPT-OSS attention: learned per-head attention sinks and alternating sliding/full windows.

Shape legend: B batch, T queries, S keys, nh/nkv heads, hd head_dim, W sliding window.
A sink is a logit s_h per head that joins every query's softmax and takes probability mass but
has no value: out = Σ_j softmax([scores, s_h])_j · v_j over the real keys j only. It is computed
exactly with SDPA by appending one zero key and zero value and giving that column the bias s_h
(its score q·0 = 0 plus s_h); the other columns get 0 or −inf from the allowed-keys mask.
Sliding layers (`layer_types[i] == "sliding_attention"`) let a query at position p see keys at
positions > p − W (W keys, itself included), as transformers' `sliding_window_overlay`.

SDPA's boolean masks cannot carry the sinks, so this module builds its float bias itself in
`sink_window_bias`, from position ids (documents of a packed row restart at position 0), from the
KV cache's mask, or under context parallelism from the gathered rows (models/context_parallel.py);
the model-level `mask` argument is otherwise not used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig
from vf.models.layers import Attention, ShardedMask


def sink_window_bias(
    position_ids: torch.Tensor, allowed: torch.Tensor | None, S: int, window: int | None, sinks: torch.Tensor,
    key_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float attention bias [B, nh, T, S + 1] for keys 0..S-1 plus the sink column.

    position_ids [B, T]: the queries' positions. `allowed` [B|1, 1, T, S] bool from the KV cache
    (key j sits at absolute position j) or from context parallelism (with the whole rows'
    `key_positions` [B, S]), or None: then T == S and the keys are the queries themselves,
    attending causally within their document (a document starts where position_ids == 0).
    """
    B, T = position_ids.shape
    dev = position_ids.device
    if allowed is None:
        doc = torch.cumsum((position_ids == 0).to(torch.int32), dim=1)  # [B, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        allowed = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]  # [B, 1, T, T]
        key_pos = position_ids[:, None, None, :]  # same document: position differences are distances
    elif key_positions is not None:
        key_pos = key_positions[:, None, None, :]
    else:
        key_pos = torch.arange(S, device=dev)[None, None, None, :]
    if window is not None:
        allowed = allowed & (key_pos > position_ids[:, None, :, None] - window)
    zero = torch.zeros((), dtype=sinks.dtype, device=dev)
    bias = torch.where(allowed, zero, torch.tensor(float("-inf"), dtype=sinks.dtype, device=dev))
    nh = sinks.shape[0]
    bias = bias.expand(B, nh, T, S)
    return torch.cat((bias, sinks.view(1, nh, 1, 1).expand(B, nh, T, 1)), dim=-1)


class SinkAttention(Attention):
    """The fused-qkv attention of layers.py plus sinks [nh] and an optional sliding window."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.sinks = nn.Parameter(torch.empty(config.num_heads))
        self.window = config.sliding_window_for(layer_idx)

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        B, T, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        allowed = key_positions = None
        if isinstance(mask, ShardedMask):  # context parallel: this rank's queries over the whole rows' K/V
            (k, v), allowed, key_positions = mask.gather(k, v), mask.visible, mask.key_positions
        if cache is not None:
            (k, v), allowed = cache.store(self.layer_idx, k, v)
            S = k.shape[2]
            if allowed is None:  # a fresh block: causal over itself (keys at positions 0..T-1)
                allowed = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)[None, None]
        S = k.shape[2]
        out = attend_with_sinks(q, k, v, sink_window_bias(position_ids, allowed, S, self.window, self.sinks.to(q.dtype),
                                                                key_positions))
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


def attend_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q [B, nh, T, d], k/v [B, nkv, S, d], bias [B, nh, T, S + 1] from `sink_window_bias` -> [B, nh, T, d]:
    SDPA over the keys plus one zero key/value whose column of the bias is the sink logit."""
    zeros = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[-1])
    return F.scaled_dot_product_attention(q, torch.cat((k, zeros), 2), torch.cat((v, zeros), 2),
                                          attn_mask=bias, enable_gqa=q.shape[1] != k.shape[1])
