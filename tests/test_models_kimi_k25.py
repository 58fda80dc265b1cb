"""Kimi K2.5 (`kimi_k25`) natively: the DeepSeek-V3 decoder (MLA, group-limited sigmoid MoE, yarn)
with the MoonViT tower and projector, against transformers' `Kimi_K25ForConditionalGeneration` on
a tiny random checkpoint (transformers' config defaults, sizes shrunk, every tensor random):
fp32 logits on text and image prompts, packed rows, the engine's greedy continuation (text and
image) and log-probs, engine vs trainer log-probs on image rollouts, the HF round trip, Kimi's
image preprocessing, broken checkpoints and inputs, and vf-train on image-colors.

The checkpoint's tokenizer is the built-in tiny one plus Kimi's media tokens; its chat template
writes `<|media_begin|>image<|media_content|><|media_pad|><|media_end|>` per image part, as Kimi's
does. (transformers' own Kimi image processor needs torchvision, absent here: the preprocessing is
checked against transformers' `navit_resize` and patch layout re-derived in `_reference_pixels`.)"""

from __future__ import annotations

import asyncio
import json
import shutil

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_models_families import (
    _train,
    check_packed_rows,
    check_refused,
    check_round_trip,
)
from test_models_families import (
    check_engine_greedy as check_text_greedy,
)
from test_vl import _image, _image_messages, check_trainer_logprobs, user_node
from vf.models import ModelLoadError, load_model
from vf.models.checkpoint import resolve_impl

MEDIA = ["<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>"]
START, PAD, END = 512, 514, 515  # <|media_begin|>, <|media_pad|>, <|media_end|> in the tokenizer below
V = 516
TEXT = {"vocab_size": V, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 256, "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "q_lora_rank": 24,
        "kv_lora_rank": 16, "qk_rope_head_dim": 8, "head_dim": 8, "qk_nope_head_dim": 12, "v_head_dim": 10,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                            "rope_theta": 10000.0, "mscale": 1.0, "mscale_all_dim": 1.0}}
VISION = {"patch_size": 4, "pos_emb_height": 6, "pos_emb_width": 6, "num_attention_heads": 2, "num_hidden_layers": 2,
          "hidden_size": 32, "intermediate_size": 64}
TOP = {"projection_hidden_size": 32, "image_token_id": PAD, "video_token_id": V, "vision_start_token_id": START,
       "vision_end_token_id": END}
PROCESSOR = {"patch_size": 4, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
IDS = torch.randint(0, START, (2, 40), generator=torch.Generator().manual_seed(1))

_RENDER = ("{%- macro render(content) -%}{%- if content is string -%}{{- content -}}{%- else -%}"
           "{%- for part in content -%}{%- if part.type == 'image_url' or part.type == 'image' -%}"
           "{{- '<|media_begin|>image<|media_content|><|media_pad|><|media_end|>' -}}{%- elif part.type == 'text' -%}"
           "{{- part.text -}}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}\n")


def save_with_kimi_tokenizer(hf, out):
    """`hf.save_pretrained(out)`, the tiny tokenizer plus Kimi's media tokens (special) and an image
    chat template, and the Kimi image processor PROCESSOR; returns `hf`."""
    from tokenizers import AddedToken
    from vf.models import tiny, tiny_vl
    from vf.models.kimi_image_processor import KimiImageProcessor

    hf.save_pretrained(out)
    tok = tiny.build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MEDIA])
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in tiny.SPECIAL + tiny.ADDED + MEDIA}
    assert [ids[t] for t in (MEDIA[0], MEDIA[2], MEDIA[3])] == [START, PAD, END]
    special = set(tiny.SPECIAL + MEDIA)
    template = _RENDER + tiny_vl.CHAT_TEMPLATE.split("{%- endmacro -%}\n", 1)[1]
    tiny._write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "chat_template": template,
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": t in special} for t, i in ids.items()},
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 256,
        "pad_token": "<|endoftext|>", "split_special_tokens": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None, "image_token": "<|media_pad|>"})
    tiny._write_json(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    tiny._write_json(out / "generation_config.json", {"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
                                                      "do_sample": True})
    tiny._write_json(out / "preprocessor_config.json", KimiImageProcessor.from_config(PROCESSOR).to_config())
    return hf


def build_kimi(out, seed: int = 0, top=None):
    """A random tiny transformers Kimi K2.5 saved in `out`: every parameter random (transformers
    zero/one-inits norms, biases, the router and the position table) and the selection bias too;
    the derived buffers (rotary frequencies, the frame sinusoids) stay as transformers computes them."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    torch.manual_seed(seed)
    hf = AutoModelForImageTextToText.from_config(
        AutoConfig.for_model("kimi_k25", text_config=TEXT, vision_config=VISION, **{**TOP, **(top or {})})).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5, generator=g)
            elif "embed_tokens" in name:  # a residual stream of unit scale; a tied head keeps logits O(10)
                p.normal_(0, 0.25, generator=g)
            elif name.endswith(("bias", "gate.weight")):
                p.normal_(0, 0.2, generator=g)
            else:
                p.normal_(0, 0.1, generator=g)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.3, 0.3, generator=g)
    hf.set_attn_implementation("eager")
    return save_with_kimi_tokenizer(hf, out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("kimi_k25")
    return build_kimi(d), d


def prompt(grids, text=(5, 6), gap=(7, 8, 9), tail=(10, 11)):
    ids = list(text)
    for i, (t, h, w) in enumerate(grids):
        ids += [START] + [PAD] * (h * w // 4) + [END] + list(gap if i < len(grids) - 1 else tail)
    return ids


def pixels(grids, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(t * h * w for t, h, w in grids), 3, 4, 4, generator=g)


def test_config_reads_the_nested_deepseek_v3_and_writes_it_back(saved):
    _, d = saved
    assert resolve_impl(d) == "native"
    ours = load_model(d)
    c = ours.config
    assert c.architecture == "deepseek_v3" and c.vl_architecture == "kimi_k25" and c.mla and c.mrope_section is None
    out = c.to_hf_dict()
    theirs = json.loads((d / "config.json").read_text())
    assert out["model_type"] == "kimi_k25" and out["text_config"]["model_type"] == "deepseek_v3"
    assert "mrope_section" not in out["text_config"]["rope_parameters"]
    for key in ("vision_config", "image_token_id", "video_token_id", "projection_hidden_size", "tie_word_embeddings"):
        assert out[key] == theirs[key], key


def test_logits_equal_transformers_on_text_and_image_prompts(saved):
    hf, d = saved
    ours = load_model(d)
    grids = [(1, 8, 8), (1, 4, 6)]
    ids = torch.tensor([prompt(grids)])
    kw = {"pixel_values": pixels(grids), "image_grid_thw": torch.tensor(grids)}
    errs = {}
    with torch.no_grad():
        for impl in ("loop", "grouped"):
            ours.set_moe_impl(impl)
            errs[f"image/{impl}"] = (hf(input_ids=ids, **kw).logits - ours.compute_logits(ids, **kw)).abs().max().item()
            errs[f"text/{impl}"] = (hf(input_ids=IDS).logits - ours.compute_logits(IDS)).abs().max().item()
        # placeholders without pixels embed as token 0 (as transformers); the images must matter
        errs["no pixels"] = (hf(input_ids=ids).logits - ours.compute_logits(ids)).abs().max().item()
        moved = (ours.compute_logits(ids) - ours.compute_logits(ids, **kw)).abs().max().item()
    print("kimi_k25 max abs logit diffs:", errs)
    assert all(e < 1e-4 for e in errs.values()), errs
    assert moved > 1e-2


def test_a_non_square_image_and_a_video_clip_through_the_tower_equal_transformers(saved):
    """Grids other than the position table's, and a two-frame clip (frame sinusoids, frame pooling)."""
    hf, d = saved
    ours = load_model(d)
    grids = torch.tensor([[1, 10, 4], [2, 4, 6]])
    x = pixels(grids.tolist(), 3)
    with torch.no_grad():
        ref = hf.model.get_image_features(x, grids).pooler_output
        got = ours.image_embeds(x, grids)
    assert (torch.cat(ref) - got).abs().max().item() < 1e-5


def test_packed_rows_equal_separate_documents(saved):
    ours = load_model(saved[1])
    check_packed_rows(ours, IDS)
    a, b = [(1, 4, 4)], [(1, 8, 4)]
    ids_a, ids_b = prompt(a), prompt(b, text=(3,))
    pa, pb = pixels(a, 1), pixels(b, 2)
    with torch.no_grad():
        sep_a = ours.compute_logits(torch.tensor([ids_a]), pixel_values=pa, image_grid_thw=torch.tensor(a))
        sep_b = ours.compute_logits(torch.tensor([ids_b]), pixel_values=pb, image_grid_thw=torch.tensor(b))
        pos = torch.tensor([list(range(len(ids_a))) + list(range(len(ids_b)))])
        packed = ours.compute_logits(torch.tensor([ids_a + ids_b]), pos, pixel_values=torch.cat([pa, pb]),
                                     image_grid_thw=torch.tensor(a + b))
    err = max((packed[0, :len(ids_a)] - sep_a[0]).abs().max().item(), (packed[0, len(ids_a):] - sep_b[0]).abs().max().item())
    assert err < 1e-5


def test_engine_greedy_equals_transformers_generate_on_text_and_image_prompts(saved):
    hf, d = saved
    check_text_greedy(hf, d, [IDS[0, :9].tolist(), IDS[1, :4].tolist()], [(1, 16), (1, 8)])  # the MLA latent cache
    ids = check_image_greedy(d, hf, text=IDS[0, :9].tolist())
    first = ids.index(PAD)
    assert ids.count(PAD) == 16  # a 32x32 image: 8x8 patches of 4 pixels, 2x2 merged
    assert ids[first + 16] == END and ids[first - 1] == START + 1 and START in ids[first - 8:first]  # <|media_begin|>image<|media_content|>


def check_image_greedy(path, hf, text=None, new_tokens=12) -> list[int]:
    """test_vl.check_engine_greedy for a model whose generate takes no mm_token_type_ids: the embedded
    engine's greedy continuation of an image chat prompt (and, batched beside it, of the text-only
    prompt `text`) equals `hf.generate`'s; returns the image prompt's ids."""
    from vf.engines.base import Sampling
    from vf.engines.chat import render_multimodal
    from vf.engines.local import LocalEngine

    engine = LocalEngine.from_model(str(path))
    messages, _ = _image_messages()
    ids, mm = render_multimodal(engine.tokenizer, engine.model, messages)
    greedy = Sampling(temperature=0.0, max_tokens=new_tokens)
    prompts = [(ids, mm)] + ([(list(text), None)] if text else [])

    async def go():
        try:
            return await asyncio.gather(*[engine.generate_ids(p, greedy, ignore_eos=True, mm=m) for p, m in prompts])
        finally:
            await engine.close()

    seqs = asyncio.run(go())
    with torch.no_grad():
        ref = hf.generate(input_ids=torch.tensor([ids]), pixel_values=mm["pixel_values"], image_grid_thw=mm["image_grid_thw"],
                          max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
        assert seqs[0].token_ids == ref[0, len(ids):].tolist()
        if text:
            ref = hf.generate(input_ids=torch.tensor([text]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
            assert seqs[1].token_ids == ref[0, len(text):].tolist()
    return ids


def test_trainer_logprobs_equal_engine_on_image_rollouts(saved):
    check_trainer_logprobs(saved[1])


def test_round_trip_bit_exact_and_loadable_by_transformers(saved, tmp_path):
    from vf.models.image_processor import ImageProcessor
    from vf.models.kimi_image_processor import KimiImageProcessor

    hf, d = saved
    check_round_trip(hf, d, tmp_path, IDS)
    ours, theirs = (json.loads(p.read_text()) for p in (tmp_path / "config.json", d / "config.json"))
    assert ours["text_config"]["model_type"] == "deepseek_v3" and ours["vision_config"] == theirs["vision_config"]
    proc = ImageProcessor.from_dir(tmp_path)  # the Kimi processor travels with the checkpoint
    assert isinstance(proc, KimiImageProcessor) and proc == KimiImageProcessor.from_config(PROCESSOR)


def test_moonshot_released_names_load_and_save_back_as_released(saved, tmp_path):
    """Moonshot's checkpoints name three prefixes differently from transformers' save (`layers` for
    `blocks`, `vision_tower.patch_embed`, `mm_projector.pre_norm`): they load to the same model, save
    back under the released names bit-exact, and transformers loads that save to identical logits."""
    from safetensors.torch import load_file, save_file
    from vf.models import save_hf
    from vf.models.families.kimi_k25 import released

    hf, d = saved
    tensors = load_file(d / "model.safetensors")
    mine = {released(k): v for k, v in tensors.items()}
    assert sum(k != released(k) for k in tensors) > 20 and "language_model.model.layers.1.mlp.gate.weight" in mine
    shutil.copytree(d, tmp_path / "released")
    save_file(mine, tmp_path / "released" / "model.safetensors")
    ours = load_model(tmp_path / "released")
    a, b = load_model(d).state_dict(), ours.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    save_hf(ours, tmp_path / "resaved")
    back = load_file(tmp_path / "resaved" / "model.safetensors")
    assert back.keys() == mine.keys() and all(torch.equal(back[k], mine[k]) for k in mine)
    reloaded = type(hf).from_pretrained(tmp_path / "resaved").eval()
    reloaded.set_attn_implementation("eager")
    grids = [(1, 8, 8)]
    kw = {"input_ids": torch.tensor([prompt(grids)]), "pixel_values": pixels(grids), "image_grid_thw": torch.tensor(grids)}
    with torch.no_grad():
        assert torch.equal(reloaded(**kw).logits, hf(**kw).logits)


def test_moonshot_config_json_reads_as_transformers_config(saved, tmp_path):
    """Moonshot's own config.json (its remote code's names: media_placeholder_token_id, vt_* and
    init_pos_emb_* vision keys, mm_hidden_size / projector_ln_eps) with the released tensor names gives
    transformers' logits; its save keeps those names, and loads again to the same logits."""
    from safetensors.torch import load_file, save_file
    from vf.models import save_hf
    from vf.models.families.kimi_k25 import MOONSHOT_VISION_KEYS, released

    hf, d = saved
    cfg = json.loads((d / "config.json").read_text())
    theirs = {ours: theirs for theirs, ours in MOONSHOT_VISION_KEYS.items()}
    vision = {theirs.get(k, k): v for k, v in cfg["vision_config"].items()}
    vision.update(mm_hidden_size=cfg.pop("projection_hidden_size"), projector_ln_eps=cfg.pop("projection_layer_norm_eps"))
    cfg.update(vision_config=vision, media_placeholder_token_id=cfg.pop("image_token_id"))
    shutil.copytree(d, tmp_path / "moonshot")
    (tmp_path / "moonshot" / "config.json").write_text(json.dumps(cfg))
    save_file({released(k): v for k, v in load_file(d / "model.safetensors").items()}, tmp_path / "moonshot" / "model.safetensors")
    grids = [(1, 8, 8), (1, 4, 6)]
    ids = torch.tensor([prompt(grids)])
    kw = {"pixel_values": pixels(grids), "image_grid_thw": torch.tensor(grids)}
    ours = load_model(tmp_path / "moonshot")
    with torch.no_grad():
        ref = hf(input_ids=ids, **kw).logits
        assert (ours.compute_logits(ids, **kw) - ref).abs().max().item() < 1e-4
        save_hf(ours, tmp_path / "resaved")
        saved_cfg = json.loads((tmp_path / "resaved" / "config.json").read_text())
        assert saved_cfg["vision_config"] == vision and saved_cfg["media_placeholder_token_id"] == PAD
        assert (load_model(tmp_path / "resaved").compute_logits(ids, **kw) - ref).abs().max().item() < 1e-4


def _hf_navit_resize():
    """transformers' `navit_resize`, compiled from its module's source (importing the module needs torchvision)."""
    import ast
    import math
    import pathlib

    src = pathlib.Path(transformers.__file__).parent / "models" / "kimi_k25" / "image_processing_kimi_k25.py"
    fn = next(n for n in ast.parse(src.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "navit_resize")
    scope = {"math": math}
    exec(compile(ast.Module([fn], []), str(src), "exec"), scope)  # noqa: S102 (transformers' own source, pinned by the venv)
    return scope["navit_resize"]


def _reference_pixels(image, patch=4, merge=2, max_patches=16384, max_side=512):
    """transformers' Kimi_K25ImageProcessor, for images that need no shrinking (the only step that
    needs torchvision): its own navit_resize sizes, zero padding right and bottom, the fused
    rescale+normalise in float32 torch, and its patchify."""
    x = torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1)
    (h, w), (ph, pw) = _hf_navit_resize()(x.shape[1], x.shape[2], patch, merge, max_patches, max_side)
    assert (h, w) == tuple(x.shape[1:])  # no resize
    x = torch.nn.functional.pad(x, (0, pw - w, 0, ph - h)).float()
    mean, std = torch.tensor([0.5] * 3) * (1 / (1 / 255)), torch.tensor([0.5] * 3) * (1 / (1 / 255))
    x = (x - mean[:, None, None]) / std[:, None, None]
    gh, gw = ph // patch, pw // patch
    return x.reshape(3, gh, patch, gw, patch).permute(1, 3, 0, 2, 4).reshape(gh * gw, 3, patch, patch), (1, gh, gw)


def test_image_processor_pads_to_whole_merge_blocks_as_transformers():
    from vf.models.kimi_image_processor import KimiImageProcessor, navit_resize

    proc = KimiImageProcessor.from_config(PROCESSOR)
    images = [_image(32, 32), _image(13, 7, 1, "L"), _image(30, 9, 2)]
    out = proc(images)
    refs = [_reference_pixels(im) for im in images]
    assert out["image_grid_thw"].tolist() == [list(g) for _, g in refs] == [[1, 8, 8], [1, 2, 4], [1, 4, 8]]
    assert np.array_equal(out["pixel_values"], torch.cat([r for r, _ in refs]).numpy())
    assert [proc.grid(*im.size) for im in images] == [tuple(g) for _, g in refs]
    # shrinking: transformers' sizes (the pixels are Pillow's bicubic, see KimiImageProcessor)
    big = KimiImageProcessor.from_config({**PROCESSOR, "max_patches": 64})
    theirs = _hf_navit_resize()
    for h, w, max_patches, max_side in [(200, 90, 64, 512), (37, 53, 16384, 512), (1000, 30, 16384, 40), (5, 3, 4, 2)]:
        assert navit_resize(h, w, 4, 2, max_patches, max_side) == theirs(h, w, 4, 2, max_patches, max_side)
    (_, _), (ph, pw) = theirs(200, 90, 4, 2, 64, 512)
    assert big([_image(90, 200, 3)])["image_grid_thw"].tolist() == [[1, ph // 4, pw // 4]]
    assert big([_image(90, 200, 3)])["pixel_values"].shape == (ph * pw // 16, 3, 4, 4)


def test_moonshot_media_proc_cfg_is_read(tmp_path):
    """Moonshot's preprocessor_config.json (custom code: `media_proc_cfg`) gives the same processor."""
    from vf.models.image_processor import ImageProcessor
    from vf.models.kimi_image_processor import KimiImageProcessor

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": {
        "in_patch_limit": 64, "patch_size": 4, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "merge_kernel_size": 2, "fixed_output_tokens": None, "patch_limit_on_one_side": 40,
        "in_patch_limit_each_frame": 4096}, "auto_map": {"AutoProcessor": "kimi_k25_processor.KimiK25Processor"}}))
    got = ImageProcessor.from_dir(tmp_path)
    assert got == KimiImageProcessor.from_config({**PROCESSOR, "max_patches": 64, "size": {"max_height": 40, "max_width": 40}})


def test_checkpoint_with_a_missing_or_misshapen_key_exits_2(saved, tmp_path):
    """Refused by load_model and by vf-train (exit 2) with the key named, never half-loaded."""
    from safetensors.torch import load_file

    _, d = saved
    tensors = load_file(d / "model.safetensors")
    tower = "vision_tower.encoder.blocks.1.wqkv.weight"
    proj = "mm_projector.proj.0.weight"
    expert = "language_model.model.blocks.1.mlp.experts.3.up_proj.weight"
    assert {tower, proj, expert} <= tensors.keys()
    check_refused(d, tmp_path, {
        "missing": ({k: v for k, v in tensors.items() if k != tower}, tower),
        "misshapen": ({**tensors, proj: torch.zeros(3, 3)}, "mm_projector.proj.0.weight"),
        "no_expert": ({k: v for k, v in tensors.items() if k != expert}, expert),
    })
    proc = _train("-o", str(tmp_path / "run"), "--model", str(tmp_path / "missing"), "--steps", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert tower in proc.stderr and "Traceback" not in proc.stderr


def test_configs_it_cannot_run_are_refused(saved, tmp_path):
    from vf.models import ModelConfig

    cfg = json.loads((saved[1] / "config.json").read_text())
    for change, words in {"projection_hidden_size": (64, "projection_hidden_size 64"),
                          "merge_kernel_size": ([2, 1], "not square"),
                          "quantization_config": ({"quant_method": "compressed-tensors"}, "quantized")}.items():
        bad = json.loads(json.dumps(cfg))
        (bad["vision_config"] if change == "merge_kernel_size" else bad)[change] = words[0]
        with pytest.raises(ModelLoadError, match=words[1]):
            ModelConfig.from_hf_dict(bad)
    with pytest.raises(ModelLoadError, match="text_config of model_type 'qwen3'"):
        ModelConfig.from_hf_dict({**cfg, "text_config": {**cfg["text_config"], "model_type": "qwen3"}})
    kimi_k2 = ModelConfig.from_hf_dict({**cfg, "text_config": {**cfg["text_config"], "model_type": "kimi_k2"}})
    assert kimi_k2.architecture == "deepseek_v3"  # the released files' name for it, as transformers reads it


def test_bad_images_and_placeholder_mismatches_name_the_message(saved):
    """The local engine refuses an image that does not decode (BadImage: its episode fails); the
    vLLM path's request builder, with Kimi's processor and placeholder, names the message of a bad
    image, and of a prompt whose placeholders and images differ in number (UnsupportedContent: the
    run stops, exit 2)."""
    from vf.engines.chat import render_multimodal
    from vf.engines.local import LocalEngine
    from vf.engines.vllm_images import ImageSpec, image_request
    from vf.errors import EngineError

    engine = LocalEngine.from_model(str(saved[1]))
    messages, _ = _image_messages()
    bad_url = "data:image/png;base64,aGVsbG8="
    bad = [messages[0], {"role": "assistant", "content": "ok"},
           {"role": "user", "content": [{"type": "image_url", "image_url": {"url": bad_url}}]}]
    with pytest.raises(EngineError, match="cannot be decoded") as e:
        render_multimodal(engine.tokenizer, engine.model, bad)
    assert e.value.type == "BadImage"
    spec = ImageSpec.from_dir(saved[1])
    assert spec.image_token_id == PAD and spec.tokens(32, 32) == 16 and spec.tokens(30, 9) == 8
    req = image_request(engine.tokenizer, spec, messages)
    assert req.expanded_ids == render_multimodal(engine.tokenizer, engine.model, messages)[0]
    with pytest.raises(EngineError, match=r"message 2, image 1: the image cannot be decoded"):
        image_request(engine.tokenizer, spec, bad)
    smuggled = [messages[0], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "a <|media_pad|> b"}]
    with pytest.raises(EngineError, match=r"message 2: the prompt shows 2 image placeholder\(s\) for 1 image") as e:
        image_request(engine.tokenizer, spec, smuggled)
    assert e.value.type == "UnsupportedContent"
    # more images than placeholders: this chat template writes none for an assistant message's image
    dropped = [messages[0], {"role": "assistant", "content": [{"type": "text", "text": "ok"}, messages[0]["content"][1]]},
               {"role": "user", "content": "more"}]
    with pytest.raises(EngineError, match=r"message 1: the prompt shows 1 image placeholder\(s\) for 2 image") as e:
        image_request(engine.tokenizer, spec, dropped)
    assert e.value.type == "UnsupportedContent"
    asyncio.run(engine.close())


@pytest.mark.matrix  # vf-train on kimi_k25 runs by default in test_vf_train_on_image_colors_learns
def test_vf_train_runs_rl_steps_on_text_prompts(saved, tmp_path):
    """test_models_families.check_vf_train's run (the default taskset, text prompts, grouped experts)
    after one SFT warm-up step: a random model earns no reward there, the warm-up gives it loss tokens."""
    run = tmp_path / "run"
    proc = _train("-o", str(run), "--model", str(saved[1]), "--warmup.steps", "1", "--steps", "3",
                  "--batch-size", "8", "--group-size", "4", "--eval.at-start", "false", "--eval.at-end", "false",
                  "--seed", "7", "--trainer.threads", "1", "--model.moe.impl", "grouped")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["warmup", "rl", "rl", "rl"]  # --steps counts the RL steps
    assert rows[0]["num_loss_tokens"] > 0 and rows[0]["grad_norm"] > 0
    assert all(np.isfinite(r["loss"]) and 0 < r["moe/routing_confidence"] <= 1 for r in rows)
    assert abs(rows[1]["mismatch_kl"]) < 1e-6  # engine and trainer agree on the first RL step's samples
    print("kimi_k25 text run:", [(r["phase"], r["loss"], r.get("reward"), r.get("mismatch_kl")) for r in rows])


@pytest.mark.slow
def test_vf_train_on_image_colors_learns(saved, cli, tmp_path):
    """vf-train on image-colors: 12 SFT warm-up steps on image prompts (gradients through the
    experts, MoonViT and the projector; the loss falls), then 12 RL steps on image rollouts with
    MoE metrics, everything finite, and the reward rises (mean of the last six RL steps over the
    first six: about 0.23 against 0.07 when measured)."""
    out = tmp_path / "run"
    cli("vf-train", "-m", str(saved[1]), "--taskset", "image-colors", "--batch-size", "32", "--group-size", "8",
        "--sampling.max-tokens", "3", "--warmup.steps", "12", "--steps", "12", "--async.deterministic", "true",
        "--async.level", "0", "--seed", "3", "--trainer.threads", "1", "--eval.at-start", "false",
        "--eval.at-end", "false", "-o", str(out), check=True, timeout=600)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    warm, rl = [r for r in rows if r["phase"] == "warmup"], [r for r in rows if r["phase"] == "rl"]
    assert len(warm) == 12 and len(rl) == 12
    assert warm[-1]["loss"] < 0.2 * warm[0]["loss"] and all(r["grad_norm"] > 0 for r in warm)
    assert all(np.isfinite(r["loss"]) and 0 < r["moe/routing_confidence"] <= 1 for r in rows)
    rewards = [r["reward"] for r in rl]
    print("kimi_k25 image-colors RL rewards:", rewards)
    assert np.mean(rewards[6:]) > np.mean(rewards[:6]) + 0.05
    episode = json.loads((out / "traces.jsonl").read_text().splitlines()[0])
    assert user_node(episode)["token_ids"].count(PAD) == 16  # a 32x32 image
    assert user_node(episode)["message"]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
