"""Qwen3-MoE sparse block: softmax top-k router + stacked SwiGLU experts.

Shape legend: N tokens (B*T flattened), H hidden, E experts, k experts per token, Im expert
intermediate size, A = N*k token-expert assignments.
Parameters: router.weight [E, H]; gate_up_proj [E, 2*Im, H] (per expert rows: gate, then up —
the same layout as transformers-5's fused experts); down_proj [E, H, Im].

Two compute paths, chosen per layer with `impl`:
  "loop"    — reference: for each expert, find its tokens, compute, scatter-add (mirrors transformers).
  "grouped" — fast path: sort the A assignments by expert once, run one matmul per contiguous group
              (`torch._grouped_mm` on CUDA; on CPU a loop over contiguous slices, since CPU
              `_grouped_mm` has no working backward), weight and scatter-add once.
Shared experts (Qwen2-MoE `shared_expert_intermediate_size`) are not part of the Qwen3-MoE config and
are not implemented.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import ModelConfig

MOE_IMPLS = ("grouped", "loop")


class MoE(nn.Module):
    def __init__(self, config: ModelConfig, impl: str | None = None):
        super().__init__()
        E, H, Im = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.top_k, self.norm_topk_prob = (
            E,
            config.num_experts_per_tok,
            config.norm_topk_prob,
        )
        self.router = nn.Linear(H, E, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * Im, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, Im))
        self.impl = impl or config.moe_impl
        if self.impl not in MOE_IMPLS:
            raise ValueError(f"moe impl {self.impl!r} unknown; choose one of {MOE_IMPLS}")

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, H] -> (weights [N, k] in x.dtype, expert ids [N, k]). Softmax in fp32, then top-k."""
        probs = F.softmax(self.router(x), dim=-1, dtype=torch.float)  # [N, E]
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        return w.to(x.dtype), idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, H] -> [B, T, H]
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        w, idx = self.route(flat)
        out = self._grouped(flat, w, idx) if self.impl == "grouped" else self._loop(flat, w, idx)
        return out.view(shape)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:  # [n, H] -> [n, H]
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])

    def _loop(self, x, w, idx):
        out = torch.zeros_like(x)
        for e in range(self.num_experts):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            out.index_add_(0, tok, self._expert(e, x[tok]) * w[tok, slot, None])
        return out

    def _grouped(self, x, w, idx):
        _N, k = idx.shape
        flat_idx = idx.reshape(-1)  # [A]
        order = torch.argsort(flat_idx, stable=True)  # assignments grouped by expert
        tok = order // k  # [A] source token of each sorted assignment
        xs = x[tok]  # [A, H]
        counts = torch.bincount(flat_idx, minlength=self.num_experts)
        if x.is_cuda and hasattr(torch, "_grouped_mm"):
            offs = torch.cumsum(counts, 0).to(torch.int32)
            gate, up = torch._grouped_mm(xs, self.gate_up_proj.transpose(1, 2), offs=offs).chunk(2, dim=-1)
            ys = torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(1, 2), offs=offs)
        else:
            parts, start = [], 0
            for e, n in enumerate(counts.tolist()):
                if n:
                    parts.append(self._expert(e, xs[start : start + n]))
                start += n
            ys = torch.cat(parts) if parts else xs.new_zeros(0, x.shape[-1])
        ys = ys * w.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, tok, ys)
