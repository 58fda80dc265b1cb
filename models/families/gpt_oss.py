"""GPT-OSS: attention sinks with alternating sliding/full layers (models/gpt_oss.py), biased router
and experts with the clamped SwiGLU; its `intermediate_size` is the expert width."""
from vf.models.families._shared import REQUIRED, A, L
from vf.models.families._spec import Family


def read(fields: dict, d: dict, source: str) -> None:
    fields["moe_intermediate_size"] = int(d["intermediate_size"])
    if fields.get("layer_types") is None:  # transformers' default: alternate sliding/full
        fields["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                 for i in range(int(d["num_hidden_layers"]))]


def write(cfg, d: dict) -> None:
    d["intermediate_size"] = cfg.moe_intermediate_size


FAMILIES = (Family(
    model_type="gpt_oss", hf_class="GptOssForCausalLM",
    hf_keys={
        "num_local_experts": ("num_experts", REQUIRED),
        "num_experts_per_tok": ("num_experts_per_tok", REQUIRED),
        "sliding_window": ("sliding_window", None),
        "layer_types": ("layer_types", None),
        "swiglu_alpha": ("swiglu_alpha", 1.702),
        "swiglu_limit": ("swiglu_limit", 7.0),
    },
    fixed={"router_bias": True, "expert_bias_terms": True, "expert_act": "clamped_swiglu", "norm_topk_prob": True},
    attention="sinks", read=read, write=write,
    weights={
        "layers.{i}.attn.sinks": ("rename", [A + "sinks"]),
        "layers.{i}.mlp.router.weight": ("rename", [L + "mlp.router.weight"]),
        "layers.{i}.mlp.router.bias": ("rename", [L + "mlp.router.bias"]),
        "layers.{i}.mlp.gate_up_proj": ("deinterleave_t", [L + "mlp.experts.gate_up_proj"]),
        "layers.{i}.mlp.gate_up_proj_bias": ("deinterleave", [L + "mlp.experts.gate_up_proj_bias"]),
        "layers.{i}.mlp.down_proj": ("transpose", [L + "mlp.experts.down_proj"]),
        "layers.{i}.mlp.down_proj_bias": ("rename", [L + "mlp.experts.down_proj_bias"]),
    },
),)
