"""Native model config: one small dataclass for Qwen3, Qwen3-MoE and Llama, mapped to/from HF config.json.

No torch import here. Shape legend used across models/:
  B batch, T tokens per row, H hidden_size, V vocab_size, L num_layers,
  nh num_heads, nkv num_kv_heads, hd head_dim, I intermediate_size,
  E num_experts, k num_experts_per_tok, Im moe_intermediate_size, N = B*T flattened tokens.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from vf.models.errors import ModelLoadError

# model_type -> HF architectures entry
ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "llama": "LlamaForCausalLM",
}
SUPPORTED_ROPE_TYPES = ("default", "llama3")

# HF keys this module owns; everything else in an HF config.json is carried through untouched.
_OWNED_HF_KEYS = {
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "tie_word_embeddings",
    "max_position_embeddings",
    "attention_bias",
    "mlp_bias",
    "hidden_act",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "dtype",
    "torch_dtype",
}


@dataclass
class ModelConfig:
    architecture: str  # HF model_type: "qwen3" | "qwen3_moe" | "llama"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None or {"rope_type": "llama3", "factor", "low_freq_factor", ...}
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    mlp_bias: bool = False  # Llama only
    # MoE (qwen3_moe); num_experts == 0 means dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    moe_impl: str = "grouped"  # default per-layer MoE compute: "grouped" | "loop"
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    torch_dtype: str | None = None  # dtype recorded in config.json, informational
    hf_extra: dict = field(default_factory=dict, repr=False)  # untouched HF keys, written back by to_hf_dict

    @property
    def qk_norm(self) -> bool:
        return self.architecture in ("qwen3", "qwen3_moe")

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (
            self.num_experts > 0
            and layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> ModelConfig:
        arch = d.get("model_type")
        if arch not in ARCHITECTURES:
            archs = d.get("architectures")
            raise ModelLoadError(
                f"{source}: unsupported architecture model_type={arch!r} (architectures={archs})",
                hint=f"supported model_type values: {', '.join(ARCHITECTURES)} "
                f"({', '.join(ARCHITECTURES.values())})",
            )
        try:
            hidden, nh = int(d["hidden_size"]), int(d["num_attention_heads"])
            act = d.get("hidden_act", "silu")
            if act != "silu":
                raise ModelLoadError(f"{source}: hidden_act={act!r} is not supported (only 'silu')")
            if d.get("use_sliding_window"):
                raise ModelLoadError(
                    f"{source}: use_sliding_window=true is not supported by the native models"
                )
            theta, scaling = _rope_from_hf(d, source)
            is_moe = arch == "qwen3_moe"
            return cls(
                architecture=arch,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                num_layers=int(d["num_hidden_layers"]),
                num_heads=nh,
                num_kv_heads=int(d.get("num_key_value_heads") or nh),
                head_dim=int(d.get("head_dim") or hidden // nh),
                intermediate_size=int(d.get("intermediate_size") or 0),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=scaling,
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
                attention_bias=bool(d.get("attention_bias", False)),
                mlp_bias=bool(d.get("mlp_bias", False)),
                num_experts=int(d.get("num_local_experts", d.get("num_experts", 0)) or 0) if is_moe else 0,
                num_experts_per_tok=int(d.get("num_experts_per_tok", 0) or 0) if is_moe else 0,
                moe_intermediate_size=int(d.get("moe_intermediate_size", 0) or 0) if is_moe else 0,
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                decoder_sparse_step=int(d.get("decoder_sparse_step", 1) or 1),
                mlp_only_layers=list(d.get("mlp_only_layers") or []),
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=d.get("eos_token_id"),
                pad_token_id=d.get("pad_token_id"),
                torch_dtype=d.get("dtype", d.get("torch_dtype")),
                hf_extra={k: copy.deepcopy(v) for k, v in d.items() if k not in _OWNED_HF_KEYS},
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: required key {e.args[0]!r} is missing") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """HF config.json dict (transformers 5 layout: `rope_parameters`; also `rope_theta` for 4.x readers)."""
        d: dict[str, Any] = copy.deepcopy(self.hf_extra)
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            rope = {**self.rope_scaling, "rope_theta": self.rope_theta}
        d.update(
            architectures=[ARCHITECTURES[self.architecture]],
            model_type=self.architecture,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=rope,
            rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            attention_bias=self.attention_bias,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
        )
        if self.architecture == "llama":
            d["mlp_bias"] = self.mlp_bias
        if self.architecture == "qwen3_moe":
            d.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        if self.torch_dtype:
            d["dtype"] = self.torch_dtype
        return dict(sorted(d.items()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rope_from_hf(d: dict, source: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either transformers-5 `rope_parameters` or 4.x `rope_theta`/`rope_scaling`."""
    params = d.get("rope_parameters") or {}
    legacy = d.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    scaling = {k: v for k, v in {**legacy, **params}.items() if k != "rope_theta"}
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    scaling.pop("type", None)
    rope_type = scaling.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: rope_type={rope_type!r} is not supported", hint=f"supported: {SUPPORTED_ROPE_TYPES}"
        )
    if rope_type == "default":
        return theta, None
    need = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in need if k not in scaling]
    if missing:
        raise ModelLoadError(f"{source}: llama3 rope scaling lacks {missing}")
    return theta, scaling
