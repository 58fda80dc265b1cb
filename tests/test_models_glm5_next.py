"""GLM-5.3 (`glm5_next`, transformers' Glm5NextForConditionalGeneration) against transformers, on
random tiny configs shrunk from transformers' Glm5NextTextConfig defaults: fp32 logits (both MoE
paths), packed rows, cached decode, the engine's greedy continuation and log-probs, the HF round trip
(vision tower weights included), each mechanism mattering, broken checkpoints and configs, vf-train;
and images end to end: logits through the vision tower, GLM's image preprocessing (pixel-exact against
transformers' PIL backend), the engine's greedy continuation of an image chat prompt, engine vs
trainer log-probs on image rollouts, packed image documents, bad images, vf-train on image-colors.
Every tensor is random (transformers zero/one-inits the k-pool ape and gate, norms, biases, the
expert-selection bias and A_log), so each one reaches the logits.

The checkpoint's tokenizer is the built-in tiny one plus GLM's image/video tokens (special); its
chat template writes `<|begin_of_image|><|image|><|end_of_image|>` per image part, as GLM's does,
and the directory holds transformers' own Glm5NextImageProcessorPil config.

The indexer's top-k has no defined order for exactly tied pool scores (every index head's ReLU at 0):
the configs use 8 index heads so that no tie reaches the k-th place in these rows. The untuned case
(4 index heads, ties at the k-th place, transformers' ties in CUDA's order) is swept in
tests/test_indexed_selection.py."""

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Glm5NextForConditionalGeneration"):
    pytest.skip("transformers without glm5_next", allow_module_level=True)

from test_hf_fallback import build_conditional_generation
from test_models_families import (
    check_cached_decode,
    check_engine_greedy,
    check_logits_parity,
    check_packed_rows,
    check_refused,
    check_round_trip,
    check_vf_train,
)
from test_models_parity import hf_logits
from test_vl import (
    _image,
    _image_messages,
    check_packed,
    check_trainer_logprobs,
    train_on_image_colors,
    user_node,
)
from vf.models import ModelConfig, ModelLoadError, build_model, load_model, save_hf

# the built-in tiny tokenizer's 512 tokens, then GLM's image and video tokens (see save_with_glm_tokenizer)
GLM_TOKENS = ["<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]
START, END, IMAGE = 512, 513, 514
V = 512 + len(GLM_TOKENS)
# transformers' defaults with the sizes shrunk: a KDA layer, a full indexed layer, a "shared" indexed
# layer reusing its selection, a KDA layer; dense then sparse MLPs (4 experts, top 2, a shared expert),
# 4 hyper-connection streams; k-pools of 4 tokens, top-8 = 2 pools per query (of up to 10 in 40 tokens)
TEXT = {"vocab_size": V, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 16, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 16, "v_head_dim": 16,
        "index_topk": 8, "index_kpool": 4, "index_head_dim": 16, "index_n_heads": 8, "linear_head_dim": 16,
        "linear_num_heads": 4, "max_position_embeddings": 256, "pad_token_id": 0,
        "layer_types": ["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"],
        "indexer_types": ["full", "full", "shared", "full"], "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]}
VISION = {"depth": 1, "hidden_size": 32, "num_heads": 2, "image_size": 16, "patch_size": 4, "out_hidden_size": 64,
          "intermediate_size": 64, "projection_intermediate_size": 64}
TOP = {"image_token_id": IMAGE, "video_token_id": 517, "image_start_token_id": START, "image_end_token_id": END,
       "video_start_token_id": 515, "video_end_token_id": 516}
# transformers' defaults (CLIP mean/std, temporal 2) with 4-pixel patches and a 4..64-token budget
PROCESSOR = {"patch_size": 4, "merge_size": 2, "temporal_patch_size": 2, "min_image_tokens": 4, "max_image_tokens": 64}
IDS = torch.randint(3, 500, (2, 40), generator=torch.Generator().manual_seed(1))

_RENDER = ("{%- macro render(content) -%}{%- if content is string -%}{{- content -}}{%- else -%}"
           "{%- for part in content -%}{%- if part.type == 'image_url' or part.type == 'image' -%}"
           "{{- '<|begin_of_image|><|image|><|end_of_image|>' -}}{%- elif part.type == 'text' -%}"
           "{{- part.text -}}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}\n")


def save_with_glm_tokenizer(hf, out):
    """`hf.save_pretrained(out)`, the tiny tokenizer plus GLM_TOKENS (special) with an image chat
    template (tiny-vl's, GLM's image markup), and transformers' Glm5NextImageProcessorPil(PROCESSOR)."""
    from tokenizers import AddedToken
    from transformers.models.glm5_next.image_processing_pil_glm5_next import Glm5NextImageProcessorPil
    from vf.models import tiny, tiny_vl

    hf.save_pretrained(out)
    Glm5NextImageProcessorPil(**PROCESSOR).save_pretrained(out)
    tok = tiny.build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GLM_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in tiny.SPECIAL + tiny.ADDED + GLM_TOKENS}
    assert [ids[t] for t in GLM_TOKENS] == list(range(512, V))
    special = set(tiny.SPECIAL + GLM_TOKENS)
    template = _RENDER + tiny_vl.CHAT_TEMPLATE.split("{%- endmacro -%}\n", 1)[1]
    tiny._write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "chat_template": template,
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": t in special} for t, i in ids.items()},
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 256,
        "pad_token": "<|endoftext|>", "split_special_tokens": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None, "image_token": "<|image|>", "video_token": "<|video|>"})
    tiny._write_json(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    tiny._write_json(out / "generation_config.json", {"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
                                                      "do_sample": True})
    return hf


def build(out, seed=0, drop=(), **text):
    """A random tiny Glm5NextForConditionalGeneration checkpoint in `out` (tiny tokenizer), the text
    config's `drop` keys left to transformers' defaults; returns the HF model."""
    hf = build_conditional_generation("glm5_next", out, seed, save=save_with_glm_tokenizer,
                                      configs=({k: v for k, v in {**TEXT, **text}.items() if k not in drop}, VISION, TOP))
    hf.config._attn_implementation = hf.config.text_config._attn_implementation = "eager"
    return hf


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("glm5_next")
    return build(d), d


def test_glm5_next_logits_match_transformers_both_moe_impls(saved):
    check_logits_parity("glm5_next", *saved, IDS)


def test_glm5_next_packed_rows_match_separate_documents(saved):
    """Pools, KDA state, conv windows and hyper-connection streams restart at each document."""
    check_packed_rows(load_model(saved[1]), IDS)


def test_glm5_next_cache_decode_matches_full_forward(saved):
    """Prefill then single tokens: pools complete during decode, the KDA state carries over."""
    check_cached_decode(load_model(saved[1]), IDS, prefill=13)


def test_glm5_next_engine_greedy_equals_transformers_generate_and_logprobs(saved):
    # the MLA latent (16), the index key and gate logits (16 each); prompts of 13 and 5 tokens + 20
    check_engine_greedy(*saved, [IDS[0, :13].tolist(), IDS[1, :5].tolist()], [(1, 16), (1, 16), (1, 16)],
                        new_tokens=20)


def test_glm5_next_round_trip_bit_exact_and_loadable_by_transformers(saved, tmp_path):
    check_round_trip(*saved, tmp_path, IDS)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "glm5_next" and cfg["text_config"]["model_type"] == "glm5_next_text"
    assert cfg["vision_config"]["depth"] == 1 and cfg["image_start_token_id"] == START
    # GLM's image processor travels with the checkpoint, and transformers reads what we write alike
    from transformers.models.glm5_next.image_processing_pil_glm5_next import Glm5NextImageProcessorPil
    from vf.models.glm5_image_processor import Glm5ImageProcessor
    from vf.models.image_processor import ImageProcessor

    ours = ImageProcessor.from_dir(tmp_path)
    assert isinstance(ours, Glm5ImageProcessor) and ours == ImageProcessor.from_dir(saved[1])
    image = _image(53, 37)
    assert np.array_equal(Glm5NextImageProcessorPil.from_pretrained(tmp_path)([image], return_tensors="np")["pixel_values"],
                          ours([image])["pixel_values"])


def test_glm5_next_selection_drops_keys_and_each_mechanism_matters(saved):
    """Each late query attends to 2 complete pools plus its tail (fewer than the keys it may see);
    switching off the selection, the indexer's pooling gate, the per-channel decay or the streams'
    mixing moves the logits (so the parity above would notice each being wrong)."""
    model = load_model(saved[1])
    attn = model.layers[1].attn
    with torch.no_grad():
        base = model.compute_logits(IDS)
        sel = attn.selection[:, 0]  # [B, T, T]
        assert sel.sum(-1)[0].tolist() == [min(t + 1, 8 + (t + 1) % 4) for t in range(40)]
        assert not (sel & ~torch.ones(40, 40, dtype=torch.bool).tril()).any()
        assert torch.equal(model.layers[2].attn.source[0].selection, attn.selection)  # the shared layer's

        def moved(change, undo):
            change()
            out = model.compute_logits(IDS)
            undo()
            assert torch.equal(model.compute_logits(IDS), base)
            return (out - base).abs().max().item()

        assert moved(lambda: setattr(attn, "sparse", False), lambda: setattr(attn, "sparse", True)) > 1e-3
        shared = model.layers[2].attn
        assert moved(lambda: setattr(shared, "sparse", False), lambda: setattr(shared, "sparse", True)) > 1e-3
        for p in (attn.indexer.index_kpool_compress_gate, attn.indexer.index_kpool_compress_ape,
                  attn.indexer.wk.weight, model.layers[0].mlp_hc.fn, model.layers[3].attn.f_b_proj.weight):
            kept = p.clone()
            assert moved(lambda p=p: p.zero_(), lambda p=p, kept=kept: p.copy_(kept)) > 1e-4
        kda = model.layers[0].attn
        decay = kda.decay
        per_head = lambda x: decay(x).mean(-1, keepdim=True).expand(-1, -1, -1, kda.d)
        assert moved(lambda: setattr(kda, "decay", per_head), lambda: setattr(kda, "decay", decay)) > 1e-4


def test_glm5_next_checkpoint_that_does_not_match_its_config_is_refused(saved, tmp_path):
    from safetensors.torch import load_file

    d = saved[1]
    tensors = load_file(d / "model.safetensors")
    p = "model.language_model.layers."
    cases = {
        "missing": ({k: v for k, v in tensors.items() if "k_conv1d" not in k}, "k_conv1d"),
        "extra": ({**tensors, p + "2.self_attn.indexer.wk.weight": torch.zeros(16, 64)}, "layers.2.self_attn.indexer.wk"),
        "misshapen": ({**tensors, p + "1.self_attn.indexer.index_kpool_compress_ape": torch.zeros(3, 16)},
                      "indexer.index_kpool_compress_ape"),
        "vision": ({k: v for k, v in tensors.items() if "visual.merger.proj" not in k}, "visual.merger.proj"),
    }
    check_refused(d, tmp_path, cases)
    # the multi-token-prediction layer after the last decoder layer is skipped, as transformers does
    import shutil

    from safetensors.torch import save_file

    mtp = tmp_path / "mtp"
    shutil.copytree(d, mtp)
    save_file({**tensors, p + "4.eh_proj.weight": torch.zeros(2, 2), p + "3.shared_head.norm.weight": torch.ones(2)},
              mtp / "model.safetensors")
    assert load_model(mtp).config.num_layers == 4


def test_glm5_next_configs_transformers_would_not_run_are_refused(saved):
    cfg = json.loads((saved[1] / "config.json").read_text())
    text = cfg["text_config"]
    for bad, match in (({"index_kpool": 3}, "multiple of index_kpool"),
                       ({"index_kpool_always_select_tail": False}, "always_select_tail"),
                       ({"indexer_types": ["full", "shared", "full", "full"]}, "layer 1 reuses"),
                       ({"qk_rope_head_dim": 8}, "NoPE"),
                       ({"num_key_value_heads": 2}, "num_key_value_heads"),
                       ({"layer_types": ["linear_attention", "sliding_attention", "indexed_attention",
                                         "linear_attention"]}, "layer_types")):
        with pytest.raises(ModelLoadError, match=match):
            ModelConfig.from_hf_dict({**cfg, "text_config": {**text, **bad}})
    with pytest.raises(ModelLoadError, match="without a text_config"):
        ModelConfig.from_hf_dict({**{k: v for k, v in cfg.items() if k != "text_config"}, **text,
                                  "model_type": "glm5_next"})
    # what transformers derives when config.json leaves it out
    drop = ("layer_types", "mlp_layer_types", "indexer_types", "linear_lower_bound")
    c = ModelConfig.from_hf_dict({**cfg, "text_config": {k: v for k, v in text.items() if k not in drop}})
    assert c.layer_types == ["linear_attention"] * 3 + ["indexed_attention"]
    assert c.mlp_layer_types == ["dense"] * 3 + ["sparse"] and c.indexer_types == ["full"] * 4
    assert c.linear_lower_bound == -5.0
    legacy = {"linear_attn_config": {"head_dim": 16, "num_heads": 4, "gate_lower_bound": None, "safe_gate": False}}
    assert ModelConfig.from_hf_dict({**cfg, "text_config": {**text, **legacy}}).linear_lower_bound is None


def _image_prompt(grids, text=(5, 6), gap=(7, 8, 9), tail=(10, 11)):
    """Token ids: text, then per image <start> pads <end> and some text; and random patches."""
    ids = list(text)
    for i, (t, h, w) in enumerate(grids):
        ids += [START] + [IMAGE] * (t * h * w // 4) + [END] + list(gap if i < len(grids) - 1 else tail)
    g = torch.Generator().manual_seed(len(ids))
    return ids, torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 4 * 4, generator=g)


def test_glm5_next_image_prompts_match_transformers(saved):
    """Two images (8x8 and 4x6 patches) in a 33-token prompt: logits equal transformers' (the vision
    tower's rope, q/k norms, merge conv and clipped SwiGLU merger); without the pixels they move; a
    wrong image-token count and video inputs are refused; packed with a text document it gives the
    documents' own logits."""
    from vf.errors import UsageError

    hf, d = saved
    model = load_model(d)
    grids = [(1, 8, 8), (1, 4, 6)]
    p, px = _image_prompt(grids)
    ids = torch.tensor([p])
    kw = {"pixel_values": px, "image_grid_thw": torch.tensor(grids)}
    with torch.no_grad():
        out = model.compute_logits(ids, **kw)
        assert (out - hf(input_ids=ids, **kw).logits).abs().max().item() <= 1e-4
        assert (model.compute_logits(ids) - out).abs().max().item() > 1e-3
        with pytest.raises(UsageError, match="image tokens"):
            model.compute_logits(IDS[:1, :10], **kw)
        with pytest.raises(UsageError, match="video inputs"):
            model.compute_logits(ids, pixel_values_videos=px)
        text = IDS[1, :12]
        packed, pos = torch.cat([ids[0], text])[None], torch.cat([torch.arange(len(p)), torch.arange(12)])[None]
        got = model.compute_logits(packed, pos, **kw)[0]
        sep = torch.cat([out[0], model.compute_logits(text[None])[0]])
        assert (got - sep).abs().max().item() <= 1e-5


def _hf_pil_processor(**kw):
    from transformers.models.glm5_next.image_processing_pil_glm5_next import Glm5NextImageProcessorPil

    return Glm5NextImageProcessorPil(**{**PROCESSOR, **kw})


def test_glm5_next_image_processor_equals_transformers():
    """Pixel values and grids equal transformers' Glm5NextImageProcessorPil exactly: images inside the
    budget (padded to whole merge blocks), over it (shrunk, then padded), under the token floor
    (enlarged), grey and extreme aspects, and transformers' defaults; its sizing function agrees on
    a sweep; `grid` (the engine's token count) agrees with transformers' own count."""
    from transformers.models.glm5_next.image_processing_pil_glm5_next import smart_resize
    from vf.models.glm5_image_processor import Glm5ImageProcessor, glm_smart_resize
    from vf.models.image_processor import ImageProcessor

    images = [_image(53, 37), _image(16, 16, 1, "L"), _image(90, 200, 2), _image(8, 500, 3), _image(3, 2, 4),
              _image(1, 300, 5), _image(640, 480, 6), _image(32, 32, 7)]
    for kw in ({}, {"min_image_tokens": 30, "max_image_tokens": 40}, {"patch_size": 14, "min_image_tokens": 16,
                                                                         "max_image_tokens": 8000}):
        theirs = _hf_pil_processor(**kw)
        ours = ImageProcessor.from_config(theirs.to_dict())  # the family's processor, found by the config's type
        assert isinstance(ours, Glm5ImageProcessor) and ours.max_image_tokens == theirs.max_image_tokens
        want, got = theirs(images, return_tensors="np"), ours(images)
        assert got["image_grid_thw"].tolist() == want["image_grid_thw"].tolist(), kw
        assert np.array_equal(got["pixel_values"], want["pixel_values"]), kw
        assert [list(ours.grid(*im.size)) for im in images] == want["image_grid_thw"].tolist()
        assert [ours.grid(*im.size)[1] * ours.grid(*im.size)[2] for im in images] == [
            theirs.get_number_of_image_patches(im.size[1], im.size[0]) for im in images]
    grids = ImageProcessor.from_config(_hf_pil_processor().to_dict())(images)["image_grid_thw"].tolist()
    assert grids[0] == [1, 10, 14] and grids[2] == [1, 24, 10] and grids[4] == [1, 4, 6]  # padded, shrunk, enlarged
    rng = np.random.default_rng(0)
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(1, 3000, 2))
        f, lo = int(rng.choice([8, 28, 56])), int(rng.integers(0, 64))
        hi = lo + int(rng.integers(1, 9000))
        assert glm_smart_resize(h, w, f, 2, lo, hi) == smart_resize(2, h, w, 2, f, lo, hi), (h, w, f, lo, hi)
    assert Glm5ImageProcessor.from_config(Glm5ImageProcessor().to_config()) == Glm5ImageProcessor()
    assert type(ImageProcessor.from_config({"image_processor_type": "Qwen2VLImageProcessor"})) is ImageProcessor
    with pytest.raises(ModelLoadError, match="max_image_tokens"):
        Glm5ImageProcessor.from_config({**_hf_pil_processor().to_dict(), "max_image_tokens": 0})


def test_glm5_next_engine_greedy_on_an_image_prompt_equals_transformers_generate(saved):
    """The chat template's `<|begin_of_image|><|image|><|end_of_image|>` expands to the image's 16
    tokens (32x32 pixels, 4-pixel patches, 2x2 merged); the engine (KDA state, MLA latent and index
    caches after an image prefill), batched with a text prompt, continues as transformers.generate."""
    from test_models_kimi_k25 import check_image_greedy

    hf, d = saved
    ids = check_image_greedy(d, hf, text=IDS[0, :9].tolist())
    first = ids.index(IMAGE)
    assert ids.count(IMAGE) == 16 and ids[first - 1] == START and ids[first + 16] == END


def test_glm5_next_trainer_logprobs_equal_engine_on_image_rollouts(saved):
    err = check_trainer_logprobs(saved[1])  # three image rollouts packed in one row, within 1e-5
    print("glm5_next engine vs trainer image log-probs max abs diff:", err)


def test_glm5_next_packed_image_documents_equal_separate(saved):
    """Two image prompts in one row: each document's images, pools, KDA state and streams its own."""
    model = load_model(saved[1])
    assert model.is_multimodal and model.image_tokens((1, 8, 6)) == 12 and model.rope_delta([1, 2], [[1, 8, 6]]) == 0
    print("glm5_next packed image documents max abs diff:", check_packed(model, (IMAGE, START, END)))
    import dataclasses

    text_only = build_model(dataclasses.replace(model.config, vision=None), seed=0)
    assert not text_only.is_multimodal  # a flat (text) glm5_next config: the engine renders text only


def test_glm5_next_bad_images_and_placeholder_mismatches_name_the_message(saved):
    """An image that does not decode fails its request (BadImage: in vf-eval its episode fails); the
    vLLM path's request builder, with GLM's processor and placeholder, names the message of a bad
    image, and of a prompt whose placeholders and images differ in number (UnsupportedContent: the
    run stops, exit 2); the local engine refuses such a prompt too."""
    import asyncio

    from vf.engines.chat import render_multimodal
    from vf.engines.local import LocalEngine
    from vf.engines.vllm_images import ImageSpec, image_request
    from vf.errors import EngineError

    engine = LocalEngine.from_model(str(saved[1]))
    messages, _ = _image_messages()
    bad = [messages[0], {"role": "assistant", "content": "ok"},
           {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]}]
    with pytest.raises(EngineError, match="cannot be decoded") as e:
        render_multimodal(engine.tokenizer, engine.model, bad)
    assert e.value.type == "BadImage"
    spec = ImageSpec.from_dir(saved[1])
    assert spec.image_token_id == IMAGE and spec.tokens(32, 32) == 16 and spec.tokens(53, 37) == 35
    req = image_request(engine.tokenizer, spec, messages)
    assert req.expanded_ids == render_multimodal(engine.tokenizer, engine.model, messages)[0]
    with pytest.raises(EngineError, match=r"message 2, image 1: the image cannot be decoded"):
        image_request(engine.tokenizer, spec, bad)
    smuggled = [messages[0], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "a <|image|> b"}]
    with pytest.raises(EngineError, match=r"message 2: the prompt shows 2 image placeholder\(s\) for 1 image") as e:
        image_request(engine.tokenizer, spec, smuggled)
    assert e.value.type == "UnsupportedContent"
    # more images than placeholders: this chat template writes none for an assistant message's image
    dropped = [messages[0], {"role": "assistant", "content": [{"type": "text", "text": "ok"}, messages[0]["content"][1]]},
               {"role": "user", "content": "more"}]
    with pytest.raises(EngineError, match=r"message 1: the prompt shows 1 image placeholder\(s\) for 2 image") as e:
        image_request(engine.tokenizer, spec, dropped)
    assert e.value.type == "UnsupportedContent"
    with pytest.raises(EngineError, match=r"wrote 1 image placeholder\(s\) for 2 image"):
        render_multimodal(engine.tokenizer, engine.model, dropped)
    asyncio.run(engine.close())


@pytest.mark.slow
def test_vf_eval_bad_images_fail_their_episode_and_the_run_goes_on(saved, cli, tmp_path):
    """test_vl's four-image taskset on this checkpoint: the good image's episode runs, an URL, an
    undecodable image and a file outside the roots each fail their own episode with a BadImage."""
    from test_vl import BAD_IMAGES_ENV

    env = tmp_path / "bad_images.py"
    env.write_text(BAD_IMAGES_ENV)
    r = cli("vf-eval", str(env), "-m", str(saved[1]), "-n", "4", "-r", "1", "-o", str(tmp_path / "run"), "--json",
            "--sampling.max-tokens", "2", "--max-errors", "3")  # the three bad images fail their episodes
    assert r.returncode == 0, r.stderr[-2000:]
    episodes = {e["task"]["data"]["id"]: e for e in map(json.loads, (tmp_path / "run" / "traces.jsonl").read_text().splitlines())}
    assert episodes["bad-0"]["ok"] and user_node(episodes["bad-0"])["token_ids"].count(IMAGE) == 16
    for key, words in {"bad-1": "not read", "bad-2": "cannot be decoded", "bad-3": "outside"}.items():
        (err,) = [c["error"] for t in episodes[key]["traces"] for c in t["calls"]]
        assert not episodes[key]["ok"] and err["type"] == "BadImage" and words in err["message"], err


@pytest.mark.slow
def test_vf_train_on_image_colors_runs_on_glm5_next(saved, cli, tmp_path):
    """An SFT warm-up step on image prompts (gradients through the experts and the tower), then two RL
    steps on image rollouts with MoE metrics, every image its 16 `<|image|>` tokens."""
    rows, episodes = train_on_image_colors(cli, saved[1], tmp_path / "run", "--warmup.steps", "1", "--steps", "2",
                                           "--trainer.threads", "1")
    print("glm5_next image-colors:", [(r["phase"], r["loss"], r.get("reward")) for r in rows])
    assert [r["phase"] for r in rows] == ["warmup", "rl", "rl"] and len(episodes) == 4
    assert rows[0]["num_loss_tokens"] > 0 and rows[0]["grad_norm"] > 0
    assert all(np.isfinite(r["loss"]) and 0 < r["moe/routing_confidence"] <= 1 for r in rows)
    assert all(user_node(ep)["token_ids"].count(IMAGE) == 16 for ep in episodes)


def test_glm5_next_native_build_saves_and_reloads(saved, tmp_path):
    """A random native build saves and reloads to the same logits; transformers reads it alike."""
    model = build_model(load_model(saved[1]).config, seed=3)
    save_hf(model, tmp_path)
    hf = transformers.Glm5NextForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        ours = model.compute_logits(IDS)
        assert torch.equal(load_model(tmp_path).compute_logits(IDS), ours)
        assert (hf_logits(hf, IDS) - ours).abs().max().item() <= 1e-4


def test_glm5_next_gradients_match_transformers(saved):
    """The training path: the mean next-token log-prob's gradients equal transformers' (KDA's
    per-channel chunked scan and its backward, the forget gate, MLA, the streams, router, embeddings)."""
    hf, d = saved
    model = load_model(d)
    ids = IDS[:, :36]

    def loss(logits):
        return torch.log_softmax(logits, -1)[:, :-1].gather(2, ids[:, 1:, None]).mean()

    hf.zero_grad()
    loss(hf(input_ids=ids).logits).backward()
    loss(model.compute_logits(ids)).backward()
    P, A = "model.language_model.", "model.language_model.layers.{}.self_attn."
    pairs = {"embed_tokens.weight": P + "embed_tokens.weight",
             "layers.0.attn.f_a_proj.weight": A.format(0) + "forget_gate.f_a_proj.weight",
             "layers.0.attn.A_log": A.format(0) + "forget_gate.A_log",
             "layers.3.attn.dt_bias": A.format(3) + "forget_gate.dt_bias",
             "layers.0.attn.conv_weight": A.format(0) + "conv1d.weight",
             "layers.3.attn.o_norm.weight": A.format(3) + "o_norm.weight",
             "layers.1.attn.kv_b_proj.weight": A.format(1) + "kv_b_proj.weight",
             "layers.2.attn.q_b_proj.weight": A.format(2) + "q_b_proj.weight",
             "layers.1.attn_hc.fn": P + "layers.1.attn_hc.fn",
             "layers.2.mlp_hc.scale": P + "layers.2.ffn_hc.scale",
             "layers.2.mlp.router.weight": P + "layers.2.mlp.gate.weight"}
    ours, theirs = dict(model.named_parameters()), dict(hf.named_parameters())
    for a, b in pairs.items():
        g, want = ours[a].grad, theirs[b].grad
        assert g is not None and want.abs().max() > 0, a
        assert (g - want).abs().max().item() <= 1e-5 + 1e-3 * want.abs().max().item(), a
    hf.zero_grad()


def test_glm5_next_activation_checkpointing_same_loss_and_grads(saved):
    model = load_model(saved[1])
    ids, pos = IDS[:1, :30], torch.cat([torch.arange(12), torch.arange(18)])[None]
    out = {}
    for ckpt in (False, True):
        model.zero_grad()
        model.activation_checkpointing = ckpt
        loss = torch.log_softmax(model.compute_logits(ids, pos), -1)[0, :-1].gather(1, ids[0, 1:, None]).mean()
        loss.backward()
        out[ckpt] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert out[False][0] == out[True][0] and out[False][1].keys() == out[True][1].keys()
    assert all(torch.allclose(out[False][1][n], out[True][1][n], atol=1e-7) for n in out[False][1])
    grads = out[False][1]
    assert "layers.0.attn.f_a_proj.weight" in grads and "layers.1.attn.indexer.wk.weight" not in grads


def test_glm5_next_layers_refuse_context_parallel_slices(saved):
    from vf.models.context_parallel import ContextShard

    from vf.errors import UsageError

    model = load_model(saved[1])
    pos = torch.arange(8)[None]
    mask = ContextShard(None, 2, 0, "ring", pos).mask()
    nope = torch.zeros(1, 4, 0)
    for layer, what in ((model.layers[0], "KDA"), (model.layers[1], "k-pool")):
        with pytest.raises(UsageError, match=what):
            layer.attn(torch.zeros(1, 4, 64), nope, nope, mask, None, pos[:, :4])


# ---- a sweep of configs against transformers --------------------------------------------------------
SWEEP = {
    "softplus_decay": {"linear_lower_bound": None},  # -exp(A_log)·softplus(f) instead of the lower bound
    "default_pattern_grouped_router": {"drop": ("layer_types", "indexer_types", "mlp_layer_types"),
                                       "n_routed_experts": 8, "n_group": 2, "topk_group": 1},
    "every_pool_selected": {"index_topk": 64},
    "single_token_pools": {"index_kpool": 1, "index_topk": 5},
    "two_streams_long_kernel": {"hc_mult": 2, "linear_conv_kernel_dim": 2, "hc_sinkhorn_iters": 3},
}
SWEEP_IDS = torch.randint(3, 500, (2, 70), generator=torch.Generator().manual_seed(2))  # two KDA chunks


@pytest.mark.parametrize("case", list(SWEEP))
def test_glm5_next_sweep_matches_transformers(case, tmp_path):
    """Each config: logits, packed rows, cached decode (70 tokens: the KDA scan crosses a chunk)."""
    hf = build(tmp_path / "hf", seed=4, **SWEEP[case])
    model = load_model(tmp_path / "hf")
    assert model.config.linear_lower_bound == hf.config.text_config.linear_lower_bound
    with torch.no_grad():
        diff = (model.compute_logits(SWEEP_IDS) - hf_logits(hf, SWEEP_IDS)).abs().max().item()
    assert diff <= 1e-4, f"{case}: max abs logit diff {diff}"
    check_packed_rows(model, SWEEP_IDS)
    check_cached_decode(model, SWEEP_IDS, prefill=37)


@pytest.mark.matrix  # vf-train on glm5_next runs by default in test_vf_train_on_image_colors_runs_on_glm5_next
def test_vf_train_runs_rl_steps_on_glm5_next(saved, tmp_path):
    check_vf_train(saved[1], tmp_path)
