"""Qwen3.8 Flash Next (models/qwen4_exp.py): the Qwen3.5 hybrid with QSA indexed attention
(models/qsa.py), gated-residual streams (models/gated_residual.py), per-layer hashed n-gram embeddings
(models/ple.py, models/ngram_embedding.py) and a sigmoid-gated shared expert; text
(Qwen4ExpForCausalLM) and vision-language (Qwen4ExpForConditionalGeneration, Qwen3.5's tower)."""
from dataclasses import dataclass, field

from vf.models.errors import ModelLoadError
from vf.models.families._shared import DELTANET, DELTANET_KEYS, QWEN_NEXT_MOE_KEYS, REQUIRED, A, L
from vf.models.families._spec import Family, VisionLanguage
from vf.models.families.qwen3_5 import WEIGHTS as QWEN3_5_WEIGHTS


@dataclass
class Qwen4ExpSection:
    hc_lowrank: int = 0  # gated residual streams' low-rank mixing (hc_mult streams)
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


def check(cfg, d: dict, source: str) -> None:
    """The invariants transformers' Qwen4ExpTextConfig checks, plus what the native model supports (QSA
    on every full-attention layer, DeltaNet's silu output gate). Derives the layer pattern (every 4th
    layer indexed attention) and reads "full_attention" as "indexed_attention", as transformers does."""
    if cfg.layer_types is None:
        cfg.layer_types = ["linear_attention" if (i + 1) % 4 else "indexed_attention" for i in range(cfg.num_layers)]
    # transformers 5.17 (the GPU image's) spells the indexed layer "qwen_sparse_attention"
    cfg.layer_types = ["indexed_attention" if t in ("full_attention", "qwen_sparse_attention") else t
                       for t in cfg.layer_types]
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


HC, PL = "model.layers.{i}.{part}_hyper_connection.", L + "ple."
_GATED_RESIDUAL = ("hc_norm.weight", "input_mix_weight_down.weight", "input_mix_weight_up.weight")
WEIGHTS = {
    **QWEN3_5_WEIGHTS,
    **{f"layers.{{i}}.attn.indexer.{p}": ("rename", [A + f"indexer.{p}"])
       for p in ("index_qk_proj.weight", "q_layernorm.weight", "k_layernorm.weight")},
    **{f"layers.{{i}}.{part}_hc.{p}": ("rename", [HC.replace("{part}", part) + p])
       for part in ("attn", "mlp") for p in (*_GATED_RESIDUAL, "block_inject_weight.weight")},
    **{f"hc_mixer.{p}": ("rename", ["model.hyper_connection_mixer." + p]) for p in _GATED_RESIDUAL},
    **{f"layers.{{i}}.ple.{p}": ("rename", [PL + p])
       for p in ("key_proj.weight", "value_proj.weight", "norm_key.weight", "norm_query.weight", "norm_conv.weight")},
    "layers.{i}.ple.conv_weight": ("rename", [PL + "conv1d.weight"]),
    "layers.{i}.ple.ngram.weight": ("row_shards", [PL + "ple_embedding.ngram_embedding.shard_{k}.weight"]),
}

FAMILIES = (
    Family(
        model_type="qwen4_exp_text", hf_class="Qwen4ExpForCausalLM", section=Qwen4ExpSection,
        hf_keys={  # defaults: transformers' Qwen4ExpTextConfig
            **DELTANET_KEYS, **QWEN_NEXT_MOE_KEYS, "norm_topk_prob": ("norm_topk_prob", True),
            "hc_count": ("hc_mult", 4), "hc_lowrank": ("hc_lowrank", 320),
            "ple_layer_ids": ("ple_layer_ids", []), "ple_embed_dim": ("ple_embed_dim", None),
            "ple_conv_kernel_size": ("ple_conv_kernel", 4), "ngram_size": ("ngram_size", 3),
            "heads_per_ngram": ("heads_per_ngram", 8), "ngram_vocab_size_base": ("ngram_vocab_size_base", 20_000_000),
            "make_ngram_vocab_size_divisible_by": ("ngram_divisible_by", 128), "seed": ("ngram_seed", 1234),
            "split_ngram_parts": ("split_ngram_parts", 512),
            "indexer_n_heads": ("index_n_heads", REQUIRED), "indexer_kv_heads": ("indexer_kv_heads", 1),
            "indexer_head_dim": ("index_head_dim", REQUIRED), "indexer_budget": ("indexer_budget", REQUIRED),
            "indexer_compress_ratio": ("indexer_compress_ratio", REQUIRED),
            "output_gate_type": ("output_gate_type", None),
        },
        fixed={"shared_expert_gate": True}, qk_norm=True, zero_centered_norm=True, attn_output_gate=True,
        linear_attention=DELTANET, moe_layers="all", check=check, weights=WEIGHTS,
        derived_tensors="vf.models.ple:hf_buffers",
        layer="vf.models.qwen4_exp:Qwen4ExpLayer", model="vf.models.qwen4_exp:Qwen4ExpModel",
    ),
    VisionLanguage(model_type="qwen4_exp", hf_class="Qwen4ExpForConditionalGeneration", text="qwen4_exp_text",
                   text_config_type="qwen4_exp_text", mrope_section=(11, 11, 10), deepstack=False,
                   model="vf.models.qwen4_exp:Qwen4ExpVLModel"),
)
