"""Reference KV cache behind the attention cache seam.

Seam (what the inference engine implements): each attention layer calls
    out = cache.attend(layer_idx, q, k, v)
with q [B, nh, T, hd], k/v [B, nkv, T, hd] (q/k-norm and rope already applied at the given
position_ids); the cache stores k/v and returns attention output [B, nh, T, hd]. GQA (repeating the
nkv heads to nh) is the cache's job. Optional hooks: `seq_len` (positions stored; used by
NativeModel.forward when position_ids is None) and `advance(T)` (called once after all layers).

SimpleKVCache: contiguous per-row buffers, every row appends the same T new positions per call,
and the new block attends to all stored positions plus itself causally. Shapes: S = stored + T.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class SimpleKVCache:
    def __init__(self, batch: int, max_len: int | None = None):
        self.batch = batch
        self.max_len = max_len
        self.k: dict[int, torch.Tensor] = {}  # layer -> [B, nkv, S, hd]
        self.v: dict[int, torch.Tensor] = {}
        self.seq_len = 0  # positions stored per row (all layers)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[0] != self.batch:
            raise ValueError(f"SimpleKVCache holds {self.batch} rows, got a batch of {q.shape[0]}")
        if layer_idx in self.k:
            k = torch.cat([self.k[layer_idx], k], dim=2)
            v = torch.cat([self.v[layer_idx], v], dim=2)
        if self.max_len is not None and k.shape[2] > self.max_len:
            raise ValueError(f"SimpleKVCache full: {k.shape[2]} > max_len {self.max_len}")
        self.k[layer_idx], self.v[layer_idx] = k, v
        T, S = q.shape[2], k.shape[2]
        gqa = q.shape[1] != k.shape[1]
        if T == 1:  # decode step: the new token sees everything stored
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        # query i (absolute position S-T+i) sees keys j <= S-T+i
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    def advance(self, T: int) -> None:
        self.seq_len += T
