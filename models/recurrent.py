"""Shared mechanics of the recurrent token mixers (gated DeltaNet `deltanet.py`, Mamba-2 `mamba2.py`).

Shape legend: B rows, T tokens per row, C channels, K conv kernel, L chunk length, Tp laid-out length.

Packed documents. A packed training row holds several documents (position_ids restart at 0, see
`layers.Documents`); every recurrent and convolution state must restart at each boundary, exactly as
if each document ran alone:
  * the short causal convolution runs per document (`causal_conv` with the spans);
  * the chunked scans run on a `ChunkLayout`: every document of every row is laid out on one flat
    sequence starting at a chunk boundary (padded to a multiple of L with no-op tokens), and the
    scan zeroes its carried state at each chunk where a document starts (`resets`). Nothing inside
    a chunk crosses a document, and padding is under L tokens per document.

Cache seam (what an inference cache implements besides `attend`/`store`, see `cache.py`):
    state = cache.get_state(layer_idx)      tuple of [B, ...] tensors, or None for fresh rows (zeros)
    cache.set_state(layer_idx, *state)      the state after the new tokens
    cache.valid_lengths                     [B] int tensor during a right-padded prefill, else None:
                                            tokens at or beyond a row's length are padding, and the
                                            saved state must be the one after its last real token
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class ChunkLayout:
    """Documents (`layers.Documents` spans of a [B, T] batch) laid out chunk-aligned on one flat row.

      pack(x [B, T, ...]) -> [1, Tp, ...]  (padding slots are zero)
      unpack(y [1, Tp, ...]) -> [B, T, ...]
      resets  bool [1, Tp / L]: chunks where a document starts (the scan's carried state restarts)
    """

    def __init__(self, spans: list[list[tuple[int, int]]], T: int, chunk: int, device):
        src, resets = [], []
        for b, row in enumerate(spans):
            for s, e in row:
                n = e - s
                n_chunks = -(-n // chunk)
                src.extend(range(b * T + s, b * T + e))
                src.extend([-1] * (n_chunks * chunk - n))
                resets.extend([True] + [False] * (n_chunks - 1))
        src_t = torch.tensor(src, dtype=torch.int64, device=device)
        self.B, self.T = len(spans), T
        self.valid = src_t >= 0
        self.index = src_t.clamp(min=0)
        self.back = self.valid.nonzero()[:, 0]  # slot of each flat token, in order (sources are increasing)
        self.resets = torch.tensor(resets, dtype=torch.bool, device=device)[None]

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(self.B * self.T, *x.shape[2:])[self.index]
        mask = self.valid.view(-1, *([1] * (x.dim() - 2))).to(x.dtype)
        return (flat * mask)[None]

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        return y[0, self.back].reshape(self.B, self.T, *y.shape[2:])


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, spans=None,
                state: torch.Tensor | None = None, lengths: torch.Tensor | None = None):
    """SiLU(depthwise causal conv) over time. x [B, T, C]; weight [C, 1, K] (transformers' Conv1d
    layout); `spans` (packed rows, `Documents.spans`): each document is convolved on its own, so no
    tap crosses a document start (and the numbers equal a separate run's bit for bit); `state`
    [B, C, K-1]: the previous K-1 inputs (a cached row); `lengths` [B]: right-padded rows (the new
    state ends at each row's last real token). Returns (out [B, T, C], new state [B, C, K-1])."""
    B, T, C = x.shape
    K = weight.shape[-1]
    xt = x.transpose(1, 2)  # [B, C, T]
    if spans is not None:
        out = torch.cat([torch.cat([F.conv1d(F.pad(xt[b:b + 1, :, s:e], (K - 1, 0)), weight, bias, groups=C)
                                    for s, e in row], dim=-1) for b, row in enumerate(spans)], dim=0)
        return F.silu(out).transpose(1, 2), None
    prev = state.to(xt.dtype) if state is not None else xt.new_zeros(B, C, K - 1)
    full = torch.cat([prev, xt], dim=-1)  # [B, C, K-1+T]
    out = F.conv1d(full, weight, bias, groups=C)  # [B, C, T]
    if lengths is None:
        new_state = full[..., T:]
    else:  # inputs at full positions len .. len+K-2 (the K-1 ending at the last real token)
        idx = lengths.to(torch.int64)[:, None] + torch.arange(K - 1, device=x.device)[None]
        new_state = full.gather(2, idx[:, None, :].expand(B, C, K - 1))
    return F.silu(out).transpose(1, 2), new_state


def valid_mask(lengths: torch.Tensor | None, B: int, T: int, device) -> torch.Tensor | None:
    """bool [B, T]: real (not right-padding) tokens, or None when every token is real."""
    if lengths is None:
        return None
    return torch.arange(T, device=device)[None] < lengths.to(device)[:, None]
