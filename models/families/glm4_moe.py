"""GLM-4.5 / 4.6 / Air: DeepSeek-style MoE after `first_k_dense_replace` dense layers, half rotary,
optional q/k norm, no o_proj bias; multi-token-prediction layers appended after the decoder."""
from vf.models.families._shared import DEEPSEEK_MOE_KEYS, DEEPSEEK_MOE_ROWS
from vf.models.families._spec import Family

FAMILIES = (Family(
    model_type="glm4_moe", hf_class="Glm4MoeForCausalLM",
    hf_keys={**DEEPSEEK_MOE_KEYS, "use_qk_norm": ("use_qk_norm", False)},
    fixed={"router_scoring": "sigmoid", "expert_bias": True},
    default_partial_rotary=0.5,  # transformers' Glm4MoeConfig default
    o_proj_bias=False, moe_layers="first_k_dense", weights=DEEPSEEK_MOE_ROWS, mtp="appended",
),)
