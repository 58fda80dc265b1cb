"""Kimi K2.5 (`model_type: kimi_k25`): the DeepSeek-V3 decoder of `transformer.NativeModel` (MLA,
MoE) with the MoonViT tower and projector (models/moonvit.py); each image's projected tokens replace
its placeholder tokens (`<|media_pad|>`, `image_token_id`). Positions are plain 1-D text positions
(no M-RoPE: an image's tokens count as text tokens, so `rope_delta` is always 0). Declarations
(keys, weights, checks) are models/families/kimi_k25.py; the image preprocessing is
models/kimi_image_processor.py.

Shape legend: B rows, T tokens per row, H hidden, n images, N patches, p patch side.

    forward(input_ids [B,T], position_ids=None, cache=None, *, pixel_values [N,3,p,p]=None,
            image_grid_thw [n,3]=None) -> hidden [B,T,H]
    compute_logits(same) -> [B,T,V]      (the keyword arguments of transformers' model)

As transformers does, placeholder (image and video) tokens embed as token 0 before the image
embeddings are scattered in, so a prompt whose placeholders get no pixels still matches it.
Images are consumed in token order across rows (row-major); packed documents need nothing more
than the text model's document masking, since positions carry no image geometry.
"""

from __future__ import annotations

from pathlib import Path

import torch
from vf.models.config import ModelConfig
from vf.models.families import kimi_k25 as KIMI
from vf.models.layers import positions_and_mask, refuse_context_parallel
from vf.models.moonvit import MoonViT, Projector
from vf.models.transformer import NativeModel


class KimiK25Model(NativeModel):
    is_multimodal = True
    processor = None  # the model directory's image processor (set by load_model), else `default_processor()`

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.vision_tower = MoonViT(config.vision)
        kh, kw = self.vision_tower.kernel
        width, eps = KIMI.projection(config.vl_extra, config.vision)
        self.mm_projector = Projector(width, kh * kw, config.hidden_size, eps)
        self.video_token_id = config.vl_extra.get("video_token_id", KIMI.HF_KEYS["video_token_id"])
        self.merge = kh

    def default_processor(self):
        """transformers' Kimi_K25ImageProcessor defaults with this tower's patch size and merge kernel."""
        from vf.models.kimi_image_processor import KimiImageProcessor

        return KimiImageProcessor.from_config({**KIMI.PROCESSOR_DEFAULTS, "patch_size": self.vision_tower.settings["patch_size"],
                                               "merge_size": self.merge})

    def image_inputs(self, refs: list[str], roots=()) -> dict:
        """Image references (data URLs, local files under `roots`, default the working directory)
        -> pixel_values [N, 3, p, p], image_grid_thw [n, 3]."""
        from vf.models.image_processor import pixel_inputs

        if self.processor is None:
            self.processor = self.default_processor()
        p = self.embed_tokens.weight
        return pixel_inputs(self.processor, refs, roots or (Path.cwd(),), device=p.device, dtype=p.dtype)

    @property
    def image_token_id(self) -> int:
        return int(self.config.image_token_id)

    def image_tokens(self, grid) -> int:
        """Placeholder tokens one image of patch grid (t, h, w) takes: its merged blocks (frames pool)."""
        kh, kw = self.vision_tower.kernel
        return int(grid[1]) * int(grid[2]) // (kh * kw)

    def rope_delta(self, input_ids: list[int], grids) -> int:
        return 0  # 1-D positions: image tokens advance them like text

    def image_embeds(self, pixel_values, image_grid_thw) -> torch.Tensor:  # -> [n_tokens, H]
        return self.mm_projector(self.vision_tower(pixel_values, image_grid_thw))

    def forward(self, input_ids, position_ids=None, cache=None, *, pixel_values=None, image_grid_thw=None, **_unused):
        T = input_ids.shape[1]
        position_ids, mask = positions_and_mask(input_ids, position_ids, cache)
        image_mask = input_ids == self.image_token_id
        x = self.embed_tokens(input_ids.masked_fill(image_mask | (input_ids == self.video_token_id), 0))
        if pixel_values is not None:
            refuse_context_parallel(mask, "image inputs of vision-language")  # images must not be split
            embeds = self.image_embeds(pixel_values, image_grid_thw)
            n = int(image_mask.sum())
            if n != embeds.shape[0]:
                raise ValueError(f"the prompt holds {n} image tokens and the images give {embeds.shape[0]}")
            x = x.masked_scatter(image_mask[..., None], embeds.to(x.dtype))
        cos, sin = self.rotary(position_ids, x.dtype)
        x = self.run_layers(x, cos, sin, mask, cache=cache, position_ids=position_ids)
        if cache is not None and hasattr(cache, "advance"):
            cache.advance(T)
        return self.norm(x)

    def compute_logits(self, input_ids, position_ids=None, cache=None, **mm):
        return self.forward(input_ids, position_ids, cache, **mm) @ self.lm_head_weight.t()  # [B, T, V]
