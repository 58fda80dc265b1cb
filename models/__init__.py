"""Native models (Qwen3, Qwen3-MoE, Llama, GLM-4.5 `glm4_moe`, DeepSeek-V3 `deepseek_v3`, DeepSeek-V4 `deepseek_v4`,
GPT-OSS `gpt_oss`, GLM-5 `glm_moe_dsa`,
and the hybrids Qwen3-Next `qwen3_next`, Qwen3.5 text `qwen3_5_text` / `qwen3_5_moe_text` (gated DeltaNet) and
Nemotron-H `nemotron_h` (Mamba-2), and Qwen3.8 Flash Next `qwen4_exp_text` / `qwen4_exp` (gated DeltaNet,
QSA indexed attention, gated residual streams, per-layer n-gram embeddings: models/qwen4_exp.py)):
HF checkpoint loading/saving and a built-in tiny model.

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
