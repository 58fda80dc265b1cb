"""Per-token log-probs (and entropy) from the LM head without materialising tokens×vocab logits.

    z      = (hidden @ weightᵀ) / T                      logits, [N, V] — never built whole
    logZ   = logsumexp_v z                              running (online) log-sum-exp over slices
    logp   = z[target] − logZ
    H      = logZ − Σ_v softmax(z)_v · z_v             entropy

Shapes: hidden [N, H], weight [V, H] (the LM head, possibly tied to the input embedding),
targets [N] int64, temperature a float or a per-token tensor [N].

`chunked_logprobs` walks the vocabulary in slices of `chunk_size` rows (and the tokens in blocks of
`token_chunk_size`), keeping per token a running max m, Σ e^(z−m) and Σ e^(z−m)·z. Peak extra memory
is one [token_chunk_size, chunk_size] fp32 slice. It is a custom autograd Function: forward saves
only hidden, weight, targets, (per-token temperature) and logZ; backward recomputes each logits slice,
p = exp(z − logZ), dz = g·(onehot(target) − p)/T, and accumulates dhidden = dz·W and
dW[slice] = dzᵀ·hidden. A tied weight just receives its grad (autograd adds it to the embedding's).

Entropy is forward-only: it is marked non-differentiable (use it for metrics, not as a loss term).
Logits are computed in the input dtype and accumulated in fp32 (fp64 for fp64 inputs); targets outside [0, V) (e.g. −100
padding) give logp = −logZ without error — mask them out of the loss.

`naive_logprobs` is the reference: full log_softmax + gather.
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


def _forward_block(h: Tensor, weight: Tensor, tgt: Tensor, inv_t: Tensor, chunk: int, entropy: bool):
    n, v, acc = h.shape[0], weight.shape[0], inv_t.dtype
    m = torch.full((n,), -torch.inf, dtype=acc, device=h.device)
    s = torch.zeros(n, dtype=acc, device=h.device)
    t = torch.zeros(n, dtype=acc, device=h.device) if entropy else None
    z_tgt = torch.zeros(n, dtype=acc, device=h.device)
    for start in range(0, v, chunk):
        end = min(start + chunk, v)
        z = _slice_logits(h, weight[start:end], inv_t)  # [n, c]
        in_slice = (tgt >= start) & (tgt < end)
        idx = (tgt - start).clamp(0, end - start - 1).unsqueeze(1)
        z_tgt = torch.where(in_slice, z.gather(1, idx).squeeze(1), z_tgt)
        m_new = torch.maximum(m, z.max(dim=1).values)
        scale = torch.exp(m - m_new)  # 0 on the first slice (m = −inf)
        e = torch.exp(z - m_new.unsqueeze(1))
        s = s * scale + e.sum(dim=1)
        if entropy:
            t = t * scale + (e * z).sum(dim=1)
        m = m_new
    lse = m + torch.log(s)
    ent = lse - t / s if entropy else None
    return z_tgt - lse, lse, ent


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_t, chunk, token_chunk, entropy):
        empty = hidden.new_zeros(0, dtype=inv_t.dtype)
        logp, lse, ent = [empty], [empty], [empty]
        for a in range(0, hidden.shape[0], token_chunk):
            b = a + token_chunk
            lp, l, e = _forward_block(hidden[a:b], weight, targets[a:b], inv_t[a:b], chunk, entropy)
            logp.append(lp), lse.append(l), ent.append(e)
        logp, lse = torch.cat(logp), torch.cat(lse)
        ent = torch.cat(ent) if entropy else torch.zeros_like(logp)
        ctx.save_for_backward(hidden, weight, targets, inv_t, lse)
        ctx.chunk, ctx.token_chunk = chunk, token_chunk
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        hidden, weight, targets, inv_t, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if grad_logp is None or not (need_h or need_w):
            return None, None, None, None, None, None, None
        v = weight.shape[0]
        acc = inv_t.dtype
        grad_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        for a in range(0, hidden.shape[0], ctx.token_chunk):
            b = a + ctx.token_chunk
            h, tgt, it, g = hidden[a:b], targets[a:b], inv_t[a:b], grad_logp[a:b].to(acc)
            for start in range(0, v, ctx.chunk):
                end = min(start + ctx.chunk, v)
                w = weight[start:end]
                p = torch.exp(_slice_logits(h, w, it) - lse[a:b].unsqueeze(1))
                dz = -g.unsqueeze(1) * p  # d logp / d z = onehot − p
                in_slice = (tgt >= start) & (tgt < end)
                idx = (tgt - start).clamp(0, end - start - 1).unsqueeze(1)
                dz.scatter_add_(1, idx, torch.where(in_slice, g, torch.zeros_like(g)).unsqueeze(1))
                dz = dz * it
                if need_h:
                    grad_h[a:b] += (dz.to(w.dtype) @ w).to(acc)
                if need_w:
                    grad_w[start:end] += (dz.t().to(h.dtype) @ h).to(acc)
        grad_h = grad_h.to(hidden.dtype) if need_h else None
        grad_w = grad_w.to(weight.dtype) if need_w else None
        return grad_h, grad_w, None, None, None, None, None


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
    logp, ent = _ChunkedLogprobs.apply(hidden, weight, targets.long(), inv_t, int(chunk_size),
                                       int(token_chunk_size), bool(return_entropy))
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
