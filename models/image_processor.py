"""Images for Qwen-VL models, offline, with Pillow and numpy only (no torchvision).

    ImageProcessor.from_dir(model_dir)          # preprocessor_config.json (or processor_config.json)
    processor(images: list[PIL.Image]) -> {"pixel_values": float32 [N, D], "image_grid_thw": int64 [n, 3]}
    processor.grid(width, height) -> (1, h, w)  # patch grid of an image of that size, no pixels read
    load_image(ref, roots=(), max_bytes=...) -> PIL.Image (RGB)   # a data URL or a local file

What transformers' `Qwen2VLImageProcessorPil` (the processor Qwen2-VL, Qwen2.5-VL, Qwen3-VL and
Qwen3.5 ship) does, step for step, so pixel values match it: convert to RGB; resize with PIL
bicubic to the `smart_resize` size (each side a multiple of patch_size*merge_size, the area
within [shortest_edge, longest_edge] pixels, the aspect kept as well as that allows); scale by
1/255 (in float64, then float32); normalise by mean/std; cut into patch_size² patches, each
repeated temporal_patch_size times (a still image is a one-frame clip), ordered in
merge_size×merge_size blocks. D = 3 * temporal_patch_size * patch_size².

Only data URLs and local files are read, never the network: a local file must lie under one of
`roots` (the embedded engine's `image_roots`, by default its working directory); anything else,
and a corrupt or oversized image, is a `BadImage` error (HTTP 400 from vf-serve; in vf-eval one
episode fails and the run goes on).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from vf.models.errors import read_json_object, under_root
from vf.models.families import image_processors, resolve

from vf.errors import EngineError

MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 64 * 1024 * 1024  # decoded size limit (Pillow's decompression-bomb guard)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' `smart_resize`: (height, width) multiples of `factor`, area in [min, max]."""
    if max(height, width) / min(height, width) > 200:
        raise BadImage(f"image aspect ratio {max(height, width) / min(height, width):.0f}:1 is over 200:1")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def BadImage(message: str, hint: str | None = None) -> EngineError:
    return EngineError(message + (f"; {hint}" if hint else ""), type="BadImage", status_code=400)


@dataclass
class ImageProcessor:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, ...] = (0.48145466, 0.4578275, 0.40821073)  # OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = (0.26862954, 0.26130258, 0.27577711)
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL bicubic
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True

    @classmethod
    def from_config(cls, d: dict) -> ImageProcessor:
        own = family_processor(d) if cls is ImageProcessor else None
        if own is not None:  # a family's own preprocessing (`VisionLanguage.processor`)
            return own.from_config(d)
        size = d.get("size") or {}
        kw = {k: d[k] for k in ("patch_size", "temporal_patch_size", "merge_size", "rescale_factor", "resample",
                                "do_resize", "do_rescale", "do_normalize") if d.get(k) is not None}
        kw["min_pixels"] = int(d.get("min_pixels") or size.get("shortest_edge") or cls.min_pixels)
        kw["max_pixels"] = int(d.get("max_pixels") or size.get("longest_edge") or cls.max_pixels)
        for k in ("image_mean", "image_std"):
            if d.get(k) is not None:
                v = d[k]
                kw[k] = tuple(float(x) for x in (v if isinstance(v, (list, tuple)) else [v] * 3))
        return cls(**kw)

    @classmethod
    def from_dir(cls, path: str | os.PathLike, root: Path | None = None) -> ImageProcessor | None:
        """The processor a model directory ships, or None when it has none. With `root` (the
        weights root), its config file must resolve under it."""
        path = Path(path)
        if (path / "preprocessor_config.json").is_file():
            return cls.from_config(read_json_object(under_root(path / "preprocessor_config.json", root)))
        if (path / "processor_config.json").is_file():
            d = read_json_object(under_root(path / "processor_config.json", root))
            if isinstance(d.get("image_processor"), dict):
                return cls.from_config(d["image_processor"])
        return None

    def to_config(self) -> dict:
        return {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": self.patch_size,
                "temporal_patch_size": self.temporal_patch_size, "merge_size": self.merge_size,
                "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
                "image_mean": list(self.image_mean), "image_std": list(self.image_std),
                "rescale_factor": self.rescale_factor, "resample": self.resample, "do_resize": self.do_resize,
                "do_rescale": self.do_rescale, "do_normalize": self.do_normalize, "do_convert_rgb": True}

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(height, width) after resizing."""
        if not self.do_resize:
            return height, width
        return smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)

    def grid(self, width: int, height: int) -> tuple[int, int, int]:
        h, w = self.resized(width, height)
        return 1, h // self.patch_size, w // self.patch_size

    def __call__(self, images: list) -> dict[str, np.ndarray]:
        patches, grids = [], []
        for image in images:
            p, grid = self.patchify(self.pixels(image))
            patches.append(p)
            grids.append(grid)
        D = 3 * self.temporal_patch_size * self.patch_size**2
        return {"pixel_values": np.concatenate(patches) if patches else np.zeros((0, D), np.float32),
                "image_grid_thw": np.array(grids, dtype=np.int64).reshape(-1, 3)}

    def canvas(self, image) -> np.ndarray:
        """RGB image -> resized uint8 [3, h, w] (a family's processor may pad it, see `pixels`)."""
        image = image.convert("RGB")
        h, w = self.resized(*image.size)
        if (w, h) != image.size:
            image = image.resize((w, h), resample=self.resample)
        return np.asarray(image).transpose(2, 0, 1)

    def pixels(self, image) -> np.ndarray:
        """RGB image -> resized (`canvas`), rescaled, normalised float32 [3, h, w]."""
        x = self.canvas(image)
        if self.do_rescale:
            x = (x.astype(np.float64) * self.rescale_factor).astype(np.float32)
        x = x.astype(np.float32)
        if self.do_normalize:
            mean = np.asarray(self.image_mean, dtype=np.float32)[:, None, None]
            std = np.asarray(self.image_std, dtype=np.float32)[:, None, None]
            x = (x - mean) / std
        return x

    def patchify(self, x: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        """[3, h, w] -> patches [gh*gw, D] in merge-block order, grid (1, gh, gw)."""
        p, m, tp = self.patch_size, self.merge_size, self.temporal_patch_size
        c, h, w = x.shape
        gh, gw = h // p, w // p
        x = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # gh', gw', m, m, c, p, p
        x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], tp, p, p))
        return np.ascontiguousarray(x.reshape(gh * gw, c * tp * p * p), dtype=np.float32), (1, gh, gw)


def load_image(ref: str, roots: tuple[Path, ...] | list[Path] = (), max_bytes: int = MAX_IMAGE_BYTES):
    """Decode an image reference: a `data:image/...;base64,` URL, or a local path (`file://` or
    plain) under one of `roots`. Raises `BadImage` for anything else, an unreadable, corrupt or
    oversized image, and never opens a network connection."""
    from PIL import Image

    if not isinstance(ref, str) or not ref:
        raise BadImage("an image part needs a non-empty url")
    if ref.startswith("data:"):
        head, _, data = ref.partition(",")
        if ";base64" not in head:
            raise BadImage("only base64 data URLs are read (data:image/png;base64,...)")
        if len(data) * 3 // 4 > max_bytes:
            raise BadImage(f"the image is over {max_bytes // (1024 * 1024)} MiB")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise BadImage("the image data URL is not valid base64") from None
    elif "://" in ref and not ref.startswith("file://"):
        raise BadImage(f"image URL {ref[:60]!r} is not read: nothing is fetched from the network, only data URLs "
                       "and local files under the allowed folders are read",
                       hint="inline the image as a data URL, e.g. with vf.utils.image.image_data_url")
    else:
        path = Path(ref.removeprefix("file://")).expanduser()
        resolved = path.resolve()
        allowed = [Path(r).resolve() for r in roots]
        if not any(resolved.is_relative_to(r) for r in allowed):
            raise BadImage(f"image file {ref!r} is outside the folders images may be read from "
                           f"({', '.join(str(r) for r in allowed) or 'none'})",
                           hint="put it under one of them (the engine's working directory by default), or inline it as a data URL")
        try:
            if resolved.stat().st_size > max_bytes:
                raise BadImage(f"image file {ref!r} is over {max_bytes // (1024 * 1024)} MiB")
            raw = resolved.read_bytes()
        except OSError as e:
            raise BadImage(f"image file {ref!r} cannot be read: {e.strerror or e}") from None
    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    try:
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise BadImage(f"the image cannot be decoded: {e}") from None
    return image.convert("RGB")


def family_processor(d: dict):
    """The processor class a family declares (`VisionLanguage.processor`) that reads this
    preprocessor config (its `handles(d)`), else None (Qwen-VL's, this module's)."""
    for path in image_processors():
        cls = resolve(path)
        if cls.handles(d):
            return cls
    return None


def processor_for(model, path: str | os.PathLike | None = None, root: Path | None = None) -> ImageProcessor:
    """The image processor of a VL model: its directory's config (under `root`, when given), else
    one matching its vision tower."""
    found = ImageProcessor.from_dir(path, root) if path is not None else None
    if found is not None:
        return found
    if hasattr(model, "default_processor"):  # a model with its own preprocessing
        return model.default_processor()
    c = model.visual.settings
    return ImageProcessor(patch_size=c["patch_size"], temporal_patch_size=c["temporal_patch_size"],
                          merge_size=c["spatial_merge_size"])


def pixel_inputs(processor: ImageProcessor, refs: list[str], roots=(), device="cpu", dtype=None) -> dict:
    """Image references -> {"pixel_values": [N, D], "image_grid_thw": [n, 3]} tensors for the model."""
    import torch

    out = processor([load_image(r, roots) for r in refs])
    return {"pixel_values": torch.from_numpy(out["pixel_values"]).to(device=device, dtype=dtype or torch.float32),
            "image_grid_thw": torch.from_numpy(out["image_grid_thw"]).to(device)}
