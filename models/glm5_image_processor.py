"""GLM-5.3's image preprocessing (transformers' Glm5NextImageProcessor / Glm5NextImageProcessorPil; the
`glm5_next` family's `VisionLanguage.processor`): Qwen2-VL's pipeline (models/image_processor.py:
RGB, PIL bicubic, rescale, normalise, merge-block patches repeated `temporal_patch_size` times) with
GLM's own sizing, a token budget instead of a pixel range:

    canvas = glm_smart_resize(...)   each side a multiple of f = patch·merge·patch_expand_factor, the
                                     largest canvas of at most `max_image_tokens` tokens (h·w/f²) whose
                                     content keeps the aspect, at least `min_image_tokens`
    content = the image scaled by min(canvas_h/h, canvas_w/w) (never enlarged unless the image is
              under `min_image_tokens`), floored; it is drawn top-left and the rest of the canvas is
              zero pixels (black, normalised like any pixel), as transformers pads before rescaling.

The pixels equal transformers' PIL backend exactly (tests/test_models_glm5_next.py). Its
torchvision backend sizes alike (the same function; with patch_expand_factor in f, which the PIL
backend leaves out: the two differ only when that factor is not 1, and this follows torchvision).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from vf.models.errors import ModelLoadError
from vf.models.image_processor import ImageProcessor

CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def glm_smart_resize(height: int, width: int, factor: int, temporal: int, min_tokens: int, max_tokens: int):
    """transformers' glm5_next `smart_resize` for one still image (num_frames = temporal): the
    (height, width) canvas, multiples of `factor`. Its budget counts temporal·h·w pixels against
    tokens·temporal·factor², i.e. h·w/factor² tokens."""
    per_token = temporal * factor**2
    min_pixels, max_pixels = min_tokens * per_token, max_tokens * per_token

    def align(v):
        return math.ceil(v / factor) * factor

    frames = temporal  # transformers' aligned frame count for num_frames = temporal
    h, w = align(height), align(width)
    if frames * h * w < min_pixels:
        scale = math.sqrt(min_pixels / (temporal * height * width))
        h, w = align(max(1, math.ceil(height * scale))), align(max(1, math.ceil(width * scale)))
    if frames * h * w > max_pixels:  # the tallest content whose aligned canvas fits (binary search)
        low, high = 1, height
        h = w = factor
        while low <= high:
            ch = (low + high) // 2
            cand_h, cand_w = align(ch), align(max(1, math.floor(width * ch / height)))
            if frames * cand_h * cand_w <= max_pixels:
                h, w, low = cand_h, cand_w, ch + 1
            else:
                high = ch - 1
    return h, w


@dataclass
class Glm5ImageProcessor(ImageProcessor):
    TYPES = ("Glm5NextImageProcessor", "Glm5NextImageProcessorPil")
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    min_image_tokens: int = 16
    max_image_tokens: int = 8000
    patch_expand_factor: int = 1

    @classmethod
    def handles(cls, d: dict) -> bool:
        return d.get("image_processor_type") in cls.TYPES

    @classmethod
    def from_config(cls, d: dict) -> Glm5ImageProcessor:
        """transformers' keys; the shared ones read as Qwen's (`size` is a placeholder in GLM's
        config, {"longest_edge": 1}: the token budget replaces it)."""
        shared = ImageProcessor.from_config.__func__(cls, {k: v for k, v in d.items() if k != "size"})
        own = {k: int(d[k]) for k in ("min_image_tokens", "max_image_tokens", "patch_expand_factor")
               if d.get(k) is not None}
        out = dataclasses.replace(shared, **own)
        if out.max_image_tokens < 1 or out.min_image_tokens < 0 or out.patch_expand_factor < 1:
            raise ModelLoadError(f"GLM image processor: max_image_tokens ({out.max_image_tokens}) and "
                                 f"patch_expand_factor ({out.patch_expand_factor}) must be at least 1, "
                                 f"min_image_tokens ({out.min_image_tokens}) at least 0")
        return out

    def to_config(self) -> dict:
        return {"image_processor_type": self.TYPES[0], "patch_size": self.patch_size,
                "temporal_patch_size": self.temporal_patch_size, "merge_size": self.merge_size,
                "min_image_tokens": self.min_image_tokens, "max_image_tokens": self.max_image_tokens,
                "patch_expand_factor": self.patch_expand_factor, "size": {"longest_edge": 1},
                "image_mean": list(self.image_mean), "image_std": list(self.image_std),
                "rescale_factor": self.rescale_factor, "resample": self.resample, "do_resize": self.do_resize,
                "do_rescale": self.do_rescale, "do_normalize": self.do_normalize, "do_convert_rgb": True}

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) of the padded canvas."""
        if not self.do_resize:
            return height, width
        f = self.patch_size * self.merge_size * self.patch_expand_factor
        return glm_smart_resize(height, width, f, self.temporal_patch_size, self.min_image_tokens, self.max_image_tokens)

    def content(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) the image is resized to inside its canvas."""
        th, tw = self.resized(width, height)
        f = self.patch_size * self.merge_size * self.patch_expand_factor
        scale = min(th / height, tw / width)
        if self.temporal_patch_size * height * width >= self.temporal_patch_size * f * f * self.min_image_tokens:
            scale = min(1.0, scale)  # enlarged only when under the token floor
        return max(1, min(th, math.floor(height * scale))), max(1, min(tw, math.floor(width * scale)))

    def canvas(self, image) -> np.ndarray:
        image = image.convert("RGB")
        if not self.do_resize:
            return np.asarray(image).transpose(2, 0, 1)
        (th, tw), (h, w) = self.resized(*image.size), self.content(*image.size)
        if (w, h) != image.size:
            image = image.resize((w, h), resample=self.resample)
        return np.pad(np.asarray(image).transpose(2, 0, 1), ((0, 0), (0, th - h), (0, tw - w)))
