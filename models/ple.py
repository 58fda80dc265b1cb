"""Per-layer embeddings (PLE) of Qwen3.8 Flash Next (transformers' `Qwen4ExpTextPLELayer`): each PLE
layer looks up its hashed n-gram embedding (models/ngram_embedding.py) and injects it into every
residual stream through a stream-wise gate and a dilated depthwise convolution.

Shape legend: B batch, T tokens, n streams (hc_count), H hidden, E ple_embed_dim, K ple_conv_kernel,
d = ngram_size (the conv's dilation), S = (K-1)·d conv state, C = ngram_size - 1 tokens of history.
  e    = ngram(input_ids)                                  [B, T, E]
  key  = norm_key(key_proj(e))   [B, T, n, H]      value = value_proj(e)   [B, T, H]
  g    = <key_k, norm_query(h)_k> / sqrt(H);  g = sign(g) · sqrt(max(|g|, 1e-6))      per stream k
  u_k  = sigmoid(g_k) · value                              [B, T, n·H]
  out  = u + silu(conv_dilated(norm_conv(u)))              added to the streams h [B, T, n·H]
The norms are zero-centred RMSNorms per stream (gated_residual.GroupRMSNorm).
Packed rows (position_ids restart at 0): the n-gram history and the convolution restart at each
document. Engine cache (state under key `state_key`, see `PLE.state_shapes`): the conv's last S
inputs and the last C token ids; a right-padded prefill keeps them as of each row's last real token.
The n-gram tables (`multipliers`, `head_sizes`, `head_offsets`) are derived from the config, never
loaded (convert.py checks a checkpoint's copies); they are rebuilt here whenever the module sits on a
new device, since a model built on the meta device and materialised with `to_empty` has no values
for non-persistent buffers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig
from vf.models.gated_residual import GroupRMSNorm
from vf.models.ngram_embedding import (
    NGramEmbedding,
    NGramSpec,
    head_offsets,
    head_vocab_sizes,
    layer_multipliers,
)


def ngram_spec(config: ModelConfig, ple_index: int) -> NGramSpec:
    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    return NGramSpec(vocab_size=config.vocab_size, embed_dim=config.ple_embed_dim or config.hidden_size,
                     eos_token_id=int(eos), layer=ple_index, ngram_size=config.ngram_size,
                     heads_per_ngram=config.heads_per_ngram, vocab_size_base=config.ngram_vocab_size_base,
                     divisible_by=config.ngram_divisible_by, seed=config.ngram_seed)


def derived_tables(spec: NGramSpec) -> dict[str, list[int]]:
    """The n-gram lookup's constant tables, by NGramEmbedding buffer name."""
    sizes = head_vocab_sizes(spec.vocab_size_base, spec.ngram_size, spec.heads_per_ngram, spec.layer)
    return {"multipliers": layer_multipliers(spec.vocab_size, spec.ngram_size, spec.layer, spec.seed),
            "head_sizes": sizes, "head_offsets": head_offsets(sizes)}


# transformers' persistent copies of the n-gram tables (derived from the config: checked, never loaded)
_HF_BUFFERS = {"multipliers": "layer_multipliers", "head_sizes": "ngram_heads_vocab_sizes",
               "head_offsets": "ngram_heads_offsets"}


def hf_buffers(config: ModelConfig) -> dict[str, torch.Tensor]:
    """{HF name below the model prefix: tensor} of every PLE layer's derived tables (the family's
    `derived_tensors`, models/convert.py `derived_hf_tensors`)."""
    out = {}
    for ple_index, layer_id in enumerate(config.ple_layer_ids):
        tables = derived_tables(ngram_spec(config, ple_index))
        for ours, theirs in _HF_BUFFERS.items():
            out[f"layers.{layer_id - 1}.ple.ple_embedding.{theirs}"] = torch.tensor(tables[ours], dtype=torch.long)
    return out


def dilated_conv(x: torch.Tensor, weight: torch.Tensor, dilation: int, spans=None,
                 state: torch.Tensor | None = None, lengths: torch.Tensor | None = None):
    """SiLU(depthwise causal conv with dilation) over time. x [B, T, C], weight [C, 1, K]; `spans`
    (packed rows): each document alone; `state` [B, C, S]: the previous S inputs; `lengths` [B]:
    right-padded rows. Returns (out [B, T, C], new state [B, C, S] or None with spans)."""
    B, _, C = x.shape
    S = (weight.shape[-1] - 1) * dilation
    xt = x.transpose(1, 2)
    if spans is not None:
        out = torch.cat([torch.cat([F.conv1d(F.pad(xt[b:b + 1, :, s:e], (S, 0)), weight, dilation=dilation, groups=C)
                                    for s, e in row], dim=-1) for b, row in enumerate(spans)], dim=0)
        return F.silu(out).transpose(1, 2), None
    prev = state.to(xt.dtype) if state is not None else xt.new_zeros(B, C, S)
    full = torch.cat([prev, xt], dim=-1)  # [B, C, S + T]
    out = F.conv1d(full, weight, dilation=dilation, groups=C)
    return F.silu(out).transpose(1, 2), last_columns(full, S, lengths)


def last_columns(full: torch.Tensor, n: int, lengths: torch.Tensor | None) -> torch.Tensor:
    """full [B, ..., n + T]: its last n columns, or with `lengths` [B] the n ending at each row's
    last real column (n + length - 1)."""
    if lengths is None:
        return full[..., full.shape[-1] - n:]
    idx = lengths.to(torch.int64)[:, None] + torch.arange(n, device=full.device)[None]  # [B, n]
    idx = idx.view(idx.shape[0], *([1] * (full.dim() - 2)), n).expand(*full.shape[:-1], n)
    return full.gather(-1, idx)


class PLE(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, ple_index: int):
        super().__init__()
        n, H = config.hc_mult, config.hidden_size
        E = config.ple_embed_dim or H
        self.n, self.H, self.dilation = n, H, config.ngram_size
        self.state_key = config.num_layers + layer_idx  # its engine-cache slot (the layer's own holds DeltaNet's)
        self.ngram = NGramEmbedding(ngram_spec(config, ple_index))
        self._tables = derived_tables(self.ngram.spec)
        self._tables_on = None  # the device the n-gram tables were last rebuilt on
        self.key_proj = nn.Linear(E, n * H, bias=False)
        self.value_proj = nn.Linear(E, H, bias=False)
        self.norm_key = GroupRMSNorm(n * H, H, config.rms_norm_eps)
        self.norm_query = GroupRMSNorm(n * H, H, config.rms_norm_eps)
        self.norm_conv = GroupRMSNorm(n * H, H, config.rms_norm_eps)
        self.conv_weight = nn.Parameter(torch.empty(n * H, 1, config.ple_conv_kernel))

    def state_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype | None]]:
        C = self.ngram.spec.ngram_size - 1
        return [((self.n * self.H, (self.conv_weight.shape[-1] - 1) * self.dilation), None), ((C,), torch.int64)]

    def _sync_tables(self) -> None:
        device = self.ngram.weight.device
        if self._tables_on != device:
            for name, values in self._tables.items():
                setattr(self.ngram, name, torch.tensor(values, dtype=torch.long, device=device))
            self._tables_on = device

    def forward(self, h, input_ids, position_ids=None, spans=None, cache=None):  # h [B, T, n·H] -> [B, T, n·H]
        self._sync_tables()
        state = cache.get_state(self.state_key) if cache is not None else None
        conv_state, context = state if state is not None else (None, None)
        e = self.ngram(input_ids, position_ids if cache is None else None, context)
        key = self.norm_key(self.key_proj(e)).unflatten(-1, (self.n, self.H))
        query = self.norm_query(h).unflatten(-1, (self.n, self.H))
        g = (key * query).sum(dim=-1, keepdim=True) / math.sqrt(self.H)
        g = g.abs().clamp_min(1e-6).sqrt() * g.sign()
        u = (torch.sigmoid(g) * self.value_proj(e).unsqueeze(-2)).flatten(-2)
        lengths = getattr(cache, "valid_lengths", None) if cache is not None else None
        conv, conv_state = dilated_conv(self.norm_conv(u), self.conv_weight, self.dilation, spans, conv_state, lengths)
        if cache is not None:
            C = self.ngram.spec.ngram_size - 1
            if context is None:
                context = input_ids.new_full((input_ids.shape[0], C), self.ngram.spec.eos_token_id)
            hist = torch.cat([context.to(input_ids.device, torch.long), input_ids.long()], dim=1)
            cache.set_state(self.state_key, conv_state, last_columns(hist, C, lengths))
        return u + conv
