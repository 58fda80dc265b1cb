"""Qwen3-VL and Qwen3-VL-MoE (models/qwen3_vl.py, models/vision.py): a Qwen3 / Qwen3-MoE decoder
with M-RoPE and DeepStack features from the vision tower. Their native text family has the VL
model_type's name (their text_config types are written as `*_text`)."""
from dataclasses import dataclass

from vf.models.families._shared import QWEN_MOE_KEYS, L
from vf.models.families._spec import Family, VisionLanguage


@dataclass
class Qwen3VLMoeSection:
    # the checkpoint held its fused experts transposed (the released layout, which vLLM reads), not as
    # transformers' save_pretrained writes them; set on load, saving keeps the layout
    experts_transposed: bool = False


FAMILIES = (
    Family(model_type="qwen3_vl", hf_class="Qwen3VLForConditionalGeneration", qk_norm=True,
           fixed={"use_qk_norm": True}),
    # transformers' Qwen3VLMoeTextTopKRouter renormalises the top-k softmax weights (no norm_topk_prob key);
    # norm_topk_prob is written for readers that take it from config.json (vLLM; transformers accepts it)
    Family(model_type="qwen3_vl_moe", hf_class="Qwen3VLMoeForConditionalGeneration", qk_norm=True,
           section=Qwen3VLMoeSection, hf_keys={**QWEN_MOE_KEYS, "norm_topk_prob": ("norm_topk_prob", True)},
           aliases={"num_experts": "num_local_experts"},  # what transformers' save writes
           fixed={"use_qk_norm": True, "norm_topk_prob": True},
           weights={f"layers.{{i}}.mlp.{p}": ("fused_experts", [L + f"mlp.experts.{p}"])
                    for p in ("gate_up_proj", "down_proj")}),
    VisionLanguage(model_type="qwen3_vl", hf_class="Qwen3VLForConditionalGeneration", text="qwen3_vl",
                   text_config_type="qwen3_vl_text", mrope_section=(24, 20, 20)),
    VisionLanguage(model_type="qwen3_vl_moe", hf_class="Qwen3VLMoeForConditionalGeneration", text="qwen3_vl_moe",
                   text_config_type="qwen3_vl_moe_text", mrope_section=(24, 20, 20)),
)
