"""DeepSeek-V4's compressed attention branches: a compressor that pools every `rate` tokens into one
key/value entry (HCA: non-overlapping windows; CSA: overlapping ones) and, for CSA, the lightning
indexer that keeps each query's top-k entries.

Shape legend: B batch, T queries, S tokens (keys), d entry dim (head_dim, or index_head_dim for the
indexer's own compressor), m = rate, Nw = S // m windows, rd rotary dims, ni/di index heads / dim.

Compressor (transformers' DeepseekV4HCACompressor / DeepseekV4CSACompressor and the indexer's):
  per token   c = kv_proj(x), z = gate_proj(x)            [S, d] (HCA) or [S, 2d] (CSA: halves Ca | Cb)
  window w    tokens w·m .. w·m+m-1; logits z + position_bias[slot]
  HCA entry   Σ_slots softmax(z)·c over the window's m slots
  CSA entry   the same over 2m slots: window w-1's Ca halves, then window w's Cb halves (window 0
              has no previous window: its Ca slots weigh 0)
  then kv_norm (RMSNorm) and rope at position w·m on the entry's last rd dims (the compress rope)
Entry w holds tokens up to w·m+m-1: query at position p may see it iff w < (p + 1) // m; a row (or a
packed document, or an engine prefill) shorter than m has no entry yet, and attends to its window alone.
Indexer (CSA only): index queries q_i = wq_b(q latent) [ni, di] roped at the query position, index
keys = the indexer compressor's entries, weights w = weights_proj(x) / sqrt(ni);
  score(t, s) = Σ_h w_h(t) · relu(q_i,h(t) · k_s) / sqrt(di)
and query t attends to the top `index_topk` visible entries (all of them while it sees fewer;
dsa.top_k_mask: exact ties go to the earlier entry, torch.topk's order on CUDA). The selection is a
hard, non-differentiable choice, so the indexer's parameters get no gradient (transformers' indexer
returns only the indices) and training leaves them as loaded.

Rope layout (`rope_tail`): DeepSeek-V4 rotates the LAST rd dims of a head, as interleaved pairs
(x0, x1), (x2, x3), ..., with one angle per pair (cos/sin tables of rd/2 columns, `half_rope`).
"""

from __future__ import annotations

import torch
from torch import nn
from vf.models.config import ModelConfig
from vf.models.dsa import top_k_mask
from vf.models.layers import RMSNorm


def half_rope(rotary, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, T, rd/2] (one angle per rotated pair) from a `layers.Rotary`."""
    cos, sin = rotary(position_ids, dtype)
    half = cos.shape[-1] // 2
    return cos[..., :half], sin[..., :half]


def rope_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, h, T, d], cos/sin [B|1, T, rd/2] -> x with its last rd dims rotated as interleaved pairs
    (in fp32, as transformers' DeepSeek-V4 `apply_rotary_pos_emb`); pass -sin to rotate back."""
    c = cos.repeat_interleave(2, dim=-1)[:, None]
    s = sin.repeat_interleave(2, dim=-1)[:, None]
    rd = c.shape[-1]
    nope, r = x[..., : x.shape[-1] - rd], x[..., x.shape[-1] - rd :]
    turned = torch.stack((-r[..., 1::2], r[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat((nope, (r.float() * c + turned.float() * s).to(x.dtype)), dim=-1)


def visible_entries(position_ids: torch.Tensor, n: int, rate: int) -> torch.Tensor:
    """bool [B, T, n]: entry w is complete by query position p (w < (p + 1) // rate)."""
    return torch.arange(n, device=position_ids.device) < ((position_ids + 1) // rate)[..., None]


class Compressor(nn.Module):
    def __init__(self, config: ModelConfig, dim: int, rate: int, overlap: bool):
        super().__init__()
        self.dim, self.rate, self.overlap = dim, rate, overlap
        self.width = 2 * dim if overlap else dim  # per-token projection width
        self.kv_proj = nn.Linear(config.hidden_size, self.width, bias=False)
        self.gate_proj = nn.Linear(config.hidden_size, self.width, bias=False)
        self.position_bias = nn.Parameter(torch.empty(rate, self.width))
        self.kv_norm = RMSNorm(dim, config.rms_norm_eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, H] -> per-token kv and gate logits [B, S, width] (what an engine cache stores)."""
        return self.kv_proj(x), self.gate_proj(x)

    def pool(self, kv: torch.Tensor, gate: torch.Tensor, rotary) -> torch.Tensor:
        """Per-token kv/gate [B, S, width] of tokens 0..S-1 -> the entries of the Nw = S // m complete
        windows [B, Nw, d], normed and roped (rotary: the compress `layers.Rotary`)."""
        B, S, _ = kv.shape
        m, d, nw = self.rate, self.dim, S // self.rate
        kv = kv[:, : nw * m].view(B, nw, m, self.width)
        gate = gate[:, : nw * m].view(B, nw, m, self.width) + self.position_bias.to(gate.dtype)
        if self.overlap:  # slots: the previous window's Ca halves, then this window's Cb halves
            # ([:, :nw]: a row or document shorter than m has no window, so no previous one either)
            prev_kv = torch.cat((kv.new_zeros(B, 1, m, d), kv[:, :-1, :, :d]), dim=1)[:, :nw]
            prev_gate = torch.cat((gate.new_full((B, 1, m, d), float("-inf")), gate[:, :-1, :, :d]), dim=1)
            kv = torch.cat((prev_kv, kv[..., d:]), dim=2)
            gate = torch.cat((prev_gate[:, :nw], gate[..., d:]), dim=2)
        weights = gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)
        entries = self.kv_norm((kv * weights).sum(dim=2))  # [B, Nw, d]
        positions = (torch.arange(nw, device=kv.device) * m)[None]
        cos, sin = half_rope(rotary, positions, entries.dtype)
        return rope_tail(entries[:, None], cos, sin)[:, 0]


class Indexer(nn.Module):
    """The lightning indexer of a CSA layer: its own compressor at index_head_dim (overlapping
    windows) plus the index queries and head weights."""

    def __init__(self, config: ModelConfig, rate: int):
        super().__init__()
        self.ni, self.di, self.topk = config.index_n_heads, config.index_head_dim, config.index_topk
        self.compressor = Compressor(config, self.di, rate, overlap=True)
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.ni * self.di, bias=False)
        self.weights_proj = nn.Linear(config.hidden_size, self.ni, bias=False)

    def queries(self, x: torch.Tensor, q_lat: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, H], the normed q latent [B, T, rq], compress-rope cos/sin at the query positions
        -> (index queries [B, T, ni, di], head weights [B, T, ni] fp32)."""
        B, T, _ = x.shape
        q = rope_tail(self.q_b_proj(q_lat).view(B, T, self.ni, self.di).transpose(1, 2), cos, sin).transpose(1, 2)
        return q, self.weights_proj(x).float() * self.ni**-0.5

    @torch.no_grad()
    def index_scores(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor):
        """q [B, T, ni, di], weights [B, T, ni], index keys [B, Nw, di], visible bool [B, T, Nw]
        -> fp32 [B, T, Nw]: each query's score of every entry, -inf where it may not look."""
        scores = torch.relu(q.float() @ keys.float().transpose(-1, -2)[:, None]) * self.di**-0.5  # [B, T, ni, Nw]
        return (scores * weights[..., None]).sum(dim=2).masked_fill(~visible, float("-inf"))  # [B, T, Nw]

    def select(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """As `index_scores` -> bool [B, T, Nw]: each query's top-k visible entries."""
        return top_k_mask(self.index_scores(q, weights, keys, visible), self.topk)
