"""Qwen3.5 (dense and MoE): the Qwen3-Next hybrid with separate DeltaNet input projections, and its
vision-language checkpoints (Qwen3-VL's tower without DeepStack, models/qwen3_vl.py)."""
from vf.models.families._shared import (
                                        DELTANET,
                                        DELTANET_KEYS,
                                        DELTANET_ROWS,
                                        LA,
                                        QWEN_NEXT_MOE_KEYS,
                                        check_deltanet,
)
from vf.models.families._spec import Family, VisionLanguage

WEIGHTS = {**DELTANET_ROWS, "layers.{i}.attn.in_proj.weight": (
    "concat", [LA + f"in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")])}
_HYBRID = {"default_partial_rotary": 0.25, "qk_norm": True, "zero_centered_norm": True, "attn_output_gate": True,
           "hybrid": True, "linear_attention": DELTANET, "check": check_deltanet, "mtp": "prefixed", "weights": WEIGHTS}

FAMILIES = (
    Family(model_type="qwen3_5_text", hf_class="Qwen3_5ForCausalLM", hf_keys=DELTANET_KEYS, **_HYBRID),
    Family(model_type="qwen3_5_moe_text", hf_class="Qwen3_5MoeForCausalLM",
           hf_keys={**DELTANET_KEYS, **QWEN_NEXT_MOE_KEYS}, fixed={"shared_expert_gate": True, "norm_topk_prob": True},
           moe_layers="all", **_HYBRID),
    VisionLanguage(model_type="qwen3_5", hf_class="Qwen3_5ForConditionalGeneration", text="qwen3_5_text",
                   text_config_type="qwen3_5_text", mrope_section=(11, 11, 10), deepstack=False),
    VisionLanguage(model_type="qwen3_5_moe", hf_class="Qwen3_5MoeForConditionalGeneration", text="qwen3_5_moe_text",
                   text_config_type="qwen3_5_moe_text", mrope_section=(11, 11, 10), deepstack=False),
)
