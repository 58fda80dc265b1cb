"""Kimi K2.5 (`model_type: kimi_k25`, transformers' Kimi_K25ForConditionalGeneration): the DeepSeek-V3
text family (config.json's text_config, `model_type` deepseek_v3, or kimi_k2 in the released files)
with the MoonViT tower and projector (models/moonvit.py), the VL model models/kimi_k25.py and its own
image preprocessing (models/kimi_image_processor.py). No M-RoPE: an image's tokens take text positions.

    HF_KEYS                     top-level HF key -> default (kept in ModelConfig.vl_extra)
    with_image_token(d), projection(top, vision), MOONSHOT_VISION_KEYS
                                Moonshot's own config.json names (read as transformers' are)
    VISION_DEFAULTS             transformers' Kimi_K25VisionConfig defaults
    check(cfg, d, source)       validate a config.json read as `cfg` (raises ModelLoadError)
    WEIGHTS                     the tower's and projector's rows (models/convert.py ops)
    PROCESSOR_DEFAULTS          transformers' Kimi_K25ImageProcessor defaults
    RELEASED_PROBE, released()  Moonshot's released names (the other layout read and written)
    table(text_rows, cfg)       the whole native -> HF table
"""

from __future__ import annotations

from vf.models.errors import ModelLoadError
from vf.models.families._spec import VisionLanguage

MODEL_TYPE = "kimi_k25"
ARCHITECTURE = "Kimi_K25ForConditionalGeneration"
TEXT_TYPE = "deepseek_v3"
TEXT_TYPES_READ = ("deepseek_v3", "kimi_k2")
HF_KEYS = {"projection_hidden_size": 1152, "projection_layer_norm_eps": 1e-5, "video_token_id": 163840,
           "vision_start_token_id": 163602, "vision_end_token_id": 163604}
VISION_DEFAULTS = {"patch_size": 14, "pos_emb_height": 64, "pos_emb_width": 64, "pos_emb_time": 4,
                   "num_attention_heads": 16, "num_hidden_layers": 27, "hidden_size": 1152, "intermediate_size": 4304,
                   "hidden_act": "gelu_pytorch_tanh", "merge_kernel_size": [2, 2],
                   "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0}}
PROCESSOR_DEFAULTS = {"patch_size": 14, "merge_size": 2, "max_patches": 16384, "size": {"max_height": 512, "max_width": 512},
                      "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255,
                      "resample": 3, "do_resize": True, "do_rescale": True, "do_normalize": True}

# The names transformers' save_pretrained writes (its conversion mapping run backwards): the text
# model's under `language_model.model.` with `blocks.{i}` for `layers.{i}` (its blanket blocks->layers
# rename, reversed), the LM head `language_model.lm_head`; MoonViT and the projector under their
# released names (models/moonvit.py holds them natively), except the two its reverse mapping moves.
WEIGHTS = {"vision_tower.patch_embed.proj.{rest}": ("rename", ["vision_tower.encoder.patch_embed.proj.{rest}"]),
           "mm_projector.pre_norm.{rest}": ("rename", ["model.mm_projector.pre_norm.{rest}"]),
           "vision_tower.{rest}": ("rename", ["vision_tower.{rest}"]),
           "mm_projector.{rest}": ("rename", ["mm_projector.{rest}"])}
REST_PREFIXES = tuple(k.removesuffix("{rest}") for k in WEIGHTS)  # native names matched whole, longest first


# Moonshot's released checkpoints (what vLLM and SGLang read) differ from transformers' save in three
# prefixes; either loads, and a save writes the names the checkpoint had (`ModelConfig.hf_layout`).
_RELEASED = (("language_model.model.blocks.", "language_model.model.layers."),
             ("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed."), ("model.mm_projector.", "mm_projector."))
RELEASED_PROBE = "language_model.model.layers.0.input_layernorm.weight"  # present only in the released layout
RELEASED = "released"  # `ModelConfig.hf_layout` of a checkpoint with Moonshot's names


def released(hf: str) -> str:
    """A name as transformers' save writes it -> as Moonshot released it."""
    for theirs, ours in _RELEASED:
        if hf.startswith(theirs):
            return ours + hf.removeprefix(theirs)
    return hf


def detect(cfg, has) -> None:
    """Which layout the checkpoint has: Moonshot's released names, or transformers' save's."""
    cfg.hf_layout = RELEASED if has(RELEASED_PROBE) else None


def table(text_table: dict, cfg) -> dict:
    """The kimi_k25 weight table from the text family's (`model.` names): its rows under
    `language_model.`, plus WEIGHTS; in the released layout when the checkpoint had it."""
    released_names = cfg.hf_layout == RELEASED
    def where(hf: str) -> str:
        hf = "language_model.lm_head.weight" if hf == "lm_head.weight" else (
            "language_model.model." + hf.removeprefix("model.").replace("layers.{i}.", "blocks.{i}."))
        return released(hf) if released_names else hf

    rows = {**{k: (op, [where(s) for s in srcs]) for k, (op, srcs) in text_table.items()}, **WEIGHTS}
    return {k: (op, [released(s) if released_names else s for s in srcs]) for k, (op, srcs) in rows.items()}

# Moonshot's config.json (its remote code's KimiK25Config) names some keys otherwise; read either,
# and keep the file's own names on save so both readers still find theirs
MOONSHOT_VISION_KEYS = {"init_pos_emb_height": "pos_emb_height", "init_pos_emb_width": "pos_emb_width",
                        "init_pos_emb_time": "pos_emb_time", "vt_hidden_size": "hidden_size",
                        "vt_intermediate_size": "intermediate_size", "vt_num_attention_heads": "num_attention_heads",
                        "vt_num_hidden_layers": "num_hidden_layers"}
MOONSHOT_IMAGE_TOKEN = "media_placeholder_token_id"


def with_image_token(d: dict) -> dict:
    """config.json with `image_token_id` taken from Moonshot's `media_placeholder_token_id` when absent."""
    if d.get("image_token_id") is None and d.get(MOONSHOT_IMAGE_TOKEN) is not None:
        return {**d, "image_token_id": d[MOONSHOT_IMAGE_TOKEN]}
    return d


def projection(top: dict, vision: dict) -> tuple[int, float]:
    """(projector LayerNorm width, its eps): transformers' top-level keys, else Moonshot's vision ones."""
    hidden = top.get("projection_hidden_size") or vision.get("mm_hidden_size") or HF_KEYS["projection_hidden_size"]
    eps = top.get("projection_layer_norm_eps") or vision.get("projector_ln_eps") or HF_KEYS["projection_layer_norm_eps"]
    return int(hidden), float(eps)


def vision_settings(vision: dict) -> dict:
    """The HF vision_config (transformers' or Moonshot's names) with transformers' defaults filled in."""
    vision = {**{ours: vision[theirs] for theirs, ours in MOONSHOT_VISION_KEYS.items() if theirs in vision}, **vision}
    out = {**VISION_DEFAULTS, **{k: v for k, v in vision.items() if v is not None}}
    out["rope_parameters"] = {**VISION_DEFAULTS["rope_parameters"], **(vision.get("rope_parameters") or {})}
    return out


def check(cfg, d: dict, source: str) -> None:
    """What transformers would build but this implementation does not, or shapes that cannot fit."""
    if d.get("quantization_config"):  # top-level in a VL config.json (the released K2.5 is INT4 experts)
        method = (d["quantization_config"] or {}).get("quant_method")
        raise ModelLoadError(f"{source}: quantized checkpoints (quant_method={method!r}) are not supported",
                             hint="use a bf16/fp32 checkpoint (dequantize it first)")
    text_type = (d.get("text_config") or {}).get("model_type", TEXT_TYPE)
    if text_type not in TEXT_TYPES_READ:
        raise ModelLoadError(f"{source}: a kimi_k25 text_config of model_type {text_type!r}: "
                             f"only {', '.join(TEXT_TYPES_READ)} (DeepSeek-V3) is read")
    v = vision_settings(cfg.vision or {})
    kh, kw = (int(k) for k in v["merge_kernel_size"])
    if kh != kw:
        raise ModelLoadError(f"{source}: vision_config.merge_kernel_size {v['merge_kernel_size']} is not square "
                             "(the image processor merges merge_size × merge_size patches)")
    if v["rope_parameters"].get("rope_type", "axial") != "axial":
        raise ModelLoadError(f"{source}: vision_config rope_type {v['rope_parameters']['rope_type']!r}: MoonViT has axial rope only")
    if int(v["hidden_size"]) % int(v["num_attention_heads"]) or (int(v["hidden_size"]) // int(v["num_attention_heads"])) % 4:
        raise ModelLoadError(f"{source}: vision head_dim must be a multiple of 4 (axial rope over h and w)")
    proj, _ = projection(d, cfg.vision or {})
    if proj != int(v["hidden_size"]):
        raise ModelLoadError(f"{source}: projection_hidden_size {proj} must equal vision_config.hidden_size "
                             f"{v['hidden_size']} (the projector's LayerNorm runs on each patch)")


FAMILIES = (VisionLanguage(
    model_type=MODEL_TYPE, hf_class=ARCHITECTURE, text=TEXT_TYPE, text_config_type=TEXT_TYPE, mrope_section=None,
    model="vf.models.kimi_k25:KimiK25Model", read=with_image_token, check=check, table=table, detect=detect,
    processor="vf.models.kimi_image_processor:KimiImageProcessor",
),)
