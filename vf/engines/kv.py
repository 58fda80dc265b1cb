"""Slot KV cache for continuous batching, behind the models' attention seam
(`out = cache.attend(layer_idx, q, k, v)` and `streams, mask = cache.store(layer_idx, *new)`, see
vf/models/cache.py).

Shape legend: R row capacity (max_batch), L length capacity, n active rows, m new rows,
T prompt block length (right-padded), nh/nkv query/kv heads, hd head dim.
    bufs[s][layer] : [R, h_s, L, d_s] per stored stream s (R, L grow on demand up to max_rows, max_len)
    k = bufs[0], v = bufs[1] for the usual two streams [(nkv, hd), (nkv, hd)]; multi-head latent
    attention stores its compact latent instead: streams [(1, kv_lora_rank), (1, qk_rope_head_dim)].
Hybrid models (gated DeltaNet, Mamba-2): only the layers of kind "kv" (`model.cache_kinds()`) get
k/v buffers (the others' entries are None); each "state" layer keeps per-row recurrent state
    states[layer] : ([R, *shape_s], ...) per state tensor (`model.state_shapes()`: conv window, SSM/delta state)
served through `get_state` / `set_state` (models/recurrent.py): a prefilled block starts from zero
state (fresh rows) and stores its state as of each row's last real token (`valid_lengths`); a
decode step reads rows 0..n-1 and writes them back. `move` copies state rows with the k/v rows,
so admitting and retiring sequences never mixes two sequences' states.
Active sequences always occupy rows 0..n-1 (kept compact: a finished row is overwritten by the
last row via `move`), so a decode step reads the views k[layer][:n, :, :Lmax] with no gather.

Two modes, set before each model forward:
    begin_prefill(start, m, T): rows start..start+m-1 get a fresh right-padded prompt block; plain
        causal attention inside the block is exact for every real token (padding only follows it);
        the padding's k/v land beyond each row's length and are masked later / overwritten.
    begin_decode(n, pos [n]): row i appends one token at position pos[i] and attends to 0..pos[i].
"""

from __future__ import annotations

import torch

from vf.models.cache import attend_masked


class SlotKVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_rows: int, max_len: int,
                 dtype: torch.dtype, device, initial_len: int = 256,
                 streams: list[tuple[int, int]] | None = None, kv_layers: list[int] | None = None,
                 state_shapes: dict[int, list[tuple[tuple[int, ...], torch.dtype | None]]] | None = None):
        self.num_layers, self.nkv, self.hd = num_layers, num_kv_heads, head_dim
        self.max_rows, self.max_len = max_rows, max_len
        self.dtype, self.device = dtype, device
        self.cap_rows = self.cap_len = 0
        self.stream_shapes = list(streams or [(num_kv_heads, head_dim), (num_kv_heads, head_dim)])
        self.kv_layers = list(range(num_layers)) if kv_layers is None else list(kv_layers)
        self.bufs: list[list[torch.Tensor | None]] = [[None] * num_layers for _ in self.stream_shapes]
        self.k, self.v = (self.bufs + [[], []])[:2]
        self.state_shapes = dict(state_shapes or {})
        self.states: dict[int, list[torch.Tensor]] = {i: [] for i in self.state_shapes}
        self.valid_lengths: torch.Tensor | None = None
        self._reserve(1, min(initial_len, max_len))
        self._mode = None
        self._start = self._m = self._T = self._n = self._lmax = 0
        self._pos: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None

    def _reserve(self, rows: int, length: int) -> None:
        """Grow capacity to at least rows x length (each doubling, capped at max_rows / max_len),
        keeping contents. Memory follows what requests use, not max_batch x context."""
        if rows <= self.cap_rows and length <= self.cap_len:
            return
        new_rows, new_len = max(self.cap_rows, 1), max(self.cap_len, 16)
        while new_rows < rows:
            new_rows *= 2
        while new_len < length:
            new_len *= 2
        new_rows, new_len = min(new_rows, self.max_rows), min(new_len, self.max_len)
        for (h, d), store in zip(self.stream_shapes, self.bufs):
            shape = (new_rows, h, new_len, d)
            for i in self.kv_layers:
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if store[i] is not None:
                    fresh[: self.cap_rows, :, : self.cap_len] = store[i]
                store[i] = fresh
        if new_rows > self.cap_rows:
            for i, shapes in self.state_shapes.items():
                old = self.states[i]
                self.states[i] = [torch.zeros((new_rows, *shape), dtype=dtype or self.dtype, device=self.device)
                                  for shape, dtype in shapes]
                for fresh, o in zip(self.states[i], old):
                    fresh[: self.cap_rows] = o
        self.cap_rows, self.cap_len = new_rows, new_len

    # -- modes -------------------------------------------------------------------------------
    def begin_prefill(self, start: int, m: int, T: int, lengths: torch.Tensor | None = None) -> None:
        """Rows start..start+m-1 take a fresh right-padded block of T tokens; `lengths` [m]: each row's
        real tokens (recurrent layers keep their state as of the last one)."""
        self._reserve(start + m, T + 1)
        self._mode, self._start, self._m, self._T = "prefill", start, m, T
        self.valid_lengths = lengths

    def begin_decode(self, n: int, pos: torch.Tensor) -> None:
        """pos [n] int64: the position each row's new token takes (= tokens already stored)."""
        lmax = int(pos.max()) + 1
        self._reserve(n, lmax)
        self._mode, self._n, self._lmax, self._pos = "decode", n, lmax, pos
        self._rows = torch.arange(n, device=self.device)
        ar = torch.arange(lmax, device=self.device)
        self._mask = (ar[None, :] <= pos[:, None])[:, None, None, :]  # [n, 1, 1, Lmax]

    # -- the seam ----------------------------------------------------------------------------
    def get_state(self, layer_idx: int) -> tuple[torch.Tensor, ...] | None:
        if self._mode == "prefill":
            return None  # fresh rows start from zero state
        return tuple(t[: self._n] for t in self.states[layer_idx])

    def set_state(self, layer_idx: int, *state: torch.Tensor) -> None:
        rows = slice(self._start, self._start + self._m) if self._mode == "prefill" else slice(0, self._n)
        for buf, t in zip(self.states[layer_idx], state):
            buf[rows] = t

    def store(self, layer_idx: int, *new: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        if self._mode == "prefill":
            s, m, T = self._start, self._m, self._T
            for bufs, x in zip(self.bufs, new):
                bufs[layer_idx][s : s + m, :, :T] = x
            return new, None  # the block attends causally within itself
        if self._mode == "decode":
            n, lmax = self._n, self._lmax
            out = []
            for bufs, x in zip(self.bufs, new):
                buf = bufs[layer_idx]
                buf[self._rows, :, self._pos] = x[:, :, 0]
                out.append(buf[:n, :, :lmax])
            return tuple(out), self._mask
        raise RuntimeError("SlotKVCache.store called outside begin_prefill/begin_decode")

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        (k, v), mask = self.store(layer_idx, k, v)
        return attend_masked(q, k, v, mask)

    def advance(self, T: int) -> None:  # lengths are tracked by the scheduler, not here
        self._mode = None
        self.valid_lengths = None

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy row `src`'s first `length` positions into row `dst` (compaction after a row finishes)."""
        for store in self.bufs:
            for buf in store:
                if buf is not None:
                    buf[dst, :, :length] = buf[src, :, :length]
        for bufs in self.states.values():
            for buf in bufs:
                buf[dst] = buf[src]
