"""QSA indexed sparse attention of Qwen3.8 Flash Next (transformers' `Qwen4ExpTextQSAIndexer` and
`Qwen4ExpTextAttention`): gated GQA attention (layers.Attention with the output gate) whose keys are
restricted per query to the blocks an indexer picks plus the query's incomplete last block.

Shape legend: B batch, T queries, S keys, nh index heads, d index_head_dim, r indexer_compress_ratio,
k = indexer_budget / r blocks per query, nb = S // r blocks.
Indexer (parameters named as transformers'): index_qk_proj [(nh + 1)·d, H] gives per token nh query
heads and one raw key; q = rope(q_layernorm(q)) at the query's position (zero-centred RMSNorm, rope on
the first rotary_dim dims, half-split). For the query at index p of its document (it sees keys 0..p; p counts tokens, whatever the rope
positions are: M-RoPE moves them around images):
  block b = keys [b·r, (b+1)·r), complete when (b+1)·r <= p+1;  c(p) complete blocks
  key_b   = rope(k_layernorm(mean of its r raw keys)) with the rope of the block's first token
  score_b = Σ_heads relu(q_h · key_b) / sqrt(d)                              (fp32)
  selected = topk(score_0 .. score_{c(p)-1}, min(k, c(p))), plus the tail keys c(p)·r .. p
Exact ties are common (score_b = 0 whenever every head's dot product is negative) and torch.topk
breaks them by its algorithm, not by index: the top-k above is taken, as transformers takes it, over
the query's own c(p) scores alone, so the tied choice is transformers' too (`top_blocks`).
Attention then runs on the selected keys only (causal). This differs from GLM-5's DSA (dsa.py: a
top-k of single keys from a weighted-ReLU indexer) and DeepSeek-V4's (compressed entries): its own
module. Packed rows run per document (blocks start at each document's first token). Engine cache:
the layer stores k, v, the raw index key and the token's rope (cos | sin, [1, 2·rotary_dim]) per
token (`cache.store`), and re-pools the blocks from the stored raw keys at each step (elementwise
work, no projection recomputed); a query's index p is then the count of keys the cache lets it see.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig
from vf.models.layers import Attention, Documents, RMSNorm, apply_rope, refuse_context_parallel


class QSAIndexer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.nh, self.d = config.index_n_heads, config.index_head_dim
        self.ratio = config.indexer_compress_ratio
        self.topk = config.indexer_budget // self.ratio
        self.index_qk_proj = nn.Linear(config.hidden_size, (self.nh + 1) * self.d, bias=False)
        self.q_layernorm = RMSNorm(self.d, config.rms_norm_eps, zero_centered=True)
        self.k_layernorm = RMSNorm(self.d, config.rms_norm_eps, zero_centered=True)

    def project(self, x, cos, sin):
        """x [B, T, H] -> (queries [B, T, nh, d] normed and roped, raw keys [B, T, d])."""
        q, k = self.index_qk_proj(x).split([self.nh * self.d, self.d], dim=-1)
        q = self.q_layernorm(q.unflatten(-1, (self.nh, self.d)))
        return apply_rope(q.transpose(1, 2), cos, sin).transpose(1, 2), k

    def select(self, q, raw, index, key_cos, key_sin) -> torch.Tensor:
        """q [B, T, nh, d]; raw keys [B, S, d] and their rope key_cos/key_sin [B, S, rd]; the
        queries' indices `index` [B, T] (query p sees keys 0..p) -> bool [B, T, S]: the keys each
        query attends to (module docstring)."""
        B, S, d = raw.shape
        r, nb = self.ratio, raw.shape[1] // self.ratio
        key_idx = torch.arange(S, device=raw.device)
        complete = torch.div(index + 1, r, rounding_mode="floor")  # [B, T]
        tail = (key_idx >= (complete * r)[..., None]) & (key_idx <= index[..., None])
        if nb == 0:
            return tail
        pooled = self.k_layernorm(raw[:, : nb * r].reshape(B, nb, r, d).float().mean(dim=2).to(raw.dtype))
        starts = slice(0, nb * r, r)  # each block's first token
        keys = apply_rope(pooled[:, None], key_cos[:, starts], key_sin[:, starts])[:, 0]  # [B, nb, d]
        # one head at a time: [B, T, nb] scores instead of a [B, T, nb, nh] product
        qf, kf = q.float(), keys.float().transpose(1, 2)
        scores = torch.zeros(B, q.shape[1], nb, device=q.device)
        for h in range(q.shape[2]):
            scores += torch.relu(qf[:, :, h] @ kf)
        scores = scores / math.sqrt(d)
        chosen = top_blocks(scores, complete, self.topk)
        blocks = F.pad(chosen.repeat_interleave(r, dim=-1), (0, S - nb * r))
        return blocks | tail


def top_blocks(scores: torch.Tensor, count: torch.Tensor, k: int) -> torch.Tensor:
    """scores [B, T, nb] fp32 of every block, `count` [B, T] the complete blocks each query sees
    (blocks 0..count-1) -> bool [B, T, nb]: each query's top-min(k, count) blocks.

    Why not just one batched top-k: a block score is a sum of ReLUs, exactly 0 whenever every index
    head's dot product is negative, so exact ties at the k-th place are common (few index heads,
    untrained weights), and torch.topk breaks ties by its algorithm over the row it is given (CPU:
    std::nth_element or partial_sort), not by index. transformers calls it once per query on that
    query's `count` scores alone; a batched call over all nb blocks, the rest at -inf, breaks the same
    ties otherwise (a weight perturbation keeps ReLU zeros at zero: no rounding matter; it moved the
    logits of tiny configs by up to 1). So: one batched top-k, whose set is exact wherever the k-th
    score is not tied with an unchosen block; the tied queries redo it on rows of just their `count`
    scores, grouped by count (a batched top-k runs the 1-d call's algorithm on each row of that
    length): transformers' choice, ties included, for one more top-k per distinct count among tied
    queries (and a host sync per call to find them)."""
    nb = scores.shape[-1]
    valid = torch.arange(nb, device=scores.device) < count[..., None]  # [B, T, nb]
    if k == 0 or nb == 0:
        return torch.zeros_like(valid)
    top = scores.masked_fill(~valid, float("-inf")).topk(min(k, nb), dim=-1)
    chosen = torch.zeros_like(valid).scatter_(-1, top.indices, True) & valid
    if nb <= k:  # every complete block fits the budget: no choice made
        return chosen
    kth = top.values[..., k - 1 :]  # [B, T, 1]: the k-th best (meaningful where count > k)
    tied = (count > k) & (valid & ~chosen & (scores == kth)).any(-1)  # [B, T]
    if tied.any():
        b, t = tied.nonzero(as_tuple=True)
        c = count[b, t]
        for n in c.unique().tolist():
            rows = (b[c == n], t[c == n])
            idx = scores[rows][:, :n].topk(k, dim=-1).indices
            chosen[rows] = torch.zeros(idx.shape[0], nb, dtype=torch.bool, device=scores.device).scatter_(-1, idx, True)
    return chosen


class QSAttention(Attention):
    """Gated attention (Attention with attn_output_gate, q/k norm, rope) plus the QSA indexer."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.indexer = QSAIndexer(config)
        self.sparse = True  # False: every causal key (tests switch the selection off)

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        refuse_context_parallel(mask, "QSA indexed attention")
        B, T, _ = x.shape
        (q, gate), k, v = self.project(x, cos, sin)
        with torch.no_grad():  # a hard selection: no gradient, as in transformers
            iq, ik = self.indexer.project(x, cos, sin)
        rope = torch.cat([cos, sin], dim=-1).expand(B, T, -1)  # [B, T, 2·rd]: the keys' rope, for the blocks
        allowed = None
        if cache is not None:
            (k, v, ik, rope), allowed = cache.store(self.layer_idx, k, v, ik[:, None], rope[:, None])
            ik, rope = ik[:, 0], rope[:, 0]
            if allowed is not None:  # [T, S] or [B|1, 1, T, S]
                allowed = allowed.reshape(-1, *allowed.shape[-2:])
        if isinstance(mask, Documents) and not mask.single:
            out = torch.cat([torch.cat([
                self.mix(q[b:b + 1, :, s:e], k[b:b + 1, :, s:e], v[b:b + 1, :, s:e], iq[b:b + 1, s:e],
                         ik[b:b + 1, s:e], rope[b:b + 1, s:e], None)
                for s, e in row], dim=2) for b, row in enumerate(mask.spans)], dim=0)
        else:
            out = self.mix(q, k, v, iq, ik, rope, allowed)
        out = out.transpose(1, 2).reshape(B, T, self.nh * self.hd) * torch.sigmoid(gate)
        return self.o_proj(out)

    def mix(self, q, k, v, iq, ik, rope, allowed):
        """q [B, nh, T, hd], index queries iq [B, T, nI, d]; per key (tokens 0..S-1 of the row or
        document) k/v [B, nkv, S, hd], raw index keys [B, S, d], rope [B, S, 2·rd]; `allowed` (a
        cache's) bool [B|1, T, S] or None (the T queries are the last T keys) -> [B, nh, T, hd]."""
        B, T, S = q.shape[0], q.shape[2], k.shape[2]
        with torch.no_grad():
            if allowed is None:
                index = torch.arange(S - T, S, device=q.device).expand(B, T)
            else:  # the cache shows each query the keys up to its own
                index = allowed.sum(-1).expand(B, T) - 1
            if self.sparse:
                keep = self.indexer.select(iq, ik, index, *rope.chunk(2, dim=-1))
            else:
                keep = torch.arange(S, device=k.device) <= index[..., None]
            if allowed is not None:
                keep = keep & allowed
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None], enable_gqa=self.nh != self.nkv)
