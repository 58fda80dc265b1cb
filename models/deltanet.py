"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): chunked form for training and prefill,
recurrent form for decode, with the short causal convolution and its state.

Shape legend: B batch, T tokens, H hidden, nk/nv key/value heads (r = nv/nk), dk/dv head dims,
kd = nk*dk, vd = nv*dv, Cc = 2*kd + vd conv channels, K conv kernel, L chunk length (64).
Parameters (native names under `layers.{i}.attn.`):
  in_proj [2kd + 2vd + 2nv, H]  rows q (kd), k (kd), v (vd), z (vd), b (nv), a (nv), heads in order.
                                Qwen3.5's in_proj_qkv/z/b/a concatenated; Qwen3-Next's in_proj_qkvz
                                and in_proj_ba group rows per key head (models/convert.py regroups)
  conv_weight [Cc, 1, K]        depthwise causal conv over q, k, v (transformers' conv1d.weight)
  dt_bias [nv], A_log [nv]      decay: g = -exp(A_log) * softplus(a + dt_bias)  (log space, <= 0)
  norm.weight [dv]              gated RMSNorm per value head: norm(o) * silu(z)
  out_proj [H, vd]
Per token t and value head (state S [dk, dv], fp32), with q, k L2-normalised and q scaled by dk^-1/2,
beta = sigmoid(b):  S = exp(g) S;  S = S + k (beta (v - Sᵀk))ᵀ;  o = Sᵀq   (the gated delta rule).
The kernels also take one decay per key channel (g [.., dk]: S = diag(exp(g)) S), which is Kimi
Delta Attention's rule (models/kda.py).
The chunked form (transformers' `torch_chunk_gated_delta_rule`, WY/UT transform inside each chunk of
L tokens, a sequential scan over chunks) computes the same outputs; value head h reads key head h//r.
Under context parallelism (`ShardedMask`) the projections and the gated norm run on the rank's
slice and the core (`_mix`) on the full rows for one head group per rank: see
models/context_parallel_recurrent.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig
from vf.models.context_parallel_recurrent import (
    HeadSplit,
    channels,
    full_documents,
    gather_heads,
    heads_to_sequence,
    sequence_to_heads,
)
from vf.models.layers import Documents, ShardedMask
from vf.models.recurrent import ChunkLayout, causal_conv, valid_mask

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _heads_first(q, k, v, g, beta):
    """[B, T, h, d] inputs -> fp32 [B, nv, T, d] (keys repeated to the value heads), q/k normalised;
    g -> [B, nv, T, 1] (one decay per head) or [B, nv, T, dk] (one per key channel)."""
    r = v.shape[2] // k.shape[2]
    if r > 1:
        q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
    q, k, v, g, beta = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, g, beta))
    return l2norm(q) * q.shape[-1] ** -0.5, l2norm(k), v, g if g.dim() == 4 else g[..., None], beta


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, resets=None, chunk: int = CHUNK):
    """q/k [B, T, nk, dk], v [B, T, nv, dv], beta [B, T, nv], g [B, T, nv] (one log decay per head) or
    [B, T, nv, dk] (one per key channel: Kimi Delta Attention, models/kda.py); initial_state
    [B, nv, dk, dv] or None; resets bool [B, T/L] (T a multiple of L then): the carried state
    restarts at those chunks. Returns (out [B, T, nv, dv] in v's dtype, final state [B, nv, dk, dv] fp32)."""
    dtype, (B, T, nv, dv) = v.dtype, v.shape
    q, k, v, g, beta = _heads_first(q, k, v, g, beta)  # g [B, nv, T, 1 | dk]
    dk = q.shape[-1]
    pad = (-T) % chunk
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta, g = (x.reshape(B, nv, n, chunk, x.shape[-1]) for x in (q, k, k_beta, v_beta, g))
    g = g.cumsum(-2)  # cumulative log decay inside each chunk
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    if g.shape[-1] == 1:  # one decay per head: the decay j -> i is a scalar, the products stay matmuls
        gs = g[..., 0]
        decay = (gs[..., :, None] - gs[..., None, :]).masked_fill(upper, float("-inf")).exp()  # [.., i, j]: j -> i
        system = (k_beta @ k.transpose(-1, -2)) * decay  # its strictly-lower part is the UT system (unit diagonal)
        intra = (q @ k.transpose(-1, -2)) * decay  # causal within the chunk (diagonal included)
    else:  # per key channel: decay [.., i, j, dk], one chunk at a time to bound memory (no factoring
        # exp(g_i)·exp(-g_j) into matmuls: it overflows fp32 once a chunk's log decay passes ~88)
        system, intra = [], []
        for i in range(n):
            gi = g[:, :, i]
            decay = (gi[..., :, None, :] - gi[..., None, :, :]).masked_fill(upper[..., None], float("-inf")).exp()
            kd = k[:, :, i, None, :, :] * decay  # [B, nv, L, L, dk]
            system.append((k_beta[:, :, i, :, None, :] * kd).sum(-1))
            intra.append((q[:, :, i, :, None, :] * kd).sum(-1))
        system, intra = torch.stack(system, dim=2), torch.stack(intra, dim=2)
    # one solve for both right-hand sides (values and decayed keys): half the LAPACK calls
    rhs = torch.cat([v_beta, k_beta * g.exp()], dim=-1)
    new_v, k_cum = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True).split([dv, dk], dim=-1)
    q = q * g.exp()
    k = k * (g[..., -1:, :] - g).exp()
    chunk_decay = g[..., -1, :].exp()[..., None]  # [B, nv, n, 1 | dk, 1]
    S = (torch.zeros(B, nv, dk, dv, dtype=torch.float32, device=q.device) if initial_state is None
         else initial_state.float())
    keep = None if resets is None else (~resets).float()[:, None, :, None, None]  # [B, 1, n, 1, 1]
    out = torch.empty_like(new_v)
    for i in range(n):
        if keep is not None:
            S = S * keep[:, :, i]
        u = new_v[:, :, i] - k_cum[:, :, i] @ S
        out[:, :, i] = q[:, :, i] @ S + intra[:, :, i] @ u
        S = S * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ u
    out = out.reshape(B, nv, n * chunk, dv)[:, :, :T]
    return out.transpose(1, 2).to(dtype), S


def recurrent_gated_delta_rule(q, k, v, g, beta, state=None):
    """The token-by-token form (decode); same arguments and results as `chunk_gated_delta_rule`."""
    dtype, (B, T, nv, dv) = v.dtype, v.shape
    q, k, v, g, beta = _heads_first(q, k, v, g, beta)
    S = torch.zeros(B, nv, q.shape[-1], dv, dtype=torch.float32, device=q.device) if state is None else state.float()
    out = torch.empty_like(v)
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None]  # [B, nv, 1 | dk, 1]
        delta = (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]  # [B, nv, dv]
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = (S * q[:, :, t, :, None]).sum(-2)
    return out.transpose(1, 2).to(dtype), S


def delta_scan(q, k, v, g, beta, S0, docs, lengths):
    """The gated delta rule over a batch as a layer sees it: packed documents each from a zero state,
    one cached decode token by the recurrent form, else chunked from S0. g is [B, T, nv] (a decay per
    head) or [B, T, nv, dk] (per key channel). Right padding (`lengths`) neither decays nor updates,
    so the state stays at the last real token. Returns (out [B, T, nv, dv], final state)."""
    B, T = beta.shape[:2]
    valid = valid_mask(lengths, B, T, beta.device)
    if valid is not None:
        beta, g = beta * valid[..., None], g * valid.view(B, T, *([1] * (g.dim() - 2)))
    if docs is not None:
        layout = ChunkLayout(docs.spans, T, CHUNK, beta.device)
        out, S = chunk_gated_delta_rule(*(layout.pack(t) for t in (q, k, v, g, beta)), resets=layout.resets)
        return layout.unpack(out), S
    if T == 1 and S0 is not None:
        return recurrent_gated_delta_rule(q, k, v, g, beta, S0)
    return chunk_gated_delta_rule(q, k, v, g, beta, S0)


class GatedRMSNorm(nn.Module):
    """norm(x) * w * silu(gate) over the last dim (norm before gate, as transformers' RMSNormGated);
    act="sigmoid" (Kimi Delta Attention): norm(x) * w * sigmoid(gate), all in fp32 (its strict-fp32 norm)."""

    def __init__(self, dim: int, eps: float, act: str = "silu"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.act = eps, act

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.act == "sigmoid":
            return (self.weight.float() * x * torch.sigmoid(gate.float())).to(dtype)
        x = self.weight * x.to(dtype)
        return (x * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.nk, self.nv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        kd, vd = self.nk * self.dk, self.nv * self.dv
        self.splits = [2 * kd + vd, vd, self.nv, self.nv]  # conv input (q, k, v), z, b, a
        self.in_proj = nn.Linear(config.hidden_size, sum(self.splits), bias=False)
        self.conv_weight = nn.Parameter(torch.empty(2 * kd + vd, 1, config.linear_conv_kernel))
        self.dt_bias = nn.Parameter(torch.empty(self.nv))
        self.A_log = nn.Parameter(torch.empty(self.nv))
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = nn.Linear(vd, config.hidden_size, bias=False)

    def state_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype | None]]:
        """Per-row cache state: the conv's last K-1 inputs (model dtype) and S per value head (fp32)."""
        return [((self.conv_weight.shape[0], self.conv_weight.shape[-1] - 1), None),
                ((self.nv, self.dk, self.dv), torch.float32)]

    def forward(self, x, cos=None, sin=None, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        B, T, _ = x.shape
        mixed, z, b, a = self.in_proj(x).split(self.splits, dim=-1)
        if isinstance(mask, ShardedMask):  # context parallelism: the core runs on whole rows, a head group per rank
            out = self._sharded(mixed, b, a, mask)
        else:
            state = cache.get_state(self.layer_idx) if cache is not None else None
            lengths = getattr(cache, "valid_lengths", None) if cache is not None else None
            docs = mask if isinstance(mask, Documents) and not mask.single and cache is None else None
            out, conv_state, S = self._mix(mixed, b, a, self.conv_weight, self.dt_bias, self.A_log, self.nk,
                                           docs, state, lengths)
            if cache is not None:
                cache.set_state(self.layer_idx, conv_state, S)
        out = self.norm(out, z.reshape(B, T, self.nv, self.dv))
        return self.out_proj(out.reshape(B, T, self.nv * self.dv))

    def _mix(self, mixed, b, a, conv_weight, dt_bias, A_log, nk: int, docs, state, lengths):
        """The sequence-mixing core for nk key heads and b.shape[-1] value heads (all of them, or one
        rank's group under CP): conv, decay and the gated delta rule. mixed [B, T, 2·nk·dk + nv·dv]
        (q, k, v), b/a [B, T, nv]. Returns (out [B, T, nv, dv], conv state, S)."""
        B, T, nv = b.shape
        mixed, conv_state = causal_conv(mixed, conv_weight, None, None if docs is None else docs.spans,
                                        None if state is None else state[0], lengths)
        kd = nk * self.dk
        q, k, v = mixed.split([kd, kd, nv * self.dv], dim=-1)
        q, k = q.reshape(B, T, nk, self.dk), k.reshape(B, T, nk, self.dk)
        v = v.reshape(B, T, nv, self.dv)
        beta = b.sigmoid()
        g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
        out, S = delta_scan(q, k, v, g, beta, None if state is None else state[1], docs, lengths)
        return out, conv_state, S


    def _sharded(self, mixed, b, a, mask):
        """Under CP (models/context_parallel_recurrent.py): this rank's slice of q/k/v/b/a goes to the
        ranks owning its heads, `_mix` runs over the full rows for this rank's head group (rank j:
        value heads j·nv/size.., the key heads they read), and the outputs come back per token.
        Returns out [B, T/size, nv, dv] for this rank's tokens."""
        shard = mask.shard
        split = HeadSplit("Gated DeltaNet", self.nv, self.nk, shard.size, shard.rank)
        B, Tl, _ = mixed.shape
        kd, dk, dv = self.nk * self.dk, self.dk, self.dv
        q, k, v = mixed.split([kd, kd, self.nv * dv], dim=-1)
        heads = [q.reshape(B, Tl, self.nk, dk), k.reshape(B, Tl, self.nk, dk), v.reshape(B, Tl, self.nv, dv),
                 b[..., None], a[..., None]]
        keys, values = split.key_index, split.value_index
        full = sequence_to_heads(gather_heads(heads, [keys, keys, values, values, values], split), shard)
        nkl, nvl = split.keys_per_rank, split.per_rank
        q, k, v, b, a = full.split([nkl * dk, nkl * dk, nvl * dv, nvl, nvl], dim=-1)
        kidx, vidx = keys(shard.rank).to(b.device), values(shard.rank).to(b.device)
        rows = torch.cat([channels(kidx, dk), kd + channels(kidx, dk), 2 * kd + channels(vidx, dv)])
        out, _, _ = self._mix(torch.cat([q, k, v], dim=-1), b, a, self.conv_weight.index_select(0, rows),
                              self.dt_bias.index_select(0, vidx), self.A_log.index_select(0, vidx), nkl,
                              full_documents(mask), None, None)
        T = full.shape[1]
        return heads_to_sequence(out.reshape(B, T, nvl * dv), shard).reshape(B, Tl, self.nv, dv)
