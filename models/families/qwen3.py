"""Qwen3 (dense): Llama's decoder with q/k RMSNorm."""
from vf.models.families._spec import Family

FAMILIES = (Family(model_type="qwen3", hf_class="Qwen3ForCausalLM", qk_norm=True),)
