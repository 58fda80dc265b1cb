"""DeepSeek-V3: multi-head latent attention (models/mla.py) and DeepSeek-style MoE; Kimi K2's text
model too. Multi-token-prediction layers are appended after the decoder (not run)."""
from vf.models.families._shared import DEEPSEEK_MOE_KEYS, DEEPSEEK_MOE_ROWS, MLA_ROWS, REQUIRED
from vf.models.families._spec import Family

MLA_KEYS = {
    "q_lora_rank": ("q_lora_rank", None),
    "kv_lora_rank": ("kv_lora_rank", REQUIRED),
    "qk_rope_head_dim": ("qk_rope_head_dim", REQUIRED),
    "qk_nope_head_dim": ("qk_nope_head_dim", REQUIRED),
    "v_head_dim": ("v_head_dim", REQUIRED),
    "rope_interleave": ("rope_interleave", True),
}
WEIGHTS = {**MLA_ROWS, **DEEPSEEK_MOE_ROWS}

FAMILIES = (Family(
    model_type="deepseek_v3", hf_class="DeepseekV3ForCausalLM", hf_keys={**DEEPSEEK_MOE_KEYS, **MLA_KEYS},
    fixed={"router_scoring": "sigmoid", "expert_bias": True}, attention="mla", moe_layers="first_k_dense",
    weights=WEIGHTS, mtp="appended",
),)
