"""Qwen3-Next: gated DeltaNet layers (models/deltanet.py) between gated full-attention layers, zero-centred
(1 + w) RMSNorms, MoE with a gated shared expert. transformers groups the DeltaNet input rows per key
head (`regroup_qkvzba`)."""
from vf.models.families._shared import (
                                        DELTANET,
                                        DELTANET_KEYS,
                                        DELTANET_ROWS,
                                        LA,
                                        QWEN_NEXT_MOE_KEYS,
                                        check_deltanet,
)
from vf.models.families._spec import Family

FAMILIES = (Family(
    model_type="qwen3_next", hf_class="Qwen3NextForCausalLM",
    hf_keys={**DELTANET_KEYS, **QWEN_NEXT_MOE_KEYS, "norm_topk_prob": ("norm_topk_prob", True),
             "decoder_sparse_step": ("decoder_sparse_step", 1), "mlp_only_layers": ("mlp_only_layers", [])},
    fixed={"shared_expert_gate": True}, default_partial_rotary=0.25,
    qk_norm=True, zero_centered_norm=True, attn_output_gate=True, hybrid=True, linear_attention=DELTANET,
    check=check_deltanet, mtp="prefixed",
    weights={**DELTANET_ROWS, "layers.{i}.attn.in_proj.weight": (
        "regroup_qkvzba", [LA + "in_proj_qkvz.weight", LA + "in_proj_ba.weight"])},
),)
