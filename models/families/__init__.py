"""The family registry: one spec module per model family in this package (see docs/architecture.md).

A spec module (`qwen3_next.py`, `deepseek_v4.py`, ...) is torch-free and exports `FAMILIES`, a
tuple of `Family` (a text model_type) and `VisionLanguage` (a checkpoint nesting one) entries.
Shared code asks this registry (`family`, `vision_language`, `native_model_types`, `hf_keys_read`)
and never names a family. Modules are found by listing the package, so adding a family is adding
its file; names starting with "_" hold what specs share.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from vf.models.families._spec import REQUIRED, Family, VisionLanguage

__all__ = [
    "GENERIC",
    "REQUIRED",
    "Family",
    "VisionLanguage",
    "family",
    "hf_keys_read",
    "image_processors",
    "native_model_types",
    "resolve",
    "vision_language",
]

# what a config of a model_type with no native family (the transformers fallback) behaves as
GENERIC = Family(model_type="", hf_class="")


@cache
def _registry() -> tuple[dict[str, Family], dict[str, VisionLanguage]]:
    families: dict[str, Family] = {}
    vls: dict[str, VisionLanguage] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for spec in module.FAMILIES:
            table = vls if isinstance(spec, VisionLanguage) else families
            if spec.model_type in table:  # a VL checkpoint may share its text family's name (qwen3_vl)
                raise RuntimeError(f"model_type {spec.model_type!r} is declared twice (models/families/{info.name}.py)")
            table[spec.model_type] = spec
    for vl in vls.values():
        if vl.text not in families:
            raise RuntimeError(f"{vl.model_type} nests text family {vl.text!r}, which no spec declares")
    return families, vls


def family(model_type: str) -> Family:
    """The Family of a native text model_type, else `GENERIC` (a fallback model's config)."""
    return _registry()[0].get(model_type, GENERIC)


def vision_language(model_type: str | None) -> VisionLanguage | None:
    return _registry()[1].get(model_type) if model_type else None


def native_model_types() -> dict[str, str]:
    """model_type -> HF architectures entry, for every checkpoint the native models load."""
    families, vls = _registry()
    return {**{t: f.hf_class for t, f in families.items()}, **{t: v.hf_class for t, v in vls.items()}}


@cache
def hf_keys_read() -> frozenset[str]:
    """Every HF config key some family reads (never carried through a config as an unknown key)."""
    keys: set[str] = set()
    for f in _registry()[0].values():
        keys |= set(f.hf_keys) | set(f.aliases.values()) | set(f.extra_hf_keys)
    return frozenset(keys)


def image_processors() -> tuple[str, ...]:
    """The image processor classes VL families declare (`VisionLanguage.processor`)."""
    return tuple(sorted({v.processor for v in _registry()[1].values() if v.processor}))


def resolve(path: str):
    """The object a "module:Name" path names (model code, imported when a model is built)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
