"""The one MoE runtime every MoE family uses (Qwen3-MoE, GLM-4.5, DeepSeek-V3, GPT-OSS).

Shape legend: N tokens (B*T flattened), H hidden, E routed experts, k experts per token,
Im expert intermediate size, A = N*k token-expert assignments, C = most assignments of one expert.

Parameters (native names under `layers.{i}.mlp.`):
  router.weight [E, H]          router.bias [E] (GPT-OSS: a bias on the router logits)
  router.expert_bias [E]        aux-loss-free selection bias (DeepSeek-V3 `e_score_correction_bias`);
                                a frozen parameter (requires_grad=False): RL does not update it
  gate_up_proj [E, 2Im, H]      per expert rows: gate, then up (transformers-5 fused layout)
  down_proj [E, H, Im]
  gate_up_proj_bias [E, 2Im], down_proj_bias [E, H]   (GPT-OSS biased experts)
  shared.gate_up_proj.weight [2*Is, H], shared.down_proj.weight  (shared experts, GLM/DeepSeek, Qwen3-Next;
                                Is = shared_expert_intermediate_size, else Im*n_shared)
  shared_gate.weight [1, H]     Qwen3-Next: the shared experts' output times sigmoid(x·w)
  relu2 experts (Nemotron-H, not gated): gate_up_proj [E, Im, H] holds the up projection only, and
  the shared expert is the non-gated `MLP(act="relu2")` (shared.up_proj; biases when mlp_bias)
  latent_in.weight [Hl, H], latent_out.weight [H, Hl] (+ .bias when mlp_bias)
                                Nemotron-H Super's latent MoE (Hl = moe_latent_size): the routed
                                experts run in width Hl, so their tensors are [E, Im, Hl] / [E, Hl, Im]

Routing (`Router.forward`), always in fp32:
  logits = x·Wᵀ (+ b);  scores = softmax(logits) | sigmoid(logits) | sqrt(softplus(logits))
  choice = scores + expert_bias; with n_group > 1 only the topk_group groups with the largest
  sum-of-top-2 choice scores stay eligible (group-limited routing, DeepSeek-V3);
  idx = top-k(choice); w = scores[idx], renormalised to sum 1 when norm_topk_prob, times
  routed_scaling_factor. (GPT-OSS's softmax over the top-k logits is softmax scoring + renormalise.)
Experts: act(gate) * up with act = SiLU ("swiglu"), or GPT-OSS's clamped SwiGLU
  ("clamped_swiglu": gate ≤ limit, |up| ≤ limit, gate·σ(α·gate)·(up + 1)), or DeepSeek-V4's
  ("swiglu_limit": SiLU(min(gate, limit)) · clamp(up, ±limit), its shared expert too), or
  Nemotron-H's squared ReLU on the up projection alone ("relu2": relu(up)²).
Latent MoE (transformers' NemotronHMoE): the router and the shared expert see the hidden state x;
only the routed path is wrapped: routed = latent_out(Σ_j w_j · expert_j(latent_in(x))), so
latent_out's bias is added once per token, after the weighted sum. Expert parallelism exchanges
the Hl-wide latent rows (the projections run on the token's own rank).
Routers that choose by token id (DeepSeek-V4's hash layers, models/hash_routing.py) get the
token ids: `forward(x, token_ids)`.

Two compute paths, chosen per layer (`impl`):
  "loop"    reference: for each expert, find its tokens, compute, scatter-add (mirrors transformers).
  "grouped" sort the A assignments by expert once and run `torch.nn.functional.grouped_mm` over
            the contiguous groups (CPU and CUDA; torch 2.13's CPU kernel has autograd and takes
            the experts' weights transposed, as stored). Without grouped_mm (older torch): scatter
            the sorted rows into a padded [E, C, H] block and run two batched GEMMs (`torch.bmm`).
            On CPU at Qwen3-30B-A3B-like shapes (128 experts, top-8) grouped_mm is ~1.25x the
            padded bmm (no zero rows: C is ~1.6x the mean load at random init) and both beat the
            loop (see `bench_moe`). The first CPU grouped_mm call of a process is slow (one-off setup).
Load-balance statistics accumulate over forwards until `pop_stats()` (see `stats_from_counts`).
Expert parallelism (models/expert_parallel.py): with `ep` set, this layer's expert weights are one
rank's block [E/ep, ...] and the forward exchanges assignments with the other ranks of its group
(`ep.compute`); the compute paths above size themselves by the weights held (gate_up_proj.shape[0]).

Router replay (`--model.router-replay`): the engine records the expert ids each MoE layer picked
(`RoutingRecorder` switches `record_routing` on; off, the forward does nothing more), and the trainer
hands them back (`replay_routing`): a layer with `replay` set [N, k] uses those ids instead of its
own top-k for every token whose ids are ≥ 0 (−1: route normally). The gate weights are still the
router's scores at the given ids (renormalised and scaled as usual), so the router keeps its gradient.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.config import MOE_IMPLS, ModelConfig
from vf.models.errors import ModelLoadError
from vf.models.layers import MLP, swiglu

SCORINGS = ("softmax", "sigmoid", "sqrt_softplus")


def check_impl(impl: str) -> str:
    if impl not in MOE_IMPLS:
        raise ModelLoadError(f"unknown MoE implementation {impl!r}", hint=f"choose one of {', '.join(MOE_IMPLS)}")
    return impl


def router_scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Per-expert scores from router logits [N, E] (one of SCORINGS)."""
    if scoring == "softmax":
        return logits.softmax(dim=-1)
    if scoring == "sigmoid":
        return logits.sigmoid()
    return F.softplus(logits).sqrt()


class Router(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        E, H = config.num_experts, config.hidden_size
        self.num_experts, self.top_k = E, config.num_experts_per_tok
        self.scoring, self.norm_topk_prob = config.router_scoring, config.norm_topk_prob
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.scale = config.routed_scaling_factor
        if self.scoring not in SCORINGS:
            raise ModelLoadError(f"router scoring {self.scoring!r} unknown", hint=f"one of {SCORINGS}")
        if E % self.n_group:
            raise ModelLoadError(f"n_group={self.n_group} does not divide the {E} experts")
        self.weight = nn.Parameter(torch.empty(E, H))
        self.bias = nn.Parameter(torch.empty(E)) if config.router_bias else None
        self.expert_bias = nn.Parameter(torch.empty(E), requires_grad=False) if config.expert_bias else None

    def forward(self, x: torch.Tensor, replay: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, H] -> (weights [N, k] fp32, expert ids [N, k], confidence [N] fp32: the selected
        share of the score mass, detached). `replay` [N, k]: expert ids to use where ≥ 0."""
        logits = F.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())
        scores = router_scores(logits, self.scoring)
        choice = scores.detach() if self.expert_bias is None else scores.detach() + self.expert_bias.float()
        if self.n_group > 1:
            N, G = choice.shape[0], self.n_group
            grouped = choice.view(N, G, -1)
            group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)  # [N, G]
            keep = torch.zeros_like(group_scores, dtype=torch.bool)
            keep.scatter_(1, group_scores.topk(self.topk_group, dim=-1, sorted=False)[1], True)
            choice = choice.masked_fill(~keep[:, :, None].expand_as(grouped).reshape(N, -1), float("-inf"))
        idx = choice.topk(self.top_k, dim=-1)[1]
        if replay is not None:
            if replay.shape != idx.shape:
                raise ValueError(f"router replay: expert ids of shape {tuple(replay.shape)} for a forward "
                                 f"of {tuple(idx.shape)} (tokens, top-k)")
            replay = replay.to(device=idx.device, dtype=idx.dtype)
            idx = torch.where(replay >= 0, replay, idx)
        w = scores.gather(1, idx)
        with torch.no_grad():
            confidence = w.sum(-1) / scores.sum(-1)
        if self.norm_topk_prob:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        if self.scale != 1.0:
            w = w * self.scale
        return w, idx, confidence


class MoE(nn.Module):
    def __init__(self, config: ModelConfig, impl: str | None = None):
        super().__init__()
        E, H, Im = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.num_experts, self.top_k = E, config.num_experts_per_tok
        self.router = Router(config)
        latent = config.moe_latent_size
        # Hx: the routed experts' input/output width (the latent width under a latent MoE)
        Hx = latent or H
        self.latent_in = nn.Linear(H, latent, bias=config.mlp_bias) if latent else None
        self.latent_out = nn.Linear(latent, H, bias=config.mlp_bias) if latent else None
        gated = config.expert_act != "relu2"
        self.gate_up_proj = nn.Parameter(torch.empty(E, (2 if gated else 1) * Im, Hx))
        self.down_proj = nn.Parameter(torch.empty(E, Hx, Im))
        if config.expert_bias_terms:
            self.gate_up_proj_bias = nn.Parameter(torch.empty(E, 2 * Im))
            self.down_proj_bias = nn.Parameter(torch.empty(E, Hx))
        else:
            self.gate_up_proj_bias = self.down_proj_bias = None
        self.act, self.alpha, self.limit = config.expert_act, config.swiglu_alpha, config.swiglu_limit
        shared = config.shared_expert_intermediate_size or Im * config.n_shared_experts
        limit = self.limit if self.act == "swiglu_limit" else None
        self.shared = (MLP(H, shared, bias=config.mlp_bias, act="swiglu" if gated else "relu2", limit=limit)
                       if shared else None)
        self.shared_gate = nn.Linear(H, 1, bias=False) if config.shared_expert_gate else None
        self.impl = check_impl(impl or config.moe_impl_for(0))
        self._counts: torch.Tensor | None = None  # [E] assignments since the last pop_stats()
        self._confidence: torch.Tensor | None = None  # Σ routing confidence over those tokens
        self._tokens = 0
        self.record_routing = False  # keep the last forward's expert ids in `routed` (RoutingRecorder)
        self.routed: torch.Tensor | None = None  # [N, k]
        self.replay: torch.Tensor | None = None  # [N, k] expert ids to use, −1 = own top-k (replay_routing)
        # expert parallelism (models/expert_parallel.shard_experts): an ExpertShard when this process
        # holds only a block of the experts; the weights above are then that block [E/ep, ...]
        self.ep = None

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:  # [B, T, H] -> [B, T, H]
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if token_ids is not None:  # a hash router: the experts are a function of the token id
            w, idx, confidence = self.router(flat, token_ids.reshape(-1))
        else:
            w, idx, confidence = self.router(flat, self.replay)
        if self.record_routing:
            self.routed = idx
        w = w.to(x.dtype)
        impl = check_impl(self.impl)
        routed = flat if self.latent_in is None else self.latent_in(flat)  # [N, Hx]
        if self.ep is not None:  # the assignments travel to the ranks holding their experts and back
            out = self.ep.compute(self, routed, w, idx)
        else:
            out = self._grouped(routed, w, idx) if impl == "grouped" else self._loop(routed, w, idx)
        if self.latent_out is not None:
            out = self.latent_out(out)
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        self._record(idx, confidence)
        return out.view(shape)

    # -- experts -----------------------------------------------------------------------------
    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:  # [..., 2Im] -> [..., Im]
        if self.act == "relu2":  # [..., Im] -> [..., Im]
            return torch.relu(gate_up).square()
        gate, up = gate_up.chunk(2, dim=-1)
        if self.act in ("swiglu", "swiglu_limit"):
            return swiglu(gate, up, self.limit if self.act == "swiglu_limit" else None)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return gate * torch.sigmoid(gate * self.alpha) * (up + 1)

    def _loop(self, x, w, idx):
        # unbind once: indexing `param[e]` per expert would make backward build a full-size [E, ...]
        # gradient for every expert
        E = self.gate_up_proj.shape[0]  # experts held here: E, or E/ep under expert parallelism
        none = [None] * E
        w1, w2 = self.gate_up_proj.unbind(0), self.down_proj.unbind(0)
        b1 = none if self.gate_up_proj_bias is None else self.gate_up_proj_bias.unbind(0)
        b2 = none if self.down_proj_bias is None else self.down_proj_bias.unbind(0)
        out = torch.zeros_like(x)
        for e in range(E):
            tok, slot = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            y = F.linear(self._act(F.linear(x[tok], w1[e], b1[e])), w2[e], b2[e])
            out.index_add_(0, tok, y * w[tok, slot, None])
        return out

    def _grouped(self, x, w, idx):
        k = idx.shape[1]
        flat_idx = idx.reshape(-1)  # [A]
        order = torch.argsort(flat_idx, stable=True)  # assignments grouped by expert
        tok = order // k  # [A] source token of each sorted assignment
        xs = x[tok]  # [A, H]
        counts = torch.bincount(flat_idx, minlength=self.gate_up_proj.shape[0])  # per expert held here
        grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
        Im = self.down_proj.shape[-1]
        if grouped_mm is not None and _aligned(xs, self.gate_up_proj, self.down_proj) and Im * xs.element_size() % 16 == 0:
            offs = torch.cumsum(counts, 0).to(torch.int32)
            h = grouped_mm(xs, self.gate_up_proj.transpose(1, 2), offs=offs)
            if self.gate_up_proj_bias is not None:
                h = h + self.gate_up_proj_bias[flat_idx[order]]
            ys = grouped_mm(self._act(h), self.down_proj.transpose(1, 2), offs=offs)
            if self.down_proj_bias is not None:
                ys = ys + self.down_proj_bias[flat_idx[order]]
        else:
            ys = self._padded_bmm(xs, flat_idx[order], counts)
        ys = ys * w.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, tok, ys)

    def _padded_bmm(self, xs, experts, counts):
        """xs [A, H] sorted by expert (`experts` [A]) -> expert outputs [A, H] with two batched GEMMs
        over a zero-padded [E, C, H] block (C = the busiest expert's assignment count)."""
        A, H = xs.shape
        E = self.gate_up_proj.shape[0]
        C = int(counts.max()) if A else 0
        starts = torch.cumsum(counts, 0) - counts  # [E] first sorted row of each expert
        slot = torch.arange(A, device=xs.device) - starts[experts]  # row within its expert's group
        flat_pos = experts * C + slot  # [A] row in the [E*C] padded block
        block = xs.new_zeros(E * C, H).index_copy(0, flat_pos, xs).view(E, C, H)
        h = torch.bmm(block, self.gate_up_proj.transpose(1, 2))  # [E, C, 2Im]
        if self.gate_up_proj_bias is not None:
            h = h + self.gate_up_proj_bias[:, None]
        y = torch.bmm(self._act(h), self.down_proj.transpose(1, 2))  # [E, C, H]
        if self.down_proj_bias is not None:
            y = y + self.down_proj_bias[:, None]
        return y.reshape(-1, H)[flat_pos]

    # -- load-balance statistics -------------------------------------------------------------
    @torch.no_grad()
    def _record(self, idx: torch.Tensor, confidence: torch.Tensor) -> None:
        counts = torch.bincount(idx.reshape(-1), minlength=self.num_experts)
        self._counts = counts if self._counts is None else self._counts + counts
        total = confidence.sum()
        self._confidence = total if self._confidence is None else self._confidence + total
        self._tokens += idx.shape[0]

    def pop_stats(self) -> dict[str, float] | None:
        """{max_vio, routing_confidence} over the forwards since the last call (None if none)."""
        if self._counts is None or not self._tokens:
            return None
        out = {**stats_from_counts(self._counts), "routing_confidence": float(self._confidence) / self._tokens}
        self._counts, self._confidence, self._tokens = None, None, 0
        return out


# -- router replay ------------------------------------------------------------------------------


def moe_layers(model: nn.Module) -> list[MoE]:
    """The model's MoE layers in module order (= decoder layer order): the `L` axis of routed experts."""
    return [m for m in model.modules() if isinstance(m, MoE)]


class RoutingRecorder:
    """The engine's side of router replay: switches recording on in every MoE layer and, after a
    forward, reads the expert ids of the positions whose logits are sampled from.

    `take(seqs)` after a forward over `len(seqs)` rows returns, per row, [L][k] expert ids (L = MoE
    layers) at the position that produced the row's next token: in a prefill ([rows, T] padded
    block, no token sampled yet) the row's last prompt token, in a decode step its one token."""

    def __init__(self, model: nn.Module):
        self.layers = moe_layers(model)
        for layer in self.layers:
            layer.record_routing = True

    def take(self, seqs) -> list[list[list[int]]]:
        routed = [layer.routed for layer in self.layers]
        for layer in self.layers:
            layer.routed = None  # a layer the next forward skips fails loudly instead of repeating
        if any(r is None for r in routed) or routed[0].shape[0] % len(seqs):
            raise RuntimeError("router replay: the last forward did not run every MoE layer over its rows")
        ids = torch.stack(routed, dim=1)  # [N, L, k]
        T = ids.shape[0] // len(seqs)
        pos = [r * T + (len(s.prompt_ids) - 1 if not s.token_ids else 0) for r, s in enumerate(seqs)]
        return ids[torch.tensor(pos, device=ids.device)].tolist()


@contextlib.contextmanager
def replay_routing(model: nn.Module, routed: torch.Tensor | None):
    """The trainer's side: during the block, MoE layer l of a forward over [R, T] tokens routes
    each token to `routed[r, t, l]` (k expert ids; −1 = its own top-k). Keep the block around the
    backward too, so activation checkpointing recomputes the same routing. `routed` None: no-op."""
    if routed is None:
        yield
        return
    layers = moe_layers(model)
    if routed.shape[-2] != len(layers):
        raise ValueError(f"router replay: routed experts for {routed.shape[-2]} MoE layers, the model has {len(layers)}")
    flat = routed.reshape(-1, *routed.shape[-2:])
    try:
        for i, layer in enumerate(layers):
            layer.replay = flat[:, i]
        yield
    finally:
        for layer in layers:
            layer.replay = None


def _aligned(*tensors: torch.Tensor) -> bool:
    """grouped_mm's kernel needs 16-byte aligned data and strides (else it raises); tiny test
    shapes with odd sizes take the padded-bmm path."""
    return all(t.data_ptr() % 16 == 0 and all(st * t.element_size() % 16 == 0 for st in t.stride() if st != 1)
               for t in tensors)


def stats_from_counts(counts: torch.Tensor) -> dict[str, float]:
    """max_vio = (most assignments of one expert − mean) / mean: 0 when perfectly balanced,
    E − 1 when every token goes to the same experts."""
    c = counts.float()
    mean = c.mean()
    return {"max_vio": float((c.max() - mean) / mean) if mean > 0 else 0.0}


def moe_stats(model: nn.Module) -> dict[str, float]:
    """Per-step MoE metrics of a model (empty for a dense one): the mean and max over layers of
    max_vio, and the mean routing confidence. Resets the layers' counters."""
    per_layer = [s for m in model.modules() if isinstance(m, MoE) and (s := m.pop_stats()) is not None]
    if not per_layer:
        return {}
    vio = [s["max_vio"] for s in per_layer]
    return {
        "moe/max_vio": sum(vio) / len(vio),
        "moe/max_vio_max": max(vio),
        "moe/routing_confidence": sum(s["routing_confidence"] for s in per_layer) / len(per_layer),
    }


def bench_moe(
    num_experts: int = 128, top_k: int = 8, hidden: int = 512, intermediate: int = 192, tokens: int = 1024,
    repeats: int = 3, seed: int = 0,
) -> dict[str, float]:
    """Forward+backward seconds of one MoE layer per impl (median of `repeats`) on a
    Qwen3-30B-A3B-like shape scaled to CPU; returns {impl: seconds, "speedup": loop / grouped}."""
    cfg = ModelConfig(
        architecture="qwen3_moe", vocab_size=8, hidden_size=hidden, num_layers=1, num_heads=1, num_kv_heads=1,
        head_dim=8, intermediate_size=8, num_experts=num_experts, num_experts_per_tok=top_k,
        moe_intermediate_size=intermediate, norm_topk_prob=True,
    )
    g = torch.Generator().manual_seed(seed)
    layer = MoE(cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    x = torch.randn(1, tokens, hidden, generator=g)
    out: dict[str, float] = {}
    for impl in MOE_IMPLS:
        layer.impl = impl
        times = []
        for _ in range(repeats + 1):  # the first run warms up
            xi = x.clone().requires_grad_(True)
            t0 = time.perf_counter()
            layer(xi).square().mean().backward()
            times.append(time.perf_counter() - t0)
        out[impl] = sorted(times[1:])[len(times[1:]) // 2]
    out["speedup"] = out["loop"] / out["grouped"]
    return out
