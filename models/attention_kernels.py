"""Which kernel runs packed attention, and the call into it.

Packed training rows hold several documents; attention is causal within each (`layers.Documents`).
On a GPU the whole micro-batch goes to ONE variable-length flash call: the rows [B, nh, T, hd] are
laid end to end as [B·T, nh, hd] and the documents' cumulative lengths (`Documents.cu_seqlens`, the
flash-attn varlen layout) tell the kernel where each one starts. Elsewhere (CPU, fp32) each document
is its own causal SDPA call, as before (`layers.sdpa`).

  varlen_backend(q)   "flash_attn"    flash-attn's `flash_attn_varlen_func` (installed, CUDA, fp16/bf16)
                      "torch_varlen"  torch's own `torch.nn.attention.varlen.varlen_attn` (torch >= 2.10)
                      "sdpa_loop"     one causal SDPA per document (CPU, fp32, or neither kernel)
  supports(backend, q, k, v, window)  whether this layer's call fits the kernel (else that layer loops)
  varlen_attention(backend, q, k, v, cu_seqlens, max_seqlen, window)  the one call, flat layout
  ring_block_backend(q)  "flash" | "tiles": what context parallelism's ring runs a block with on CUDA

Override: the environment variable VF_ATTENTION = auto (default) | flash_attn | torch_varlen |
sdpa_loop, read at each call. A forced kernel that cannot run here (no CUDA, fp32, not installed, a
GPU older than sm80) raises UsageError instead of quietly running another path; `sdpa_loop` also
turns ring attention's CUDA kernel off (the tile math then runs).

What each backend does with the layers' variants:
  GQA             flash_attn takes kv heads as they are; torch_varlen passes `enable_gqa=True` where
                  its signature has it (torch 2.13) and otherwise gets kv heads repeated to nh.
  q/v head sizes  differ for MLA (192/128): q, k, v are zero-padded to one size (no score or kept
                  output column changes) and the scale 1/sqrt(dq) is passed explicitly; a torch
                  varlen without a `scale` argument keeps that layer on the loop.
  sliding window  `window` W (a query at p sees keys p-W+1..p, GPT-OSS's convention): the kernels'
                  window_size=(W-1, 0); a kernel without `window_size` (torch 2.10's varlen) keeps
                  the layer on the loop, which masks each document's band.
  sinks           no kernel here takes a sink logit: GPT-OSS / DeepSeek-V4 keep their own masked
                  SDPA path (they never call `sdpa` with a `Documents` layout).
  head size > 256 beyond FA2's kernels: that layer loops.

flash_attn is imported lazily, on the first decision on a CUDA half-precision tensor, never at
`import vf`; it is never required. torch's varlen module has no CPU kernel (torch 2.13), so on CPU
tests stand in for both with functions of the same signature.
"""

from __future__ import annotations

import inspect
import os
from functools import lru_cache

import torch

from vf.errors import UsageError

ENV = "VF_ATTENTION"
BACKENDS = ("flash_attn", "torch_varlen", "sdpa_loop")
MAX_HEAD_DIM = 256  # FlashAttention-2's largest head size (and torch's vendored copy of it)
_HALF = (torch.float16, torch.bfloat16)

# torch's CUDA flash kernel with its log-sum-exp, per ring block (context_parallel); names for tests
_CUDA_FLASH = torch.ops.aten._scaled_dot_product_flash_attention
_CUDA_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward


def forced_backend() -> str | None:
    """$VF_ATTENTION when it names a backend; None for unset/auto; an unknown value is an error."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in BACKENDS:
        raise UsageError(f"{ENV}={value!r} is not an attention backend",
                         hint=f"one of auto, {', '.join(BACKENDS)}")
    return value


@lru_cache(maxsize=1)
def _flash_attn_varlen():
    """flash-attn's `flash_attn_varlen_func`, or None when it is not installed (or its CUDA library
    does not load: a wheel built against another torch fails at import with OSError/ImportError)."""
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - any failure to import means "not available"
        return None
    return flash_attn_varlen_func


@lru_cache(maxsize=1)
def _torch_varlen():
    """`torch.nn.attention.varlen.varlen_attn` (torch >= 2.10), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@lru_cache(maxsize=8)
def _params(fn) -> frozenset[str]:
    """The keyword names `fn` takes: the two kernels' signatures grew across versions (torch's varlen:
    `is_causal` in 2.10, `window_size`/`scale` later, `enable_gqa` in 2.13), so calls adapt to them."""
    return frozenset(inspect.signature(fn).parameters)


def _flash_capable(device) -> bool:
    """FlashAttention-2 kernels (flash-attn's and torch's) need an sm80+ GPU (Ampere or later)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 0)


def _unavailable(backend: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `backend` cannot run on (device, dtype), or None when it can."""
    if backend == "sdpa_loop":
        return None
    if device.type != "cuda":
        return f"it needs a CUDA device (the tensors are on {device.type})"
    if dtype not in _HALF:
        return f"flash kernels take float16/bfloat16, not {str(dtype).removeprefix('torch.')}"
    if backend == "flash_attn" and _flash_attn_varlen() is None:
        return "flash-attn is not installed (or does not import)"
    if backend == "torch_varlen" and _torch_varlen() is None:
        return f"this torch ({torch.__version__}) has no torch.nn.attention.varlen (torch >= 2.10)"
    if not _flash_capable(device):
        return "the GPU is older than sm80"
    return None


def varlen_backend(q) -> str:
    """The backend for packed attention on `q`'s device and dtype (anything with `.device` and
    `.dtype`): the override if set (an error if it cannot run here), else flash_attn, else
    torch_varlen, else sdpa_loop. Cheap: the imports are cached."""
    device, dtype = torch.device(q.device), q.dtype
    forced = forced_backend()
    if forced is not None:
        why = _unavailable(forced, device, dtype)
        if why:
            raise UsageError(f"{ENV}={forced}: {why}",
                             hint=f"unset {ENV} (auto) or set it to sdpa_loop on this machine")
        return forced
    for backend in ("flash_attn", "torch_varlen"):
        if _unavailable(backend, device, dtype) is None:
            return backend
    return "sdpa_loop"


def supports(backend: str, q, k, v, window: int | None = None) -> bool:
    """Whether this layer's call fits `backend`'s kernel (q [.., nh, ., dq], k [.., nkv, ., dq],
    v [.., nkv, ., dv]); a layer that does not fit runs the per-document loop (module doc)."""
    if backend == "sdpa_loop":
        return False
    dq, dv, nh, nkv = q.shape[-1], v.shape[-1], q.shape[-3], k.shape[-3]
    if max(dq, dv) > MAX_HEAD_DIM or nh % nkv:
        return False
    if backend == "flash_attn":
        return window is None or "window_size" in _params(_flash_attn_varlen())
    params = _params(_torch_varlen())
    if "window_size" not in params and "is_causal" not in params:  # no way to ask it for causal
        return False
    if dq != dv and "scale" not in params:
        return False
    return window is None or "window_size" in params


def _pad(t: torch.Tensor, d: int) -> torch.Tensor:
    return t if t.shape[-1] == d else torch.nn.functional.pad(t, (0, d - t.shape[-1]))


def varlen_attention(backend: str, q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int,
                     window: int | None = None) -> torch.Tensor:
    """One kernel call over every document of a micro-batch: q [N, nh, dq], k [N, nkv, dq],
    v [N, nkv, dv] (N = all tokens, documents end to end), `cu_seqlens` int32 [D+1] on their device,
    `max_seqlen` the longest document -> [N, nh, dv], causal within each document (and within the
    last `window` keys when given). Differentiable (both kernels carry their own backward)."""
    dq, dv = q.shape[-1], v.shape[-1]
    scale = None
    if dq != dv:  # one head size for the kernel: zero columns change no score, the extra out columns go
        d = max(dq, dv)
        q, k, v, scale = _pad(q, d), _pad(k, d), _pad(v, d), dq ** -0.5
    left = -1 if window is None else window - 1  # flash convention: keys i-left..i (W keys with itself)
    if backend == "flash_attn":
        kw = {"causal": True}
        if scale is not None:
            kw["softmax_scale"] = scale
        if window is not None:
            kw["window_size"] = (left, 0)
        out = _flash_attn_varlen()(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kw)
    elif backend == "torch_varlen":
        fn = _torch_varlen()
        params = _params(fn)
        kw = {}
        if "is_causal" in params:  # torch 2.10's spelling
            kw["is_causal"] = True
        if "window_size" in params:  # later ones: (-1, 0) is causal (is_causal = window == (-1, 0))
            kw["window_size"] = (left, 0)
        if scale is not None:
            kw["scale"] = scale
        if q.shape[1] != k.shape[1]:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        out = fn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kw)
    else:
        raise ValueError(f"varlen_attention: no kernel for backend {backend!r}")
    return out[..., :dv]


# ---- ring attention's per-block kernel (context_parallel) -----------------------------------------


def ring_block_backend(q) -> str:
    """Returns "flash" when ring attention runs each unmasked block (every key visible, or one document's causal
    diagonal) through torch's CUDA flash kernel, which returns the block's log-sum-exp for the merge
    (`flash_block_forward`/`_backward`), else "tiles": the explicit tile math. CUDA, fp16/bf16, sm80+;
    $VF_ATTENTION=sdpa_loop turns it off, a forced kernel that cannot run here raises. torch's own
    op, not flash-attn's: every CUDA build of torch has it, with one signature since 2.1."""
    forced = forced_backend()
    if forced == "sdpa_loop":
        return "tiles"
    if forced is not None:
        varlen_backend(q)  # raises when the forced kernel cannot run here
    return "flash" if _unavailable("torch_flash", torch.device(q.device), q.dtype) is None else "tiles"


def flash_block_forward(q, k, v, causal: bool, scale: float):
    """q [B, h, Tq, d], k/v [B, h, Tk, d] (one head count, d a multiple of 8, fp16/bf16, CUDA; Tq == Tk
    when causal) -> (out [B, h, Tq, d] in q's dtype, lse fp32 [B, h, Tq], aux): `aux` is the op's
    (philox seed, offset) placeholders, handed back to `flash_block_backward` (unused at dropout 0,
    but typed per torch build)."""
    out, lse, _, _, _, _, seed, offset, _ = _CUDA_FLASH(q, k, v, 0.0, causal, False, scale=scale)
    return out, lse, (seed, offset)


def flash_block_backward(dout, q, k, v, out, lse, causal: bool, scale: float, aux):
    """The block's (dq, dk, dv) given the FINAL out and lse of its queries (the ring's identity:
    P = exp(S - lse), D = rowsum(dO·O)); dout/out in q's dtype, lse fp32 [B, h, Tq]."""
    seed, offset = aux
    return _CUDA_FLASH_BACKWARD(dout, q, k, v, out, lse.contiguous(), None, None, q.shape[2], k.shape[2],
                                0.0, causal, seed, offset, scale=scale)
