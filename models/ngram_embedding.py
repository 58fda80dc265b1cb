"""Hashed n-gram embeddings: the per-layer embedding (PLE) table of Qwen3.8 Flash Next
(transformers' `qwen4_exp`, `Qwen4ExpTextNGramEmbedding`), as vf's own module.

Shape legend: B rows, T tokens per row, V token vocabulary (`vocab_size`), n = `ngram_size`,
C = n − 1 tokens of history, h = `heads_per_ngram`, H = C·h heads, D = `embed_dim` / H (the width of
one head), P padded table rows, ℓ = the PLE layer index: decoder layer i (from 0) has a PLE when
i + 1 is in `ple_layer_ids` (one-indexed, sorted), and ℓ = ple_layer_ids.index(i + 1).

Tables (pure functions below, recomputed from the config, never loaded):
  sizes      head j of layer ℓ hashes into a prime number of rows: the (ℓ·H + j + 1)-th smallest prime
             ≥ `ngram_vocab_size_base` (`head_vocab_sizes`), so every head of every layer has its own
             modulus; offsets[j] = Σ_{i<j} sizes[i], and head j owns rows [offsets[j], offsets[j] + sizes[j]).
  P          Σ sizes rounded up to a multiple of `make_ngram_vocab_size_divisible_by` (`padded_rows`);
             rows ≥ Σ sizes are padding no id reaches.
  m[0..n-1]  odd int64 multipliers (`layer_multipliers`): with bound = ⌊⌊(2⁶³−1)/V⌋ / 2⌋ and
             base = seed + 10007·ℓ,  m[i] = 2·(splitmix64((base + γ·(i+1)) mod 2⁶⁴) mod bound) + 1,
             γ = 0x9E3779B97F4A7C15. m[i] < (2⁶³−1)/V, so t·m[i] never overflows int64 for 0 ≤ t < V.

Ids, in int64 (`NGramEmbedding.ngram_ids`), for the token at column p:
  x_k = the token k places back (x_0 the token itself), or eos when that place is not visible:
        before the start of the row (or of the given `context`), at or before an eos token lying
        strictly before p (transformers' `_shift_right_ignore_eos`: an eos ends a document), or,
        with `position_ids`, before the start of p's packed document (a column whose position is 0);
  mix_k = (x_0·m[0]) ⊕ (x_1·m[1]) ⊕ … ⊕ (x_{k-1}·m[k-1])     (⊕ = bitwise xor; all terms ≥ 0)
  for the order-k n-gram (k = 2..n), head j = (k−2)·h + i (i < h):
        id[p, j] = offsets[j] + (mix_k mod sizes[j])
  out[p] = concat_j weight[id[p, j]]   → [B, T, H·D] (heads in order: all order-2 heads, then order 3, …)

Packed rows: with vf's position_ids (restarting at 0 at each document) no history reaches across a
document start, so a packed row equals each document embedded alone (history = eos). transformers
has no packed rows: its model turns padding into eos (its conv mask) before this lookup, and the
eos rule above then cuts the history there. Incremental decoding: `context` [B, C] is the C tokens before
`input_ids` (eos where there are fewer; `next_context` keeps it), what transformers keeps in its
cache (conv state 2).

Weights: one parameter `weight` [P, D]. transformers: decoder layer i's
`model.layers.{i}.ple.ple_embedding.ngram_embedding.weight` [P, D] (`model.language_model.` prefix
in the multimodal model), stored in the checkpoint as `split_ngram_parts` row blocks (torch.chunk
along dim 0) `...ngram_embedding.shard_{0..parts-1}.weight`, concatenated in shard order. Its buffers
`layer_multipliers`, `ngram_heads_vocab_sizes`, `ngram_heads_offsets` (`HF_DERIVED_BUFFERS`) are
derived from the config: this module keeps them as non-persistent buffers and `check_hf_buffers`
verifies a checkpoint's copies instead of loading them.

Vocabulary sharding (models/ngram_parallel.py): with `shard` set, `weight` is one rank's row block
and the lookup exchanges ids and rows with the other ranks of its group (`shard.lookup`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.errors import ModelLoadError

from vf.errors import UsageError

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment (the golden ratio in 64-bit fixed point)
_LAYER_STRIDE = 10007  # per-layer seed step (transformers' _PRIME_1)

HF_DERIVED_BUFFERS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")


def splitmix64(x: int) -> int:
    """One splitmix64 output for state x (the finaliser after the γ step), as an unsigned 64-bit int."""
    z = (x + _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def layer_multipliers(vocab_size: int, ngram_size: int, layer: int, seed: int) -> list[int]:
    """m[0..ngram_size-1] of PLE layer `layer` (module docstring): odd, below (2⁶³−1)/vocab_size."""
    bound = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + _LAYER_STRIDE * layer
    return [2 * (splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % bound) + 1 for i in range(ngram_size)]


def primes_from(start: int, count: int) -> list[int]:
    """The `count` smallest primes ≥ start, by sieving windows above start (a 20M base needs only
    divisors up to ~4500, so each window costs a few ms even for hundreds of heads)."""
    found: list[int] = []
    lo = max(start, 2)
    # prime gaps near x average ln x: a window of 2·count·ln x usually holds them all
    width = max(256, 2 * count * max(1, round(math.log(lo + 1))))
    while len(found) < count:
        hi = lo + width
        alive = bytearray([1]) * width
        for d in range(2, math.isqrt(hi - 1) + 1):
            first = max(d * d, -(-lo // d) * d)  # first multiple of d in [lo, hi) that is not d itself
            if first < hi:
                alive[first - lo::d] = bytes(len(range(first - lo, width, d)))
        found += [lo + i for i, keep in enumerate(alive) if keep]
        lo = hi
    return found[:count]


def head_vocab_sizes(vocab_size_base: int, ngram_size: int, heads_per_ngram: int, layer: int) -> list[int]:
    """sizes[0..H-1] of PLE layer `layer`: the primes ≥ base numbered ℓ·H+1 .. ℓ·H+H (module docstring)."""
    heads = (ngram_size - 1) * heads_per_ngram
    return primes_from(vocab_size_base, (layer + 1) * heads)[layer * heads:]


def head_offsets(sizes: list[int]) -> list[int]:
    """offsets[j] = Σ_{i<j} sizes[i]: head j's first table row."""
    out, total = [], 0
    for s in sizes:
        out.append(total)
        total += s
    return out


def padded_rows(total: int, divisible_by: int) -> int:
    """Table rows: `total` rounded up to a multiple of `divisible_by`."""
    return -(-total // divisible_by) * divisible_by


@dataclass(frozen=True)
class NGramSpec:
    """What the lookup depends on. Field ↔ transformers' `Qwen4ExpTextConfig` (see `from_hf`):
    vocab_size, embed_dim ↔ ple_embed_dim, ngram_size, heads_per_ngram, vocab_size_base ↔
    ngram_vocab_size_base, divisible_by ↔ make_ngram_vocab_size_divisible_by, seed, eos_token_id (a
    list: its first), layer ↔ ple_layer_ids.index(decoder layer + 1)."""

    vocab_size: int
    embed_dim: int
    eos_token_id: int
    layer: int = 0
    ngram_size: int = 3
    heads_per_ngram: int = 8
    vocab_size_base: int = 20_000_000
    divisible_by: int = 128
    seed: int = 1234

    def __post_init__(self):
        problems = []
        if self.ngram_size < 2:
            problems.append(f"ngram_size {self.ngram_size} < 2 (no n-gram heads)")
        if self.heads_per_ngram < 1:
            problems.append(f"heads_per_ngram {self.heads_per_ngram} < 1")
        heads = max(1, (self.ngram_size - 1) * self.heads_per_ngram)
        if self.embed_dim < 1 or self.embed_dim % heads:
            problems.append(f"ple_embed_dim {self.embed_dim} is not a positive multiple of the {heads} heads")
        if not 0 <= self.eos_token_id < self.vocab_size:
            problems.append(f"eos_token_id {self.eos_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.vocab_size_base < 1 or self.divisible_by < 1 or self.layer < 0:
            problems.append(f"ngram_vocab_size_base {self.vocab_size_base}, make_ngram_vocab_size_divisible_by "
                            f"{self.divisible_by} and the PLE layer index {self.layer} must be ≥ 1, ≥ 1, ≥ 0")
        if problems:
            raise ModelLoadError("n-gram embedding config: " + "; ".join(problems))

    @property
    def heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @classmethod
    def from_hf(cls, config, layer: int) -> NGramSpec:
        """From a transformers `Qwen4ExpTextConfig` (or anything with its attribute names) for PLE
        layer index `layer`."""
        eos = config.eos_token_id
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        if eos is None:
            raise ModelLoadError("n-gram embedding config: eos_token_id must be set (it fills missing history)")
        embed_dim = getattr(config, "ple_embed_dim", None) or config.hidden_size
        return cls(vocab_size=config.vocab_size, embed_dim=embed_dim, eos_token_id=int(eos), layer=layer,
                   ngram_size=config.ngram_size, heads_per_ngram=config.heads_per_ngram,
                   vocab_size_base=config.ngram_vocab_size_base,
                   divisible_by=config.make_ngram_vocab_size_divisible_by, seed=config.seed)


class NGramEmbedding(nn.Module):
    """The hashed n-gram lookup of one PLE layer (module docstring): input_ids [B, T] → [B, T, embed_dim]."""

    def __init__(self, spec: NGramSpec, std: float = 0.02):
        super().__init__()
        self.spec = spec
        sizes = head_vocab_sizes(spec.vocab_size_base, spec.ngram_size, spec.heads_per_ngram, spec.layer)
        self.total_rows = sum(sizes)  # rows an id can reach
        self.rows = padded_rows(self.total_rows, spec.divisible_by)  # P
        mults = layer_multipliers(spec.vocab_size, spec.ngram_size, spec.layer, spec.seed)
        # derived from the config, so not part of the state dict (check_hf_buffers compares a checkpoint's)
        self.register_buffer("multipliers", torch.tensor(mults, dtype=torch.long), persistent=False)
        self.register_buffer("head_sizes", torch.tensor(sizes, dtype=torch.long), persistent=False)
        self.register_buffer("head_offsets", torch.tensor(head_offsets(sizes), dtype=torch.long), persistent=False)
        self.weight = nn.Parameter(torch.randn(self.rows, spec.embed_dim // spec.heads) * std)
        self.shard = None  # a models.ngram_parallel.RowShard when the rows are split over ranks

    def extra_repr(self) -> str:
        s = self.spec
        return f"layer={s.layer}, n={s.ngram_size}, heads={s.heads}, rows={self.rows}, dim={s.embed_dim}"

    def check_hf_buffers(self, buffers: dict[str, torch.Tensor]) -> None:
        """A transformers checkpoint's copies of the derived buffers (`HF_DERIVED_BUFFERS` names, any
        subset) must equal this module's: a mismatch means the checkpoint hashes with other constants
        and its table rows would be read at the wrong places. ModelLoadError naming the buffer."""
        ours = dict(zip(HF_DERIVED_BUFFERS, (self.multipliers, self.head_sizes, self.head_offsets)))
        for name, t in buffers.items():
            if name not in ours:
                raise ModelLoadError(f"n-gram embedding: unknown buffer {name!r} (expected {HF_DERIVED_BUFFERS})")
            if tuple(t.shape) != tuple(ours[name].shape) or not torch.equal(t.cpu().long(), ours[name].cpu()):
                raise ModelLoadError(f"n-gram embedding (PLE layer {self.spec.layer}): the checkpoint's {name} "
                                     f"differs from the one the config derives; the table would be misread")

    def next_context(self, input_ids: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """The `context` for the tokens after `input_ids`: the last C tokens of context + input_ids
        (eos before the first token, as transformers pads its cache)."""
        hist = self._history(input_ids.long(), context)
        return hist[:, hist.shape[1] - (self.spec.ngram_size - 1):]

    def _history(self, ids: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        """[B, C + T]: the context (eos when none) then the ids, range-checked."""
        s = self.spec
        C = s.ngram_size - 1
        if ids.dim() != 2:
            raise UsageError(f"n-gram embedding: input_ids must be [B, T], got shape {tuple(ids.shape)}")
        if context is None:
            context = ids.new_full((ids.shape[0], C), s.eos_token_id)
        elif tuple(context.shape) != (ids.shape[0], C):
            raise UsageError(f"n-gram embedding: context must be [B, {C}] = {(ids.shape[0], C)}, "
                             f"got {tuple(context.shape)}")
        hist = torch.cat([context.to(ids.device, torch.long), ids], dim=1)
        if hist.numel():
            # out-of-range ids would overflow t·m and hash silently to arbitrary rows (one host sync)
            lo, hi = torch.aminmax(hist)
            if lo.item() < 0 or hi.item() >= s.vocab_size:
                bad = lo.item() if lo.item() < 0 else hi.item()
                raise UsageError(f"n-gram embedding: token id {bad} is outside the vocabulary [0, {s.vocab_size})")
        return hist

    def ngram_ids(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                  context: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, H] int64 table rows (module docstring). position_ids [B, T] (packed rows: a 0 starts
        a document), context [B, C] (the tokens before input_ids)."""
        s = self.spec
        C, eos = s.ngram_size - 1, s.eos_token_id
        ids = input_ids.long()
        hist = self._history(ids, context)  # [B, C+T]
        B, T = ids.shape
        col = torch.arange(C + T, device=ids.device)
        # first visible column for each column p: one past the last eos strictly before p
        after_eos = torch.where(hist == eos, col + 1, 0)
        first = F.pad(after_eos[:, :-1], (1, 0)).cummax(dim=1).values[:, C:]  # [B, T]
        if position_ids is not None:
            if tuple(position_ids.shape) != (B, T):
                raise UsageError(f"n-gram embedding: position_ids shape {tuple(position_ids.shape)} != "
                                 f"input_ids shape {(B, T)}")
            starts = torch.where(position_ids.to(ids.device) == 0, col[C:], 0)  # packed document starts
            first = torch.maximum(first, starts.cummax(dim=1).values)
        p = col[C:]  # [T] the tokens' columns in hist
        mix = ids * self.multipliers[0]
        blocks = []
        for k in range(1, C + 1):
            src = p - k  # ≥ 0: hist holds C columns before the first token
            x_k = torch.where(src >= first, hist[:, src], eos)  # [B, T]
            mix = mix ^ (x_k * self.multipliers[k])
            heads = slice((k - 1) * s.heads_per_ngram, k * s.heads_per_ngram)  # the order-(k+1) heads
            blocks.append(mix[..., None] % self.head_sizes[heads] + self.head_offsets[heads])
        return torch.cat(blocks, dim=-1)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                context: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids [B, T] → [B, T, H·D] in the weight's dtype (module docstring)."""
        ids = self.ngram_ids(input_ids, position_ids, context)  # [B, T, H]
        if self.shard is not None:
            rows = self.shard.lookup(ids.reshape(-1), self.weight)  # [B·T·H, D]
        else:
            rows = F.embedding(ids.reshape(-1), self.weight)
        return rows.view(*ids.shape[:2], self.spec.embed_dim)  # named, not -1: B or T may be 0
