"""Reference KV cache behind the attention cache seam.

Seam (what the inference engine implements), two calls per attention layer:
    out = cache.attend(layer_idx, q, k, v)
with q [B, nh, T, hd], k/v [B, nkv, T, hd] (q/k-norm and rope already applied at the given
position_ids); the cache stores k/v and returns attention output [B, nh, T, hd]. GQA (repeating the
nkv heads to nh) is the cache's job. Attention variants that attend themselves (multi-head latent
attention keeps a compact latent cache, GPT-OSS adds sinks and sliding windows) call instead
    streams, mask = cache.store(layer_idx, *new)
with each new stream [B, h, T, d] (any h, d, fixed per layer); it returns every stored stream
[B, h, S, d] (S = keys stored, key j at absolute position j) and the bool mask [B|1, 1, T, S] of the
keys each new query may see (True = attend), or None for plain causal attention (T == S).
Recurrent layers (gated DeltaNet, Mamba-2) call `get_state(layer_idx)` / `set_state(layer_idx, *state)`
and read `valid_lengths` (see models/recurrent.py).
Optional hooks: `seq_len` (positions stored; used by NativeModel.forward when position_ids is None)
and `advance(T)` (called once after all layers).

SimpleKVCache: contiguous per-row buffers, every row appends the same T new positions per call,
and the new block attends to all stored positions plus itself causally. Shapes: S = stored + T.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA over stored keys: causal when `mask` is None (T == S), else the cache's bool mask."""
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class SimpleKVCache:
    def __init__(self, batch: int, max_len: int | None = None):
        self.batch = batch
        self.max_len = max_len
        self.streams: dict[int, tuple[torch.Tensor, ...]] = {}  # layer -> ([B, h, S, d], ...)
        self.seq_len = 0  # positions stored per row (all layers)
        self.states: dict[int, tuple[torch.Tensor, ...]] = {}  # recurrent layers: layer -> ([B, ...], ...)
        self.valid_lengths = None  # every row appends the same T real tokens

    def get_state(self, layer_idx: int) -> tuple[torch.Tensor, ...] | None:
        return self.states.get(layer_idx)

    def set_state(self, layer_idx: int, *state: torch.Tensor) -> None:
        self.states[layer_idx] = state

    def store(self, layer_idx: int, *new: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        if new[0].shape[0] != self.batch:
            raise ValueError(f"SimpleKVCache holds {self.batch} rows, got a batch of {new[0].shape[0]}")
        T = new[0].shape[2]
        streams = new
        if layer_idx in self.streams:
            streams = tuple(torch.cat([old, x], dim=2) for old, x in zip(self.streams[layer_idx], new))
        S = streams[0].shape[2]
        if self.max_len is not None and S > self.max_len:
            raise ValueError(f"SimpleKVCache full: {S} > max_len {self.max_len}")
        self.streams[layer_idx] = streams
        if T == S:
            return streams, None
        # query i (absolute position S-T+i) sees keys j <= S-T+i
        return streams, torch.ones(T, S, dtype=torch.bool, device=new[0].device).tril(diagonal=S - T)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        (k, v), mask = self.store(layer_idx, k, v)
        return attend_masked(q, k, v, mask)

    def advance(self, T: int) -> None:
        self.seq_len += T
