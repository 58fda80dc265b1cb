"""The built-in tiny vision-language model `tiny-vl`: a random-init Qwen3-VL, built offline on first use.

    ensure_tiny_vl_model(path=None) -> Path   # HF directory: config.json, model.safetensors,
                                              # tokenizer files, preprocessor_config.json
    python -m vf.models.tiny_vl [--out DIR]   # build it into DIR

The text model has the shapes of `tiny` (H=128, 2 layers, 4/2 heads, hd=32, tied embeddings); the
vision tower: 2 blocks, E=64, 2 heads, 8-pixel patches, 2×2 merging, DeepStack after block 0. The
tokenizer is tiny's byte-level BPE plus the three vision tokens (`<|vision_start|>`,
`<|image_pad|>`, `<|vision_end|>`; special, so decoding skips them) and a chat template that
writes `<|vision_start|><|image_pad|><|vision_end|>` for each image part, as Qwen3-VL's does.
Images are resized to between 32×32 and 64×64 pixels: a 32×32 image is 4 text-model tokens.
Location: $VF_CACHE_DIR/tiny-qwen3-vl-<hash> (else ~/.cache/vf/...), like `tiny-random`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

from vf.models import tiny

VERSION = 1
SEED = 4321
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
VISION = {"depth": 2, "hidden_size": 64, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 128, "num_heads": 2,
          "in_channels": 3, "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
          "num_position_embeddings": 64, "deepstack_visual_indexes": [0], "model_type": "qwen3_vl_vision",
          "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0}}
PROCESSOR = {"patch_size": 8, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 32 * 32, "max_pixels": 64 * 64,
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
MROPE_SECTION = [6, 5, 5]  # head_dim/2 = 16 frequencies over (t, h, w)

_RENDER = ("{%- macro render(content) -%}{%- if content is string -%}{{- content -}}{%- else -%}"
           "{%- for part in content -%}{%- if part.type == 'image_url' or part.type == 'image' -%}"
           "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}{%- elif part.type == 'text' -%}{{- part.text -}}"
           "{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}\n")
CHAT_TEMPLATE = _RENDER + tiny.CHAT_TEMPLATE.replace(
    "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n'",
    "'<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n'").replace(
    "'<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n'",
    "'<|im_start|>system\\n' + render(messages[0].content) + '<|im_end|>\\n'")


def _recipe() -> dict:
    return {"version": VERSION, "seed": SEED, "text": tiny._recipe(), "vision": VISION, "processor": PROCESSOR,
            "mrope": MROPE_SECTION, "tokens": VISION_TOKENS, "template": CHAT_TEMPLATE}


def default_path() -> Path:
    root = os.environ.get("VF_CACHE_DIR") or Path.home() / ".cache" / "vf"
    digest = hashlib.sha256(json.dumps(_recipe(), sort_keys=True).encode()).hexdigest()[:12]
    return Path(root) / f"tiny-qwen3-vl-{digest}"


def _complete(path: Path) -> bool:
    return all((path / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json",
                                              "tokenizer_config.json", "preprocessor_config.json"))


def ensure_tiny_vl_model(path: str | os.PathLike | None = None) -> Path:
    """A directory holding tiny-vl, built first if absent (offline, about a second plus imports)."""
    return tiny.build_once(Path(path) if path is not None else default_path(), build_into, _complete)


def build_into(out: Path) -> None:
    from tokenizers import AddedToken
    from vf.models.checkpoint import save_hf
    from vf.models.config import ModelConfig
    from vf.models.image_processor import ImageProcessor
    from vf.models.transformer import build_model

    tok = tiny.build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in tiny.SPECIAL + tiny.ADDED + VISION_TOKENS}
    special = set(tiny.SPECIAL + VISION_TOKENS)
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": t in special} for t, i in ids.items()}
    tiny._write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added, "bos_token": None,
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": tiny.MODEL["max_position_embeddings"], "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": None,
        "image_token": "<|image_pad|>", "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"})
    tiny._write_json(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    tiny._write_json(out / "generation_config.json", {"eos_token_id": eos, "pad_token_id": pad, "do_sample": True})
    processor = ImageProcessor.from_config(PROCESSOR)
    tiny._write_json(out / "preprocessor_config.json", processor.to_config())

    config = ModelConfig(architecture="qwen3_vl", vocab_size=tok.get_vocab_size(), eos_token_id=eos, pad_token_id=pad,
                         bos_token_id=None, use_qk_norm=True, vision={**VISION, "out_hidden_size": tiny.MODEL["hidden_size"]},
                         mrope_section=list(MROPE_SECTION), image_token_id=ids["<|image_pad|>"],
                         vl_extra={"vision_start_token_id": ids["<|vision_start|>"],
                                   "vision_end_token_id": ids["<|vision_end|>"]},
                         **tiny.MODEL)
    save_hf(build_model(config, seed=SEED), out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="build the tiny-vl model directory")
    parser.add_argument("--out", type=Path, default=None)
    print(ensure_tiny_vl_model(parser.parse_args().out))
