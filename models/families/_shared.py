"""What several family specs share: HF config keys and weight rows of shared mechanisms (DeepSeek-style
MoE, gated DeltaNet, multi-head latent attention), the layer-pattern check of the hybrids, and the
rope reader. Torch-free."""

from __future__ import annotations

from typing import Any

from vf.models.errors import ModelLoadError
from vf.models.families._spec import REQUIRED

SUPPORTED_ROPE_TYPES = ("default", "llama3", "yarn")
L = "model.layers.{i}."  # HF prefix of decoder layer i
A = L + "self_attn."
LA = L + "linear_attn."

# ---- HF config keys -> (ModelConfig field, default) ------------------------------------------
# DeepSeek-style MoE (sigmoid router, expert bias, group-limited top-k, shared experts)
DEEPSEEK_MOE_KEYS = {
    "n_routed_experts": ("num_experts", REQUIRED),
    "num_experts_per_tok": ("num_experts_per_tok", REQUIRED),
    "moe_intermediate_size": ("moe_intermediate_size", REQUIRED),
    "norm_topk_prob": ("norm_topk_prob", True),
    "n_shared_experts": ("n_shared_experts", 1),
    "routed_scaling_factor": ("routed_scaling_factor", 1.0),
    "n_group": ("n_group", 1),
    "topk_group": ("topk_group", 1),
    "first_k_dense_replace": ("first_k_dense_replace", 1),
}
# Qwen3-MoE-style MoE (softmax router; sparse every decoder_sparse_step-th layer)
QWEN_MOE_KEYS = {
    "num_experts": ("num_experts", REQUIRED),
    "num_experts_per_tok": ("num_experts_per_tok", REQUIRED),
    "moe_intermediate_size": ("moe_intermediate_size", REQUIRED),
    "norm_topk_prob": ("norm_topk_prob", False),
    "decoder_sparse_step": ("decoder_sparse_step", 1),
    "mlp_only_layers": ("mlp_only_layers", []),
}
# gated DeltaNet layers; defaults: transformers' Qwen3NextConfig / Qwen3_5TextConfig
DELTANET_KEYS = {
    "layer_types": ("layer_types", None),
    "linear_conv_kernel_dim": ("linear_conv_kernel", 4),
    "linear_key_head_dim": ("linear_key_head_dim", 128),
    "linear_value_head_dim": ("linear_value_head_dim", 128),
    "linear_num_key_heads": ("linear_num_key_heads", 16),
    "linear_num_value_heads": ("linear_num_value_heads", 32),
}
# the Qwen "Next" line's MoE: a shared expert of its own width
QWEN_NEXT_MOE_KEYS = {
    "num_experts": ("num_experts", REQUIRED),
    "num_experts_per_tok": ("num_experts_per_tok", REQUIRED),
    "moe_intermediate_size": ("moe_intermediate_size", REQUIRED),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size", REQUIRED),
}

# ---- weight rows (models/convert.py's ops) -------------------------------------------------------
MLA_ROWS = {  # multi-head latent attention (models/mla.py)
    "layers.{i}.attn.qkv_a_proj.weight": ("concat", [A + "q_a_proj.weight", A + "kv_a_proj_with_mqa.weight"]),
    "layers.{i}.attn.qkv_a_proj.bias": ("concat", [A + "q_a_proj.bias", A + "kv_a_proj_with_mqa.bias"]),
    "layers.{i}.attn.q_a_norm.weight": ("rename", [A + "q_a_layernorm.weight"]),
    "layers.{i}.attn.q_b_proj.weight": ("rename", [A + "q_b_proj.weight"]),
    "layers.{i}.attn.q_proj.weight": ("rename", [A + "q_proj.weight"]),
    "layers.{i}.attn.kv_a_proj.weight": ("rename", [A + "kv_a_proj_with_mqa.weight"]),
    "layers.{i}.attn.kv_a_proj.bias": ("rename", [A + "kv_a_proj_with_mqa.bias"]),
    "layers.{i}.attn.kv_a_norm.weight": ("rename", [A + "kv_a_layernorm.weight"]),
    "layers.{i}.attn.kv_b_proj.weight": ("rename", [A + "kv_b_proj.weight"]),
}
DEEPSEEK_MOE_ROWS = {  # GLM-4.5, GLM-5 and DeepSeek-V3 share transformers' module names
    "layers.{i}.mlp.router.expert_bias": ("rename", [L + "mlp.gate.e_score_correction_bias"]),
    "layers.{i}.mlp.shared.gate_up_proj.weight": (
        "concat", [L + "mlp.shared_experts.gate_proj.weight", L + "mlp.shared_experts.up_proj.weight"]),
    "layers.{i}.mlp.shared.down_proj.weight": ("rename", [L + "mlp.shared_experts.down_proj.weight"]),
}
DELTANET_ROWS = {  # gated DeltaNet layers (models/deltanet.py) and the gated shared expert around them
    "layers.{i}.attn.conv_weight": ("rename", [LA + "conv1d.weight"]),
    **{f"layers.{{i}}.attn.{p}": ("rename", [LA + p]) for p in ("dt_bias", "A_log", "norm.weight", "out_proj.weight")},
    "layers.{i}.mlp.shared.gate_up_proj.weight": (
        "concat", [L + "mlp.shared_expert.gate_proj.weight", L + "mlp.shared_expert.up_proj.weight"]),
    "layers.{i}.mlp.shared.down_proj.weight": ("rename", [L + "mlp.shared_expert.down_proj.weight"]),
    "layers.{i}.mlp.shared_gate.weight": ("rename", [L + "mlp.shared_expert_gate.weight"]),
}
DELTANET = "vf.models.deltanet:GatedDeltaNet"


def check_layer_pattern(cfg, d: dict, source: str, allowed: set[str]) -> None:
    """A hybrid's `layer_types`: derived as transformers does when config.json lacks it (every
    `full_attention_interval`-th layer full attention), one allowed kind per layer."""
    if cfg.layer_types is None:
        every = int(d.get("full_attention_interval", 4))
        cfg.layer_types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(cfg.num_layers)]
    if len(cfg.layer_types) != cfg.num_layers or set(cfg.layer_types) - allowed:
        raise ModelLoadError(f"{source}: layer types must give one of {sorted(allowed)} for each of {cfg.num_layers} layers")


def check_deltanet(cfg, d: dict, source: str) -> None:
    """The gated-DeltaNet hybrids (Qwen3-Next, Qwen3.5): layer pattern and head grouping."""
    check_layer_pattern(cfg, d, source, {"linear_attention", "full_attention"})
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ModelLoadError(f"{source}: linear_num_key_heads must divide linear_num_value_heads")


def rope_from_hf(d: dict, source: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either transformers-5 `rope_parameters` or 4.x `rope_theta`/`rope_scaling`."""
    params = d.get("rope_parameters") or {}
    legacy = d.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    scaling: dict[str, Any] = {k: v for k, v in {**legacy, **params}.items() if k != "rope_theta"}
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    scaling.pop("type", None)
    scaling.pop("partial_rotary_factor", None)  # a ModelConfig field of its own
    rope_type = scaling.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"{source}: rope_type={rope_type!r} is not supported", hint=f"supported: {SUPPORTED_ROPE_TYPES}"
        )
    if rope_type == "default":
        return theta, None
    if rope_type == "yarn":
        missing = [k for k in ("factor", "original_max_position_embeddings") if scaling.get(k) is None]
        if missing:
            raise ModelLoadError(f"{source}: yarn rope scaling lacks {missing}")
        return theta, scaling
    need = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in need if k not in scaling]
    if missing:
        raise ModelLoadError(f"{source}: llama3 rope scaling lacks {missing}")
    return theta, scaling
