"""GLM-5.3 (`glm5_next`, transformers' Glm5NextForConditionalGeneration): KDA linear-attention layers
(models/kda.py), NoPE MLA attention with the k-pool DSA indexer, hyper-connection streams, SwiGLU-limit
MoE after dense layers, and a vision tower (models/glm5_next.py); GLM's image preprocessing is
models/glm5_image_processor.py (`processor`, found by preprocessor_config.json's image_processor_type).

config.json nests the text model under `text_config` (model_type glm5_next_text) beside a
`vision_config` and the image/video token ids at the top; the native config is the text model's,
flat, with `architecture` "glm5_next". There is no rope anywhere in the text model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vf.models.errors import ModelLoadError
from vf.models.families._spec import Family, VisionLanguage
from vf.models.families.glm_moe_dsa import check as check_dsa_schedule

MODEL_TYPE, TEXT_TYPE, ARCHITECTURE = "glm5_next", "glm5_next_text", "Glm5NextForConditionalGeneration"

HF_KEYS: dict[str, tuple[str, Any]] = {  # defaults: transformers' Glm5NextTextConfig
    "n_routed_experts": ("num_experts", 288),
    "num_experts_per_tok": ("num_experts_per_tok", 8),
    "moe_intermediate_size": ("moe_intermediate_size", 2048),
    "n_shared_experts": ("n_shared_experts", 1),
    "routed_scaling_factor": ("routed_scaling_factor", 2.5),
    "n_group": ("n_group", 1),
    "topk_group": ("topk_group", 1),
    "norm_topk_prob": ("norm_topk_prob", True),
    "swiglu_limit": ("swiglu_limit", 10.0),
    "mlp_layer_types": ("mlp_layer_types", None),
    "layer_types": ("layer_types", None),
    "q_lora_rank": ("q_lora_rank", 1536),
    "kv_lora_rank": ("kv_lora_rank", 512),
    "qk_rope_head_dim": ("qk_rope_head_dim", 0),
    "qk_nope_head_dim": ("qk_nope_head_dim", 256),
    "v_head_dim": ("v_head_dim", 256),
    "index_topk": ("index_topk", 2048),
    "index_head_dim": ("index_head_dim", 128),
    "index_n_heads": ("index_n_heads", 32),
    "indexer_types": ("indexer_types", None),
    "index_kpool": ("index_kpool", 16),
    "index_kpool_always_select_tail": ("index_kpool_always_select_tail", True),
    "linear_head_dim": ("linear_key_head_dim", 128),
    "linear_num_heads": ("linear_num_key_heads", 64),
    "linear_conv_kernel_dim": ("linear_conv_kernel", 4),
    "linear_lower_bound": ("linear_lower_bound", -5.0),
    "hc_mult": ("hc_mult", 4),
    "hc_sinkhorn_iters": ("hc_sinkhorn_iters", 20),
    "hc_eps": ("hc_eps", 1e-6),
}
FIXED: dict[str, Any] = {"router_scoring": "sigmoid", "expert_bias": True, "expert_act": "swiglu_limit"}


@dataclass
class Glm5NextSection:
    indexer_types: list[str] | None = None  # per layer "full" | "shared" (the DSA schedule)
    linear_lower_bound: float | None = -5.0  # KDA forget gate: lower_bound·sigmoid(..) (None: -exp(A_log)·softplus(..))
    index_kpool: int = 16  # tokens pooled into one index candidate
    index_kpool_always_select_tail: bool = True  # the query's incomplete pool is always attended
# top-level config.json keys (beside text_config / vision_config), and what transformers defaults them to
TOP_DEFAULTS = {"image_token_id": 154854, "video_token_id": 154855, "image_start_token_id": 154830,
                "image_end_token_id": 154831, "video_start_token_id": 154832, "video_end_token_id": 154833}
LAYER_KINDS = ("linear_attention", "indexed_attention")
VISION_DEFAULTS = {"depth": 24, "hidden_size": 1024, "num_heads": 16, "in_channels": 3, "patch_size": 14,
                   "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 1536, "intermediate_size": 4096,
                   "projection_intermediate_size": 10240, "attention_bias": True, "rms_norm_eps": 1e-5,
                   "swiglu_limit": 10.0}  # transformers' Glm5NextVisionConfig, for keys a vision_config leaves out


def read_top(d: dict[str, Any]) -> dict[str, Any]:
    """config.json's top level with transformers' default image_token_id when it leaves it out."""
    return d if d.get("image_token_id") is not None else {**d, "image_token_id": TOP_DEFAULTS["image_token_id"]}


def read(fields: dict, d: dict[str, Any], source: str) -> None:
    """A flat config.json is the text model's; flat text keys beside a vision_config (which
    transformers also reads) are refused: where their weights live is not settled."""
    if "vision_config" in d:
        raise ModelLoadError(f"{source}: a glm5_next config.json without a text_config object is not supported natively",
                             hint="--model.impl hf runs it through transformers")


def check(cfg, d: dict[str, Any], source: str) -> None:
    """Derive the schedules and legacy keys as Glm5NextTextConfig does; refuse what the native model
    does not run (as transformers' validate_architecture, plus native limits)."""
    check_dsa_schedule(cfg, d, source)
    n = cfg.num_layers
    if "linear_lower_bound" in d and d["linear_lower_bound"] is None:  # explicit null: the softplus decay
        cfg.linear_lower_bound = None
    legacy = d.get("linear_attn_config")
    if isinstance(legacy, dict):
        cfg.linear_key_head_dim = legacy.get("head_dim", cfg.linear_key_head_dim)
        cfg.linear_num_key_heads = legacy.get("num_heads", cfg.linear_num_key_heads)
        cfg.linear_conv_kernel = legacy.get("short_conv_kernel_size", cfg.linear_conv_kernel)
        cfg.linear_lower_bound = legacy.get("gate_lower_bound", cfg.linear_lower_bound)
        if legacy.get("safe_gate", True) and cfg.linear_lower_bound is None:
            cfg.linear_lower_bound = -5.0
    cfg.linear_value_head_dim, cfg.linear_num_value_heads = cfg.linear_key_head_dim, cfg.linear_num_key_heads
    if cfg.mlp_layer_types is None:
        cfg.mlp_layer_types = ["dense"] * min(3, n) + ["sparse"] * max(n - 3, 0)
    if cfg.layer_types is None:
        cfg.layer_types = ["linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(n)]
    # transformers 5.17 (the GPU image's) spells the indexed layer "deepseek_sparse_attention"
    cfg.layer_types = ["indexed_attention" if t in ("full_attention", "deepseek_sparse_attention") else t
                       for t in cfg.layer_types]
    for key, allowed in (("layer_types", LAYER_KINDS), ("mlp_layer_types", ("dense", "sparse"))):
        bad = sorted(set(getattr(cfg, key)) - set(allowed))
        if len(getattr(cfg, key)) != n or bad:
            raise ModelLoadError(f"{source}: {key} must give one of {list(allowed)} for each of {n} layers "
                                 f"(got {bad or len(getattr(cfg, key))})")
    if cfg.num_kv_heads != cfg.num_heads:
        raise ModelLoadError(f"{source}: num_key_value_heads ({cfg.num_kv_heads}) must equal num_attention_heads "
                             f"({cfg.num_heads})")
    if cfg.qk_rope_head_dim:
        raise ModelLoadError(f"{source}: glm5_next attention has no rope (NoPE), got qk_rope_head_dim="
                             f"{cfg.qk_rope_head_dim}")
    if cfg.rope_scaling:
        raise ModelLoadError(f"{source}: glm5_next has no rope; rope scaling {cfg.rope_scaling} is not supported")
    kp = cfg.index_kpool
    if not isinstance(kp, int) or kp < 1 or cfg.index_topk % kp:
        raise ModelLoadError(f"{source}: index_topk ({cfg.index_topk}) must be a positive multiple of index_kpool ({kp})")
    if not cfg.index_kpool_always_select_tail:  # early queries would attend to no key (transformers then
        # spreads them over every key, future ones included)
        raise ModelLoadError(f"{source}: index_kpool_always_select_tail=false is not supported natively")
    for i, (kind, mode) in enumerate(zip(cfg.layer_types, cfg.indexer_types)):
        if kind == "indexed_attention" and mode == "shared" and (
                i == 0 or cfg.layer_types[i - 1] != "indexed_attention" or cfg.indexer_types[i - 1] != "full"):
            # transformers hands a layer's selection only to the layer right after it
            raise ModelLoadError(f"{source}: layer {i} reuses ('shared') an indexer, but layer {i - 1} is not a "
                                 "full indexed_attention layer")
    if cfg.hc_mult < 1 or cfg.hc_sinkhorn_iters < 1:
        raise ModelLoadError(f"{source}: glm5_next needs hc_mult >= 1 and hc_sinkhorn_iters >= 1")
    if min(cfg.linear_key_head_dim, cfg.linear_num_key_heads, cfg.linear_conv_kernel) < 1:
        raise ModelLoadError(f"{source}: linear attention sizes must be positive")


def write(cfg, d: dict[str, Any]) -> None:
    """The text config transformers writes: no rope keys, head_dim 0 (its absent rope dim)."""
    for k in ("rope_parameters", "rope_theta"):
        d.pop(k, None)
    d["head_dim"] = 0


L, A = "model.layers.{i}.", "model.layers.{i}.self_attn."
WEIGHTS: dict[str, tuple[str, list[str]]] = {
    # hyper-connections (transformers saves DeepSeek's hc_* names)
    **{f"layers.{{i}}.{ours}_hc.{p}": ("rename", [L + f"hc_{theirs}_{p}"])
       for ours, theirs in (("attn", "attn"), ("mlp", "ffn")) for p in ("fn", "base", "scale")},
    # KDA linear attention (models/kda.py); transformers saves the conv per q / k / v
    **{f"layers.{{i}}.attn.{p}": ("rename", [A + p]) for p in (
        "q_proj.weight", "k_proj.weight", "v_proj.weight", "b_proj.weight", "f_a_proj.weight", "f_b_proj.weight",
        "dt_bias", "A_log", "g_a_proj.weight", "g_b_proj.weight", "o_norm.weight")},
    "layers.{i}.attn.conv_weight": ("concat", [A + f"{p}_conv1d.weight" for p in "qkv"]),
    # MLA (models/mla.py; no q_lora-less variant: q_lora_rank is required) and the k-pool indexer
    "layers.{i}.attn.qkv_a_proj.weight": ("concat", [A + "q_a_proj.weight", A + "kv_a_proj_with_mqa.weight"]),
    "layers.{i}.attn.qkv_a_proj.bias": ("concat", [A + "q_a_proj.bias", A + "kv_a_proj_with_mqa.bias"]),
    "layers.{i}.attn.q_a_norm.weight": ("rename", [A + "q_a_layernorm.weight"]),
    "layers.{i}.attn.q_b_proj.weight": ("rename", [A + "q_b_proj.weight"]),
    "layers.{i}.attn.kv_a_norm.weight": ("rename", [A + "kv_a_layernorm.weight"]),
    "layers.{i}.attn.kv_b_proj.weight": ("rename", [A + "kv_b_proj.weight"]),
    **{f"layers.{{i}}.attn.indexer.{p}": ("rename", [A + f"indexer.{p}"]) for p in (
        "wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight",
        "index_kpool_compress_ape", "index_kpool_compress_gate")},
    # MoE (DeepSeek-style names, per-expert tensors on disk)
    "layers.{i}.mlp.router.expert_bias": ("rename", [L + "mlp.gate.e_score_correction_bias"]),
    "layers.{i}.mlp.shared.gate_up_proj.weight": (
        "concat", [L + "mlp.shared_experts.gate_proj.weight", L + "mlp.shared_experts.up_proj.weight"]),
    "layers.{i}.mlp.shared.down_proj.weight": ("rename", [L + "mlp.shared_experts.down_proj.weight"]),
}

_LAYERS = "vf.models.glm5_next:"
FAMILIES = (
    Family(model_type=MODEL_TYPE, hf_class=ARCHITECTURE, section=Glm5NextSection, hf_keys=HF_KEYS, fixed=FIXED,
           read=read, check=check, write=write, weights=WEIGHTS, mtp="appended", ignore_hf=r"\.shared_head\.",
           layer=_LAYERS + "Glm5NextLayer", model=_LAYERS + "Glm5NextModel"),
    VisionLanguage(model_type=MODEL_TYPE, hf_class=ARCHITECTURE, text=MODEL_TYPE, text_config_type=TEXT_TYPE,
                   mrope_section=None, deepstack=False, model=_LAYERS + "Glm5NextModel", read=read_top,
                   processor="vf.models.glm5_image_processor:Glm5ImageProcessor"),
)
