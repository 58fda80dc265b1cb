"""Native model config: the fields of the shared decoder and its shared mechanisms, mapped to/from HF
config.json; what differs per family comes from the family registry (models/families/).

`ModelConfig` holds what every family has (sizes, rope, norms, token ids) and the fields of mechanisms
several families share (MoE, multi-head latent attention, gated DeltaNet, indexers, hyper-connection
streams, sliding windows, vision). A family's own fields live in its spec's typed section
(`Family.section`, e.g. Nemotron-H's Mamba-2 sizes) and read and write as attributes of the config:
`cfg.mamba_num_heads` is `cfg.section.mamba_num_heads`. Behaviour per family (q/k norm, zero-centred
norms, which attention, which layers are sparse) is a property that asks the family's spec.

No torch import here. Shape legend used across models/:
  B batch, T tokens per row, H hidden_size, V vocab_size, L num_layers,
  nh num_heads, nkv num_kv_heads, hd head_dim, I intermediate_size,
  E num_experts, k num_experts_per_tok, Im moe_intermediate_size, N = B*T flattened tokens.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from functools import cache
from typing import Any

from vf.models.errors import ModelLoadError
from vf.models.families import (
    GENERIC,
    REQUIRED,
    Family,
    VisionLanguage,
    family,
    hf_keys_read,
    native_model_types,
    vision_language,
)
from vf.models.families._shared import rope_from_hf

MOE_IMPLS = ("grouped", "loop")
# HF keys this module reads for every family; everything else in an HF config.json that no family
# reads is carried through untouched (`hf_extra`).
_COMMON_HF_KEYS = {
    "model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "tie_word_embeddings", "max_position_embeddings", "attention_bias", "mlp_bias",
    "hidden_act", "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
    "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "bos_token_id", "eos_token_id", "pad_token_id",
    "dtype", "torch_dtype", "partial_rotary_factor", "quantization_config",
}


@dataclass(init=False)
class ModelConfig:
    """One model's config: the shared fields below plus `section`, its family's own fields (see the module
    doc). Built as `ModelConfig(architecture=..., **fields)` with any mix of the two."""

    architecture: str  # HF model_type of the text model (a `Family`, or any for the transformers fallback)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None or {"rope_type": "llama3" | "yarn", "factor", ...}
    partial_rotary_factor: float = 1.0  # rope on the first head_dim * factor dims (GLM-4.5: 0.5)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    mlp_bias: bool = False  # llama; nemotron_h (its MLPs, shared expert and latent MoE projections)
    use_qk_norm: bool = False  # glm4_moe (qwen3 families always have q/k norm)
    # MoE; num_experts == 0 means dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    first_k_dense_replace: int = 0  # glm4_moe / deepseek_v3: the first k layers are dense
    n_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    router_scoring: str = "softmax"  # "softmax" | "sigmoid" | "sqrt_softplus"
    router_bias: bool = False  # gpt_oss: router logits have a bias
    expert_bias: bool = False  # aux-loss-free selection bias (e_score_correction_bias)
    expert_bias_terms: bool = False  # gpt_oss: experts' gate_up/down have biases
    expert_act: str = "swiglu"  # "swiglu" | "clamped_swiglu" (gpt_oss) | "swiglu_limit" (deepseek_v4) | "relu2"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    moe_impl: str | list[str] = "grouped"  # MoE compute, one for all layers or one per decoder layer
    # multi-head latent attention (deepseek_v3)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    mlp_layer_types: list[str] | None = None  # glm_moe_dsa: per layer "dense" | "sparse"
    # indexers of sparse attention (DSA, DeepSeek-V4's compressed attention, QSA)
    index_topk: int = 0
    index_head_dim: int = 0
    index_n_heads: int = 0
    hc_mult: int = 0  # hyper-connection / gated residual streams (0: a plain residual)
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    sliding_window: int | None = None
    # per layer kind: "sliding_attention" | "full_attention", or for the hybrids "linear_attention" |
    # "full_attention" (and Nemotron-H's "moe" | "mlp" mixers), or a family's own kinds
    layer_types: list[str] | None = None
    shared_expert_intermediate_size: int = 0  # qwen3_next / nemotron_h shared expert width (else Im * n_shared)
    shared_expert_gate: bool = False  # qwen3_next: the shared expert's output times sigmoid(x·w)
    moe_latent_size: int | None = None  # nemotron_h (Super): routed experts run in this width (models/moe.py)
    linear_conv_kernel: int = 4  # gated DeltaNet (qwen3_next, qwen3_5)
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    torch_dtype: str | None = None  # dtype recorded in config.json, informational
    # vision-language models (see `_vl_from_hf`): the HF vision_config, multimodal rope, token ids
    vision: dict | None = None
    mrope_section: list[int] | None = None  # rope frequencies given to the (t, h, w) position axes
    image_token_id: int | None = None
    vl_architecture: str | None = None  # the VL model_type (a `VisionLanguage` spec) nesting the text family
    vl_extra: dict = field(default_factory=dict, repr=False)  # other top-level keys of a VL config.json
    hf_layout: str | None = None  # which of a VL checkpoint's tensor-name layouts it had (`VisionLanguage.detect`)
    hf_extra: dict = field(default_factory=dict, repr=False)  # untouched HF keys, written back by to_hf_dict
    section: Any = None  # the family's own fields (`Family.section`), an instance of that dataclass

    def __init__(self, architecture: str, section: Any = None, **kwargs: Any):
        spec = family(architecture)
        own = _section_fields(spec.section)
        values = {"architecture": architecture}
        for f in fields(self):
            if f.name in ("architecture", "section"):
                continue
            if f.name in kwargs:
                values[f.name] = kwargs.pop(f.name)
            elif f.default_factory is not MISSING:
                values[f.name] = f.default_factory()
            elif f.default is not MISSING:
                values[f.name] = f.default
            else:
                raise TypeError(f"ModelConfig() missing required argument {f.name!r}")
        unknown = sorted(set(kwargs) - own)
        if unknown:
            raise TypeError(f"ModelConfig({architecture!r}) got fields neither shared nor of its family: {unknown}")
        if section is None:
            section = spec.section(**kwargs) if spec.section is not None else None
        else:  # a config's section is its own (`dataclasses.replace` hands over the original's)
            section = replace(section, **kwargs)
        self.__dict__.update(values, section=section)

    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails: a section field
        section = self.__dict__.get("section")
        if section is not None and name in _section_fields(type(section)):
            return getattr(section, name)
        raise AttributeError(f"{self.__dict__.get('architecture')!r} config has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        section = self.__dict__.get("section")
        if name not in _SHARED_FIELDS and section is not None and name in _section_fields(type(section)):
            setattr(section, name, value)
        else:
            object.__setattr__(self, name, value)


    @property
    def family(self) -> Family:
        return family(self.architecture)

    @property
    def vl(self) -> VisionLanguage | None:
        """The vision-language spec of a config with a vision tower."""
        return vision_language(self.vl_architecture or self.architecture) if self.vision is not None else None

    @property
    def qk_norm(self) -> bool:
        return self.family.qk_norm or self.use_qk_norm

    @property
    def hybrid(self) -> bool:
        """Layers mix linear attention / SSM with full attention by `layer_types`."""
        return self.family.hybrid

    @property
    def zero_centered_norm(self) -> bool:
        """RMSNorms scale by (1 + w), w initialised to 0 (the Qwen "Next" line)."""
        return self.family.zero_centered_norm

    @property
    def attn_output_gate(self) -> bool:
        """Full attention's q_proj also emits a per-head gate: out = o_proj(attn · sigmoid(gate))."""
        return self.family.attn_output_gate

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias and self.family.o_proj_bias

    @property
    def mla(self) -> bool:
        return self.family.attention in ("mla", "dsa")

    @property
    def dsa(self) -> bool:
        return self.family.attention == "dsa"

    @property
    def attention_sinks(self) -> bool:
        return self.family.attention == "sinks"

    @property
    def rotary_dim(self) -> int:
        """Dims of each head that rope rotates (the rest pass through)."""
        if self.mla:
            return self.qk_rope_head_dim
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer_idx: int) -> bool:
        if self.num_experts <= 0:
            return False
        rule = self.family.moe_layers
        if rule == "layer_types":
            return self.layer_types[layer_idx] == "moe"
        if rule == "all":
            return True
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types[layer_idx] == "sparse"
        if rule == "first_k_dense":
            return layer_idx >= self.first_k_dense_replace
        return layer_idx not in self.mlp_only_layers and (layer_idx + 1) % self.decoder_sparse_step == 0

    def sliding_window_for(self, layer_idx: int) -> int | None:
        """Keys a query sees in a sliding layer (itself included), None for full attention."""
        if not self.sliding_window or not self.layer_types:
            return None
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None

    def moe_impl_for(self, layer_idx: int) -> str:
        impl = self.moe_impl[layer_idx] if isinstance(self.moe_impl, list) else self.moe_impl
        if impl not in MOE_IMPLS:
            raise ModelLoadError(f"unknown MoE implementation {impl!r} (layer {layer_idx})",
                                 hint=f"choose one of {', '.join(MOE_IMPLS)}")
        return impl

    def set_moe_impl(self, impl: str | list[str]) -> None:
        """Validate and set `moe_impl` (a list names one impl per decoder layer)."""
        if isinstance(impl, (list, tuple)):
            if len(impl) != self.num_layers:
                raise ModelLoadError(f"moe impl list has {len(impl)} entries, the model has {self.num_layers} layers",
                                     hint="give one of grouped|loop per decoder layer (dense layers ignore theirs)")
            impl = list(impl)
        self.moe_impl = impl
        for i in range(self.num_layers if isinstance(impl, list) else 1):
            self.moe_impl_for(i)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> ModelConfig:
        arch = d.get("model_type")
        if vision_language(arch) is not None and isinstance(d.get("text_config"), dict):
            return _vl_from_hf(cls, d, source)
        spec = family(arch) if isinstance(arch, str) else GENERIC
        if spec is GENERIC:
            archs, known = d.get("architectures"), native_model_types()
            raise ModelLoadError(
                f"{source}: unsupported architecture model_type={arch!r} (architectures={archs})",
                hint=f"supported model_type values: {', '.join(known)} ({', '.join(known.values())})",
            )
        try:
            act = d.get("hidden_act", "silu")
            if act != "silu":
                raise ModelLoadError(f"{source}: hidden_act={act!r} is not supported (only 'silu')")
            if d.get("quantization_config"):
                method = (d["quantization_config"] or {}).get("quant_method")
                raise ModelLoadError(
                    f"{source}: quantized checkpoints (quant_method={method!r}) are not supported",
                    hint="use a bf16/fp32 checkpoint (dequantize it first)",
                )
            if d.get("use_sliding_window"):
                raise ModelLoadError(
                    f"{source}: use_sliding_window=true is not supported by the native models"
                )
            theta, scaling = rope_from_hf(d, source)
            params = d.get("rope_parameters") or {}
            partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor"))
            own = _read_family_keys(spec, d)
            if spec.read is not None:
                spec.read(own, d, source)
            hidden, nh = int(d["hidden_size"]), int(d["num_attention_heads"])
            cfg = cls(**{
                "architecture": arch,
                "vocab_size": int(d["vocab_size"]),
                "hidden_size": hidden,
                "num_layers": own.pop("num_layers") if "num_layers" in own else int(d["num_hidden_layers"]),
                "num_heads": nh,
                "num_kv_heads": int(d.get("num_key_value_heads") or nh),
                "head_dim": int(d.get("head_dim") or hidden // nh),
                "intermediate_size": int(d.get("intermediate_size") or 0),
                "rms_norm_eps": float(own.pop("rms_norm_eps", d.get("rms_norm_eps", 1e-6))),
                "rope_theta": theta,
                "rope_scaling": scaling,
                "tie_word_embeddings": bool(d.get("tie_word_embeddings", False)),
                "max_position_embeddings": int(d.get("max_position_embeddings", 32768)),
                "attention_bias": bool(d.get("attention_bias", False)),
                "partial_rotary_factor": float(partial if partial is not None else spec.default_partial_rotary),
                "bos_token_id": d.get("bos_token_id"),
                "eos_token_id": d.get("eos_token_id"),
                "pad_token_id": d.get("pad_token_id"),
                "torch_dtype": d.get("dtype", d.get("torch_dtype")),
                "hf_extra": {k: copy.deepcopy(v) for k, v in d.items() if k not in _COMMON_HF_KEYS | hf_keys_read()},
                **own,
            })
            if cfg.num_experts and cfg.n_group > 1 and cfg.num_experts % cfg.n_group:
                raise ModelLoadError(f"{source}: n_group={cfg.n_group} does not divide n_routed_experts={cfg.num_experts}")
            for key in ("layer_types", "mlp_layer_types", "indexer_types"):
                value = getattr(cfg, key, None)
                if value is not None and len(value) != cfg.num_layers:
                    raise ModelLoadError(f"{source}: {key} has {len(value)} entries for {cfg.num_layers} layers")
            if spec.check is not None:
                spec.check(cfg, d, source)
            return cfg
        except KeyError as e:
            raise ModelLoadError(f"{source}: required key {e.args[0]!r} is missing") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """HF config.json dict (transformers 5 layout: `rope_parameters`; also `rope_theta` for 4.x readers)."""
        spec = self.family
        d: dict[str, Any] = copy.deepcopy(self.hf_extra)
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            rope = {**self.rope_scaling, "rope_theta": self.rope_theta}
        if self.partial_rotary_factor != 1.0 or spec.default_partial_rotary != 1.0:
            rope["partial_rotary_factor"] = self.partial_rotary_factor
        d.update(
            architectures=[spec.hf_class],
            model_type=self.architecture,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=rope,
            rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            attention_bias=self.attention_bias,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
        )
        for hf_key, (name, _default) in spec.hf_keys.items():
            d[hf_key] = copy.deepcopy(getattr(self, name))
        if spec.write is not None:
            spec.write(self, d)
        if self.torch_dtype:
            d["dtype"] = self.torch_dtype
        if self.vision is not None:
            return _vl_to_hf(self, d)
        return dict(sorted(d.items()))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SHARED_FIELDS = frozenset(f.name for f in fields(ModelConfig))


@cache
def _section_fields(section: type | None) -> frozenset[str]:
    return frozenset(f.name for f in fields(section)) if section is not None else frozenset()


def _read_family_keys(spec: Family, d: dict[str, Any]) -> dict[str, Any]:
    """{field: value} of the family's HF keys (an alias when the key is absent, else the default;
    KeyError for a missing required key), then its fixed values."""
    own: dict[str, Any] = {}
    for hf_key, (name, default) in spec.hf_keys.items():
        if d.get(hf_key) is None:
            hf_key = spec.aliases.get(hf_key, hf_key)
        if d.get(hf_key) is not None:
            own[name] = copy.deepcopy(d[hf_key])
        elif default is REQUIRED:
            raise KeyError(hf_key)
        elif default is not None:
            own[name] = copy.deepcopy(default)
    own.update(copy.deepcopy(dict(spec.fixed)))
    return own


# ---- vision-language checkpoints: config.json nests the text model under text_config -------------
def _vl_from_hf(cls, d: dict[str, Any], source: str) -> ModelConfig:
    """A VL config.json (text_config + vision_config + token ids at the top) as one flat ModelConfig:
    the text model's fields as for a text family, `vision` = the HF vision_config, `mrope_section`
    from the text rope parameters, the other top-level keys kept in `vl_extra`."""
    vl = vision_language(d["model_type"])
    if vl.read is not None:
        d = vl.read(d)
    text = copy.deepcopy(d["text_config"])
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    mrope = rope.pop("mrope_section", None)
    rope.pop("mrope_interleaved", None)
    text["rope_parameters"] = rope
    text.pop("rope_scaling", None)
    vision = d.get("vision_config")
    if not isinstance(vision, dict):
        raise ModelLoadError(f"{source}: a {d['model_type']} config needs a vision_config object")
    if d.get("image_token_id") is None:
        raise ModelLoadError(f"{source}: required key 'image_token_id' is missing")
    cfg = cls.from_hf_dict({**text, "model_type": vl.text,
                            "tie_word_embeddings": d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))},
                           source)
    if vl.mrope_section is not None:
        half = cfg.rotary_dim // 2
        cfg.mrope_section = list(mrope) if mrope is not None else list(vl.mrope_section)
        if sum(cfg.mrope_section) != half:
            raise ModelLoadError(f"{source}: mrope_section {cfg.mrope_section} must add up to rotary_dim/2 = {half}")
    cfg.vl_architecture = d["model_type"]
    cfg.vision = copy.deepcopy(vision)
    cfg.image_token_id = int(d["image_token_id"])
    owned = {"model_type", "architectures", "text_config", "vision_config", "image_token_id", "tie_word_embeddings"}
    cfg.vl_extra = {k: copy.deepcopy(v) for k, v in d.items() if k not in owned}
    if vl.check is not None:
        vl.check(cfg, d, source)
    return cfg


def _vl_to_hf(cfg: ModelConfig, text: dict[str, Any]) -> dict[str, Any]:
    """Nest the flat text dict back under text_config (inverse of `_vl_from_hf`)."""
    text.pop("architectures", None)
    vl = cfg.vl
    text["model_type"] = vl.text_config_type
    if vl.mrope_section is not None:
        text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": list(cfg.mrope_section or []),
                                   "mrope_interleaved": True}
    out = {**copy.deepcopy(cfg.vl_extra), "architectures": [vl.hf_class],
           "model_type": vl.model_type, "text_config": dict(sorted(text.items())),
           "vision_config": copy.deepcopy(cfg.vision), "image_token_id": cfg.image_token_id,
           "tie_word_embeddings": cfg.tie_word_embeddings}
    if "dtype" in text:
        out["dtype"] = text["dtype"]
    if vl.write is not None:
        vl.write(cfg, out)
    return dict(sorted(out.items()))
