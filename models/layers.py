"""Building blocks: RMSNorm, rotary embedding (default, llama3 and yarn scaling; partial rotary),
attention, gated MLP.

Shape legend: B batch, T tokens, H hidden, nh query heads, nkv kv heads, hd head_dim,
I intermediate size, S key length (cache), P = nh*hd + 2*nkv*hd (fused qkv width).
Native layout: q/k/v fused in `qkv_proj` [P, H] (rows: q, then k, then v); gate/up fused in
`gate_up_proj` [2I, H] (rows: gate, then up).
"""

from __future__ import annotations

import math
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn
from vf.models import attention_kernels
from vf.models.config import ModelConfig

from vf.errors import UsageError


class Embedding(nn.Embedding):
    """nn.Embedding whose backward can add its rows straight into `weight.grad` (`grad_in_place`).

    For a weight tied to the LM head: the head's dense [V, H] gradient becomes `weight.grad` as soon
    as the head's backward is done, and the lookup's gradient (T rows) is index-added into it in
    place at the end of backward. Plain autograd would instead hold the head's gradient until the
    lookup's own dense [V, H] gradient exists and sum the two: one V×H gradient less at the peak.
    Only for one process (FSDP shards gradients) and where `weight.grad` is a plain dense tensor."""

    grad_in_place = False

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not (self.grad_in_place and torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(ids)
        w = self.weight
        x = F.embedding(ids, w.detach()).requires_grad_()  # a leaf: its grad is d loss / d embeddings

        def add_rows(g: torch.Tensor) -> None:
            if w.grad is None:
                w.grad = torch.zeros_like(w)
            w.grad.index_add_(0, ids.reshape(-1), g.reshape(-1, g.shape[-1]).to(w.dtype))

        x.register_hook(add_rows)
        return x


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in fp32 and cast back (as transformers does).
    `zero_centered` (the Qwen "Next" line): y = (x / rms) * (1 + w) with the product in fp32, w
    initialised to 0."""

    def __init__(self, dim: int, eps: float, zero_centered: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))
        self.eps = eps
        self.zero_centered = zero_centered

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.zero_centered:
            return (x * (1.0 + self.weight.float())).to(dtype)
        return self.weight * x.to(dtype)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_attention_factor(config: ModelConfig) -> float:
    """Factor yarn applies to cos/sin (1 for other rope types), as transformers computes it."""
    s = config.rope_scaling
    if not s or s.get("rope_type") != "yarn":
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor, mscale, mscale_all = s["factor"], s.get("mscale"), s.get("mscale_all_dim")
    if mscale and mscale_all:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
    return _yarn_mscale(factor)


def _yarn_inv_freq(config: ModelConfig, dim: int, device) -> torch.Tensor:
    """YaRN (arXiv 2309.00071): interpolate the low frequencies by `factor`, keep the high ones,
    with a linear ramp between the correction dims of beta_fast and beta_slow rotations."""
    s, base = config.rope_scaling, config.rope_theta
    factor, old_ctx = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(old_ctx / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(device)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_inv_freq(config: ModelConfig, device=None) -> torch.Tensor:
    """Inverse frequencies [rotary_dim/2]; llama3 scaling rescales the low frequencies and smooths
    the middle band; yarn see `_yarn_inv_freq`."""
    dim = config.rotary_dim
    s = config.rope_scaling
    if s and s.get("rope_type") == "yarn":
        return _yarn_inv_freq(config, dim, device)
    inv_freq = 1.0 / (
        config.rope_theta
        ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim)
    )
    if not s or s.get("rope_type", "default") == "default":
        return inv_freq
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / lo, old_ctx / hi
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary(nn.Module):
    """cos/sin tables [B, T, rd] (rd = config.rotary_dim) for given position_ids [B, T] (computed in
    fp32, times yarn's attention factor, cast to the activations)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self._inv_freq: torch.Tensor | None = None  # lazily built on the activations' device

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self._inv_freq is None or self._inv_freq.device != position_ids.device:
            self._inv_freq = rope_inv_freq(self.config, position_ids.device)
        freqs = position_ids[..., None].float() * self._inv_freq  # [B, T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, rd]
        cos, sin = emb.cos(), emb.sin()
        factor = rope_attention_factor(self.config)
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, hd]; cos/sin [B, T, rd]. Half-split rotation (HF `rotate_half` convention) of
    the first rd dims; the rest pass through (partial rotary)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rd], cos[:, 0], sin[:, 0]), x[..., rd:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Fused-qkv GQA attention with optional q/k RMSNorm (Qwen3). Without a cache it runs
    `sdpa(q, k, v, mask)` (mask: None = plain causal, a `Documents` layout, or a `ShardedMask` under
    context parallelism); with a cache it hands
    q [B,nh,T,hd], k/v [B,nkv,T,hd] to `cache.attend(layer_idx, q, k, v)`, which stores k/v, repeats kv
    heads for GQA itself and returns [B,nh,T,hd].

    Hybrid variants: `config.attn_output_gate` (Qwen3-Next / Qwen3.5 gated attention): the q rows of
    `qkv_proj` hold per head [q (hd), gate (hd)] (transformers' q_proj layout, P = 2*nh*hd + 2*nkv*hd)
    and the output is o_proj(attn · sigmoid(gate)); `rope=False` (Nemotron-H) skips the rotary."""

    def __init__(self, config: ModelConfig, layer_idx: int, rope: bool = True):
        super().__init__()
        self.layer_idx = layer_idx
        self.nh, self.nkv, self.hd = config.num_heads, config.num_kv_heads, config.head_dim
        self.gated, self.rope = config.attn_output_gate, rope
        q_rows = self.nh * self.hd * (2 if self.gated else 1)
        self.qkv_proj = nn.Linear(config.hidden_size, q_rows + 2 * self.nkv * self.hd, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, config.hidden_size, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.hd, config.rms_norm_eps, config.zero_centered_norm)
            self.k_norm = RMSNorm(self.hd, config.rms_norm_eps, config.zero_centered_norm)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # x [B, T, H] -> [B, T, H]
        B, T, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        gate = None
        if self.gated:
            q, gate = q
        if cache is not None:
            out = cache.attend(self.layer_idx, q, k, v)
        else:
            out = sdpa(q, k, v, mask)
        out = out.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)

    def project(self, x, cos, sin):
        """x [B, T, H] -> q [B, nh, T, hd], k/v [B, nkv, T, hd] (q/k-norm and rope applied); with the
        output gate q is (q, gate [B, T, nh*hd])."""
        B, T, _ = x.shape
        qkv = self.qkv_proj(x)  # [B, T, P]
        q_rows = self.nh * self.hd * (2 if self.gated else 1)
        q, k, v = qkv.split([q_rows, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        gate = None
        if self.gated:
            q, gate = q.view(B, T, self.nh, 2 * self.hd).chunk(2, dim=-1)
            gate = gate.reshape(B, T, self.nh * self.hd)
        q = q.reshape(B, T, self.nh, self.hd)
        k = k.view(B, T, self.nkv, self.hd)
        v = v.view(B, T, self.nkv, self.hd).transpose(1, 2)  # [B, nkv, T, hd]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if self.rope:
            q = apply_rope(q, cos, sin)  # [B, nh, T, hd]
            k = apply_rope(k, cos, sin)  # [B, nkv, T, hd]
        return ((q, gate) if self.gated else q), k, v


class Documents:
    """Where packed documents lie in each row: the attention `mask` object for packed training.

    Built from position_ids [B, T] (a document starts wherever the position is 0, and at column 0).
    Attention stays within a document and is causal inside it. On a GPU in fp16/bf16 `sdpa` makes
    one varlen flash call for the whole micro-batch (models/attention_kernels.py: the rows laid end
    to end, `cu_seqlens` marking the documents); elsewhere it runs each document as its own causal
    SDPA call, so no T×T mask is built and every call takes SDPA's causal fast path (a dense bool
    mask forces the general masked kernel and its T×T work per head).

      spans[b]     [(start, end), ...] python ints: row b's documents, in order, covering 0..T
      cu_seqlens   int32 [D+1]: cumulative lengths over all rows flattened (flash-attn varlen layout)
      max_seqlen   python int: the longest document (the varlen kernels' tiling bound)
      dense()      bool [B, 1, T, T] (True = attend): for attention variants that need a mask

    Measured on the project CPU (torch 2.13, fp32, B1 T2048, 16/8 heads × 128, 7 documents, fwd+bwd):
    per-document causal SDPA 1.3–2.6 s, one causal SDPA over the whole row (wrong: crosses documents)
    1.8–3.6 s, the dense mask 2.6–4.5 s. Flex attention has no CPU backward in torch 2.13.
    """

    def __init__(self, position_ids: torch.Tensor):
        B, T = position_ids.shape
        starts = position_ids == 0
        starts[:, 0] = True
        rows, cols = starts.nonzero(as_tuple=True)  # one host sync per forward
        self.shape = (B, T)
        self.device = position_ids.device
        self.spans: list[list[tuple[int, int]]] = [[] for _ in range(B)]
        for b, c in zip(rows.tolist(), cols.tolist()):
            if self.spans[b]:
                self.spans[b][-1] = (self.spans[b][-1][0], c)
            self.spans[b].append((c, T))
        lengths = [e - s for row in self.spans for s, e in row]
        self.max_seqlen = max(lengths)
        self.cu_seqlens = torch.tensor([0] + lengths, dtype=torch.int32, device=self.device).cumsum(0, dtype=torch.int32)

    @property
    def single(self) -> bool:
        """Every row is one document (plain causal attention)."""
        return all(len(row) == 1 for row in self.spans)

    def dense(self) -> torch.Tensor:
        """bool [B, 1, T, T]: causal within documents."""
        B, T = self.shape
        doc = torch.zeros(B, T, dtype=torch.int32, device=self.device)
        for b, row in enumerate(self.spans):
            for i, (s, e) in enumerate(row):
                doc[b, s:e] = i
        same_doc = doc[:, :, None] == doc[:, None, :]
        causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        return (same_doc & causal)[:, None]


class ShardedMask:
    """The attention `mask` under context parallelism (models/context_parallel.py implements it):
    the layers' q/k/v hold this rank's slice of the sequence and `sdpa` hands them to `attend`, which
    talks to the other ranks. Defined here so layers.py need not import context_parallel (which
    builds on `Documents` and `sdpa`)."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # For attention that builds its own mask (DSA's selection, sinks): the whole rows' keys and which
    # of them this rank's queries may see, so the layer runs its own masked path on them.
    def gather(self, *slices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each [B, h, T/size, d] key-side slice of this rank -> the whole rows [B, h, T, d]."""
        raise NotImplementedError

    visible: torch.Tensor  # bool [B, 1, T/size, T]: causal within documents, this rank's query rows
    key_positions: torch.Tensor  # [B, T]: the whole rows' positions
    columns: torch.Tensor  # [T/size]: this rank's global columns
    documents: Documents  # the whole rows' layout


# The active context-parallel shard (`context_parallel.context_parallel` sets it for a micro-batch):
# an object with `local_positions(position_ids) -> [B, T/size]` and `mask() -> ShardedMask`.
# A ContextVar, so another thread's forward (an engine, say) never sees it.
CONTEXT_SHARD: ContextVar = ContextVar("vf_context_shard", default=None)


def refuse_context_parallel(mask, layer: str) -> None:
    """For layers that build their own mask or carry state along the sequence: on a rank's slice
    they would compute as if the slice were the whole row, silently wrong. Refuse instead (exit 2)."""
    if isinstance(mask, ShardedMask):
        raise UsageError(f"context parallelism does not support {layer} layers (they would see only this "
                         "rank's slice of the sequence)",
                         hint="run this model without context parallelism (cp size 1)")


def positions_and_mask(input_ids: torch.Tensor, position_ids: torch.Tensor | None, cache=None):
    """(position_ids [B, T], mask) for a forward: positions default to the cache's offset onward;
    explicit positions without a cache are packed rows, whose mask is their `Documents` layout.
    Under an active context-parallel shard (no cache) the rows are this rank's slices: the local
    positions (the tokens' true positions, for rotary) and a `ShardedMask` that attends across ranks."""
    shard = CONTEXT_SHARD.get()
    if shard is not None and cache is None:
        return shard.local_positions(position_ids), shard.mask()
    if position_ids is None:
        B, T = input_ids.shape
        offset = int(getattr(cache, "seq_len", 0)) if cache is not None else 0
        return torch.arange(offset, offset + T, device=input_ids.device).expand(B, T), None
    return position_ids, (Documents(position_ids) if cache is None else None)


@torch.compiler.disable  # a graph break under `--model.compile`: the packed path (a per-document loop,
# or a varlen kernel whose layout changes with the packing) stays eager, so compiled blocks never
# recompile for a new packing layout
def sdpa(q, k, v, mask=None, window: int | None = None):
    """q [B,nh,T,hd], k/v [B,nkv,S,hd] -> [B,nh,T,hd]. mask: None (causal, T == S), a `Documents`
    layout (causal within each packed document, T == S), a `ShardedMask` (context parallelism: this
    rank's slice, causal within documents across all ranks) or bool [B|1,1,T,S] (True = attend).
    `window` W (with None or `Documents`): a query at position p sees only keys p-W+1..p.

    With `Documents` on CUDA in fp16/bf16 the whole micro-batch is one varlen kernel call
    (`attention_kernels.varlen_backend`: flash-attn, else torch's varlen); a layer the kernel does
    not fit (`attention_kernels.supports`), and CPU/fp32, run one causal SDPA per document."""
    if isinstance(mask, ShardedMask):
        if window is not None:
            raise ValueError("sdpa: a sliding window under context parallelism is not supported")
        return mask.attend(q, k, v)
    gqa = q.shape[1] != k.shape[1]
    if window is not None and mask is None:
        mask = Documents(torch.arange(q.shape[2], device=q.device).expand(q.shape[0], -1))  # one document a row
    if isinstance(mask, Documents):
        if mask.single and window is None:
            mask = None
        else:
            backend = attention_kernels.varlen_backend(q)
            if attention_kernels.supports(backend, q, k, v, window):
                return _varlen(backend, q, k, v, mask, window)
            return _per_document(q, k, v, mask, window)
    if window is not None:
        raise ValueError("sdpa: a sliding window needs mask None or a Documents layout")
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def _varlen(backend: str, q, k, v, docs: Documents, window: int | None):
    """The packed rows through one varlen call: [B, h, T, d] -> [B·T, h, d] (row after row, the
    layout `docs.cu_seqlens` counts in) and the output back to [B, nh, T, dv]."""
    B, nh, T, _ = q.shape
    flat = [t.transpose(1, 2).reshape(B * T, t.shape[1], t.shape[-1]) for t in (q, k, v)]
    cu = docs.cu_seqlens.to(q.device)  # the kernel reads it on the GPU (a no-op where the layout was built)
    out = attention_kernels.varlen_attention(backend, *flat, cu, docs.max_seqlen, window)
    return out.view(B, T, nh, -1).transpose(1, 2)


def _band(n: int, window: int, device) -> torch.Tensor:
    """bool [n, n]: causal, and key j within the last `window` positions of query i (i - j < window)."""
    i = torch.arange(n, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)


def _per_document(q, k, v, docs: Documents, window: int | None):
    """One causal SDPA per document (with a sliding window: the document's band as a bool mask)."""
    gqa = q.shape[1] != k.shape[1]

    def one(b, s, e):
        qd, kd, vd = q[b:b + 1, :, s:e], k[b:b + 1, :, s:e], v[b:b + 1, :, s:e]
        if window is None:
            return F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=gqa)
        return F.scaled_dot_product_attention(qd, kd, vd, attn_mask=_band(e - s, window, q.device), enable_gqa=gqa)

    return torch.cat([torch.cat([one(b, s, e) for s, e in row], dim=2) for b, row in enumerate(docs.spans)], dim=0)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None = None) -> torch.Tensor:
    """silu(gate) * up; with `limit` (DeepSeek-V4's swiglu_limit) gate is clipped to <= limit and up
    to [-limit, limit] first."""
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) with gate/up fused in `gate_up_proj` [2I, H]; or
    act="relu2" (Nemotron-H, not gated): down(relu(up(x))²) with `up_proj` [I, H]; `limit` clips the
    SwiGLU inputs (see `swiglu`)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, act: str = "swiglu",
                 limit: float | None = None):
        super().__init__()
        self.intermediate, self.act, self.limit = intermediate, act, limit
        if act == "relu2":
            self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        else:
            self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x):  # [..., H] -> [..., H]
        if self.act == "relu2":
            return self.down_proj(torch.relu(self.up_proj(x)).square())
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(swiglu(gate, up, self.limit))
