"""Mamba-2 mixer (Nemotron-H): chunked SSD scan for training and prefill, recurrent step for decode,
the short causal convolution with its state.

Shape legend: B batch, T tokens, H hidden, nh heads, hd head dim, I = nh*hd, G groups, N state size,
Cc = I + 2*G*N conv channels, K conv kernel, L chunk length (`mamba_chunk_size`).
Parameters (native names under `layers.{i}.mixer.`, transformers' names otherwise):
  in_proj [I + Cc + nh, H] (+ bias with use_bias)   rows z (gate, I), x (I), B (G*N), C (G*N), dt (nh)
  conv_weight [Cc, 1, K], conv_bias [Cc]             depthwise causal conv over x, B, C, then SiLU
  dt_bias [nh], A_log [nh], D [nh]                   norm.weight [I]     out_proj [H, I] (+ bias)
Per token and head (state S [hd, N], fp32; head h reads group h // (nh/G)):
  dt = max(softplus(dt + dt_bias), time_step_min);  A = -exp(A_log)
  S = exp(dt A) S + dt x Bᵀ;   y = S C + D x;   out = out_proj(norm(y * silu(z)))  (RMSNorm per group of I/G)
transformers clamps dt at time_step_min in its chunked scan but not in its decode step; here both
forms clamp, so they agree with each other (they differ from transformers' decode only where
softplus(dt + dt_bias) < time_step_min).
The chunked form is the SSD algorithm (transformers' `mamba2_chunk_scan`): quadratic within each
chunk, the states passed between chunks by a segment-sum of the chunks' total decays; a document
reset (models/recurrent.py) zeroes the state entering its chunk (that chunk's incoming decay is
-inf and the previous chunk's own contribution is dropped).
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


def segment_sum(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] -> [..., n, n]: out[i, j] = x[j+1] + ... + x[i] (0 on the diagonal, -inf above)."""
    n = x.shape[-1]
    x = x[..., None].expand(*x.shape, n)
    x = x.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-1), 0)
    out = x.cumsum(dim=-2)
    return out.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=x.device).tril(0), float("-inf"))


def _chunks(t: torch.Tensor, pad: int, chunk: int) -> torch.Tensor:
    """[b, T, ...] -> [b, T/L, L, ...] after right-padding T with zeros."""
    t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
    return t.reshape(t.shape[0], -1, chunk, *t.shape[2:])


def ssd_chunk_scan(x, dt, A, B, C, chunk: int, initial_state=None, resets=None):
    """x [b, T, h, p], dt [b, T, h] (discretisation steps), A [h] (< 0), B/C [b, T, g, n];
    initial_state [b, h, p, n]; resets bool [b, T/L]. Returns (y [b, T, h, p] fp32 without the D
    skip, final state [b, h, p, n] fp32)."""
    b, T, h, p = x.shape
    rep = h // B.shape[2]
    x = x.float() * dt[..., None].float()
    A = A.float()[None, None] * dt.float()  # [b, T, h]
    B = B.float().repeat_interleave(rep, dim=2)
    C = C.float().repeat_interleave(rep, dim=2)
    pad = (-T) % chunk
    x, A, B, C = (_chunks(t, pad, chunk) for t in (x, A, B, C))
    A = A.permute(0, 3, 1, 2)  # [b, h, c, l]
    A_cumsum = A.cumsum(dim=-1)
    L = torch.exp(segment_sum(A))  # [b, h, c, l, s]
    G = torch.einsum("bclhn,bcshn->bclsh", C, B)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", G * L.permute(0, 2, 3, 4, 1), x)
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum)
    states = torch.einsum("bclhn,bclhp->bchpn", B * decay_states.permute(0, 2, 3, 1)[..., None], x)
    prev = torch.zeros_like(states[:, :1]) if initial_state is None else initial_state[:, None].float()
    states = torch.cat([prev, states], dim=1)  # [b, c+1, h, p, n]: entry j>0 is chunk j-1's own state
    totals = F.pad(A_cumsum[..., -1], (1, 0))  # [b, h, c+1]
    if resets is not None:  # entry c of `r`: chunk c starts a document
        r = F.pad(resets, (0, 1))  # [b, c+1]
        totals = totals.masked_fill(r[:, None, :], float("-inf"))  # nothing before chunk c reaches it
        states = states * (~r).to(states.dtype)[:, :, None, None, None]  # nor chunk c-1's own state
    decay_chunk = torch.exp(segment_sum(totals)).transpose(1, 3)  # [b, j, i, h]
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final = new_states[:, :-1], new_states[:, -1]
    y_off = torch.einsum("bclhn,bchpn->bclhp", C, states) * torch.exp(A_cumsum).permute(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).reshape(b, -1, h, p)[:, :T]
    return y, final


def ssd_step(x, dt, A, B, C, state):
    """One token per row: x [b, 1, h, p], dt [b, 1, h], B/C [b, 1, g, n], state [b, h, p, n]."""
    h = x.shape[2]
    rep = h // B.shape[2]
    x, dt = x[:, 0].float(), dt[:, 0].float()
    B, C = (t[:, 0].float().repeat_interleave(rep, dim=1) for t in (B, C))  # [b, h, n]
    state = state.float() * torch.exp(dt * A.float())[..., None, None] + (dt[..., None] * x)[..., None] * B[:, :, None, :]
    return (state @ C[..., None])[..., 0][:, None], state


class GroupedGatedRMSNorm(nn.Module):
    """w * rmsnorm(x * silu(gate)) with the norm over groups of `group` channels (gate before norm)."""

    def __init__(self, dim: int, group: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group, self.eps = group, eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float() * F.silu(gate.float())
        xg = x.view(*x.shape[:-1], -1, self.group)
        x = (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + self.eps)).view(x.shape)
        return self.weight * x.to(dtype)


class Mamba2Mixer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.nh, self.hd, self.N = config.mamba_num_heads, config.mamba_head_dim, config.ssm_state_size
        self.G, self.chunk, self.dt_min = config.mamba_n_groups, config.mamba_chunk_size, config.mamba_dt_min
        I = self.nh * self.hd
        conv = I + 2 * self.G * self.N
        self.splits = [I, conv, self.nh]
        self.in_proj = nn.Linear(config.hidden_size, sum(self.splits), bias=config.mamba_proj_bias)
        self.conv_weight = nn.Parameter(torch.empty(conv, 1, config.mamba_conv_kernel))
        self.conv_bias = nn.Parameter(torch.empty(conv)) if config.mamba_conv_bias else None
        self.dt_bias = nn.Parameter(torch.empty(self.nh))
        self.A_log = nn.Parameter(torch.empty(self.nh))
        self.D = nn.Parameter(torch.empty(self.nh))
        self.norm = GroupedGatedRMSNorm(I, I // self.G, config.rms_norm_eps)
        self.out_proj = nn.Linear(I, config.hidden_size, bias=config.mamba_proj_bias)

    def state_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype | None]]:
        """Per-row cache state: the conv's last K-1 inputs (model dtype) and the SSM state (fp32)."""
        return [((self.conv_weight.shape[0], self.conv_weight.shape[-1] - 1), None),
                ((self.nh, self.hd, self.N), torch.float32)]

    def forward(self, x, cos=None, sin=None, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        Bsz, T, _ = x.shape
        z, xbc, dt = self.in_proj(x).split(self.splits, dim=-1)
        if isinstance(mask, ShardedMask):  # context parallelism: the core runs on whole rows, a head group per rank
            y = self._sharded(xbc, dt, mask)
        else:
            state = cache.get_state(self.layer_idx) if cache is not None else None
            lengths = getattr(cache, "valid_lengths", None) if cache is not None else None
            docs = mask if isinstance(mask, Documents) and not mask.single and cache is None else None
            y, conv_state, S = self._mix(xbc, dt, self.conv_weight, self.conv_bias, self.dt_bias, self.A_log, self.D,
                                         self.G, docs, state, lengths)
            if cache is not None:
                cache.set_state(self.layer_idx, conv_state, S)
        y = self.norm(y.reshape(Bsz, T, self.nh * self.hd), z)
        return self.out_proj(y.to(x.dtype))

    def _mix(self, xbc, dt, conv_weight, conv_bias, dt_bias, A_log, D, G: int, docs, state, lengths):
        """The sequence-mixing core for dt.shape[-1] heads reading G groups (all of them, or one rank's
        group under CP): conv, discretisation, SSD scan and the D skip. xbc [B, T, nh·hd + 2·G·N],
        dt [B, T, nh]. Returns (y fp32 [B, T, nh, hd], conv state, S)."""
        Bsz, T, nh = dt.shape
        xbc, conv_state = causal_conv(xbc, conv_weight, conv_bias, None if docs is None else docs.spans,
                                      None if state is None else state[0], lengths)
        I, GN = nh * self.hd, G * self.N
        xs, Bm, Cm = xbc.split([I, GN, GN], dim=-1)
        xs = xs.reshape(Bsz, T, nh, self.hd)
        Bm, Cm = Bm.reshape(Bsz, T, G, self.N), Cm.reshape(Bsz, T, G, self.N)
        dt = F.softplus(dt.float() + dt_bias.float()).clamp(min=self.dt_min)
        valid = valid_mask(lengths, Bsz, T, dt.device)
        if valid is not None:  # right padding: dt = 0 leaves the state as of the last real token
            dt = dt * valid[..., None]
        A = -torch.exp(A_log.float())
        S0 = None if state is None else state[1]
        if docs is not None:
            layout = ChunkLayout(docs.spans, T, self.chunk, dt.device)
            y, S = ssd_chunk_scan(*(layout.pack(t) for t in (xs, dt)), A, layout.pack(Bm), layout.pack(Cm),
                                  self.chunk, resets=layout.resets)
            y = layout.unpack(y)
        elif T == 1 and S0 is not None:
            y, S = ssd_step(xs, dt, A, Bm, Cm, S0)
        else:
            y, S = ssd_chunk_scan(xs, dt, A, Bm, Cm, self.chunk, S0)
        return y + D.float()[:, None] * xs.float(), conv_state, S

    def _sharded(self, xbc, dt, mask):
        """Under CP (models/context_parallel_recurrent.py): this rank's slice of x/B/C/dt goes to the
        ranks owning its heads, `_mix` runs over the full rows for this rank's heads (rank j: heads
        j·nh/size.., the groups they read; groups replicated per head when the ranks do not divide
        them), and y comes back per token. Returns y fp32 [B, T/size, nh, hd] for this rank's tokens."""
        shard = mask.shard
        split = HeadSplit("Mamba-2", self.nh, self.G, shard.size, shard.rank, "heads", "groups (mamba_n_groups)")
        Bsz, Tl, _ = xbc.shape
        I, GN, hd, N = self.nh * self.hd, self.G * self.N, self.hd, self.N
        xs, Bm, Cm = xbc.split([I, GN, GN], dim=-1)
        heads = [xs.reshape(Bsz, Tl, self.nh, hd), Bm.reshape(Bsz, Tl, self.G, N), Cm.reshape(Bsz, Tl, self.G, N),
                 dt[..., None]]
        groups, own = split.key_index, split.value_index
        full = sequence_to_heads(gather_heads(heads, [own, groups, groups, own], split), shard)
        nhl, gl = split.per_rank, split.keys_per_rank
        xbc, dt = full.split([nhl * hd + 2 * gl * N, nhl], dim=-1)
        gidx, hidx = groups(shard.rank).to(dt.device), own(shard.rank).to(dt.device)
        rows = torch.cat([channels(hidx, hd), I + channels(gidx, N), I + GN + channels(gidx, N)])
        bias = None if self.conv_bias is None else self.conv_bias.index_select(0, rows)
        y, _, _ = self._mix(xbc, dt, self.conv_weight.index_select(0, rows), bias, *(
            p.index_select(0, hidx) for p in (self.dt_bias, self.A_log, self.D)), gl, full_documents(mask), None, None)
        T = full.shape[1]
        return heads_to_sequence(y.reshape(Bsz, T, nhl * hd), shard).reshape(Bsz, Tl, self.nh, hd)
