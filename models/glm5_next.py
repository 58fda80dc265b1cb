"""GLM-5.3 (`glm5_next`, transformers' Glm5NextForConditionalGeneration): linear-attention
(KDA, kda.py) and indexed-attention layers (`config.layer_types`), hyper-connection residual streams
(hyper_connections.py, DeepSeek-V4's mHC math), dense then sparse MLPs with SwiGLU clipped at
`swiglu_limit` (moe.py: sigmoid router with expert bias, shared expert). No rope anywhere in the text
model (NoPE). Declarative parts (config keys, checks, weight rows): models/families/glm5_next.py.

Shape legend: B batch, T tokens, S keys, H hidden, n hc_mult streams, rkv kv_lora_rank, di index_head_dim,
m index_kpool, Nw = S // m complete pools.

Indexed attention (`KPoolAttention`, transformers' Glm5NextTextAttention + Glm5NextTextIndexer): MLA
(mla.py) with qk_rope_head_dim 0, whose keys are cut per query by a k-pool indexer:
  index keys  k_s = k_norm(wk(x_s)) [di] and gate logits z_s = index_kpool_compress_gate · x_s [di]
  pools       tokens w·m .. w·m+m-1 of a document (counted from its first token);
              entry_w = Σ_slots softmax_slots(z + index_kpool_compress_ape[slot]) · k   (per channel)
  scores      dsa.Indexer.index_scores over the entries: Σ_h w_h(t) relu(q_h(t)·entry_w / sqrt(di))
  selected    the top index_topk / m complete pools the query may see (compressed_attention's
              visible_entries: the pool ends at or before the query), as raw tokens, plus the
              query's own incomplete pool (the tail: its (p+1) % m latest tokens, itself included)
The selection is hard and made under no_grad (as transformers), so the indexer gets no gradient.
"shared" layers (indexer_types) reuse the previous layer's selection (dsa.link_shared_indexers).
Decoder layer: h [B, T, n, H];  x, post, comb = attn_hc(h);  h = merge(h, attn(norm(x)), post, comb);
the same with mlp_hc and the MLP. The model expands the embeddings to n streams and averages them
(transformers' Glm5NextTextHyperHead: an unweighted mean) before the final norm.
Engine cache: indexed layers store the MLA latent [1, rkv], the index key and gate logits [1, di]
each ("kv"); pools are re-formed from them every step (keys at absolute positions). KDA layers keep
their conv window and delta state ("state").
Images (`compute_logits(ids, pixel_values=, image_grid_thw=)`): `Glm5NextVision` embeds them and the
embeddings replace the image tokens (`<|image|>`, embedded as itself first, as transformers does; no
positions to adjust: the text model has no rope, so `rope_delta` is 0); videos are refused. The
engine and trainer get image prompts through the VL methods (`is_multimodal`, `image_inputs`,
`image_tokens`, ...; models/kimi_k25.py has the same), with GLM's own preprocessing
(models/glm5_image_processor.py). Images are consumed in token order across rows (row-major), so packed
documents need nothing beyond the text model's document masking.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from vf.models.compressed_attention import visible_entries
from vf.models.config import ModelConfig
from vf.models.dsa import Indexer, link_shared_indexers, top_k_mask
from vf.models.families.glm5_next import VISION_DEFAULTS
from vf.models.glm5_image_processor import Glm5ImageProcessor
from vf.models.hyper_connections import HyperConnection, expand
from vf.models.image_processor import pixel_inputs, processor_for
from vf.models.kda import KimiDeltaAttention
from vf.models.layers import MLP, Documents, RMSNorm, positions_and_mask, refuse_context_parallel, swiglu
from vf.models.mla import MLAttention
from vf.models.moe import MoE
from vf.models.transformer import NativeModel
from vf.models.vision import PatchEmbed, _patch_coords, _rope, merged_tokens

from vf.errors import UsageError


class KPoolIndexer(Indexer):
    """dsa.Indexer (wq_b, wk, k_norm, weights_proj; no rope here) scoring k-pools instead of tokens."""

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.pool, self.tail = config.index_kpool, config.index_kpool_always_select_tail
        self.index_kpool_compress_ape = nn.Parameter(torch.empty(self.pool, self.di))
        self.index_kpool_compress_gate = nn.Parameter(torch.empty(self.di, config.hidden_size))

    def project(self, x, cos, sin):
        """x [B, T, H] -> (index keys, gate logits) [B, 1, T, di]: what the engine cache stores."""
        return self.key(x, cos, sin), F.linear(x, self.index_kpool_compress_gate)[:, None]

    @torch.no_grad()
    def select(self, x, q_lat, keys, gates, cos, sin, position_ids):
        """One document: x [B, T, H], q_lat [B, T, rq], keys/gates [B, 1, S, di] of tokens at
        positions 0..S-1, position_ids [B, T] -> bool [B, T, S]: the keys each query attends to."""
        S = keys.shape[2]
        m, nw = self.pool, S // self.pool
        k = keys[:, 0, : nw * m].unflatten(1, (nw, m))  # [B, Nw, m, di]
        z = gates[:, 0, : nw * m].unflatten(1, (nw, m)).float() + self.index_kpool_compress_ape.float()
        entries = (z.softmax(dim=2).to(k.dtype) * k).sum(dim=2)  # [B, Nw, di]
        visible = visible_entries(position_ids, nw, m)  # [B, T, Nw]
        picked = top_k_mask(self.index_scores(x, q_lat, entries[:, None], cos, sin, visible[:, None]), self.topk // m)
        j = torch.arange(S, device=x.device)
        pool_of = (j // m).clamp(max=max(nw - 1, 0)).expand(*picked.shape[:2], S)
        chosen = picked.gather(-1, pool_of) if nw else torch.zeros_like(pool_of, dtype=torch.bool)
        chosen = chosen & (j < nw * m)
        p = position_ids[..., None]
        tail = (j <= p) & (j >= p + 1 - (p + 1) % m)  # the query's incomplete pool
        return chosen | tail if self.tail else chosen


class KPoolAttention(MLAttention):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        # transformers' q_a_layernorm / kv_a_layernorm take rms_norm_eps here (mla.py's default is 1e-6)
        self.q_a_norm.eps = self.kv_a_norm.eps = config.rms_norm_eps
        self.di = config.index_head_dim
        self.indexer = KPoolIndexer(config) if config.indexer_types[layer_idx] == "full" else None
        self.source: tuple[KPoolAttention, ...] = (self,)  # shared layers: set by link_shared_indexers
        self.selection: torch.Tensor | None = None
        self.sparse = True  # False: attend to every visible key (the selection switched off)

    def forward(self, x, cos, sin, mask=None, cache=None, position_ids=None):  # [B, T, H] -> [B, T, H]
        refuse_context_parallel(mask, "GLM-5.3 k-pool indexed attention")
        B, T, _ = x.shape
        q, q_lat, latent, _ = self.project(x, cos, sin)
        if self.indexer is not None:
            keys, gates = self.indexer.project(x, cos, sin)
        else:  # the index streams stay empty on shared layers
            keys = gates = latent.new_zeros(B, 1, T, self.di)
        if cache is not None:
            (latent, keys, gates), mask = cache.store(self.layer_idx, latent, keys, gates)
        S = latent.shape[2]
        docs = mask.spans if isinstance(mask, Documents) and not mask.single else None
        if isinstance(mask, Documents):
            mask = mask.dense() if docs else None
        if mask is None:  # plain causal over a block with no earlier keys
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)[None, None]
        if self.indexer is not None:
            self.selection = self._select(x, q_lat, keys, gates, cos, sin, position_ids, docs)
        if self.sparse:
            mask = mask & self.source[0].selection
        return self.attend(q, latent, latent.new_zeros(B, 1, S, 0), mask, causal_none=False)

    def _select(self, x, q_lat, keys, gates, cos, sin, position_ids, docs):
        """bool [B, 1, T, S]: the indexer's keys per query; for packed rows per document (pools count
        from each document's first token, no key crosses a document)."""
        if docs is None:
            return self.indexer.select(x, q_lat, keys, gates, cos, sin, position_ids)[:, None]
        B, T, _ = x.shape
        out = torch.zeros(B, 1, T, T, dtype=torch.bool, device=x.device)
        for b, row in enumerate(docs):
            for s, e in row:
                out[b, 0, s:e, s:e] = self.indexer.select(
                    x[b : b + 1, s:e], q_lat[b : b + 1, s:e], keys[b : b + 1, :, s:e], gates[b : b + 1, :, s:e],
                    cos[b : b + 1, s:e], sin[b : b + 1, s:e], position_ids[b : b + 1, s:e])[0]
        return out


class Glm5NextLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.kind = config.layer_types[layer_idx]
        H, eps = config.hidden_size, config.rms_norm_eps
        self.attn_norm = RMSNorm(H, eps)
        self.attn = (KimiDeltaAttention if self.kind == "linear_attention" else KPoolAttention)(config, layer_idx)
        self.mlp_norm = RMSNorm(H, eps)
        self.mlp = (MoE(config, config.moe_impl_for(layer_idx)) if config.is_moe_layer(layer_idx)
                    else MLP(H, config.intermediate_size, limit=config.swiglu_limit))
        self.attn_hc = HyperConnection(config)
        self.mlp_hc = HyperConnection(config)

    @property
    def cache_kind(self) -> str:
        return "state" if self.kind == "linear_attention" else "kv"

    def forward(self, h, cos, sin, mask=None, cache=None, position_ids=None):  # [B, T, n, H]
        x, post, comb = self.attn_hc(h)
        h = self.attn_hc.merge(h, self.attn(self.attn_norm(x), cos, sin, mask, cache, position_ids), post, comb)
        x, post, comb = self.mlp_hc(h)
        return self.mlp_hc.merge(h, self.mlp(self.mlp_norm(x)), post, comb)


class Glm5NextModel(NativeModel):
    processor = None  # the model directory's image processor (set by load_model), else `default_processor()`

    def __init__(self, config: ModelConfig):
        super().__init__(config)  # embeddings, Glm5NextLayer layers, final norm, head
        link_shared_indexers([layer.attn for layer in self.layers if layer.kind == "indexed_attention"])
        self.visual = Glm5NextVision(config.vision) if config.vision is not None else None
        self.image_token_id = config.image_token_id

    @property
    def is_multimodal(self) -> bool:
        return self.visual is not None  # a text-only glm5_next checkpoint (flat config.json) has no tower

    def default_processor(self) -> Glm5ImageProcessor:
        """transformers' Glm5NextImageProcessor defaults with this tower's patch, frame and merge sizes."""
        v = self.visual.settings
        return Glm5ImageProcessor(patch_size=v["patch_size"], temporal_patch_size=v["temporal_patch_size"],
                                  merge_size=v["spatial_merge_size"])

    def image_inputs(self, refs: list[str], roots=()) -> dict:
        """Image references (data URLs, local files under `roots`, default the working directory)
        -> pixel_values [N, 3·tp·p²], image_grid_thw [n, 3]."""
        if self.processor is None:
            self.processor = processor_for(self)
        p = self.embed_tokens.weight
        return pixel_inputs(self.processor, refs, roots or (Path.cwd(),), device=p.device, dtype=p.dtype)

    def image_tokens(self, grid) -> int:
        """`<|image|>` tokens one image of patch grid (t, h, w) takes: t·h·w / merge²."""
        return merged_tokens(grid, self.visual.merge)

    def rope_delta(self, input_ids: list[int], grids) -> int:
        return 0  # no rope: positions after an image are plain token counts

    def kv_streams(self) -> list[tuple[int, int]]:
        c = self.config
        return [(1, c.kv_lora_rank), (1, c.index_head_dim), (1, c.index_head_dim)]

    def forward(self, input_ids, position_ids=None, cache=None, *, pixel_values=None, image_grid_thw=None,
                pixel_values_videos=None, **_unused):
        if pixel_values_videos is not None:
            raise UsageError("video inputs of GLM-5.3 (glm5_next) are not supported natively",
                             hint="--model.impl hf runs them through transformers")
        T = input_ids.shape[1]
        position_ids, mask = positions_and_mask(input_ids, position_ids, cache)
        x = self.embed_tokens(input_ids)
        if pixel_values is not None:  # no rope in the text model: image embeddings just take their tokens' places
            refuse_context_parallel(mask, "image inputs of GLM-5.3")
            if image_grid_thw is None or self.visual is None:
                raise UsageError("image inputs of GLM-5.3 need image_grid_thw and a checkpoint with a vision tower")
            embeds = self.visual(pixel_values, image_grid_thw)
            image_mask = input_ids == self.image_token_id
            if int(image_mask.sum()) != embeds.shape[0]:
                raise UsageError(f"the prompt holds {int(image_mask.sum())} image tokens and the images give "
                                 f"{embeds.shape[0]}")
            x = x.masked_scatter(image_mask[..., None], embeds.to(x.dtype))
        nope = x.new_zeros(*position_ids.shape, 0)  # no rope: zero-width cos/sin
        h = self.run_layers(expand(x, self.config.hc_mult), nope, nope, mask, cache=cache, position_ids=position_ids)
        if cache is not None and hasattr(cache, "advance"):
            cache.advance(T)
        return self.norm(h.mean(dim=2))  # transformers' Glm5NextTextHyperHead

    def compute_logits(self, input_ids, position_ids=None, cache=None, **mm):
        return self.forward(input_ids, position_ids, cache, **mm) @ self.lm_head_weight.t()  # [B, T, V]


class VisionAttention(nn.Module):
    """Full attention within each image frame; q and k RMS-normed per head, then the 2-D rope."""

    def __init__(self, v: dict):
        super().__init__()
        H, self.nh, bias, eps = v["hidden_size"], v["num_heads"], v["attention_bias"], v["rms_norm_eps"]
        self.qkv, self.proj = nn.Linear(H, 3 * H, bias=bias), nn.Linear(H, H, bias=bias)
        self.q_norm, self.k_norm = RMSNorm(H // self.nh, eps), RMSNorm(H // self.nh, eps)

    def forward(self, x, cos, sin, seqlens: list[int]):  # x [N, E], cos/sin [N, hd]
        N, E = x.shape
        q, k, v = self.qkv(x).reshape(N, 3, self.nh, -1).unbind(1)  # each [N, nh, hd]
        q, k = _rope(self.q_norm(q), cos, sin), _rope(self.k_norm(k), cos, sin)  # vision.py's (fp32)
        out = [F.scaled_dot_product_attention(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None])[0]
               for qi, ki, vi in zip(q.split(seqlens), k.split(seqlens), v.split(seqlens))]  # [nh, n_i, hd]
        return self.proj(torch.cat(out, dim=1).transpose(0, 1).reshape(N, E))


class ClippedSwiGLU(nn.Module):
    """down(silu(min(gate, limit)) · clamp(up, ±limit)) with separate gate/up projections (HF names)."""

    def __init__(self, dim: int, inner: int, bias: bool, limit: float):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(dim, inner, bias=bias), nn.Linear(dim, inner, bias=bias)
        self.down_proj, self.limit = nn.Linear(inner, dim, bias=bias), limit

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.limit))


class VisionBlock(nn.Module):
    def __init__(self, v: dict):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(v["hidden_size"], v["rms_norm_eps"]), RMSNorm(v["hidden_size"], v["rms_norm_eps"])
        self.attn = VisionAttention(v)
        self.mlp = ClippedSwiGLU(v["hidden_size"], v["intermediate_size"], v["attention_bias"], v["swiglu_limit"])

    def forward(self, x, cos, sin, seqlens):
        x = x + self.attn(self.norm1(x), cos, sin, seqlens)
        return x + self.mlp(self.norm2(x))


class PatchMerger(ClippedSwiGLU):
    """proj, LayerNorm, GELU, then the clipped SwiGLU (transformers' Glm5NextVisionPatchMerger)."""

    def __init__(self, v: dict):
        out = v["out_hidden_size"]
        super().__init__(out, v["projection_intermediate_size"], False, v["swiglu_limit"])
        self.proj = nn.Linear(out, out, bias=False)
        self.post_projection_norm = nn.LayerNorm(out)

    def forward(self, x):
        return super().forward(F.gelu(self.post_projection_norm(self.proj(x))))


class Glm5NextVision(nn.Module):
    """transformers' Glm5NextVisionModel (`visual.*` = HF `model.visual.*`, same names): patch
    embedding (vision.PatchEmbed), blocks with the axial 2-D rope over each patch's (row, col),
    RMSNorm, an m×m strided conv that merges each block of m² patches into one text token, and the
    merger. forward(pixel_values [N, D], grid_thw [n, 3]) ->
    image embeddings [N/m², out_hidden_size] (patches block-major, as vision.py)."""

    def __init__(self, vision: dict):
        super().__init__()
        self.settings = v = {**VISION_DEFAULTS, **{k: val for k, val in vision.items() if val is not None}}
        self.merge, self.head_dim = v["spatial_merge_size"], v["hidden_size"] // v["num_heads"]
        self.theta = float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        self.patch_embed = PatchEmbed(v)
        self.blocks = nn.ModuleList(VisionBlock(v) for _ in range(v["depth"]))
        self.post_layernorm = RMSNorm(v["hidden_size"], v["rms_norm_eps"])
        self.downsample = nn.Conv2d(v["hidden_size"], v["out_hidden_size"], kernel_size=self.merge, stride=self.merge)
        self.merger = PatchMerger(v)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        grids = [tuple(int(g) for g in row) for row in grid_thw.tolist()]
        rows, cols = _patch_coords(grids, self.merge, pixel_values.device)
        x = self.patch_embed(pixel_values)
        # axial rope: the same frequencies (over head_dim/2) for rows and columns, one half each
        quarter = self.head_dim // 2
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, quarter, 2, dtype=torch.float, device=x.device) / quarter))
        freqs = torch.cat((rows[:, None].float() * inv_freq, cols[:, None].float() * inv_freq), -1)
        emb = torch.cat((freqs, freqs), dim=-1)  # [N, hd]
        cos, sin = emb.cos(), emb.sin()
        seqlens = [h * w for t, h, w in grids for _ in range(t)]
        for block in self.blocks:
            x = block(x, cos, sin, seqlens)
        x = self.post_layernorm(x)
        m = self.merge
        x = self.downsample(x.view(-1, m, m, x.shape[-1]).permute(0, 3, 1, 2)).flatten(1)  # [N/m², out]
        return self.merger(x)
