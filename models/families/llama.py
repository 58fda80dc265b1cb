"""Llama (2, 3, 3.1 with llama3 rope scaling)."""
from vf.models.families._spec import Family

FAMILIES = (Family(model_type="llama", hf_class="LlamaForCausalLM", hf_keys={"mlp_bias": ("mlp_bias", False)}),)
