"""Per-token log-probs (and entropy) from the LM head without materialising tokens×vocab logits.

    z      = (hidden @ weightᵀ) / T                      logits, [N, V] — never built whole
    logZ   = logsumexp_v z                              running (online) log-sum-exp over slices
    logp   = z[target] − logZ
    H      = logZ − Σ_v softmax(z)_v · z_v             entropy

Shapes: hidden [N, H], weight [V, H] (the LM head, possibly tied to the input embedding),
targets [N] int64, temperature a float or a per-token tensor [N].

`chunked_logprobs` walks the vocabulary in slices of `chunk_size` rows (and the tokens in blocks of
`token_chunk_size`), keeping per token a running max m, Σ e^(z−m) (and Σ e^(z−m)·z for entropy).
Peak extra memory is one [token_chunk_size, chunk_size] slice buffer (reused across slices). It is a
custom autograd Function: forward saves only hidden, weight, targets, (per-token temperature) and
logZ; backward recomputes each logits slice, q = exp(z − logZ) − onehot(target), and accumulates
dhidden = −(g/T)·(q·W) and dW[slice] = qᵀ·(−g·hidden/T). A tied weight just receives its grad
(autograd adds it to the embedding's).

Cost: the backward recomputes the logits, so forward+backward is four [N,H]×[H,V] GEMMs against
the full-logits path's three; what chunking saves is the N×V memory and its elementwise passes.
To keep the per-slice work at the GEMMs, the row factors 1/T and g are applied to [N, H] operands
or results (never to the slice), z[target] is a row dot product, and fp32/fp64 slices are written
by `mm(out=)`/`addmm_` into reused buffers (the slice's only elementwise work: subtract, exp).

Entropy is forward-only: it is marked non-differentiable (use it for metrics, not as a loss term).
Logits are computed in the input dtype and accumulated in fp32 (fp64 for fp64 inputs); targets outside [0, V) (e.g. −100
padding) give logp = −logZ without error — mask them out of the loss.

`naive_logprobs` is the reference: full log_softmax + gather.

`fused_head_loss` is the trainer's path for per-token losses (every built-in): per block of tokens
it builds the full-vocabulary logits row in one reused [block, V] buffer, so logZ is exact at
once, evaluates the loss on the block's log-probs, and forms dhidden and dW right there — three
GEMMs and no recompute; backward only hands the gradients out. Its block (FUSED_BLOCK_ELEMENTS // V
tokens) trades buffer memory against passes over dW (one addmm_ over [V, H] per block).
"""

from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_CHUNK_SIZE = 8192
DEFAULT_TOKEN_CHUNK_SIZE = 8192


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _inv_temp(temperature: float | Tensor, n: int, device, dtype=torch.float32) -> Tensor:
    """1/T as an [N, 1] column in the accumulation dtype (a scalar temperature is broadcast)."""
    t = torch.as_tensor(temperature, device=device).to(dtype)
    if t.dim() == 0:
        t = t.expand(n)
    if t.shape != (n,):
        raise ValueError(f"temperature must be a float or a [N]={n} tensor, got shape {tuple(t.shape)}")
    return (1.0 / t).unsqueeze(1)


def _slice_logits(h: Tensor, w: Tensor, inv_t: Tensor) -> Tensor:
    return (h @ w.t()).to(inv_t.dtype) * inv_t


def _scaled_hidden(hidden: Tensor, inv_t: Tensor, unit_temp: bool) -> Tensor:
    """hidden / T, row by row. (h/T)·Wᵀ = (h·Wᵀ)/T, so scaling the [N, H] input once replaces
    scaling every [N, chunk] logits slice (an extra pass over memory per slice, forward and backward)."""
    if unit_temp:
        return hidden
    return (hidden.to(inv_t.dtype) * inv_t).to(hidden.dtype)


def _logits_into(buf: Tensor | None, hs: Tensor, w: Tensor, acc: torch.dtype) -> Tensor:
    """One logits slice hs·wᵀ in the accumulation dtype, written into `buf` when the input dtype is
    the accumulation dtype (fp32/fp64: no allocation per slice), else computed and upcast."""
    if buf is not None:  # a contiguous [n, c] view of the buffer's front (also for the short last slice)
        return torch.mm(hs, w.t(), out=buf.view(-1)[: hs.shape[0] * w.shape[0]].view(hs.shape[0], w.shape[0]))
    return (hs @ w.t()).to(acc)


def _target_rows(tgt: Tensor, start: int, end: int):
    """(row indices, column indices within the slice) of the tokens whose target lies in [start, end)."""
    rows = ((tgt >= start) & (tgt < end)).nonzero().squeeze(1)
    return rows, tgt[rows] - start


def _forward_block(hs: Tensor, weight: Tensor, tgt: Tensor, chunk: int, entropy: bool, acc: torch.dtype):
    """(z[target], logZ, entropy | None) for one block of tokens; hs is already divided by T.

    Per slice: z = hs·wᵀ (into a reused buffer), running max m and Σ e^(z−m) by an in-place
    subtract/exp over the buffer. z[target] is a row dot product over [n, H], not a per-slice gather.
    """
    n, v = hs.shape[0], weight.shape[0]
    m = torch.full((n,), -torch.inf, dtype=acc, device=hs.device)
    s = torch.zeros(n, dtype=acc, device=hs.device)
    t = torch.zeros(n, dtype=acc, device=hs.device) if entropy else None
    fused = hs.dtype == acc and weight.dtype == acc
    buf = torch.empty(n, min(chunk, v), dtype=acc, device=hs.device) if fused else None
    for start in range(0, v, chunk):
        end = min(start + chunk, v)
        z = _logits_into(buf, hs, weight[start:end], acc)  # [n, c]
        m_new = torch.maximum(m, z.amax(dim=1))
        scale = torch.exp(m - m_new)  # 0 on the first slice (m = −inf)
        if entropy:  # Σ e·z needs z itself: keep it, work on a copy (metrics only)
            e = torch.exp(z - m_new.unsqueeze(1))
            t = t * scale + (e * z).sum(dim=1)
        else:
            e = z.sub_(m_new.unsqueeze(1)).exp_()
        s = s * scale + e.sum(dim=1)
        m = m_new
    lse = m + torch.log(s)
    ent = lse - t / s if entropy else None
    # z[target] = hs_i · w[target_i]; targets outside [0, V) score 0 (→ logp = −logZ), as documented
    valid = (tgt >= 0) & (tgt < v)
    w_t = weight[tgt.clamp(0, v - 1)]
    z_tgt = (hs.to(acc) * w_t.to(acc)).sum(dim=1) * valid
    return z_tgt - lse, lse, ent


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_t, chunk, token_chunk, entropy, unit_temp):
        acc = inv_t.dtype
        hs = _scaled_hidden(hidden, inv_t, unit_temp)
        empty = hidden.new_zeros(0, dtype=acc)
        logp, lse, ent = [empty], [empty], [empty]
        for a in range(0, hidden.shape[0], token_chunk):
            b = a + token_chunk
            lp, l, e = _forward_block(hs[a:b], weight, targets[a:b], chunk, entropy, acc)
            logp.append(lp), lse.append(l), ent.append(e)
        logp, lse = torch.cat(logp), torch.cat(lse)
        ent = torch.cat(ent) if entropy else torch.zeros_like(logp)
        ctx.save_for_backward(hidden, weight, targets, inv_t, lse)
        ctx.chunk, ctx.token_chunk, ctx.unit_temp = chunk, token_chunk, unit_temp
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        """With p = softmax(z) and q = p − onehot(target) (so d logp/dz = −q), per token i:
            d/dh_i = −g_i/T_i · (q_i·W)        d/dW = qᵀ·(−g ⊙ h/T)
        The row factors (g, 1/T) are applied to the [n, H] operands/results, never to the [n, c]
        slice: per slice the elementwise work is one subtract and one exp in place, plus a sparse
        −1 at the targets that fall in it; the rest is the three GEMMs (recompute, dh, dW)."""
        hidden, weight, targets, inv_t, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_logp is None or not (need_h or need_w):
            return (None,) * 8
        n_all, v = hidden.shape[0], weight.shape[0]
        acc = inv_t.dtype
        fused = hidden.dtype == acc and weight.dtype == acc  # fp32/fp64: write GEMMs into buffers
        hs_all = _scaled_hidden(hidden, inv_t, ctx.unit_temp)
        g_all = grad_logp.to(acc)
        grad_h = torch.empty(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        # every slice of dW is written (mm out=) by the first token block, so no zero fill is needed
        grad_w = torch.empty(weight.shape, dtype=acc, device=weight.device) if need_w else None
        for a in range(0, n_all, ctx.token_chunk):
            b = min(a + ctx.token_chunk, n_all)
            hs, tgt, g, l = hs_all[a:b], targets[a:b], g_all[a:b], lse[a:b].unsqueeze(1)
            n = b - a
            neg_ghs = (hs.to(acc) * -g.unsqueeze(1)).to(weight.dtype) if need_w else None  # [n, H]
            qw = torch.zeros(n, weight.shape[1], dtype=acc, device=hidden.device) if need_h else None
            buf = torch.empty(n, min(ctx.chunk, v), dtype=acc, device=hidden.device) if fused else None
            for start in range(0, v, ctx.chunk):
                end = min(start + ctx.chunk, v)
                w = weight[start:end]
                q = _logits_into(buf, hs, w, acc).sub_(l).exp_()  # p, in place
                rows, cols = _target_rows(tgt, start, end)
                if rows.numel():
                    q.index_put_((rows, cols), q.new_full((rows.numel(),), -1.0), accumulate=True)
                qc = q if fused else q.to(w.dtype)
                if need_h:
                    if fused:
                        qw.addmm_(qc, w)
                    else:
                        qw += (qc @ w).to(acc)
                if need_w:
                    dst = grad_w[start:end]
                    if fused and a == 0:
                        torch.mm(qc.t(), neg_ghs, out=dst)
                    elif fused:
                        dst.addmm_(qc.t(), neg_ghs)
                    elif a == 0:
                        dst.copy_(qc.t() @ neg_ghs)
                    else:
                        dst += (qc.t() @ neg_ghs).to(acc)
            if need_h:
                grad_h[a:b] = qw.mul_(-(g.unsqueeze(1) * inv_t[a:b]))
        grad_h = grad_h.to(hidden.dtype) if need_h else None
        grad_w = grad_w.to(weight.dtype) if need_w else None
        return grad_h, grad_w, None, None, None, None, None, None


def chunked_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float | Tensor = 1.0,
                     chunk_size: int = DEFAULT_CHUNK_SIZE, return_entropy: bool = False,
                     token_chunk_size: int = DEFAULT_TOKEN_CHUNK_SIZE):
    """log softmax(hidden·weightᵀ / T)[targets] per token, vocab processed in slices.

    hidden [N, H], weight [V, H], targets [N] → logprobs [N] fp32 (fp64 for fp64 inputs),
    differentiable wrt hidden and weight; with return_entropy, also entropy [N] (no grad).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"need hidden [N, H] and weight [V, H]; got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [N]={hidden.shape[0]}, got {tuple(targets.shape)}")
    if chunk_size < 1 or token_chunk_size < 1:
        raise ValueError("chunk_size and token_chunk_size must be >= 1")
    inv_t = _inv_temp(temperature, hidden.shape[0], hidden.device, _acc_dtype(hidden.dtype))
    unit_temp = not isinstance(temperature, Tensor) and float(temperature) == 1.0
    logp, ent = _ChunkedLogprobs.apply(hidden, weight, targets.long(), inv_t, int(chunk_size),
                                       int(token_chunk_size), bool(return_entropy), unit_temp)
    return (logp, ent) if return_entropy else logp


def naive_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float | Tensor = 1.0,
                   return_entropy: bool = False):
    """Reference: materialise the [N, V] logits, log_softmax, gather. Same outputs as chunked."""
    inv_t = _inv_temp(temperature, hidden.shape[0], hidden.device, _acc_dtype(hidden.dtype))
    z = _slice_logits(hidden, weight, inv_t)
    logsm = torch.log_softmax(z, dim=-1)
    logp = logsm.gather(1, targets.long().unsqueeze(1)).squeeze(1)
    if not return_entropy:
        return logp
    return logp, -(logsm.exp() * logsm).sum(dim=-1)


# --- the per-token loss fused into the LM head ------------------------------------------------

FUSED_BLOCK_ELEMENTS = 1 << 25
"""Logits elements per token block of `fused_head_loss` (128 MiB in fp32): block = this // V tokens."""


class _FusedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_t, token_loss, grad_scale, block, unit_temp, outputs):
        """Per token block of n rows: z = hs·Wᵀ [n, V] into one reused buffer (GEMM 1); e = exp(z − m)
        in place, s = Σe, logZ = m + log s, logp = z[target] − logZ; g = grad_scale · dℓ/dlogp from
        the loss on this block's logp; then, with p = e/s and the row factors on [n, H] operands,
            dL/dh = g/T · (W[target] − (e·W)/s)                  (GEMM 2)
            dL/dW = −eᵀ·(g/s ⊙ hs) + scatter_add(target, g ⊙ hs)  (GEMM 3)
        Both gradients are kept for backward, which only hands them out."""
        acc = inv_t.dtype
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n_all, v = hidden.shape[0], weight.shape[0]
        fused = hidden.dtype == acc and weight.dtype == acc
        hs_all = _scaled_hidden(hidden, inv_t, unit_temp)
        grad_h = torch.empty(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w and n_all == 0 else None
        total = torch.zeros((), dtype=acc, device=hidden.device)
        buf = torch.empty(min(block, n_all), v, dtype=acc, device=hidden.device) if n_all else None
        logps = [hidden.new_zeros(0, dtype=acc)]
        for a in range(0, n_all, block):
            b = min(a + block, n_all)
            n, hs, tgt = b - a, hs_all[a:b], targets[a:b]
            e = buf[:n]
            if fused:
                torch.mm(hs, weight.t(), out=e)
            else:
                e.copy_(hs @ weight.t())
            m = e.amax(dim=1)
            s = e.sub_(m.unsqueeze(1)).exp_().sum(dim=1)
            valid = (tgt >= 0) & (tgt < v)
            tc = tgt.clamp(0, v - 1)
            w_t = weight[tc].to(acc)  # [n, H]
            hs_acc = hs.to(acc)
            logp = (hs_acc * w_t).sum(dim=1) * valid - (m + torch.log(s))
            with torch.enable_grad():
                lp = logp.detach().requires_grad_()
                out = token_loss(lp, a, b)
                g = torch.autograd.grad(out.loss, lp, allow_unused=True)[0] if out.loss.requires_grad else None
            g = torch.zeros_like(logp) if g is None else g.detach().to(acc) * grad_scale
            total += out.loss.detach().to(acc)
            out.loss = out.loss.detach()
            outputs.append(out)
            logps.append(logp)
            ec = e if fused else e.to(weight.dtype)
            if need_h:
                ew = (ec @ weight).to(acc)  # [n, H]
                grad_h[a:b] = (w_t * valid.unsqueeze(1) - ew / s.unsqueeze(1)) * (g * inv_t[a:b, 0]).unsqueeze(1)
            if need_w:
                rows = ((-g / s).unsqueeze(1) * hs_acc).to(weight.dtype)
                if grad_w is None:
                    grad_w = torch.mm(ec.t(), rows).to(acc) if not fused else torch.mm(ec.t(), rows)
                elif fused:
                    grad_w.addmm_(ec.t(), rows)
                else:
                    grad_w += (ec.t() @ rows).to(acc)
                grad_w.index_add_(0, tc[valid], (g.unsqueeze(1) * hs_acc)[valid])
        ctx.grads = (None if grad_h is None else grad_h.to(hidden.dtype),
                     None if grad_w is None else grad_w.to(weight.dtype))
        logp_all = torch.cat(logps)
        ctx.mark_non_differentiable(logp_all)
        return total * grad_scale, logp_all

    @staticmethod
    def backward(ctx, grad_loss, _grad_logp):
        grad_h, grad_w = ctx.grads
        del ctx.grads  # hand the buffers over (AccumulateGrad can take them without a copy)
        scale = float(grad_loss)
        if scale != 1.0:
            grad_h = None if grad_h is None else grad_h * scale
            grad_w = None if grad_w is None else grad_w.mul_(scale)
        return grad_h, grad_w, None, None, None, None, None, None, None


def fused_head_loss(hidden: Tensor, weight: Tensor, targets: Tensor, token_loss, temperature: float | Tensor = 1.0,
                    grad_scale: float = 1.0, block_elements: int = FUSED_BLOCK_ELEMENTS):
    """A per-token loss through the LM head, its gradient produced in the forward pass.

    hidden [N, H], weight [V, H], targets [N]; `token_loss(logp, a, b)` returns the `LossOutput`
    of tokens a..b given their log-probs `logp` [b − a] (a leaf with grad): it must be a sum of
    per-token terms, each depending on its own token's log-prob only (every built-in loss is), so
    g = dℓ/dlogp is exact inside a block. Returns (loss, logp, outputs): `loss` = grad_scale · Σ
    loss, a 0-dim tensor whose backward hands out the gradients already computed; logp [N]
    (detached); outputs the per-block `LossOutput`s (losses detached; merge their stats).

    Cost: three [N,H]×[H,V] GEMMs (logits, dh, dW), as for full logits with autograd, and one
    [block, V] buffer instead of [N, V] logits (and their log-softmax and gradient) — against four
    GEMMs for `chunked_logprobs` + backward, which must recompute the logits.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"need hidden [N, H] and weight [V, H]; got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    inv_t = _inv_temp(temperature, hidden.shape[0], hidden.device, _acc_dtype(hidden.dtype))
    unit_temp = not isinstance(temperature, Tensor) and float(temperature) == 1.0
    block = max(1, int(block_elements) // weight.shape[0])
    outputs: list = []
    loss, logp = _FusedHeadLoss.apply(hidden, weight, targets.long(), inv_t, token_loss, float(grad_scale), block,
                                      unit_temp, outputs)
    return loss, logp, outputs
