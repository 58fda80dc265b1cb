"""DeepSeek-V4 (models/deepseek_v4.py): sliding, compressed-sparse (CSA) and heavily-compressed (HCA)
attention layers with a shared key=value head and grouped output projection, hyper-connection
residual streams, hash-routed then learned-routed MoE. transformers saves DeepSeek's own tensor
names (`attn.wq_a`, `ffn.experts.{e}.w1`, `hc_attn_fn`, `head`, ...)."""
from dataclasses import dataclass, replace

from vf.models.errors import ModelLoadError
from vf.models.families._shared import L, rope_from_hf
from vf.models.families._spec import Family

# attention layer kinds and their transformers defaults (tokens pooled per compressed entry)
SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
DEFAULT_RATES = {CSA: 4, HCA: 128}
_SCORING = {"sqrtsoftplus": "sqrt_softplus", "softmax": "softmax", "sigmoid": "sigmoid"}  # HF -> native
_LEGACY = ("compress_ratios", "compress_rate_csa", "compress_rate_hca", "num_hash_layers")


@dataclass
class DeepseekV4Section:
    o_groups: int = 0  # grouped output projection: head groups g, each projected to o_lora_rank
    o_lora_rank: int = 0
    compress_rates: dict | None = None  # layer kind -> tokens pooled into one compressed entry
    compress_rope_theta: float = 160000.0  # rope of the compressed layers (and their compressors)
    compress_rope_scaling: dict | None = None  # None or yarn, as rope_scaling


def compress_rope_config(cfg):
    """`cfg` with the compressed layers' rope in place of the main one (for a `layers.Rotary`)."""
    return replace(cfg, rope_theta=cfg.compress_rope_theta, rope_scaling=cfg.compress_rope_scaling, hf_extra={})


def check(cfg, d: dict, source: str) -> None:
    """Fold the legacy keys in and derive what config.json may leave out, as transformers'
    DeepseekV4Config does (layer kinds, hash layers, rotary share, the two ropes)."""
    n = cfg.num_layers
    legacy = {k: d.get(k) for k in _LEGACY}
    rates = dict(cfg.compress_rates or DEFAULT_RATES)
    for key, kind in (("compress_rate_csa", CSA), ("compress_rate_hca", HCA)):
        if legacy[key] is not None:
            rates[kind] = legacy[key]
    cfg.compress_rates = rates
    if cfg.layer_types is None and legacy["compress_ratios"] is not None:
        by_ratio = {0: SLIDING, 4: CSA, 128: HCA}
        cfg.layer_types = [by_ratio.get(r, f"compress_ratio {r}") for r in legacy["compress_ratios"]][:n]
    if cfg.layer_types is None:  # two HCA layers, then CSA / HCA alternating (V4-Pro)
        cfg.layer_types = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    if cfg.mlp_layer_types is None:
        hashed = legacy["num_hash_layers"] if legacy["num_hash_layers"] is not None else 3
        cfg.mlp_layer_types = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    for key, allowed in (("layer_types", (SLIDING, CSA, HCA)), ("mlp_layer_types", ("hash_moe", "moe"))):
        bad = sorted(set(getattr(cfg, key)) - set(allowed))
        if bad:
            raise ModelLoadError(f"{source}: {key} entries must be one of {list(allowed)}, got {bad}")
        if len(getattr(cfg, key)) != n:
            raise ModelLoadError(f"{source}: {key} has {len(getattr(cfg, key))} entries for {n} layers")
    for kind in set(cfg.layer_types) - {SLIDING}:
        if not isinstance(rates.get(kind), int) or rates[kind] < 1:
            raise ModelLoadError(f"{source}: compress_rates needs a positive rate for {kind!r} (got {rates.get(kind)!r})")
    if cfg.router_scoring not in _SCORING:
        raise ModelLoadError(f"{source}: scoring_func {cfg.router_scoring!r} is not one of {list(_SCORING)}")
    cfg.router_scoring = _SCORING[cfg.router_scoring]
    # rope: {"main": sliding layers, "compress": compressed layers and their compressors}, or flat
    rope = d.get("rope_parameters") or {}
    main, compress = rope.get("main"), rope.get("compress")
    if isinstance(main, dict) and isinstance(compress, dict):
        if main.get("rope_type", main.get("type", "default")) != "default":
            raise ModelLoadError(f"{source}: the main (sliding-layer) rope must be 'default', got {main.get('rope_type')!r}")
        cfg.rope_theta = float(main.get("rope_theta", cfg.rope_theta))
        cfg.compress_rope_theta, cfg.compress_rope_scaling = rope_from_hf({"rope_parameters": compress}, source)
        partial = main.get("partial_rotary_factor", d.get("partial_rotary_factor"))
    else:  # flat: the parameters (yarn) apply to the compress rope; the main rope stays default
        cfg.compress_rope_scaling, cfg.rope_scaling = cfg.rope_scaling, None
        if cfg.compress_rope_scaling and cfg.compress_rope_scaling.get("rope_type") == "yarn":
            cfg.compress_rope_scaling.setdefault("attention_factor", 1.0)
        partial = d.get("partial_rotary_factor")
    if partial is None:  # transformers: legacy qk_rope_head_dim / head_dim, else 64 / 512
        partial = d["qk_rope_head_dim"] / cfg.head_dim if d.get("qk_rope_head_dim") else 64 / 512
    cfg.partial_rotary_factor = float(partial)
    # the shared expert is moe_intermediate_size wide (transformers reads it as intermediate_size)
    cfg.intermediate_size = cfg.shared_expert_intermediate_size = cfg.moe_intermediate_size
    cfg.num_kv_heads = 1  # one shared key=value head
    rd = cfg.rotary_dim
    if rd % 2 or rd > cfg.head_dim or (CSA in cfg.layer_types and rd > cfg.index_head_dim):
        raise ModelLoadError(f"{source}: the rotary dims ({rd}) must be even and fit head_dim / index_head_dim")
    if cfg.o_groups < 1 or cfg.num_heads % cfg.o_groups:
        raise ModelLoadError(f"{source}: o_groups={cfg.o_groups} must divide num_attention_heads={cfg.num_heads}")
    if cfg.hc_mult < 1 or not cfg.q_lora_rank or not cfg.sliding_window:
        raise ModelLoadError(f"{source}: deepseek_v4 needs hc_mult >= 1, q_lora_rank and sliding_window")


def write(cfg, d: dict) -> None:
    """The DeepSeek-V4 keys transformers writes (inverse of `check`)."""
    d["scoring_func"] = {v: k for k, v in _SCORING.items()}[cfg.router_scoring]
    d.pop("intermediate_size", None)  # transformers maps it onto moe_intermediate_size
    d["partial_rotary_factor"] = cfg.partial_rotary_factor
    d["qk_rope_head_dim"] = cfg.rotary_dim
    rope = {"rope_theta": cfg.rope_theta, "partial_rotary_factor": cfg.partial_rotary_factor}
    d["rope_parameters"] = {"main": {"rope_type": "default", **rope},
                            "compress": {"rope_type": "default", **(cfg.compress_rope_scaling or {}), **rope,
                                         "rope_theta": cfg.compress_rope_theta}}


AT, CP, IX = L + "attn.", L + "attn.compressor.", L + "attn.indexer."
WEIGHTS = {
    "lm_head.weight": ("rename", ["head.weight"]),
    "hc_head.fn": ("rename", ["model.hc_head.hc_fn"]),
    "hc_head.base": ("rename", ["model.hc_head.hc_base"]),
    "hc_head.scale": ("rename", ["model.hc_head.hc_scale"]),
    "layers.{i}.attn_norm.weight": ("rename", [L + "attn_norm.weight"]),
    "layers.{i}.mlp_norm.weight": ("rename", [L + "ffn_norm.weight"]),
    **{f"layers.{{i}}.{ours}_hc.{p}": ("rename", [L + f"hc_{theirs}_{p}"])
       for ours, theirs in (("attn", "attn"), ("mlp", "ffn")) for p in ("fn", "base", "scale")},
    **{f"layers.{{i}}.attn.{ours}": ("rename", [AT + theirs]) for ours, theirs in (
        ("q_a_proj.weight", "wq_a.weight"), ("q_a_norm.weight", "q_norm.weight"), ("q_b_proj.weight", "wq_b.weight"),
        ("kv_proj.weight", "wkv.weight"), ("kv_norm.weight", "norm.weight"), ("o_a_proj.weight", "wo_a.weight"),
        ("o_b_proj.weight", "wo_b.weight"), ("sinks", "attn_sink"))},
    **{f"layers.{{i}}.attn.{part}.{ours}": ("rename", [src + theirs]) for part, src in (
        ("compressor", CP), ("indexer.compressor", IX + "compressor.")) for ours, theirs in (
        ("kv_proj.weight", "wkv.weight"), ("gate_proj.weight", "wgate.weight"), ("position_bias", "ape"),
        ("kv_norm.weight", "norm.weight"))},
    "layers.{i}.attn.indexer.q_b_proj.weight": ("rename", [IX + "wq_b.weight"]),
    "layers.{i}.attn.indexer.weights_proj.weight": ("rename", [IX + "weights_proj.weight"]),
    "layers.{i}.mlp.router.weight": ("rename", [L + "ffn.gate.weight"]),
    "layers.{i}.mlp.router.expert_bias": ("rename", [L + "ffn.gate.bias"]),
    "layers.{i}.mlp.router.tid2eid": ("rename", [L + "ffn.gate.tid2eid"]),
    "layers.{i}.mlp.gate_up_proj": ("stack", [L + "ffn.experts.{e}.w1.weight", L + "ffn.experts.{e}.w3.weight"]),
    "layers.{i}.mlp.down_proj": ("stack", [L + "ffn.experts.{e}.w2.weight"]),
    "layers.{i}.mlp.shared.gate_up_proj.weight": (
        "concat", [L + "ffn.shared_experts.w1.weight", L + "ffn.shared_experts.w3.weight"]),
    "layers.{i}.mlp.shared.down_proj.weight": ("rename", [L + "ffn.shared_experts.w2.weight"]),
}

FAMILIES = (Family(
    model_type="deepseek_v4", hf_class="DeepseekV4ForCausalLM", section=DeepseekV4Section,
    hf_keys={  # defaults: transformers' DeepseekV4Config
        "n_routed_experts": ("num_experts", 256),
        "num_experts_per_tok": ("num_experts_per_tok", 6),
        "moe_intermediate_size": ("moe_intermediate_size", 2048),
        "n_shared_experts": ("n_shared_experts", 1),
        "routed_scaling_factor": ("routed_scaling_factor", 1.5),
        "scoring_func": ("router_scoring", "sqrtsoftplus"),  # spelled "sqrtsoftplus" in HF (`check`)
        "norm_topk_prob": ("norm_topk_prob", True),
        "swiglu_limit": ("swiglu_limit", 10.0),
        "q_lora_rank": ("q_lora_rank", 1024),
        "o_groups": ("o_groups", 8),
        "o_lora_rank": ("o_lora_rank", 1024),
        "layer_types": ("layer_types", None),
        "mlp_layer_types": ("mlp_layer_types", None),
        "compress_rates": ("compress_rates", None),
        "compress_rope_theta": ("compress_rope_theta", 160000.0),
        "sliding_window": ("sliding_window", 128),
        "hc_mult": ("hc_mult", 4),
        "hc_sinkhorn_iters": ("hc_sinkhorn_iters", 20),
        "hc_eps": ("hc_eps", 1e-6),
        "index_n_heads": ("index_n_heads", 64),
        "index_head_dim": ("index_head_dim", 128),
        "index_topk": ("index_topk", 512),
    },
    # transformers' V4 routers always renormalise the top-k weights, whatever norm_topk_prob says
    fixed={"expert_bias": True, "norm_topk_prob": True, "expert_act": "swiglu_limit"},
    extra_hf_keys=_LEGACY, moe_layers="all", check=check, write=write, weights=WEIGHTS, mtp="prefixed",
    layer="vf.models.deepseek_v4:DeepseekV4Layer", model="vf.models.deepseek_v4:DeepseekV4Model",
),)
