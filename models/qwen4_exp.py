"""Qwen3.8 Flash Next (`qwen4_exp_text`, transformers' Qwen4ExpForCausalLM): gated DeltaNet and QSA
indexed-attention layers (`config.layer_types`: linear_attention | indexed_attention), a softmax-routed
MoE with a sigmoid-gated shared expert in every layer (moe.py), gated residual streams instead of
pre-norms (gated_residual.py), per-layer n-gram embeddings on the layers of `ple_layer_ids`
(ple.py). Mirrors transformers' modeling_qwen4_exp (text only: the mrope of the vision model reduces
to the plain rope when the three position axes are equal).

Shape legend: B batch, T tokens, n hc_count streams, H hidden. Per decoder layer, h [B, T, n·H]:
    h = h + ple(h, ids)                              (PLE layers only)
    x, w = attn_hc(h);  h = h + concat_k w_k · attn(x)        attn: deltanet.GatedDeltaNet | qsa.QSAttention
    x, w = mlp_hc(h);   h = h + concat_k w_k · mlp(x)
The model embeds, repeats the embeddings n times, runs the layers, and `hc_mixer` (a GatedResidual
without injection) collapses the streams to [B, T, H] for the LM head: there is no final norm.
Native parameters: `layers.{i}.attn.*` (as the Qwen3.5 hybrids, plus `attn.indexer.*`),
`layers.{i}.mlp.*` (moe.MoE), `layers.{i}.{attn,mlp}_hc.*`, `layers.{i}.ple.*`, `hc_mixer.*`;
convert.py maps them to transformers' names.
The vision-language checkpoint (`qwen4_exp`, Qwen4ExpForConditionalGeneration: the same text model
under `model.language_model.`, a Qwen3.5 vision tower under `model.visual.`) loads as
`Qwen4ExpVLModel`: image embeddings scattered into the image-pad tokens and M-RoPE positions, as
qwen3_vl.Qwen3VLModel (whose positions, rope and image helpers it inherits); the QSA blocks take the
rope of their first token, image tokens included.
Engine cache: indexed layers "kv" with streams k, v (nkv, hd), the raw index key (1, d) and the
token's rope (1, 2·rotary_dim) (qsa.py); linear
layers "state" (DeltaNet's conv and delta state); a PLE layer's conv and n-gram history under its own
state slot (`num_layers + i`, ple.PLE.state_key).
"""

from __future__ import annotations

import torch
from torch import nn
from vf.models.config import ModelConfig
from vf.models.deltanet import GatedDeltaNet
from vf.models.gated_residual import GatedResidual
from vf.models.layers import Documents, positions_and_mask, refuse_context_parallel
from vf.models.moe import MoE
from vf.models.ple import PLE
from vf.models.qsa import QSAttention
from vf.models.qwen3_vl import MRotary, Qwen3VLModel
from vf.models.transformer import NativeModel
from vf.models.vision import VisionTower

from vf.errors import UsageError


class Qwen4ExpLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.kind = config.layer_types[layer_idx]
        n, H, r, eps = config.hc_mult, config.hidden_size, config.hc_lowrank, config.rms_norm_eps
        self.attn = (GatedDeltaNet if self.kind == "linear_attention" else QSAttention)(config, layer_idx)
        self.mlp = MoE(config, config.moe_impl_for(layer_idx))
        self.attn_hc = GatedResidual(n, H, r, eps)
        self.mlp_hc = GatedResidual(n, H, r, eps)
        ids = config.ple_layer_ids
        self.ple = PLE(config, layer_idx, ids.index(layer_idx + 1)) if layer_idx + 1 in ids else None

    @property
    def cache_kind(self) -> str:
        return "state" if self.kind == "linear_attention" else "kv"

    def forward(self, h, cos, sin, mask=None, cache=None, position_ids=None, input_ids=None):  # [B, T, n·H]
        if self.ple is not None:  # its conv and n-gram history would stop at this rank's slice
            refuse_context_parallel(mask, "PLE (per-layer n-gram embedding)")
            spans = mask.spans if isinstance(mask, Documents) and not mask.single and cache is None else None
            h = h + self.ple(h, input_ids, position_ids, spans, cache)
        x, w = self.attn_hc(h)
        h = GatedResidual.inject(h, self.attn(x, cos, sin, mask, cache, position_ids), w)
        x, w = self.mlp_hc(h)
        return GatedResidual.inject(h, self.mlp(x), w)


class Qwen4ExpModel(NativeModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)  # embeddings, Qwen4ExpLayer layers, rope, head
        del self.norm  # the streams' mixer takes the final norm's place
        self.hc_mixer = GatedResidual(config.hc_mult, config.hidden_size, config.hc_lowrank, config.rms_norm_eps,
                                      combine=False)

    def kv_streams(self) -> list[tuple[int, int]]:
        c = self.config
        return [(c.num_kv_heads, c.head_dim), (c.num_kv_heads, c.head_dim), (1, c.index_head_dim), (1, 2 * c.rotary_dim)]

    def state_shapes(self) -> dict[int, list[tuple[tuple[int, ...], torch.dtype | None]]]:
        out = {i: layer.attn.state_shapes() for i, layer in enumerate(self.layers) if layer.cache_kind == "state"}
        out.update({layer.ple.state_key: layer.ple.state_shapes() for layer in self.layers if layer.ple is not None})
        return out

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        T = input_ids.shape[1]
        position_ids, mask = positions_and_mask(input_ids, position_ids, cache)
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(position_ids, x.dtype)
        h = self.run_layers(x.repeat(1, 1, self.config.hc_mult), cos, sin, mask, cache=cache,
                            position_ids=position_ids, input_ids=input_ids)
        if cache is not None and hasattr(cache, "advance"):
            cache.advance(T)
        return self.hc_mixer(h)


class Qwen4ExpVLModel(Qwen3VLModel):
    """Qwen4ExpForConditionalGeneration: Qwen4ExpModel's decoder with Qwen3.5's vision tower."""

    def __init__(self, config: ModelConfig):
        NativeModel.__init__(self, config)
        del self.norm
        self.hc_mixer = GatedResidual(config.hc_mult, config.hidden_size, config.hc_lowrank, config.rms_norm_eps,
                                      combine=False)
        self.visual = VisionTower(config.vision, config.vl.deepstack)  # Qwen3.5's tower (no DeepStack)
        self.merge = self.visual.merge
        self.rotary = MRotary(config)

    kv_streams = Qwen4ExpModel.kv_streams
    state_shapes = Qwen4ExpModel.state_shapes

    def forward(self, input_ids, position_ids=None, cache=None, *, pixel_values=None, image_grid_thw=None,
                mm_token_type_ids=None, **_unused):
        T = input_ids.shape[1]
        text_pos, triples = self.positions(input_ids, position_ids, cache, image_grid_thw, mm_token_type_ids)
        text_pos, mask = positions_and_mask(input_ids, text_pos, cache)
        x = self.embed_tokens(input_ids)
        if pixel_values is not None or image_grid_thw is not None:  # M-RoPE and image spans need whole rows
            refuse_context_parallel(mask, "image inputs of vision-language")
        if pixel_values is not None:
            embeds, _ = self.visual(pixel_values, image_grid_thw)  # Qwen3.5's tower: no DeepStack outputs
            image_mask = input_ids == self.image_token_id
            n = int(image_mask.sum())
            if n != embeds.shape[0]:
                raise UsageError(f"the prompt holds {n} image tokens and the images give {embeds.shape[0]}")
            x = x.masked_scatter(image_mask[..., None], embeds.to(x.dtype))
        cos, sin = self.rotary(triples, x.dtype)
        h = self.run_layers(x.repeat(1, 1, self.config.hc_mult), cos, sin, mask, cache=cache,
                            position_ids=text_pos, input_ids=input_ids)
        if cache is not None and hasattr(cache, "advance"):
            cache.advance(T)
        return self.hc_mixer(h)
