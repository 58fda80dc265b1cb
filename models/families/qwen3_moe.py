"""Qwen3-MoE: Qwen3 with softmax-routed experts every `decoder_sparse_step`-th layer."""
from vf.models.families._shared import QWEN_MOE_KEYS
from vf.models.families._spec import Family

FAMILIES = (Family(model_type="qwen3_moe", hf_class="Qwen3MoeForCausalLM", qk_norm=True, hf_keys=QWEN_MOE_KEYS,
                   aliases={"num_experts": "num_local_experts"}),)
