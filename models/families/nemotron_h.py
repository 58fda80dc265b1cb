"""Nemotron-H (Nano, Super): one mixer per layer by pattern — Mamba-2 (models/mamba2.py), attention,
a squared-ReLU MLP or a MoE (Super's latent MoE with `moe_latent_size`) — in models/hybrid.py.
transformers saves under `backbone.`; there is no rope."""
from dataclasses import dataclass

from vf.models.errors import ModelLoadError
from vf.models.families._shared import check_layer_pattern
from vf.models.families._spec import Family


@dataclass
class NemotronHSection:
    mlp_act: str = "relu2"  # non-gated up/down MLP with squared ReLU
    ssm_state_size: int = 0  # Mamba-2
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_n_groups: int = 1
    mamba_conv_kernel: int = 4
    mamba_conv_bias: bool = True
    mamba_proj_bias: bool = False
    mamba_chunk_size: int = 128
    mamba_dt_min: float = 0.0


def read(fields: dict, d: dict, source: str) -> None:
    """Layer count and types from `layers_block_type`, or the older `hybrid_override_pattern` string
    (M Mamba-2, * attention, - MLP, E MoE)."""
    if fields.get("layer_types") is None:
        pattern = d.get("hybrid_override_pattern")
        if pattern is None:
            raise ModelLoadError(f"{source}: nemotron_h needs layers_block_type (or hybrid_override_pattern)")
        names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
        if set(pattern) - set(names):
            raise ModelLoadError(f"{source}: hybrid_override_pattern {pattern!r} has characters other than M * - E")
        fields["layer_types"] = [names[c] for c in pattern]
    fields["num_layers"] = len(fields["layer_types"])


def check(cfg, d: dict, source: str) -> None:
    check_layer_pattern(cfg, d, source, {"linear_attention", "full_attention", "moe", "mlp"})
    latent = cfg.moe_latent_size
    if latent is not None and (type(latent) is not int or latent < 1):  # bool is an int: refuse it too
        raise ModelLoadError(f"{source}: moe_latent_size must be a positive integer or null, got {latent!r}")
    if cfg.mlp_act != "relu2" or d.get("mamba_hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{source}: nemotron_h supports mlp_hidden_act 'relu2' and mamba_hidden_act 'silu'")
    if cfg.mamba_num_heads % cfg.mamba_n_groups:
        raise ModelLoadError(f"{source}: n_groups={cfg.mamba_n_groups} does not divide mamba_num_heads")


def write(cfg, d: dict) -> None:  # no rope, no hidden_act / rms_norm_eps / layer count keys
    for k in ("rope_parameters", "rope_theta", "hidden_act", "rms_norm_eps", "num_hidden_layers"):
        d.pop(k, None)


NB, NM = "backbone.layers.{i}.", "backbone.layers.{i}.mixer."
WEIGHTS = {
    "embed_tokens.weight": ("rename", ["backbone.embeddings.weight"]),
    "norm.weight": ("rename", ["backbone.norm_f.weight"]),
    "layers.{i}.norm.weight": ("rename", [NB + "norm.weight"]),
    "layers.{i}.mixer.qkv_proj.weight": ("concat", [NM + f"{p}_proj.weight" for p in "qkv"]),
    "layers.{i}.mixer.conv_weight": ("rename", [NM + "conv1d.weight"]),
    "layers.{i}.mixer.conv_bias": ("rename", [NM + "conv1d.bias"]),
    **{f"layers.{{i}}.mixer.{p}": ("rename", [NM + p]) for p in (
        "o_proj.weight", "in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias", "dt_bias", "A_log", "D",
        "norm.weight", "up_proj.weight", "up_proj.bias", "down_proj.weight", "down_proj.bias")},
    **{f"layers.{{i}}.mixer.shared.{p}": ("rename", [NM + f"shared_experts.{p}"]) for p in (
        "up_proj.weight", "up_proj.bias", "down_proj.weight", "down_proj.bias")},
    # Super's latent MoE (moe_latent_size): hidden -> latent before the routed experts, latent -> hidden after
    **{f"layers.{{i}}.mixer.{ours}.{p}": ("rename", [NM + f"{theirs}.{p}"]) for ours, theirs in (
        ("latent_in", "fc1_latent_proj"), ("latent_out", "fc2_latent_proj")) for p in ("weight", "bias")},
    "layers.{i}.mixer.router.weight": ("rename", [NM + "gate.weight"]),
    "layers.{i}.mixer.router.expert_bias": ("rename", [NM + "gate.e_score_correction_bias"]),
    "layers.{i}.mixer.gate_up_proj": ("stack", [NM + "experts.{e}.up_proj.weight"]),
    "layers.{i}.mixer.down_proj": ("stack", [NM + "experts.{e}.down_proj.weight"]),
}

FAMILIES = (Family(
    model_type="nemotron_h", hf_class="NemotronHForCausalLM", section=NemotronHSection,
    hf_keys={  # defaults: transformers' NemotronHConfig
        "layers_block_type": ("layer_types", None),
        "layer_norm_epsilon": ("rms_norm_eps", 1e-5),
        "mlp_hidden_act": ("mlp_act", "relu2"),
        "mlp_bias": ("mlp_bias", False),
        "ssm_state_size": ("ssm_state_size", 128),
        "mamba_num_heads": ("mamba_num_heads", 128),
        "mamba_head_dim": ("mamba_head_dim", 64),
        "n_groups": ("mamba_n_groups", 8),
        "conv_kernel": ("mamba_conv_kernel", 4),
        "use_conv_bias": ("mamba_conv_bias", True),
        "use_bias": ("mamba_proj_bias", False),
        "chunk_size": ("mamba_chunk_size", 128),
        "time_step_min": ("mamba_dt_min", 0.001),
        "n_routed_experts": ("num_experts", 8),
        "num_experts_per_tok": ("num_experts_per_tok", 2),
        "moe_intermediate_size": ("moe_intermediate_size", 7688),
        "moe_shared_expert_intermediate_size": ("shared_expert_intermediate_size", 7688),
        "n_group": ("n_group", 1),
        "topk_group": ("topk_group", 1),
        "norm_topk_prob": ("norm_topk_prob", True),
        "routed_scaling_factor": ("routed_scaling_factor", 1.0),
        "moe_latent_size": ("moe_latent_size", None),  # Super: routed experts in a latent space
    },
    aliases={"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "chunk_size": "mamba_chunk_size",
             "use_conv_bias": "mamba_conv_bias", "time_step_min": "mamba_dt_min"},
    fixed={"router_scoring": "sigmoid", "expert_bias": True, "expert_act": "relu2"},
    extra_hf_keys=("hybrid_override_pattern",), hybrid=True, moe_layers="layer_types",
    read=read, check=check, write=write, weights=WEIGHTS,
    fused_sources={"layers.{i}.mixer.gate_up_proj": NM + "experts.up_proj", "layers.{i}.mixer.down_proj": NM + "experts.down_proj"}, mtp="prefixed", layer="vf.models.hybrid:MixerLayer",
),)
