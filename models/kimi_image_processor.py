"""Kimi K2.5's image preprocessing (transformers' Kimi_K25ImageProcessor; the family's
`VisionLanguage.processor`): NaViT-style shrink and pad to whole merge blocks, raster-ordered
patches. numpy and Pillow, no torch.

    KimiImageProcessor.from_config(d)    transformers' keys, or Moonshot's `media_proc_cfg`
    processor(images) -> {"pixel_values": [N, 3, p, p], "image_grid_thw": [n, 3]}
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from vf.models.errors import ModelLoadError


def navit_resize(height: int, width: int, patch: int, merge: int, max_patches: int, max_side: int):
    """((resized h, w), (padded h, w)): shrink (never enlarge) to at most `max_patches` patches and
    `max_side` patches a side, then pad each side up to a multiple of patch*merge (transformers')."""
    scale = min(1.0, math.sqrt(max_patches / (max(1.0, height // patch) * max(1.0, width // patch))),
                max_side * patch / height, max_side * patch / width)
    h, w = min(max(1, int(height * scale)), max_side * patch), min(max(1, int(width * scale)), max_side * patch)
    f = merge * patch
    return (h, w), ((f - h % f) % f + h, (f - w % f) % f + w)


@dataclass
class KimiImageProcessor:
    """Convert to RGB; shrink (PIL bicubic) by `navit_resize` and zero-pad right/bottom to whole
    merge blocks; scale and normalise fused as transformers' torchvision backend does ((x - 255·mean)
    / (255·std) in float32); cut into raster-ordered patches [N, 3, p, p], grid (1, h/p, w/p).
    Images that need no shrinking match transformers exactly. The shrink is Pillow's bicubic where
    transformers uses torchvision's antialiased bicubic on uint8: the same sizes, but pixel values are
    not guaranteed bit-equal (not checked here: transformers' Kimi processor needs torchvision)."""

    TYPE = "Kimi_K25ImageProcessor"
    patch_size: int = 14
    merge_size: int = 2
    max_patches: int = 16384
    max_side: int = 512
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 3
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    temporal_patch_size = 1  # for readers of Qwen's processor attributes (vLLM's ImageSpec)

    @classmethod
    def handles(cls, d: dict) -> bool:
        """A preprocessor config of this processor (transformers' type, or Moonshot's own file)."""
        return d.get("image_processor_type") == cls.TYPE or "media_proc_cfg" in d

    @classmethod
    def from_config(cls, d: dict) -> KimiImageProcessor:
        """transformers' keys, or Moonshot's `media_proc_cfg` (what the released checkpoints ship)."""
        if isinstance(d.get("media_proc_cfg"), dict):
            m = d["media_proc_cfg"]
            if m.get("fixed_output_tokens") is not None:
                raise ModelLoadError("Kimi media_proc_cfg.fixed_output_tokens is not supported (images resized to "
                                     "a fixed token count)", hint="remove it from preprocessor_config.json")
            d = {"patch_size": m.get("patch_size"), "merge_size": m.get("merge_kernel_size"), "max_patches": m.get("in_patch_limit"),
                 "size": {"max_height": m.get("patch_limit_on_one_side")}, "image_mean": m.get("image_mean"),
                 "image_std": m.get("image_std")}
        kw = {k: d[k] for k in ("patch_size", "merge_size", "max_patches", "rescale_factor", "resample", "do_resize",
                                "do_rescale", "do_normalize") if d.get(k) is not None}
        if (d.get("size") or {}).get("max_height") is not None:
            kw["max_side"] = int(d["size"]["max_height"])
        for k in ("image_mean", "image_std"):
            if d.get(k) is not None:
                v = d[k]
                kw[k] = tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else [v] * 3))
        return cls(**kw)

    def to_config(self) -> dict:
        return {"image_processor_type": self.TYPE, "patch_size": self.patch_size, "merge_size": self.merge_size,
                "max_patches": self.max_patches, "size": {"max_height": self.max_side, "max_width": self.max_side},
                "image_mean": list(self.image_mean), "image_std": list(self.image_std),
                "rescale_factor": self.rescale_factor, "resample": self.resample, "do_resize": self.do_resize,
                "do_rescale": self.do_rescale, "do_normalize": self.do_normalize, "do_convert_rgb": True}

    def sizes(self, width: int, height: int):
        if not self.do_resize:
            return (height, width), (height, width)
        return navit_resize(height, width, self.patch_size, self.merge_size, self.max_patches, self.max_side)

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        _, (h, w) = self.sizes(width, height)
        return 1, h // self.patch_size, w // self.patch_size

    def __call__(self, images: list) -> dict[str, np.ndarray]:
        p = self.patch_size
        patches, grids = [], []
        for image in images:
            image = image.convert("RGB")
            (h, w), (ph, pw) = self.sizes(*image.size)
            if (w, h) != image.size:
                image = image.resize((w, h), resample=self.resample)
            x = np.zeros((3, ph, pw), dtype=np.float32)
            x[:, :h, :w] = np.asarray(image).transpose(2, 0, 1)
            if self.do_rescale and self.do_normalize:
                scale = np.float32(1.0 / self.rescale_factor)
                x = (x - np.asarray(self.image_mean, np.float32)[:, None, None] * scale) / (
                    np.asarray(self.image_std, np.float32)[:, None, None] * scale)
            elif self.do_rescale:
                x = x * np.float32(self.rescale_factor)
            elif self.do_normalize:
                x = (x - np.asarray(self.image_mean, np.float32)[:, None, None]) / np.asarray(self.image_std, np.float32)[:, None, None]
            gh, gw = ph // p, pw // p
            patches.append(x.reshape(3, gh, p, gw, p).transpose(1, 3, 0, 2, 4).reshape(gh * gw, 3, p, p))
            grids.append((1, gh, gw))
        return {"pixel_values": np.ascontiguousarray(np.concatenate(patches) if patches else np.zeros((0, 3, p, p)), dtype=np.float32),
                "image_grid_thw": np.array(grids, dtype=np.int64).reshape(-1, 3)}
