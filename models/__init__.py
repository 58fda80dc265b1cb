"""Native models: one spec file per family in models/families/ (Qwen3, Qwen3-MoE, Llama, GLM-4.5, GLM-5,
DeepSeek-V3/V4, GPT-OSS, the hybrids Qwen3-Next, Qwen3.5 and Nemotron-H, Qwen3.8 Flash Next, and the
Qwen-VL checkpoints), the shared decoder and mechanisms they compose, HF checkpoint loading/saving and
the built-in tiny models.

Importing `vf.models` does not import torch; the names below load their module on first use.
  load_model(path, dtype=torch.float32, device="cpu") -> NativeModel
  save_hf(model, path, max_shard_size=None) -> Path
  build_model(config, dtype=torch.float32, device="cpu", seed=None) -> NativeModel
  read_config(path) -> ModelConfig;  ModelConfig;  NativeModel;  SimpleKVCache;  ModelLoadError
  vf.models.tiny.ensure_tiny_model(path=None) -> Path
"""

from vf.models.config import ModelConfig
from vf.models.errors import ModelLoadError

_LAZY = {
    "load_model": "vf.models.checkpoint",
    "save_hf": "vf.models.checkpoint",
    "read_config": "vf.models.checkpoint",
    "build_model": "vf.models.transformer",
    "NativeModel": "vf.models.transformer",
    "SimpleKVCache": "vf.models.cache",
}

__all__ = [
    "ModelConfig",
    "ModelLoadError",
    "NativeModel",
    "SimpleKVCache",
    "build_model",
    "load_model",
    "read_config",
    "save_hf",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vf.models' has no attribute {name!r}")
