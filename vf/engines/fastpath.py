"""A lean decode-step and prefill forward for the native dense transformer, reading the model's own weights.

    FastDecoder.supports(model) -> bool
    FastDecoder(model, cache: SlotKVCache).forward(tokens [n], pos [n]) -> hidden [n, H] (final norm applied)
    FastDecoder(...).prefill(ids [m, T] right-padded, lens [m], start row) -> hidden [m, H] at each row's
        last real token (the last layer runs at those tokens only)

Why: on CPU a decode step of a small model is dominated by per-op overhead, not FLOPs. The module
forward issues ~70 ops per layer (separate q/k norms and ropes, casts, views); this path issues
~30 for the same math: fused RMSNorm (`F.rms_norm`), q and k normalised/rotated together, rope
from a precomputed cos/sin table (the model's own `Rotary`, so the same values), q/k/v and gate/up
each one GEMM (the model's fused weights). Results agree with `model.forward` to float rounding
(tests check log-probs against `compute_logits` within 1e-5 and greedy tokens against `transformers`).

Weights are read through references to the live parameters, so in-place updates are seen; derived
tensors (the per-head q/k-norm weight table) are rebuilt by `refresh()` after an update.
Layers whose MLP is not the dense `MLP` (MoE) call the module itself.

GEMMs: fp32 on CPU they run through oneDNN (`cpu_linear`), reading the live weights as they are.
Measured on the 2-vCPU AMD EPYC dev box (torch 2.13, MKL 2024.2, 2 threads, 16 weights of
[6144, 1024] so they do not sit in cache): `F.linear` (MKL sgemm) reached 7 / 34 / 59 GFLOP/s at
M = 1 / 16 / 64 rows, oneDNN's linear on the same plain weights 12 / 60 / 90 (pre-packed weights:
10 / 70 / 105, for a second copy of every weight: not taken). At M >= 1024 the two are even.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# below this hidden size the decode path keeps F.linear: with oneDNN the tiny model (hidden 128)
# decoded batch 16 at 1.24x transformers against 1.78x with F.linear (two consecutive runs, load 7-8)
ONEDNN_MIN_HIDDEN = 512


def cpu_linear(device: torch.device, dtype: torch.dtype):
    """`linear(x, w, b=None)` for a decode step: oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`,
    a plain [out, in] weight, any row count) for fp32 on CPU when this torch build has it and it
    agrees with `F.linear`; else `F.linear`."""
    if device.type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return F.linear
    try:
        op = torch.ops.mkldnn._linear_pointwise
        x, w, b = torch.randn(3, 16), torch.randn(5, 16), torch.randn(5)
        if not torch.allclose(op(x, w, b, "none", [], ""), F.linear(x, w, b), rtol=1e-5, atol=1e-5):
            return F.linear
    except (AttributeError, RuntimeError):
        return F.linear

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return op(x, w, b, "none", [], "")

    return linear


class FastDecoder:
    @staticmethod
    def supports(model) -> bool:
        try:
            from vf.models.layers import Attention

            layer = model.layers[0]
            cfg = model.config
            if getattr(cfg, "hybrid", False):  # recurrent layers run through the module forward
                return False
            if getattr(cfg, "zero_centered_norm", False):  # y = x/rms * (1 + w): not F.rms_norm's
                return False
            # the plain fused-qkv attention with full-width rope only (not MLA, sinks, partial rotary)
            if any(type(lay.attn) is not Attention for lay in model.layers) or cfg.rotary_dim != cfg.head_dim:
                return False
            return all(hasattr(layer.attn, a) for a in ("qkv_proj", "o_proj", "q_norm", "nh", "nkv", "hd")) and \
                hasattr(model, "rotary") and hasattr(model, "embed_tokens") and hasattr(model, "norm")
        except (AttributeError, IndexError, TypeError):
            return False

    def __init__(self, model, cache):
        from vf.models.layers import MLP

        self.model, self.cache = model, cache
        cfg = model.config
        self.H, self.eps = cfg.hidden_size, cfg.rms_norm_eps
        a = model.layers[0].attn
        self.nh, self.nkv, self.hd = a.nh, a.nkv, a.hd
        self._dense = [isinstance(layer.mlp, MLP) for layer in model.layers]
        p = next(model.parameters())
        # a small model's GEMMs take microseconds, less than oneDNN's per-call setup: MKL's F.linear there
        self.linear = cpu_linear(p.device, p.dtype) if cfg.hidden_size >= ONEDNN_MIN_HIDDEN else F.linear
        with torch.no_grad():
            pos = torch.arange(cache.max_len, device=p.device)[None]
            cos, sin = model.rotary(pos, p.dtype)  # [1, L, hd], the model's own tables
        half = self.hd // 2
        self.cos = cos[0].contiguous()
        # rotate_half(x) * sin == roll(x, hd/2) * [-sin_lo, sin_hi]
        self.sin_signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1).contiguous()
        self.refresh()

    def refresh(self) -> None:
        """Rebuild tensors derived from the weights (call after an in-place weight update)."""
        self.qk_w = []
        for layer in self.model.layers:
            a = layer.attn
            if a.q_norm is None:
                self.qk_w.append(None)
            else:  # one [nh + nkv, hd] table: q heads get q_norm's weight, kv heads k_norm's
                self.qk_w.append(torch.cat([a.q_norm.weight.detach().expand(self.nh, self.hd),
                                            a.k_norm.weight.detach().expand(self.nkv, self.hd)]).contiguous())

    def _qk(self, i: int, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """q/k heads [..., nh + nkv, hd]: per-head RMSNorm (q_norm / k_norm), then rope."""
        if self.qk_w[i] is not None:
            qk = F.rms_norm(qk, (self.hd,), None, self.eps) * self.qk_w[i]
        return torch.addcmul(qk * cos, qk.roll(self.hd // 2, dims=-1), sin)

    def _mlp(self, i: int, layer, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] + the layer's MLP of its normed x (the module itself for a MoE layer)."""
        h = F.rms_norm(x, (self.H,), layer.mlp_norm.weight, self.eps)
        if not self._dense[i]:
            return x + layer.mlp(h)
        mlp, lin = layer.mlp, self.linear
        gate, up = lin(h, mlp.gate_up_proj.weight, mlp.gate_up_proj.bias).chunk(2, dim=-1)
        return x + lin(F.silu(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)

    def prefill(self, ids: torch.Tensor, lens: torch.Tensor, start: int) -> torch.Tensor:
        """Rows start..start+m-1 take the fresh right-padded prompt block `ids` [m, T] (`lens` [m]
        real tokens each, positions 0..T-1); returns the final-normed hidden state at each row's
        last real token [m, H]. Every layer stores the K/V of all T positions, but the last layer
        runs its attention queries, o_proj and MLP at the m last tokens only: nothing reads the
        other positions' output (one layer in L of the GEMM work less than the module forward)."""
        m, T = ids.shape
        nh, nkv, hd, H, eps = self.nh, self.nkv, self.hd, self.H, self.eps
        nqk = (nh + nkv) * hd
        cache, lin = self.cache, self.linear
        cache.begin_prefill(start, m, T, lens)
        cos = self.cos[:T][None, :, None, :]  # [1, T, 1, hd]
        sin = self.sin_signed[:T][None, :, None, :]
        rows = torch.arange(m, device=ids.device)
        x = self.model.embed_tokens.weight[ids.reshape(-1)]  # [m*T, H]
        gqa = nh != nkv
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            a = layer.attn
            h = F.rms_norm(x, (H,), layer.attn_norm.weight, eps)
            qkv = lin(h, a.qkv_proj.weight, a.qkv_proj.bias)  # [m*T, P]
            qk = self._qk(i, qkv[:, :nqk].view(m, T, nh + nkv, hd), cos, sin)
            k = qk[:, :, nh:].transpose(1, 2)  # [m, nkv, T, hd]
            v = qkv[:, nqk:].view(m, T, nkv, hd).transpose(1, 2)
            cache.store(i, k, v)  # prefill mode: rows start..start+m-1, positions 0..T-1
            if i < last:  # causal within the block: exact for every real token (padding only follows)
                attn = F.scaled_dot_product_attention(qk[:, :, :nh].transpose(1, 2), k, v, is_causal=True,
                                                      enable_gqa=gqa)  # [m, nh, T, hd]
                attn = attn.transpose(1, 2).reshape(m * T, nh * hd)
            else:  # each row's last real token attends to its real tokens
                q = qk[rows, lens - 1, :nh][:, :, None]  # [m, nh, 1, hd]
                mask = (torch.arange(T, device=ids.device)[None] < lens[:, None])[:, None, None, :]
                attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa).view(m, nh * hd)
                x = x.view(m, T, H)[rows, lens - 1]  # [m, H]
            x = self._mlp(i, layer, x + lin(attn, a.o_proj.weight, a.o_proj.bias))
        cache.advance(T)
        return F.rms_norm(x, (H,), self.model.norm.weight, eps)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, rope_pos: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step; `rope_pos` (default `pos`): the rotary positions where they differ from the
        cache slots (a VL model's text after images, see `vf.models.qwen3_vl`)."""
        n = tokens.shape[0]
        nh, nkv, hd = self.nh, self.nkv, self.hd
        nqk = (nh + nkv) * hd
        cache = self.cache
        cache.begin_decode(n, pos)
        rows, mask, lmax = cache._rows, cache._mask, cache._lmax
        rp = pos if rope_pos is None else rope_pos
        cos = self.cos[rp][:, None, :]  # [n, 1, hd]
        sin = self.sin_signed[rp][:, None, :]
        x = self.model.embed_tokens.weight[tokens]  # [n, H]
        gqa = nh != nkv
        lin = self.linear
        for i, layer in enumerate(self.model.layers):
            a = layer.attn
            h = F.rms_norm(x, (self.H,), layer.attn_norm.weight, self.eps)
            qkv = lin(h, a.qkv_proj.weight, a.qkv_proj.bias)  # [n, P]
            qk = self._qk(i, qkv[:, :nqk].view(n, nh + nkv, hd), cos, sin)
            kb, vb = cache.k[i], cache.v[i]
            kb[rows, :, pos] = qk[:, nh:]
            vb[rows, :, pos] = qkv[:, nqk:].view(n, nkv, hd)
            attn = F.scaled_dot_product_attention(qk[:, :nh, None], kb[:n, :, :lmax], vb[:n, :, :lmax],
                                                  attn_mask=mask, enable_gqa=gqa)  # [n, nh, 1, hd]
            x = self._mlp(i, layer, x + lin(attn.view(n, nh * hd), a.o_proj.weight, a.o_proj.bias))
        cache.advance(1)
        return F.rms_norm(x, (self.H,), self.model.norm.weight, self.eps)
