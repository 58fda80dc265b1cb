"""Native model config: one small dataclass for every family, mapped to/from HF config.json.

Families (HF `model_type`): qwen3, qwen3_moe, llama, glm4_moe (GLM-4.5/4.6/Air), deepseek_v3
(multi-head latent attention), gpt_oss, glm_moe_dsa (GLM-5: MLA + DSA indexed sparse attention),
deepseek_v4 (compressed/sparse attention, hyper-connections, hash routing: models/deepseek_v4.py);
hybrids: qwen3_next, qwen3_5_text, qwen3_5_moe_text (gated DeltaNet + gated attention: what
transformers' Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM save) and nemotron_h (Mamba-2, attention, MLP
and MoE layers by pattern; Super's latent MoE with `moe_latent_size`); qwen4_exp_text (Qwen3.8 Flash
Next, models/qwen4_exp.py); vision-language (config.json nests the text model, `_vl_from_hf`):
qwen3_vl and qwen3_vl_moe (Qwen3 / Qwen3-MoE decoders with M-RoPE and DeepStack), qwen3_5 and
qwen3_5_moe (wrapping qwen3_5_text / qwen3_5_moe_text), qwen4_exp (wrapping qwen4_exp_text).
Family-specific HF keys are read and written through `FAMILY_KEYS` (HF key -> field, default when
the key is absent); behaviour that is fixed per family (router scoring, expert biases, attention
sinks) is set by `_FAMILY_FIXED`.

No torch import here. Shape legend used across models/:
  B batch, T tokens per row, H hidden_size, V vocab_size, L num_layers,
  nh num_heads, nkv num_kv_heads, hd head_dim, I intermediate_size,
  E num_experts, k num_experts_per_tok, Im moe_intermediate_size, N = B*T flattened tokens.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any

from vf.models import kimi_k25_spec as KIMI  # kimi_k25 (registry)
from vf.models.errors import ModelLoadError

# model_type -> HF architectures entry
ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "llama": "LlamaForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "deepseek_v4": "DeepseekV4ForCausalLM",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",  # config.json nests a qwen3_5_text model (VL_ARCHITECTURES)
    "qwen3_vl_moe": "Qwen3VLMoeForConditionalGeneration",  # Qwen3-VL with Qwen3-MoE's sparse MLPs
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",  # nests a qwen3_5_moe_text model
    # linear-attention / SSM hybrids (models/hybrid.py)
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "qwen4_exp_text": "Qwen4ExpForCausalLM",  # Qwen3.8 Flash Next's text model (models/qwen4_exp.py)
    "qwen4_exp": "Qwen4ExpForConditionalGeneration",  # nests a qwen4_exp_text model (text prompts only)
    KIMI.MODEL_TYPE: KIMI.ARCHITECTURE,  # kimi_k25 (registry)
}
# gated DeltaNet + gated full attention, zero-centred (1 + w) RMSNorm (the Qwen "Next" line)
DELTANET_FAMILIES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
HYBRID_FAMILIES = (*DELTANET_FAMILIES, "nemotron_h")
SUPPORTED_ROPE_TYPES = ("default", "llama3", "yarn")
MOE_IMPLS = ("grouped", "loop")
# DeepSeek-V4 attention layer kinds and their transformers defaults (compress rate per kind)
DSV4_SLIDING, DSV4_CSA, DSV4_HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
DSV4_DEFAULT_RATES = {DSV4_CSA: 4, DSV4_HCA: 128}
_DSV4_SCORING = {"sqrtsoftplus": "sqrt_softplus", "softmax": "softmax", "sigmoid": "sigmoid"}  # HF -> native
_REQUIRED = object()  # FAMILY_KEYS default: the key must be present

_MOE_SHARED = {  # DeepSeek-style MoE (sigmoid router, expert bias, group-limited top-k, shared experts)
    "n_routed_experts": ("num_experts", _REQUIRED),
    "num_experts_per_tok": ("num_experts_per_tok", _REQUIRED),
    "moe_intermediate_size": ("moe_intermediate_size", _REQUIRED),
    "norm_topk_prob": ("norm_topk_prob", True),
    "n_shared_experts": ("n_shared_experts", 1),
    "routed_scaling_factor": ("routed_scaling_factor", 1.0),
    "n_group": ("n_group", 1),
    "topk_group": ("topk_group", 1),
    "first_k_dense_replace": ("first_k_dense_replace", 1),
}
# model_type -> {HF key: (ModelConfig field, default when absent)}
FAMILY_KEYS: dict[str, dict[str, tuple[str, Any]]] = {
    "qwen3_moe": {
        "num_experts": ("num_experts", _REQUIRED),
        "num_experts_per_tok": ("num_experts_per_tok", _REQUIRED),
        "moe_intermediate_size": ("moe_intermediate_size", _REQUIRED),
        "norm_topk_prob": ("norm_topk_prob", False),
        "decoder_sparse_step": ("decoder_sparse_step", 1),
        "mlp_only_layers": ("mlp_only_layers", []),
    },
    # Qwen3-VL-MoE's text model: Qwen3-MoE's keys; its router always renormalises the top-k weights
    # (`_FAMILY_FIXED`, whatever the file says), and norm_topk_prob is written for readers that take it
    # from config.json (vLLM; transformers accepts it)
    "qwen3_vl_moe": {
        "num_experts": ("num_experts", _REQUIRED),
        "num_experts_per_tok": ("num_experts_per_tok", _REQUIRED),
        "moe_intermediate_size": ("moe_intermediate_size", _REQUIRED),
        "norm_topk_prob": ("norm_topk_prob", True),
        "decoder_sparse_step": ("decoder_sparse_step", 1),
        "mlp_only_layers": ("mlp_only_layers", []),
    },
    "llama": {"mlp_bias": ("mlp_bias", False)},
    "glm4_moe": {**_MOE_SHARED, "use_qk_norm": ("use_qk_norm", False)},
    "deepseek_v3": {
        **_MOE_SHARED,
        "q_lora_rank": ("q_lora_rank", None),
        "kv_lora_rank": ("kv_lora_rank", _REQUIRED),
        "qk_rope_head_dim": ("qk_rope_head_dim", _REQUIRED),
        "qk_nope_head_dim": ("qk_nope_head_dim", _REQUIRED),
        "v_head_dim": ("v_head_dim", _REQUIRED),
        "rope_interleave": ("rope_interleave", True),
    },
    "glm_moe_dsa": {  # defaults: transformers' GlmMoeDsaConfig
        **_MOE_SHARED,
        "norm_topk_prob": ("norm_topk_prob", True),
        "routed_scaling_factor": ("routed_scaling_factor", 2.5),
        "first_k_dense_replace": ("first_k_dense_replace", 3),
        "mlp_layer_types": ("mlp_layer_types", None),
        "q_lora_rank": ("q_lora_rank", 2048),
        "kv_lora_rank": ("kv_lora_rank", 512),
        "qk_rope_head_dim": ("qk_rope_head_dim", 64),
        "qk_nope_head_dim": ("qk_nope_head_dim", 192),
        "v_head_dim": ("v_head_dim", 256),
        "index_topk": ("index_topk", 2048),
        "index_head_dim": ("index_head_dim", 128),
        "index_n_heads": ("index_n_heads", 32),
        "indexer_types": ("indexer_types", None),
    },
    "deepseek_v4": {  # defaults: transformers' DeepseekV4Config
        "n_routed_experts": ("num_experts", 256),
        "num_experts_per_tok": ("num_experts_per_tok", 6),
        "moe_intermediate_size": ("moe_intermediate_size", 2048),
        "n_shared_experts": ("n_shared_experts", 1),
        "routed_scaling_factor": ("routed_scaling_factor", 1.5),
        "scoring_func": ("router_scoring", "sqrtsoftplus"),  # spelled "sqrtsoftplus" in HF (`_check_dsv4`)
        "norm_topk_prob": ("norm_topk_prob", True),
        "swiglu_limit": ("swiglu_limit", 10.0),
        "q_lora_rank": ("q_lora_rank", 1024),
        "o_groups": ("o_groups", 8),
        "o_lora_rank": ("o_lora_rank", 1024),
        "layer_types": ("layer_types", None),
        "mlp_layer_types": ("mlp_layer_types", None),
        "compress_rates": ("compress_rates", None),
        "compress_rope_theta": ("compress_rope_theta", 160000.0),
        "sliding_window": ("sliding_window", 128),
        "hc_mult": ("hc_mult", 4),
        "hc_sinkhorn_iters": ("hc_sinkhorn_iters", 20),
        "hc_eps": ("hc_eps", 1e-6),
        "index_n_heads": ("index_n_heads", 64),
        "index_head_dim": ("index_head_dim", 128),
        "index_topk": ("index_topk", 512),
    },
    "gpt_oss": {
        "num_local_experts": ("num_experts", _REQUIRED),
        "num_experts_per_tok": ("num_experts_per_tok", _REQUIRED),
        "sliding_window": ("sliding_window", None),
        "layer_types": ("layer_types", None),
        "swiglu_alpha": ("swiglu_alpha", 1.702),
        "swiglu_limit": ("swiglu_limit", 7.0),
    },
}
_DELTANET_KEYS = {  # defaults: transformers' Qwen3NextConfig / Qwen3_5TextConfig
    "layer_types": ("layer_types", None),
    "linear_conv_kernel_dim": ("linear_conv_kernel", 4),
    "linear_key_head_dim": ("linear_key_head_dim", 128),
    "linear_value_head_dim": ("linear_value_head_dim", 128),
    "linear_num_key_heads": ("linear_num_key_heads", 16),
    "linear_num_value_heads": ("linear_num_value_heads", 32),
}
_QWEN_NEXT_MOE = {
    "num_experts": ("num_experts", _REQUIRED),
    "num_experts_per_tok": ("num_experts_per_tok", _REQUIRED),
    "moe_intermediate_size": ("moe_intermediate_size", _REQUIRED),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size", _REQUIRED),
}
FAMILY_KEYS.update({
    "qwen3_next": {**_DELTANET_KEYS, **_QWEN_NEXT_MOE, "norm_topk_prob": ("norm_topk_prob", True),
                   "decoder_sparse_step": ("decoder_sparse_step", 1), "mlp_only_layers": ("mlp_only_layers", [])},
    "qwen3_5_text": dict(_DELTANET_KEYS),
    "qwen3_5_moe_text": {**_DELTANET_KEYS, **_QWEN_NEXT_MOE},
    "nemotron_h": {  # defaults: transformers' NemotronHConfig
        "layers_block_type": ("layer_types", None),
        "layer_norm_epsilon": ("rms_norm_eps", 1e-5),
        "mlp_hidden_act": ("mlp_act", "relu2"),
        "mlp_bias": ("mlp_bias", False),
        "ssm_state_size": ("ssm_state_size", 128),
        "mamba_num_heads": ("mamba_num_heads", 128),
        "mamba_head_dim": ("mamba_head_dim", 64),
        "n_groups": ("mamba_n_groups", 8),
        "conv_kernel": ("mamba_conv_kernel", 4),
        "use_conv_bias": ("mamba_conv_bias", True),
        "use_bias": ("mamba_proj_bias", False),
        "chunk_size": ("mamba_chunk_size", 128),
        "time_step_min": ("mamba_dt_min", 0.001),
        "n_routed_experts": ("num_experts", 8),
        "num_experts_per_tok": ("num_experts_per_tok", 2),
        "moe_intermediate_size": ("moe_intermediate_size", 7688),
        "moe_shared_expert_intermediate_size": ("shared_expert_intermediate_size", 7688),
        "n_group": ("n_group", 1),
        "topk_group": ("topk_group", 1),
        "norm_topk_prob": ("norm_topk_prob", True),
        "routed_scaling_factor": ("routed_scaling_factor", 1.0),
        "moe_latent_size": ("moe_latent_size", None),  # Nemotron-H Super: routed experts in a latent space
    },
})
# Qwen3.8 Flash Next (models/qwen4_exp.py); defaults: transformers' Qwen4ExpTextConfig
QWEN4_EXP = "qwen4_exp_text"
FAMILY_KEYS[QWEN4_EXP] = {
    **_DELTANET_KEYS, **_QWEN_NEXT_MOE, "norm_topk_prob": ("norm_topk_prob", True),
    "hc_count": ("hc_mult", 4), "hc_lowrank": ("hc_lowrank", 320),
    "ple_layer_ids": ("ple_layer_ids", []), "ple_embed_dim": ("ple_embed_dim", None),
    "ple_conv_kernel_size": ("ple_conv_kernel", 4), "ngram_size": ("ngram_size", 3),
    "heads_per_ngram": ("heads_per_ngram", 8), "ngram_vocab_size_base": ("ngram_vocab_size_base", 20_000_000),
    "make_ngram_vocab_size_divisible_by": ("ngram_divisible_by", 128), "seed": ("ngram_seed", 1234),
    "split_ngram_parts": ("split_ngram_parts", 512),
    "indexer_n_heads": ("index_n_heads", _REQUIRED), "indexer_kv_heads": ("indexer_kv_heads", 1),
    "indexer_head_dim": ("index_head_dim", _REQUIRED), "indexer_budget": ("indexer_budget", _REQUIRED),
    "indexer_compress_ratio": ("indexer_compress_ratio", _REQUIRED), "output_gate_type": ("output_gate_type", None),
}
# older/newer spellings of a FAMILY_KEYS key, read when the key itself is absent
_ALIASES = {"qwen3_moe": {"num_experts": "num_local_experts"},
            "qwen3_vl_moe": {"num_experts": "num_local_experts"},  # what transformers' save writes
            "nemotron_h": {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "chunk_size": "mamba_chunk_size",
                           "use_conv_bias": "mamba_conv_bias", "time_step_min": "mamba_dt_min"}}
_FAMILY_FIXED: dict[str, dict[str, Any]] = {
    "glm4_moe": {"router_scoring": "sigmoid", "expert_bias": True},
    "deepseek_v3": {"router_scoring": "sigmoid", "expert_bias": True},
    "glm_moe_dsa": {"router_scoring": "sigmoid", "expert_bias": True, "rope_interleave": True},
    # transformers' V4 routers always renormalise the top-k weights, whatever norm_topk_prob says
    "deepseek_v4": {"expert_bias": True, "norm_topk_prob": True, "expert_act": "swiglu_limit"},
    "gpt_oss": {"router_bias": True, "expert_bias_terms": True, "expert_act": "clamped_swiglu",
                "norm_topk_prob": True, "attention_sinks": True},
    "qwen3_vl": {"use_qk_norm": True},
    # transformers' Qwen3VLMoeTextTopKRouter renormalises the top-k softmax weights (no norm_topk_prob key)
    "qwen3_vl_moe": {"use_qk_norm": True, "norm_topk_prob": True},
    "qwen3_next": {"shared_expert_gate": True},
    "qwen3_5_moe_text": {"shared_expert_gate": True, "norm_topk_prob": True},
    QWEN4_EXP: {"shared_expert_gate": True},
    "nemotron_h": {"router_scoring": "sigmoid", "expert_bias": True, "expert_act": "relu2"},
}
_DEFAULT_PARTIAL_ROTARY = {"glm4_moe": 0.5, **{f: 0.25 for f in DELTANET_FAMILIES}}  # transformers' Glm4MoeConfig default

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
    "partial_rotary_factor",
    "quantization_config",
    "hybrid_override_pattern",
    "compress_ratios", "compress_rate_csa", "compress_rate_hca", "num_hash_layers",  # legacy DeepSeek-V4 keys
} | {k for a in _ALIASES.values() for k in a.values()} | {k for keys in FAMILY_KEYS.values() for k in keys}


@dataclass
class ModelConfig:
    architecture: str  # HF model_type, a key of ARCHITECTURES
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None or {"rope_type": "llama3" | "yarn", "factor", ...}
    partial_rotary_factor: float = 1.0  # rope on the first head_dim * factor dims (GLM-4.5: 0.5)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    mlp_bias: bool = False  # llama; nemotron_h (its MLPs, shared expert and latent MoE projections)
    use_qk_norm: bool = False  # glm4_moe (qwen3 families always have q/k norm)
    # MoE; num_experts == 0 means dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    first_k_dense_replace: int = 0  # glm4_moe / deepseek_v3: the first k layers are dense
    n_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    router_scoring: str = "softmax"  # "softmax" | "sigmoid" | "sqrt_softplus"
    router_bias: bool = False  # gpt_oss: router logits have a bias
    expert_bias: bool = False  # aux-loss-free selection bias (e_score_correction_bias)
    expert_bias_terms: bool = False  # gpt_oss: experts' gate_up/down have biases
    expert_act: str = "swiglu"  # "swiglu" | "clamped_swiglu" (gpt_oss) | "swiglu_limit" (deepseek_v4) | "relu2"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    moe_impl: str | list[str] = "grouped"  # MoE compute, one for all layers or one per decoder layer
    # multi-head latent attention (deepseek_v3)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    mlp_layer_types: list[str] | None = None  # glm_moe_dsa: per layer "dense" | "sparse"
    # DSA indexer (glm_moe_dsa)
    index_topk: int = 0
    index_head_dim: int = 0
    index_n_heads: int = 0
    indexer_types: list[str] | None = None  # per layer "full" | "shared" (reuses the previous full layer's top-k)
    # deepseek_v4 (models/deepseek_v4.py): layer_types per layer DSV4_SLIDING | DSV4_CSA | DSV4_HCA,
    # mlp_layer_types per layer "hash_moe" | "moe"; every attention also has the sliding window
    o_groups: int = 0  # grouped output projection: head groups g, each projected to o_lora_rank
    o_lora_rank: int = 0
    compress_rates: dict | None = None  # layer kind -> tokens pooled into one compressed entry
    compress_rope_theta: float = 160000.0  # rope of the compressed layers (and their compressors)
    compress_rope_scaling: dict | None = None  # None or yarn, as rope_scaling
    hc_mult: int = 0  # hyper-connection residual streams (0: a plain residual)
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    # gpt_oss attention
    attention_sinks: bool = False
    sliding_window: int | None = None
    layer_types: list[str] | None = None  # per layer "sliding_attention" | "full_attention"
    # hybrids (models/hybrid.py): layer_types per layer "linear_attention" | "full_attention", and for
    # nemotron_h also "moe" | "mlp" (one mixer per layer)
    shared_expert_intermediate_size: int = 0  # qwen3_next / nemotron_h shared expert width (else Im * n_shared)
    shared_expert_gate: bool = False  # qwen3_next: the shared expert's output times sigmoid(x·w)
    moe_latent_size: int | None = None  # nemotron_h (Super): routed experts run in this width (models/moe.py)
    linear_conv_kernel: int = 4  # gated DeltaNet (qwen3_next, qwen3_5)
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    mlp_act: str = "swiglu"  # nemotron_h: "relu2" (non-gated up/down MLP with squared ReLU)
    ssm_state_size: int = 0  # Mamba-2 (nemotron_h)
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_n_groups: int = 1
    mamba_conv_kernel: int = 4
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_chunk_size: int = 128
    mamba_dt_min: float = 0.0
    # qwen4_exp_text (models/qwen4_exp.py): gated-residual streams (hc_mult, hc_lowrank), the PLE layers'
    # hashed n-gram embeddings (models/ngram_embedding.py), QSA indexed attention (index_n_heads/head_dim)
    hc_lowrank: int = 0
    ple_layer_ids: list[int] = field(default_factory=list)  # one-indexed decoder layers with a PLE
    ple_embed_dim: int | None = None  # None: hidden_size
    ple_conv_kernel: int = 4
    ngram_size: int = 3
    heads_per_ngram: int = 8
    ngram_vocab_size_base: int = 20_000_000
    ngram_divisible_by: int = 128
    ngram_seed: int = 1234
    split_ngram_parts: int = 512  # row blocks of each n-gram table in the HF checkpoint
    indexer_kv_heads: int = 1
    indexer_budget: int = 0  # tokens selected from complete blocks per query
    indexer_compress_ratio: int = 0  # tokens pooled into one index block
    output_gate_type: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    torch_dtype: str | None = None  # dtype recorded in config.json, informational
    # vision-language models (see `_vl_from_hf`): the HF vision_config, multimodal rope, token ids
    vision: dict | None = None
    mrope_section: list[int] | None = None  # rope frequencies given to the (t, h, w) position axes
    image_token_id: int | None = None
    vl_architecture: str | None = None  # the VL model_type (a VL_ARCHITECTURES entry) when `architecture` names its text model
    vl_extra: dict = field(default_factory=dict, repr=False)  # other top-level keys of a VL config.json
    # qwen3_vl_moe: the checkpoint held its fused experts transposed (the released layout, which vLLM
    # reads), not as transformers' save_pretrained writes them; set on load, saving keeps the layout
    experts_transposed: bool = False
    released_names: bool = False  # kimi_k25 (registry): the checkpoint has Moonshot's names (KIMI.released), not transformers' save's
    hf_extra: dict = field(default_factory=dict, repr=False)  # untouched HF keys, written back by to_hf_dict

    @property
    def qk_norm(self) -> bool:
        return self.architecture in ("qwen3", "qwen3_moe", *DELTANET_FAMILIES, QWEN4_EXP) or self.use_qk_norm

    @property
    def hybrid(self) -> bool:
        """A linear-attention / SSM hybrid (models/hybrid.py builds its layers)."""
        return self.architecture in HYBRID_FAMILIES

    @property
    def zero_centered_norm(self) -> bool:
        """RMSNorms scale by (1 + w), w initialised to 0 (the Qwen "Next" line)."""
        return self.architecture in (*DELTANET_FAMILIES, QWEN4_EXP)

    @property
    def attn_output_gate(self) -> bool:
        """Full attention's q_proj also emits a per-head gate: out = o_proj(attn · sigmoid(gate))."""
        return self.architecture in (*DELTANET_FAMILIES, QWEN4_EXP)

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias and self.architecture != "glm4_moe"

    @property
    def mla(self) -> bool:
        return self.architecture in ("deepseek_v3", "glm_moe_dsa")

    @property
    def dsa(self) -> bool:
        return self.architecture == "glm_moe_dsa"

    @property
    def rotary_dim(self) -> int:
        """Dims of each head that rope rotates (the rest pass through)."""
        if self.mla:
            return self.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer_idx: int) -> bool:
        if self.num_experts <= 0:
            return False
        if self.architecture == "nemotron_h":
            return self.layer_types[layer_idx] == "moe"
        if self.architecture in ("qwen3_5_moe_text", "deepseek_v4", QWEN4_EXP):
            return True
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types[layer_idx] == "sparse"
        if self.architecture in ("glm4_moe", "deepseek_v3", "glm_moe_dsa"):
            return layer_idx >= self.first_k_dense_replace
        return layer_idx not in self.mlp_only_layers and (layer_idx + 1) % self.decoder_sparse_step == 0

    def sliding_window_for(self, layer_idx: int) -> int | None:
        """Keys a query sees in a sliding layer (itself included), None for full attention."""
        if not self.sliding_window or not self.layer_types:
            return None
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None

    def moe_impl_for(self, layer_idx: int) -> str:
        impl = self.moe_impl[layer_idx] if isinstance(self.moe_impl, list) else self.moe_impl
        if impl not in MOE_IMPLS:
            raise ModelLoadError(f"unknown MoE implementation {impl!r} (layer {layer_idx})",
                                 hint=f"choose one of {', '.join(MOE_IMPLS)}")
        return impl

    def set_moe_impl(self, impl: str | list[str]) -> None:
        """Validate and set `moe_impl` (a list names one impl per decoder layer)."""
        if isinstance(impl, (list, tuple)):
            if len(impl) != self.num_layers:
                raise ModelLoadError(f"moe impl list has {len(impl)} entries, the model has {self.num_layers} layers",
                                     hint="give one of grouped|loop per decoder layer (dense layers ignore theirs)")
            impl = list(impl)
        self.moe_impl = impl
        for i in range(self.num_layers if isinstance(impl, list) else 1):
            self.moe_impl_for(i)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> ModelConfig:
        arch = d.get("model_type")
        if arch in VL_ARCHITECTURES and isinstance(d.get("text_config"), dict):
            return _vl_from_hf(cls, d, source)
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
            if d.get("quantization_config"):
                method = (d["quantization_config"] or {}).get("quant_method")
                raise ModelLoadError(
                    f"{source}: quantized checkpoints (quant_method={method!r}) are not supported",
                    hint="use a bf16/fp32 checkpoint (dequantize it first)",
                )
            if d.get("use_sliding_window"):
                raise ModelLoadError(
                    f"{source}: use_sliding_window=true is not supported by the native models"
                )
            theta, scaling = _rope_from_hf(d, source)
            params = d.get("rope_parameters") or {}
            partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor"))
            family = {}
            for hf_key, (name, default) in FAMILY_KEYS.get(arch, {}).items():
                if d.get(hf_key) is None:
                    hf_key = _ALIASES.get(arch, {}).get(hf_key, hf_key)
                if d.get(hf_key) is not None:
                    family[name] = copy.deepcopy(d[hf_key])
                elif default is _REQUIRED:
                    raise KeyError(hf_key)
                elif default is not None:
                    family[name] = copy.deepcopy(default)
            family.update(_FAMILY_FIXED.get(arch, {}))
            if arch == "gpt_oss":  # gpt_oss's `intermediate_size` is the expert size
                family["moe_intermediate_size"] = int(d["intermediate_size"])
                if family.get("layer_types") is None:  # transformers' default: alternate sliding/full
                    n = int(d["num_hidden_layers"])
                    family["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
            if arch == "nemotron_h" and "layer_types" not in family:  # layer count and types from the pattern
                family["layer_types"] = _nemotron_layer_types(d, source)
            cfg = cls(
                architecture=arch,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                num_layers=len(family["layer_types"]) if arch == "nemotron_h" else int(d["num_hidden_layers"]),
                num_heads=nh,
                num_kv_heads=int(d.get("num_key_value_heads") or nh),
                head_dim=int(d.get("head_dim") or hidden // nh),
                intermediate_size=int(d.get("intermediate_size") or 0),
                rms_norm_eps=float(family.pop("rms_norm_eps", d.get("rms_norm_eps", 1e-6))),
                rope_theta=theta,
                rope_scaling=scaling,
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
                attention_bias=bool(d.get("attention_bias", False)),
                partial_rotary_factor=float(partial if partial is not None else _DEFAULT_PARTIAL_ROTARY.get(arch, 1.0)),
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=d.get("eos_token_id"),
                pad_token_id=d.get("pad_token_id"),
                torch_dtype=d.get("dtype", d.get("torch_dtype")),
                hf_extra={k: copy.deepcopy(v) for k, v in d.items() if k not in _OWNED_HF_KEYS},
                **family,
            )
            if arch == "deepseek_v4":
                _check_dsv4(cfg, d, source)
            if cfg.num_experts and cfg.n_group > 1 and cfg.num_experts % cfg.n_group:
                raise ModelLoadError(f"{source}: n_group={cfg.n_group} does not divide n_routed_experts={cfg.num_experts}")
            for key in ("layer_types", "mlp_layer_types", "indexer_types"):
                if getattr(cfg, key) is not None and len(getattr(cfg, key)) != cfg.num_layers:
                    raise ModelLoadError(f"{source}: {key} has {len(getattr(cfg, key))} entries for {cfg.num_layers} layers")
            if cfg.dsa:
                _check_dsa(cfg, d, source)
            if cfg.hybrid:
                _check_hybrid(cfg, d, source)
            if arch == QWEN4_EXP:
                _check_qwen4_exp(cfg, source)
            return cfg
        except KeyError as e:
            raise ModelLoadError(f"{source}: required key {e.args[0]!r} is missing") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """HF config.json dict (transformers 5 layout: `rope_parameters`; also `rope_theta` for 4.x readers)."""
        d: dict[str, Any] = copy.deepcopy(self.hf_extra)
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            rope = {**self.rope_scaling, "rope_theta": self.rope_theta}
        if self.partial_rotary_factor != 1.0 or self.architecture in _DEFAULT_PARTIAL_ROTARY:
            rope["partial_rotary_factor"] = self.partial_rotary_factor
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
        for hf_key, (name, _default) in FAMILY_KEYS.get(self.architecture, {}).items():
            d[hf_key] = copy.deepcopy(getattr(self, name))
        if self.architecture == "gpt_oss":
            d["intermediate_size"] = self.moe_intermediate_size
        if self.architecture == "nemotron_h":  # no rope, no hidden_act / rms_norm_eps / layer count keys
            for k in ("rope_parameters", "rope_theta", "hidden_act", "rms_norm_eps", "num_hidden_layers"):
                d.pop(k, None)
        if self.architecture == "deepseek_v4":
            _dsv4_to_hf(self, d)
        if self.torch_dtype:
            d["dtype"] = self.torch_dtype
        if self.vision is not None:
            return _vl_to_hf(self, d)
        return dict(sorted(d.items()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- vision-language families: config.json nests the text model under text_config ----------------
VL_ARCHITECTURES = ("qwen3_vl", "qwen3_5", "qwen3_vl_moe", "qwen3_5_moe", "qwen4_exp", KIMI.MODEL_TYPE)  # kimi_k25 (registry)
_VL_TEXT_TYPE = {"qwen3_vl": "qwen3_vl_text", "qwen3_5": "qwen3_5_text", "qwen3_vl_moe": "qwen3_vl_moe_text",
                 "qwen3_5_moe": "qwen3_5_moe_text", "qwen4_exp": QWEN4_EXP, KIMI.MODEL_TYPE: KIMI.TEXT_TYPE}  # kimi_k25 (registry)
# the native text family a VL config's text_config is read as (Qwen3-VL's decoder is Qwen3 with M-RoPE,
# Qwen3-VL-MoE's Qwen3-MoE with M-RoPE; the Qwen3.5 ones are the gated-DeltaNet hybrids)
_VL_NATIVE_TEXT = {"qwen3_vl": "qwen3_vl", "qwen3_5": "qwen3_5_text", "qwen3_vl_moe": "qwen3_vl_moe",
                   "qwen3_5_moe": "qwen3_5_moe_text", "qwen4_exp": QWEN4_EXP, KIMI.MODEL_TYPE: KIMI.TEXT_TYPE}  # kimi_k25 (registry)
# transformers' mrope_section when the text rope parameters leave it out (its text rotary embeddings)
_VL_MROPE_DEFAULT = {"qwen3_vl": [24, 20, 20], "qwen3_5": [11, 11, 10], "qwen3_vl_moe": [24, 20, 20],
                     "qwen3_5_moe": [11, 11, 10], "qwen4_exp": [11, 11, 10], KIMI.MODEL_TYPE: []}  # kimi_k25 (registry)


def _vl_from_hf(cls, d: dict[str, Any], source: str) -> ModelConfig:
    """A VL config.json (text_config + vision_config + token ids at the top) as one flat ModelConfig:
    the text model's fields as for a text family, `vision` = the HF vision_config, `mrope_section`
    from the text rope parameters, the other top-level keys kept in `vl_extra`."""
    if d["model_type"] == KIMI.MODEL_TYPE:  # kimi_k25 (registry)
        d = KIMI.with_image_token(d)
    text = copy.deepcopy(d["text_config"])
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    mrope = rope.pop("mrope_section", None)
    rope.pop("mrope_interleaved", None)
    text["rope_parameters"] = rope
    text.pop("rope_scaling", None)
    vision = d.get("vision_config")
    if not isinstance(vision, dict):
        raise ModelLoadError(f"{source}: a {d['model_type']} config needs a vision_config object")
    if d.get("image_token_id") is None:
        raise ModelLoadError(f"{source}: required key 'image_token_id' is missing")
    cfg = cls.from_hf_dict({**text, "model_type": _VL_NATIVE_TEXT[d["model_type"]],
                            "tie_word_embeddings": d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))},
                           source)
    half = cfg.rotary_dim // 2
    cfg.mrope_section = list(mrope) if mrope is not None else list(_VL_MROPE_DEFAULT[d["model_type"]])
    if d["model_type"] == KIMI.MODEL_TYPE:  # kimi_k25 (registry)
        cfg.mrope_section = KIMI.FIXED["mrope_section"]
    elif sum(cfg.mrope_section) != half:
        raise ModelLoadError(f"{source}: mrope_section {cfg.mrope_section} must add up to rotary_dim/2 = {half}")
    cfg.vl_architecture = d["model_type"]
    cfg.vision = copy.deepcopy(vision)
    cfg.image_token_id = int(d["image_token_id"])
    owned = {"model_type", "architectures", "text_config", "vision_config", "image_token_id", "tie_word_embeddings"}
    cfg.vl_extra = {k: copy.deepcopy(v) for k, v in d.items() if k not in owned}
    if d["model_type"] == KIMI.MODEL_TYPE:  # kimi_k25 (registry)
        KIMI.check(cfg, d, source)
    return cfg


def _vl_to_hf(cfg: ModelConfig, text: dict[str, Any]) -> dict[str, Any]:
    """Nest the flat text dict back under text_config (inverse of `_vl_from_hf`)."""
    text.pop("architectures", None)
    vl = cfg.vl_architecture or cfg.architecture
    text["model_type"] = _VL_TEXT_TYPE[vl]
    if cfg.mrope_section is not None:  # kimi_k25 (registry): no M-RoPE
        text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": list(cfg.mrope_section or []),
                                   "mrope_interleaved": True}
    out = {**copy.deepcopy(cfg.vl_extra), "architectures": [ARCHITECTURES[vl]],
           "model_type": vl, "text_config": dict(sorted(text.items())),
           "vision_config": copy.deepcopy(cfg.vision), "image_token_id": cfg.image_token_id,
           "tie_word_embeddings": cfg.tie_word_embeddings}
    if "dtype" in text:
        out["dtype"] = text["dtype"]
    return dict(sorted(out.items()))


def _check_dsa(cfg: ModelConfig, d: dict, source: str) -> None:
    """Validate the DSA keys; derive `indexer_types` the way transformers' GlmMoeDsaConfig does when
    config.json lacks it ("full" layers run the indexer, "shared" ones reuse the previous full layer's)."""
    if cfg.indexer_types is None:
        pattern = d.get("index_topk_pattern")
        if pattern is not None:
            cfg.indexer_types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
        else:
            freq, offset = max(d.get("index_topk_freq") or 1, 1), d.get("index_skip_topk_offset", 2)
            cfg.indexer_types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared"
                                 for i in range(cfg.num_layers)]
    if len(cfg.indexer_types) != cfg.num_layers or set(cfg.indexer_types) - {"full", "shared"}:
        raise ModelLoadError(f"{source}: indexer_types must give 'full' or 'shared' for each of {cfg.num_layers} layers")
    if cfg.indexer_types[0] != "full":
        raise ModelLoadError(f"{source}: the first layer's indexer must be 'full' (shared layers reuse an earlier one)")
    if not cfg.q_lora_rank or cfg.index_topk <= 0:
        raise ModelLoadError(f"{source}: glm_moe_dsa needs q_lora_rank and index_topk > 0")


def _check_dsv4(cfg: ModelConfig, d: dict, source: str) -> None:
    """DeepSeek-V4: fold the legacy keys in and derive what config.json may leave out, as
    transformers' DeepseekV4Config does (layer kinds, hash layers, rotary share, the two ropes)."""
    n = cfg.num_layers
    legacy = {k: d.get(k) for k in ("compress_ratios", "compress_rate_csa", "compress_rate_hca", "num_hash_layers")}
    rates = dict(cfg.compress_rates or DSV4_DEFAULT_RATES)
    for key, kind in (("compress_rate_csa", DSV4_CSA), ("compress_rate_hca", DSV4_HCA)):
        if legacy[key] is not None:
            rates[kind] = legacy[key]
    cfg.compress_rates = rates
    if cfg.layer_types is None and legacy["compress_ratios"] is not None:
        by_ratio = {0: DSV4_SLIDING, 4: DSV4_CSA, 128: DSV4_HCA}
        cfg.layer_types = [by_ratio.get(r, f"compress_ratio {r}") for r in legacy["compress_ratios"]][:n]
    if cfg.layer_types is None:  # two HCA layers, then CSA / HCA alternating (V4-Pro)
        cfg.layer_types = [DSV4_HCA] * min(n, 2) + [DSV4_CSA if i % 2 else DSV4_HCA for i in range(max(n - 2, 0))]
    if cfg.mlp_layer_types is None:
        hashed = legacy["num_hash_layers"] if legacy["num_hash_layers"] is not None else 3
        cfg.mlp_layer_types = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    for key, allowed in (("layer_types", (DSV4_SLIDING, DSV4_CSA, DSV4_HCA)), ("mlp_layer_types", ("hash_moe", "moe"))):
        bad = sorted(set(getattr(cfg, key)) - set(allowed))
        if bad:
            raise ModelLoadError(f"{source}: {key} entries must be one of {list(allowed)}, got {bad}")
    for kind in set(cfg.layer_types) - {DSV4_SLIDING}:
        if not isinstance(rates.get(kind), int) or rates[kind] < 1:
            raise ModelLoadError(f"{source}: compress_rates needs a positive rate for {kind!r} (got {rates.get(kind)!r})")
    if cfg.router_scoring not in _DSV4_SCORING:
        raise ModelLoadError(f"{source}: scoring_func {cfg.router_scoring!r} is not one of {list(_DSV4_SCORING)}")
    cfg.router_scoring = _DSV4_SCORING[cfg.router_scoring]
    # rope: {"main": sliding layers, "compress": compressed layers and their compressors}, or flat
    rope = d.get("rope_parameters") or {}
    main, compress = rope.get("main"), rope.get("compress")
    if isinstance(main, dict) and isinstance(compress, dict):
        if main.get("rope_type", main.get("type", "default")) != "default":
            raise ModelLoadError(f"{source}: the main (sliding-layer) rope must be 'default', got {main.get('rope_type')!r}")
        cfg.rope_theta = float(main.get("rope_theta", cfg.rope_theta))
        cfg.compress_rope_theta, cfg.compress_rope_scaling = _rope_from_hf({"rope_parameters": compress}, source)
        partial = main.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    else:  # flat: the parameters (yarn) apply to the compress rope; the main rope stays default
        cfg.compress_rope_scaling, cfg.rope_scaling = cfg.rope_scaling, None
        if cfg.compress_rope_scaling and cfg.compress_rope_scaling.get("rope_type") == "yarn":
            cfg.compress_rope_scaling.setdefault("attention_factor", 1.0)
        partial = d.get("partial_rotary_factor")
    if partial is None:  # transformers: legacy qk_rope_head_dim / head_dim, else 64 / 512
        partial = d["qk_rope_head_dim"] / cfg.head_dim if d.get("qk_rope_head_dim") else 64 / 512
    cfg.partial_rotary_factor = float(partial)
    # the shared expert is moe_intermediate_size wide (transformers reads it as intermediate_size)
    cfg.intermediate_size = cfg.shared_expert_intermediate_size = cfg.moe_intermediate_size
    cfg.num_kv_heads = 1  # one shared key=value head
    rd = cfg.rotary_dim
    if rd % 2 or rd > cfg.head_dim or ("compressed_sparse_attention" in cfg.layer_types and rd > cfg.index_head_dim):
        raise ModelLoadError(f"{source}: the rotary dims ({rd}) must be even and fit head_dim / index_head_dim")
    if cfg.o_groups < 1 or cfg.num_heads % cfg.o_groups:
        raise ModelLoadError(f"{source}: o_groups={cfg.o_groups} must divide num_attention_heads={cfg.num_heads}")
    if cfg.hc_mult < 1 or not cfg.q_lora_rank or not cfg.sliding_window:
        raise ModelLoadError(f"{source}: deepseek_v4 needs hc_mult >= 1, q_lora_rank and sliding_window")


def _dsv4_to_hf(cfg: ModelConfig, d: dict) -> None:
    """The DeepSeek-V4 keys transformers writes (inverse of `_check_dsv4`)."""
    d["scoring_func"] = {v: k for k, v in _DSV4_SCORING.items()}[cfg.router_scoring]
    d.pop("intermediate_size", None)  # transformers maps it onto moe_intermediate_size
    d["partial_rotary_factor"] = cfg.partial_rotary_factor
    d["qk_rope_head_dim"] = cfg.rotary_dim
    rope = {"rope_theta": cfg.rope_theta, "partial_rotary_factor": cfg.partial_rotary_factor}
    d["rope_parameters"] = {"main": {"rope_type": "default", **rope},
                            "compress": {"rope_type": "default", **(cfg.compress_rope_scaling or {}), **rope,
                                         "rope_theta": cfg.compress_rope_theta}}


def compress_rope_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with the compressed layers' rope in place of the main one (for a `layers.Rotary`)."""
    from dataclasses import replace

    return replace(cfg, rope_theta=cfg.compress_rope_theta, rope_scaling=cfg.compress_rope_scaling, hf_extra={})


def _nemotron_layer_types(d: dict, source: str) -> list[str]:
    """nemotron_h's per-layer mixers: `layers_block_type`, or the older `hybrid_override_pattern`
    string (M Mamba-2, * attention, - MLP, E MoE)."""
    pattern = d.get("hybrid_override_pattern")
    if pattern is None:
        raise ModelLoadError(f"{source}: nemotron_h needs layers_block_type (or hybrid_override_pattern)")
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    if set(pattern) - set(names):
        raise ModelLoadError(f"{source}: hybrid_override_pattern {pattern!r} has characters other than M * - E")
    return [names[c] for c in pattern]


def _check_hybrid(cfg: ModelConfig, d: dict, source: str) -> None:
    """Validate a hybrid family's layer pattern and sizes; derive qwen3_next's default pattern (every
    `full_attention_interval`-th layer full attention) as transformers does."""
    if cfg.layer_types is None:
        every = int(d.get("full_attention_interval", 4))
        cfg.layer_types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(cfg.num_layers)]
    allowed = {"linear_attention", "full_attention"} | ({"moe", "mlp"} if cfg.architecture == "nemotron_h" else set())
    if len(cfg.layer_types) != cfg.num_layers or set(cfg.layer_types) - allowed:
        raise ModelLoadError(f"{source}: layer types must give one of {sorted(allowed)} for each of {cfg.num_layers} layers")
    if cfg.architecture == "nemotron_h":
        latent = cfg.moe_latent_size
        if latent is not None and (type(latent) is not int or latent < 1):  # bool is an int: refuse it too
            raise ModelLoadError(f"{source}: moe_latent_size must be a positive integer or null, got {latent!r}")
        if cfg.mlp_act != "relu2" or d.get("mamba_hidden_act", "silu") != "silu":
            raise ModelLoadError(f"{source}: nemotron_h supports mlp_hidden_act 'relu2' and mamba_hidden_act 'silu'")
        if cfg.mamba_num_heads % cfg.mamba_n_groups:
            raise ModelLoadError(f"{source}: n_groups={cfg.mamba_n_groups} does not divide mamba_num_heads")
    elif cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ModelLoadError(f"{source}: linear_num_key_heads must divide linear_num_value_heads")


def _check_qwen4_exp(cfg: ModelConfig, source: str) -> None:
    """Qwen3.8 Flash Next: the invariants transformers' Qwen4ExpTextConfig checks, plus what the native
    model supports (QSA on every full-attention layer, DeltaNet's silu output gate). Derives the layer
    pattern (every 4th layer indexed attention) and reads "full_attention" as "indexed_attention", as
    transformers does."""
    if cfg.layer_types is None:
        cfg.layer_types = ["linear_attention" if (i + 1) % 4 else "indexed_attention" for i in range(cfg.num_layers)]
    cfg.layer_types = ["indexed_attention" if t == "full_attention" else t for t in cfg.layer_types]
    bad = sorted(set(cfg.layer_types) - {"linear_attention", "indexed_attention"})
    if len(cfg.layer_types) != cfg.num_layers or bad:
        raise ModelLoadError(f"{source}: qwen4_exp layer_types must be linear_attention / indexed_attention "
                             f"for each of {cfg.num_layers} layers (got {bad or len(cfg.layer_types)})")
    if cfg.output_gate_type not in (None, "silu"):
        raise ModelLoadError(f"{source}: output_gate_type={cfg.output_gate_type!r} is not supported natively (only silu)")
    if cfg.hc_mult < 2 or cfg.hc_lowrank < 1:
        raise ModelLoadError(f"{source}: qwen4_exp needs hc_count >= 2 and hc_lowrank >= 1")
    if cfg.indexer_kv_heads != 1:
        raise ModelLoadError(f"{source}: QSA needs indexer_kv_heads=1, got {cfg.indexer_kv_heads}")
    ratio, budget = cfg.indexer_compress_ratio, cfg.indexer_budget
    if min(cfg.index_n_heads, cfg.index_head_dim, ratio, budget) < 1 or budget % ratio:
        raise ModelLoadError(f"{source}: QSA indexer sizes must be positive and indexer_budget ({budget}) a multiple "
                             f"of indexer_compress_ratio ({ratio})")
    if cfg.rotary_dim > cfg.index_head_dim:
        raise ModelLoadError(f"{source}: the rotary dims ({cfg.rotary_dim}) must fit indexer_head_dim")
    cfg.ple_layer_ids = sorted(set(cfg.ple_layer_ids))
    wrong = [i for i in cfg.ple_layer_ids if not 1 <= i <= cfg.num_layers or cfg.layer_types[i - 1] != "linear_attention"]
    if wrong:
        raise ModelLoadError(f"{source}: ple_layer_ids {wrong} are not one-indexed linear_attention layers")
    if cfg.ple_layer_ids and cfg.eos_token_id is None:
        raise ModelLoadError(f"{source}: eos_token_id must be set when PLE layers are enabled")
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise ModelLoadError(f"{source}: linear_num_key_heads must divide linear_num_value_heads")


def _rope_from_hf(d: dict, source: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either transformers-5 `rope_parameters` or 4.x `rope_theta`/`rope_scaling`."""
    params = d.get("rope_parameters") or {}
    legacy = d.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    scaling = {k: v for k, v in {**legacy, **params}.items() if k != "rope_theta"}
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
