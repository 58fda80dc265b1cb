"""GLM-5: DeepSeek-V3's MLA and MoE plus the DSA indexer (models/dsa.py), which picks each query's
top-k keys; "shared" indexer layers reuse the previous "full" layer's selection."""
from dataclasses import dataclass

from vf.models.errors import ModelLoadError
from vf.models.families._shared import DEEPSEEK_MOE_KEYS, A
from vf.models.families._spec import Family
from vf.models.families.deepseek_v3 import WEIGHTS as DEEPSEEK_V3_WEIGHTS


@dataclass
class DsaSection:
    indexer_types: list[str] | None = None  # per layer "full" | "shared"


def check(cfg, d: dict, source: str) -> None:
    """Derive `indexer_types` the way transformers' GlmMoeDsaConfig does when config.json lacks it."""
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


FAMILIES = (Family(
    model_type="glm_moe_dsa", hf_class="GlmMoeDsaForCausalLM", section=DsaSection,
    hf_keys={  # defaults: transformers' GlmMoeDsaConfig
        **DEEPSEEK_MOE_KEYS,
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
    fixed={"router_scoring": "sigmoid", "expert_bias": True, "rope_interleave": True},
    attention="dsa", moe_layers="first_k_dense", check=check, mtp="appended",
    weights={**DEEPSEEK_V3_WEIGHTS,
             **{f"layers.{{i}}.attn.indexer.{p}": ("rename", [A + f"indexer.{p}"])
                for p in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")}},
),)
