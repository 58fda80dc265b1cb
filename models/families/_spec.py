"""What a family spec declares (`Family`, `VisionLanguage`); the registry is `models/families/__init__.py`.

No torch import here or in any spec module: configs are read, checked and written without it. The
model code a family composes is named by dotted path ("vf.models.hybrid:MixerLayer") and imported
only when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

REQUIRED = object()  # an `hf_keys` default: config.json must have the key

# (op, [HF name templates]) per native name template: the rows of models/convert.py's table
WeightRows = Mapping[str, tuple[str, list[str]]]


@dataclass(frozen=True)
class Family:
    """One text model family: the HF `model_type` it serves and everything that differs from the
    shared decoder (models/transformer.py) and the shared HF <-> native tables (models/config.py,
    models/convert.py).

    Config: `hf_keys` maps an HF config.json key to (field, default) — a field of `ModelConfig` (the
    shared mechanisms: MoE, MLA, DeltaNet, ...) or of `section`, a dataclass of the fields only this
    family has; `aliases` are other spellings of an hf_keys key, read when it is absent; `fixed` are
    values the family always has whatever config.json says. `read(fields, d, source)` derives fields
    before the config is built, `check(cfg, d, source)` validates (raise ModelLoadError) and derives
    after, `write(cfg, d)` adjusts the config.json dict on save.

    Model: `attention` names the full-attention mechanism ("mha" | "mla" | "dsa" | "sinks"),
    `linear_attention` the class of "linear_attention" layers, `layer` a decoder layer class that
    replaces the shared one, `model` a NativeModel subclass (all "module:Name", imported lazily).
    `moe_layers` says which layers are sparse: "sparse_step" (decoder_sparse_step / mlp_only_layers),
    "first_k_dense", "all", or "layer_types" (layers whose type is "moe"); `mlp_layer_types` overrides
    the last two. Checkpoints: `weights` override/extend the shared table (`fused_sources`: for a
"stack" row, the single tensor of every expert that transformers-5 also accepts), `derived_tensors`
    ("module:function", config -> {HF name below the model prefix: tensor}) are written on save and
    compared on load, `mtp` says where multi-token-prediction tensors sit ("prefixed": `mtp.` /
    `model.mtp.`, "appended": decoder layers past num_hidden_layers), which loading skips.
    """

    model_type: str
    hf_class: str
    section: type | None = None
    hf_keys: Mapping[str, tuple[str, Any]] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    extra_hf_keys: tuple[str, ...] = ()  # other keys the family reads (legacy spellings): never carried through
    default_partial_rotary: float = 1.0  # when config.json gives none (written back when not 1.0)
    qk_norm: bool = False
    zero_centered_norm: bool = False  # RMSNorms scale by (1 + w), w initialised to 0
    attn_output_gate: bool = False  # full attention's q_proj also emits a per-head sigmoid gate
    o_proj_bias: bool = True  # attention_bias also applies to o_proj
    attention: str = "mha"
    linear_attention: str | None = None
    hybrid: bool = False  # layers by `layer_types` mix linear attention / SSM with full attention
    moe_layers: str = "sparse_step"
    read: Callable[[dict, dict, str], None] | None = None
    check: Callable[[Any, dict, str], None] | None = None
    write: Callable[[Any, dict], None] | None = None
    weights: WeightRows = field(default_factory=dict)
    fused_sources: Mapping[str, str] = field(default_factory=dict)  # "stack" rows: the one HF tensor of all experts
    derived_tensors: str | None = None
    mtp: str | None = None
    ignore_hf: str | None = None  # regex of other HF tensor names transformers' class ignores on load
    layer: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class VisionLanguage:
    """A vision-language checkpoint: config.json nests the text model (`text`, a Family's
    model_type) under text_config next to a vision_config; tensors live under
    `model.language_model.` and `model.visual.` unless `table` says otherwise.

    `mrope_section`: transformers' M-RoPE split when the text rope parameters leave it out, None for a
    text model without M-RoPE. Hooks: `read(d) -> d` normalises the top-level keys (another
    spelling of image_token_id), `check(cfg, d, source)` validates the whole config, `write(cfg, out)`
    adjusts the nested config.json, `table(text_rows, cfg)` is the whole weight table when the
    default (text rows under the VL prefix plus the `visual.` tower) does not fit, `detect(cfg, has)`
    records on load which of several tensor layouts a checkpoint has (in `cfg.hf_layout`), `processor` is the image
    processor class ("module:Class", default models/image_processor.py's `ImageProcessor`)."""

    model_type: str
    hf_class: str
    text: str  # the native text family the text_config is read as
    text_config_type: str  # the model_type written into text_config
    mrope_section: tuple[int, ...] | None
    deepstack: bool = True  # the tower feeds DeepStack features into early decoder layers
    model: str = "vf.models.qwen3_vl:Qwen3VLModel"
    read: Callable[[dict], dict] | None = None
    check: Callable[[Any, dict, str], None] | None = None
    write: Callable[[Any, dict], None] | None = None
    table: Callable[[dict, Any], dict] | None = None
    detect: Callable[[Any, Callable[[str], bool]], None] | None = None
    processor: str | None = None
