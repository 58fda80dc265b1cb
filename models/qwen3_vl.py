"""Qwen3-VL (`model_type: qwen3_vl`) and Qwen3.5 with vision (`qwen3_5`, whose text model is the
gated-DeltaNet hybrid `qwen3_5_text`), and their MoEs `qwen3_vl_moe` (Qwen3-MoE decoder layers) and
`qwen3_5_moe` (text model `qwen3_5_moe_text`): the decoder of `transformer.NativeModel` (its MLPs
or `moe.MoE` layers, as the text config says) with a vision tower (`vision.VisionTower`), image
embeddings scattered into the image-pad tokens, DeepStack (the Qwen3-VL towers only: the tower's
side outputs added to the image tokens' hidden states after the first decoder layers) and
multimodal rotary positions (M-RoPE).

Shape legend: B rows, T tokens per row, H hidden, hd head_dim, n images, N patches.

    forward(input_ids [B,T], position_ids=None, cache=None, *, pixel_values [N, D]=None,
            image_grid_thw [n, 3]=None, mm_token_type_ids [B,T]=None) -> hidden [B,T,H]
    compute_logits(same) -> [B,T,V]      (the keyword arguments of transformers' model)

Positions. Every token has a (t, h, w) position triple. Text tokens have t = h = w (one counter);
an image's tokens have t = start, h = start + row, w = start + column on the merged grid, and
the counter then moves past the image by max(rows, columns). With all three equal, M-RoPE is
the plain rotary embedding, so text after the last image only needs its counter offset (the
"rope delta", `rope_delta`). `position_ids` may be:
    None or [B,T]  text positions (restarting at 0 opens a new packed document); the triples are
                   computed here, per document, from the image-pad tokens and `image_grid_thw`
    [4,B,T]        text positions then the three axes (transformers' layout)
    [3,B,T]        the three axes (plain causal attention)
Images are consumed in token order across rows and documents (row-major), as transformers does.
"""

from __future__ import annotations

import itertools

import torch
from vf.models.config import ModelConfig
from vf.models.layers import Documents, positions_and_mask, refuse_context_parallel, rope_inv_freq
from vf.models.transformer import NativeModel
from vf.models.vision import VisionTower, merged_tokens


class MRotary(torch.nn.Module):
    """Interleaved M-RoPE: frequency i rotates by the h position when i % 3 == 1 and i < 3*sec[1],
    by the w position when i % 3 == 2 and i < 3*sec[2], else by t (transformers' Qwen3-VL layout)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.section = list(config.mrope_section)
        self._inv_freq: torch.Tensor | None = None

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):  # [3,B,T] (or [B,T]: text) -> cos/sin [B,T,hd]
        if positions.ndim == 2:
            positions = positions.expand(3, *positions.shape)
        if self._inv_freq is None or self._inv_freq.device != positions.device:
            self._inv_freq = rope_inv_freq(self.config, positions.device)
        freqs = positions[..., None].float() * self._inv_freq  # [3, B, T, hd/2]
        out = freqs[0].clone()
        for axis in (1, 2):
            idx = slice(axis, self.section[axis] * 3, 3)
            out[..., idx] = freqs[axis][..., idx]
        emb = torch.cat((out, out), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_index(token_types: list[int], grids, merge: int) -> torch.Tensor:
    """(t, h, w) positions [3, L] of one document from 0: `token_types` 0 text, 1 image per token;
    `grids` yields each image's (t, h, w) patch grid in order (transformers' `get_rope_index`)."""
    parts, cur = [], 0
    for kind, group in itertools.groupby(token_types):
        n = len(list(group))
        if kind == 0:
            parts.append(torch.arange(cur, cur + n).expand(3, n))
            cur += n
            continue
        t, h, w = (int(v) for v in next(grids))
        h, w = h // merge, w // merge
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
        parts.append(torch.stack([tt + cur, hh + cur, ww + cur]).reshape(3, -1))
        cur += max(h, w)
    return torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)


class Qwen3VLModel(NativeModel):
    is_multimodal = True

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.visual = VisionTower(config.vision, config.vl.deepstack)
        self.merge = self.visual.merge
        self.rotary = MRotary(config)

    processor = None  # the model directory's ImageProcessor (set by load_model), else one built from the tower

    def image_inputs(self, refs: list[str], roots=()) -> dict:
        """Image references (data URLs, local files under `roots`, default the working directory)
        -> pixel_values, image_grid_thw."""
        from pathlib import Path

        from vf.models.image_processor import pixel_inputs, processor_for

        roots = roots or (Path.cwd(),)
        if self.processor is None:
            self.processor = processor_for(self)
        p = self.embed_tokens.weight
        return pixel_inputs(self.processor, refs, roots, device=p.device, dtype=p.dtype)

    @property
    def image_token_id(self) -> int:
        return int(self.config.image_token_id)

    def image_tokens(self, grid) -> int:
        """Image-pad tokens one image of patch grid (t, h, w) takes in the prompt."""
        return merged_tokens(grid, self.merge)

    def rope_delta(self, input_ids: list[int], grids) -> int:
        """Offset of the positions after a prompt: largest position + 1 - prompt length."""
        types = [int(t == self.image_token_id) for t in input_ids]
        pos = rope_index(types, iter(grids), self.merge)
        return int(pos.max()) + 1 - len(input_ids) if pos.numel() else 0

    def positions(self, input_ids, position_ids, cache, image_grid_thw, mm_token_type_ids):
        """(text positions [B,T] | None, the triples [3,B,T]); see the module doc."""
        if position_ids is not None and position_ids.ndim == 3:
            return (position_ids[0], position_ids[1:]) if position_ids.shape[0] == 4 else (None, position_ids)
        text, _ = positions_and_mask(input_ids, position_ids, cache)
        if image_grid_thw is None:
            return position_ids, text.expand(3, *text.shape)
        types = (input_ids == self.image_token_id).long() if mm_token_type_ids is None else mm_token_type_ids
        grids = iter(image_grid_thw.tolist())
        triples = text.expand(3, *text.shape).clone()
        spans = Documents(text).spans if cache is None else [[(0, input_ids.shape[1])]] * input_ids.shape[0]
        for b, row in enumerate(spans):
            for s, e in row:
                doc = types[b, s:e].tolist()
                if any(doc):
                    triples[:, b, s:e] = rope_index(doc, grids, self.merge).to(triples.device) + text[b, s]
        return position_ids, triples

    def forward(self, input_ids, position_ids=None, cache=None, *, pixel_values=None, image_grid_thw=None,
                mm_token_type_ids=None, **_unused):
        T = input_ids.shape[1]
        text_pos, triples = self.positions(input_ids, position_ids, cache, image_grid_thw, mm_token_type_ids)
        text_pos, mask = positions_and_mask(input_ids, text_pos, cache)
        if pixel_values is not None or image_grid_thw is not None:  # M-RoPE and image spans need whole rows
            refuse_context_parallel(mask, "image inputs of vision-language")
        x = self.embed_tokens(input_ids)
        image_mask, deepstack = None, []
        if pixel_values is not None:
            embeds, deepstack = self.visual(pixel_values, image_grid_thw)
            image_mask = input_ids == self.image_token_id
            n = int(image_mask.sum())
            if n != embeds.shape[0]:
                raise ValueError(f"the prompt holds {n} image tokens and the images give {embeds.shape[0]}")
            x = x.masked_scatter(image_mask[..., None], embeds.to(x.dtype))
        cos, sin = self.rotary(triples, x.dtype)
        checkpointing = self.activation_checkpointing and cache is None and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            if checkpointing:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(layer, x, cos, sin, mask, None, text_pos, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask, cache, text_pos)
            if i < len(deepstack):  # DeepStack: the tower's i-th side output joins the image tokens
                x = x.masked_scatter(image_mask[..., None], x[image_mask] + deepstack[i].to(x.dtype))
        if cache is not None and hasattr(cache, "advance"):
            cache.advance(T)
        return self.norm(x)

    def compute_logits(self, input_ids, position_ids=None, cache=None, **mm):
        return self.forward(input_ids, position_ids, cache, **mm) @ self.lm_head_weight.t()  # [B, T, V]
