"""Packed attention through one varlen kernel call per micro-batch (models/attention_kernels.py).

No CUDA here and torch's varlen kernel has no CPU implementation, so the kernels are replaced by CPU
stand-ins with their exact signatures (torch 2.13's `varlen_attn`, a torch 2.10-style one without
windows/GQA/scale, flash-attn's `flash_attn_varlen_func`, torch's CUDA flash op and its backward):
each checks what a real kernel would refuse, records what it was handed, and computes the answer
its own way (one masked SDPA over the flattened tokens), so a wrong flattening, cu_seqlens or
window fails the parity with the per-document loop."""

import types

import pytest
import torch
import torch.nn.functional as F
from vf.models import ModelConfig, attention_kernels, build_model
from vf.models import context_parallel as cp_module
from vf.models.context_parallel import ContextShard, ring_attention
from vf.models.layers import Documents, _per_document, sdpa

from vf.errors import UsageError

# ---- stand-ins ------------------------------------------------------------------------------------


def _reference(q, k, v, cu, left: int, scale):
    """[N, nh, d] attention over flattened documents (cu int32 [D+1]): causal within each, keys
    i-left..i when left >= 0; one SDPA with a dense [N, N] mask (not the loop under test)."""
    assert cu.dtype == torch.int32 and int(cu[-1]) == q.shape[0] == k.shape[0]
    doc = torch.repeat_interleave(torch.arange(len(cu) - 1), (cu[1:] - cu[:-1]).long())
    i = torch.arange(q.shape[0])
    dist = i[:, None] - i[None, :]
    allowed = (doc[:, None] == doc[None, :]) & (dist >= 0)
    if left >= 0:
        allowed &= dist <= left
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=allowed, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)


def _max_len(cu):
    return int((cu[1:] - cu[:-1]).max())


def torch_varlen_213(calls):
    """torch 2.13's `torch.nn.attention.varlen.varlen_attn` signature and argument checks."""
    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
        if not enable_gqa and query.size(1) != key.size(1):
            raise ValueError("Expect query and key/value to have the same number of heads")
        assert query.dim() == 3 and query.shape[-1] == key.shape[-1] == value.shape[-1]  # one head size
        assert torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k == _max_len(cu_seq_q)
        assert window_size[1] == 0  # causal: (-1, 0); a window: (W - 1, 0)
        calls.append({"shapes": (tuple(query.shape), tuple(key.shape), tuple(value.shape)), "cu": cu_seq_q.tolist(),
                      "max": max_q, "window_size": tuple(window_size), "gqa": enable_gqa, "scale": scale})
        return _reference(query, key, value, cu_seq_q, window_size[0], scale)
    return varlen_attn


def torch_varlen_210(calls):
    """The first torch varlen API (2.10): causal as a flag; no window, no scale, no GQA."""
    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        assert query.shape[1] == key.shape[1] and query.shape[-1] == value.shape[-1] and is_causal
        calls.append({"shapes": (tuple(query.shape), tuple(key.shape)), "cu": cu_seq_q.tolist()})
        return _reference(query, key, value, cu_seq_q, -1, None)
    return varlen_attn


def flash_attn_standin(calls):
    """flash-attn 2.x's `flash_attn_varlen_func` (GQA native: fewer kv heads are fine)."""
    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        assert q.shape[1] % k.shape[1] == 0 and q.shape[-1] == v.shape[-1] and causal and dropout_p == 0.0
        assert max_seqlen_q == max_seqlen_k == _max_len(cu_seqlens_q) and window_size[1] in (0, -1)
        calls.append({"shapes": (tuple(q.shape), tuple(k.shape), tuple(v.shape)), "cu": cu_seqlens_q.tolist(),
                      "window_size": tuple(window_size), "scale": softmax_scale})
        return _reference(q, k, v, cu_seqlens_q, window_size[0], softmax_scale)
    return flash_attn_varlen_func


@pytest.fixture
def kernel(monkeypatch):
    """Route packed attention on these CPU tensors to a stand-in: kernel(name, standin) -> calls."""
    monkeypatch.delenv(attention_kernels.ENV, raising=False)

    def use(backend: str, make):
        calls = []
        fn = make(calls)
        monkeypatch.setattr(attention_kernels, "varlen_backend", lambda q: backend)
        monkeypatch.setattr(attention_kernels, "_flash_attn_varlen" if backend == "flash_attn" else "_torch_varlen",
                            lambda: fn)
        return calls
    return use


def _qkv(B=2, nh=4, nkv=2, T=12, d=8, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, T, e, generator=g, requires_grad=True)
                 for h, e in ((nh, d), (nkv, d), (nkv, dv or d)))


# uneven documents, B = 2, a one-token document, a row of one document next to a packed one
POS = torch.tensor([[0, 1, 2, 3, 4, 0, 0, 1, 2, 0, 1, 2],
                    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]])


def _grads(out, inputs, seed=1):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out * w).sum(), inputs)


def _close(a, b, tol=1e-6):
    """Max difference below `tol` relative to the values' scale (at least 1): the stand-ins sum in
    another order (one dense masked SDPA), which moves fp32 gradients of size ~5 by ~1e-6."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) < tol * max(1.0, float(b.abs().max()))


# ---- (a) dispatch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("tvarlen", [True, False])
def test_dispatch_by_device_dtype_and_what_is_installed(monkeypatch, device, dtype, flash, tvarlen):
    monkeypatch.delenv(attention_kernels.ENV, raising=False)
    monkeypatch.setattr(attention_kernels, "_flash_attn_varlen", lambda: (lambda *a, **k: None) if flash else None)
    monkeypatch.setattr(attention_kernels, "_torch_varlen", lambda: (lambda *a, **k: None) if tvarlen else None)
    monkeypatch.setattr(attention_kernels, "_flash_capable", lambda device: True)
    q = types.SimpleNamespace(device=device, dtype=dtype)  # a tensor-like: no CUDA needed to decide
    want = "sdpa_loop"
    if device == "cuda" and dtype == torch.bfloat16:
        want = "flash_attn" if flash else "torch_varlen" if tvarlen else "sdpa_loop"
    assert attention_kernels.varlen_backend(q) == want
    assert attention_kernels.ring_block_backend(q) == ("flash" if device == "cuda" and dtype == torch.bfloat16
                                                        else "tiles")


def test_dispatch_needs_an_sm80_gpu_and_never_imports_flash_attn_on_cpu(monkeypatch):
    monkeypatch.delenv(attention_kernels.ENV, raising=False)
    monkeypatch.setattr(attention_kernels, "_flash_attn_varlen", lambda: (lambda *a, **k: None))
    monkeypatch.setattr(attention_kernels, "_flash_capable", lambda device: False)  # a V100 / T4
    assert attention_kernels.varlen_backend(types.SimpleNamespace(device="cuda:1", dtype=torch.float16)) == "sdpa_loop"
    monkeypatch.undo()
    attention_kernels._flash_attn_varlen.cache_clear()
    q, k, v = _qkv()
    sdpa(q, k, v, Documents(POS))  # CPU fp32: decided before any import is tried
    assert attention_kernels._flash_attn_varlen.cache_info().currsize == 0


def test_layers_the_kernel_does_not_fit_run_the_loop(monkeypatch):
    """Per layer: head sizes over 256, a torch varlen without `scale` for q/v sizes that differ, or
    one with no way to ask for causal attention; flash-attn takes all of these but the first."""
    q, kv = torch.empty(1, 4, 2, 8), torch.empty(1, 2, 2, 8)
    monkeypatch.setattr(attention_kernels, "_flash_attn_varlen", lambda: flash_attn_standin([]))
    assert attention_kernels.supports("flash_attn", q, kv, kv) and attention_kernels.supports("flash_attn", q, kv, kv, 4)
    big = torch.empty(1, 4, 2, 320)
    assert not attention_kernels.supports("flash_attn", big, big, big)
    monkeypatch.setattr(attention_kernels, "_torch_varlen", lambda: torch_varlen_210([]))
    assert attention_kernels.supports("torch_varlen", q, kv, kv)
    assert not attention_kernels.supports("torch_varlen", q, kv, kv[..., :6])  # needs `scale`
    assert not attention_kernels.supports("torch_varlen", q, kv, kv, 4)  # needs `window_size`

    def no_causal(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        raise AssertionError("never called")
    monkeypatch.setattr(attention_kernels, "_torch_varlen", lambda: no_causal)
    assert not attention_kernels.supports("torch_varlen", q, kv, kv)
    assert not attention_kernels.supports("sdpa_loop", q, kv, kv)


# ---- (b) one call per micro-batch, parity with the per-document loop ------------------------------


@pytest.mark.parametrize("backend,make", [("torch_varlen", torch_varlen_213), ("torch_varlen", torch_varlen_210),
                                          ("flash_attn", flash_attn_standin)], ids=["torch-2.13", "torch-2.10", "flash-attn"])
def test_one_kernel_call_per_micro_batch_matches_the_loop(kernel, backend, make):
    """B=2 rows, 4 documents (lengths 5, 1, 3, 3 and 12), GQA 4/2: ONE call with the rows laid end to
    end, cu_seqlens = the layout's, and values and q/k/v gradients equal the per-document loop."""
    calls = kernel(backend, make)
    q, k, v = _qkv()
    docs = Documents(POS)
    want = _per_document(q, k, v, docs, None)
    got = sdpa(q, k, v, docs)
    assert len(calls) == 1, calls  # the old code: one SDPA per document, no kernel call at all
    c = calls[0]
    assert c["cu"] == [0, 5, 6, 9, 12, 24] == docs.cu_seqlens.tolist()
    assert c["shapes"][0] == (24, 4, 8)
    if make is torch_varlen_213:
        assert c["shapes"][1] == (24, 2, 8) and c["gqa"] and c["window_size"] == (-1, 0) and c["max"] == 12
    elif make is torch_varlen_210:
        assert c["shapes"][1] == (24, 4, 8)  # no enable_gqa there: kv heads repeated
    else:
        assert c["shapes"][1] == (24, 2, 8) and c["window_size"] == (-1, -1)  # causal=True, no window
    assert got.shape == want.shape and _close(got, want)
    for a, b in zip(_grads(got, (q, k, v)), _grads(want, (q, k, v))):
        assert _close(a, b)


def test_loop_fallback_is_the_old_per_document_sdpa():
    """CPU fp32 (the default here) keeps the per-document loop bit for bit, equal to the dense mask."""
    q, k, v = _qkv()
    docs = Documents(POS)
    got = sdpa(q, k, v, docs)
    assert torch.equal(got, _per_document(q, k, v, docs, None))
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=docs.dense(), enable_gqa=True)
    assert _close(got, dense)
    for a, b in zip(_grads(got, (q, k, v)), _grads(dense, (q, k, v))):
        assert _close(a, b)


@pytest.mark.parametrize("make", [torch_varlen_213, flash_attn_standin], ids=["torch-2.13", "flash-attn"])
def test_different_q_and_v_head_sizes_are_padded_with_the_scale_passed(kernel, make):
    """MLA's 192/128 shape in small (q/k 8, v 6): one head size for the kernel, scale 1/sqrt(8)."""
    calls = kernel("flash_attn" if make is flash_attn_standin else "torch_varlen", make)
    q, k, v = _qkv(dv=6)
    docs = Documents(POS)
    got, want = sdpa(q, k, v, docs), _per_document(q, k, v, docs, None)
    assert len(calls) == 1 and calls[0]["shapes"][2][-1] == 8 and calls[0]["scale"] == pytest.approx(8 ** -0.5)
    assert got.shape[-1] == 6 and _close(got, want)
    for a, b in zip(_grads(got, (q, k, v)), _grads(want, (q, k, v))):
        assert _close(a, b)


def test_packed_model_makes_one_call_per_layer_and_matches_the_loop(kernel):
    """A packed Qwen3 micro-batch (2 layers): 2 kernel calls in forward, hidden states and every
    parameter gradient equal to the loop's."""
    cfg = ModelConfig(architecture="qwen3", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, intermediate_size=48)
    model = build_model(cfg, seed=3).train()
    ids = torch.randint(0, 97, POS.shape, generator=torch.Generator().manual_seed(1))

    def run():
        model.zero_grad()
        h = model(ids, POS)
        h.square().mean().backward()
        return h.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    h_loop, g_loop = run()
    calls = kernel("torch_varlen", torch_varlen_213)
    h_kernel, g_kernel = run()
    assert len(calls) == cfg.num_layers and len(g_loop) > 10 and g_kernel.keys() == g_loop.keys()
    assert _close(h_kernel, h_loop, 1e-5)
    for n in g_loop:
        assert _close(g_kernel[n], g_loop[n], 1e-6), n


# ---- (c) a forced backend that cannot run is an error ---------------------------------------------


def test_forced_backend_that_cannot_run_is_a_clear_error(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setenv("VF_ATTENTION", "flash_attn")
    with pytest.raises(UsageError, match="VF_ATTENTION=flash_attn: it needs a CUDA device"):
        sdpa(q, k, v, Documents(POS))
    with pytest.raises(UsageError, match="VF_ATTENTION=flash_attn"):  # ring too
        ring_attention(q, k, v, ContextShard(None, 1, 0, "ring", POS))
    monkeypatch.setattr(attention_kernels, "_flash_capable", lambda device: True)
    cuda = types.SimpleNamespace(device="cuda", dtype=torch.float32)
    with pytest.raises(UsageError, match="float16/bfloat16"):
        attention_kernels.varlen_backend(cuda)
    cuda.dtype = torch.bfloat16
    monkeypatch.setattr(attention_kernels, "_flash_attn_varlen", lambda: None)
    with pytest.raises(UsageError, match="flash-attn is not installed"):
        attention_kernels.varlen_backend(cuda)
    monkeypatch.setenv("VF_ATTENTION", "torch_varlen")
    monkeypatch.setattr(attention_kernels, "_torch_varlen", lambda: None)
    with pytest.raises(UsageError, match="no torch.nn.attention.varlen"):
        attention_kernels.varlen_backend(cuda)
    monkeypatch.setenv("VF_ATTENTION", "flash")
    with pytest.raises(UsageError, match="not an attention backend"):
        attention_kernels.varlen_backend(cuda)
    monkeypatch.setattr(attention_kernels, "_flash_attn_varlen", lambda: (lambda *a, **k: None))
    monkeypatch.setenv("VF_ATTENTION", "sdpa_loop")  # forcing the loop on a GPU with flash-attn
    assert attention_kernels.varlen_backend(cuda) == "sdpa_loop"
    assert attention_kernels.ring_block_backend(cuda) == "tiles"
    monkeypatch.setenv("VF_ATTENTION", "auto")
    assert attention_kernels.varlen_backend(cuda) == "flash_attn"


# ---- (d) sliding windows and sinks: the kernel's window, or the layer's own path ------------------


def _windowed_dense(q, k, v, docs, window):
    T = q.shape[2]
    i = torch.arange(T)
    band = (i[:, None] - i[None, :] < window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=docs.dense() & band, enable_gqa=True)


@pytest.mark.parametrize("make", [torch_varlen_213, flash_attn_standin], ids=["torch-2.13", "flash-attn"])
def test_sliding_window_goes_to_the_kernel_as_window_size(kernel, make):
    """A window of W keys (GPT-OSS's convention: p sees p-W+1..p) is window_size=(W-1, 0)."""
    calls = kernel("flash_attn" if make is flash_attn_standin else "torch_varlen", make)
    q, k, v = _qkv()
    docs = Documents(POS)
    got = sdpa(q, k, v, docs, window=3)
    want = _windowed_dense(q, k, v, docs, 3)
    assert len(calls) == 1 and calls[0]["window_size"] == (2, 0)
    assert _close(got, want)
    for a, b in zip(_grads(got, (q, k, v)), _grads(want, (q, k, v))):
        assert _close(a, b)


def test_window_the_kernel_cannot_take_keeps_that_layer_on_the_loop(kernel):
    """torch 2.10's varlen has no window_size: that layer loops (with its band), the others don't."""
    calls = kernel("torch_varlen", torch_varlen_210)
    q, k, v = _qkv()
    docs = Documents(POS)
    got = sdpa(q, k, v, docs, window=3)
    assert calls == []
    assert _close(got, _windowed_dense(q, k, v, docs, 3))
    sdpa(q, k, v, docs)  # a full-attention layer of the same model still takes the kernel
    assert len(calls) == 1
    # a window on plain causal rows (mask None) is the same band, one document per row
    one = torch.arange(12).expand(2, 12)
    assert _close(sdpa(q, k, v, None, window=4), _windowed_dense(q, k, v, Documents(one), 4))


def test_sink_layers_keep_their_own_path(kernel):
    """GPT-OSS (sinks on every layer, sliding and full): no kernel takes a sink logit, so no layer
    calls the kernel and the packed forward equals the loop's."""
    cfg = ModelConfig(architecture="gpt_oss", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, intermediate_size=16, moe_intermediate_size=16, num_experts=4,
                      num_experts_per_tok=2, sliding_window=3, layer_types=["sliding_attention", "full_attention"],
                      router_bias=True, expert_bias_terms=True, expert_act="clamped_swiglu", norm_topk_prob=True)
    model = build_model(cfg, seed=0)
    ids = torch.randint(0, 64, POS.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids, POS)
        calls = kernel("flash_attn", flash_attn_standin)
        got = model(ids, POS)
    assert calls == [] and torch.equal(got, want)


# ---- (e) ring attention's CUDA block kernel -------------------------------------------------------


def cuda_flash_standins(calls):
    """torch's `aten._scaled_dot_product_flash_attention` / `_backward` (CUDA ops) by signature, on
    torch's CPU flash kernel; each checks what the CUDA kernel requires (no mask, one head count, head
    size a multiple of 8, Tq == Tk when causal) and records the call."""
    def fwd(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        _, h, Tq, d = query.shape
        assert key.shape[1] == h and d % 8 == 0 and dropout_p == 0.0 and not return_debug_mask
        assert not is_causal or key.shape[2] == Tq
        calls.append(("forward", is_causal, Tq, key.shape[2], d))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal,
                                                                              scale=scale)
        return out, lse, None, None, Tq, key.shape[2], torch.zeros(2, dtype=torch.int64), torch.empty(0), torch.empty(0)

    def bwd(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
            philox_seed, philox_offset, *, scale=None):
        assert cum_seq_q is None and cum_seq_k is None and (max_q, max_k) == (query.shape[2], key.shape[2])
        assert philox_seed.shape == (2,) and logsumexp.is_contiguous() and out.dtype == query.dtype
        calls.append(("backward", is_causal, max_q, max_k, query.shape[-1]))
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, query, key, value, out, logsumexp, 0.0, is_causal, scale=scale)
    return fwd, bwd


RING_LAYOUTS = {  # T = 32: a ring of one has chunks [0, 16) and [16, 32)
    "one document": [[32], [32]],  # no masked tile: every block by the kernel
    "ragged": [[3, 29], [3, 29]],  # masked tiles where a document starts: those by the tile math
    "rows differ": [[3, 20, 9], [16, 16]],
}


@pytest.mark.parametrize("layout", list(RING_LAYOUTS))
@pytest.mark.parametrize("dims", [(8, 8), (12, 6)], ids=["hd8", "q12-v6"])
def test_ring_cuda_block_kernel_matches_the_tile_math(monkeypatch, layout, dims):
    monkeypatch.delenv(attention_kernels.ENV, raising=False)
    monkeypatch.setattr(cp_module, "Q_TILE", 4)
    monkeypatch.setattr(cp_module, "_fused", lambda q: False)  # not the CPU kernel: as on CUDA
    dq, dv = dims
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 32, d, generator=g, requires_grad=True) for h, d in ((4, dq), (2, dq), (2, dv)))
    pos = torch.cat([torch.cat([torch.arange(n) for n in row])[None] for row in RING_LAYOUTS[layout]])

    def ring():
        return ring_attention(q, k, v, ContextShard(None, 1, 0, "ring", pos))

    want = ring()  # the tile math (CPU fp32 without the fused kernel: ring_block_backend says "tiles")
    grads_want = _grads(want, (q, k, v))
    calls = []
    fwd, bwd = cuda_flash_standins(calls)
    monkeypatch.setattr(attention_kernels, "ring_block_backend", lambda q: "flash")
    monkeypatch.setattr(attention_kernels, "_CUDA_FLASH", fwd)
    monkeypatch.setattr(attention_kernels, "_CUDA_FLASH_BACKWARD", bwd)
    got = ring()
    assert _close(got, want)
    for a, b in zip(_grads(got, (q, k, v)), grads_want):
        assert _close(a, b)
    kinds = {c[:2] for c in calls}
    assert ("forward", True) in kinds and ("backward", True) in kinds  # the diagonals, is_causal
    assert all(c[-1] == -(-max(dq, dv) // 8) * 8 for c in calls)  # one head size, a multiple of 8
    if layout == "one document":
        assert ("forward", False) in kinds  # the off-diagonal block, unmasked
    assert sum(c[0] == "forward" for c in calls) == sum(c[0] == "backward" for c in calls)


def test_ring_cuda_block_kernel_in_bfloat16(monkeypatch):
    """The kernel's dtype path (16-bit q/k/v, final out and dout cast to it for backward) against
    the fp32 tile math on the same values, within bf16's resolution."""
    monkeypatch.delenv(attention_kernels.ENV, raising=False)
    monkeypatch.setattr(cp_module, "Q_TILE", 4)
    monkeypatch.setattr(cp_module, "_fused", lambda q: False)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, h, 32, 8, generator=g).bfloat16().requires_grad_() for h in (4, 2, 2))
    pos = torch.cat([torch.arange(n) for n in (3, 29)])[None]
    ref = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = ring_attention(*ref, ContextShard(None, 1, 0, "ring", pos))
    calls = []
    fwd, bwd = cuda_flash_standins(calls)
    monkeypatch.setattr(attention_kernels, "ring_block_backend", lambda q: "flash")
    monkeypatch.setattr(attention_kernels, "_CUDA_FLASH", fwd)
    monkeypatch.setattr(attention_kernels, "_CUDA_FLASH_BACKWARD", bwd)
    got = ring_attention(q, k, v, ContextShard(None, 1, 0, "ring", pos))
    assert got.dtype == torch.bfloat16 and calls
    assert _close(got.float(), want, 3e-2)
    for a, b in zip(_grads(got.float(), (q, k, v)), _grads(want, ref)):
        assert _close(a.float(), b, 6e-2)
