"""Qwen3.8 Flash Next (`qwen4_exp_text`, transformers' Qwen4ExpForCausalLM) against transformers on a
random-initialised tiny config: fp32 logits (also with eos tokens inside the row, which cut the
n-gram history), packed rows, cached decode, the engine's greedy continuation and log-probs, HF round
trip, each mechanism mattering, broken checkpoints and configs, and vf-train. The vision-language
checkpoint (`qwen4_exp`, Qwen4ExpForConditionalGeneration) on text prompts: the same checks, and
image inputs refused.

The QSA indexer's block scores tie exactly whenever every index head's ReLU is 0; transformers
resolves such ties by torch.topk's order on each query's own scores, and so does ours (qsa.top_blocks).
These configs use 8 index heads (few ties); tests/test_indexed_selection_qsa.py sweeps the selection
with 1 and 2 heads, where ties reach the k-th place in most rows."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen4ExpTextConfig"):
    pytest.skip("transformers without qwen4_exp", allow_module_level=True)

from test_models_families import (
    check_cached_decode,
    check_engine_greedy,
    check_logits_parity,
    check_packed_rows,
    check_refused,
    check_round_trip,
    check_vf_train,
    save_with_tiny_tokenizer,
)
from test_models_parity import hf_logits
from vf.models import ModelConfig, ModelLoadError, build_model, load_model, save_hf

V, EOS = 512, 2  # the built-in tiny tokenizer's vocabulary and eos, so the checkpoint also runs under vf-train
# one layer of each kind (a linear layer with PLE, an indexed one, a linear one without PLE); 3 gated
# residual streams; QSA: 2 blocks of 4 tokens per query (budget 8) of up to 10 blocks in 40 tokens, so
# the selection drops keys; 4 experts, top 2, a gated shared expert; n-gram tables of primes >= 300
# split in 3 checkpoint shards; half rotary (the index head gets rope on its first 8 dims)
CONFIG = {
    "vocab_size": V, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "layer_types": ["linear_attention", "indexed_attention", "linear_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
    "hc_count": 3, "hc_lowrank": 8, "ple_layer_ids": [1], "ple_embed_dim": 32, "ngram_size": 3,
    "heads_per_ngram": 2, "ngram_vocab_size_base": 300, "make_ngram_vocab_size_divisible_by": 16,
    "split_ngram_parts": 3, "indexer_n_heads": 8, "indexer_kv_heads": 1, "indexer_head_dim": 16,
    "indexer_budget": 8, "indexer_compress_ratio": 4, "eos_token_id": EOS, "max_position_embeddings": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}
IDS = torch.randint(3, V, (2, 40), generator=torch.Generator().manual_seed(1))


def build(out, seed=0, **overrides):
    """A random tiny Qwen4ExpForCausalLM checkpoint in `out` with the tiny tokenizer; returns the HF model.
    transformers zero-inits the (1 + w) norms and the PLE conv: randomised so every tensor matters."""
    cfg = transformers.Qwen4ExpTextConfig(**{k: v for k, v in {**CONFIG, **overrides}.items() if v is not None})
    torch.manual_seed(seed)
    hf = transformers.Qwen4ExpForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)
            elif name.endswith("gate.weight"):
                p.normal_(0, 0.2)
            else:
                p.normal_(0, 0.1)
    hf.config._attn_implementation = "eager"
    return save_with_tiny_tokenizer(hf, out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen4_exp")
    return build(d), d


def test_qwen4_exp_logits_match_transformers_both_moe_impls(saved):
    check_logits_parity("qwen4_exp_text", *saved, IDS)


def test_qwen4_exp_eos_inside_rows_matches_transformers(saved):
    """eos tokens inside a row end the n-gram history there (transformers' rule): same logits."""
    hf, d = saved
    ids = IDS.clone()
    ids[0, [5, 6, 20]] = EOS
    ids[1, 30] = EOS
    with torch.no_grad():
        assert (load_model(d).compute_logits(ids) - hf_logits(hf, ids)).abs().max().item() <= 1e-4


def test_qwen4_exp_packed_rows_match_separate_documents(saved):
    check_packed_rows(load_model(saved[1]), IDS)


def test_qwen4_exp_cache_decode_matches_full_forward(saved):
    """Prefill then single tokens through a cache: blocks close mid-decode, the PLE conv and n-gram
    history and the DeltaNet state carry over."""
    check_cached_decode(load_model(saved[1]), IDS, prefill=13)


def test_qwen4_exp_engine_greedy_equals_transformers_generate_and_logprobs(saved):
    # k, v (2 kv heads x 16), the raw index key (1 x 16) and the rope (1 x 2·8); 13 and 5 prompt tokens + 20: blocks close
    # during decode and the top-2 selection starts dropping blocks
    check_engine_greedy(*saved, [IDS[0, :13].tolist(), IDS[1, :5].tolist()], [(2, 16), (2, 16), (1, 16), (1, 16)],
                        new_tokens=20)


def test_qwen4_exp_round_trip_bit_exact_and_loadable_by_transformers(saved, tmp_path):
    check_round_trip(*saved, tmp_path, IDS)
    from safetensors.torch import load_file

    shards = [k for k in load_file(tmp_path / "model.safetensors") if "ngram_embedding.shard_" in k]
    assert len(shards) == 3


def test_qwen4_exp_selection_drops_keys_and_each_mechanism_matters(saved):
    """Each late query of the indexed layer attends to 2 complete blocks plus its tail; switching the
    selection, the PLE, or the residual gating off moves the logits."""
    model = load_model(saved[1])
    attn = model.layers[1].attn
    seen = {}
    hook = attn.register_forward_hook(lambda m, a, out: seen.__setitem__("x", a[0]))  # returns None: keeps out
    with torch.no_grad():
        base = model.compute_logits(IDS)
        hook.remove()
        x, pos = seen["x"], torch.arange(40).expand(2, 40)
        cos, sin = model.rotary(pos, torch.float32)
        iq, ik = attn.indexer.project(x, cos, sin)
        keep = attn.indexer.select(iq, ik, pos, cos, sin)
        assert keep.sum(-1)[0].tolist() == [min(t + 1, 8 + (t + 1) % 4) for t in range(40)]
        assert not (keep & ~torch.ones(40, 40, dtype=torch.bool).tril()).any()  # causal

        def moved(change, undo):
            change()
            out = model.compute_logits(IDS)
            undo()
            assert torch.equal(model.compute_logits(IDS), base)
            return (out - base).abs().max().item()

        assert moved(lambda: setattr(attn, "sparse", False), lambda: setattr(attn, "sparse", True)) > 1e-3
        ple = model.layers[0].ple
        assert moved(lambda: setattr(model.layers[0], "ple", None), lambda: setattr(model.layers[0], "ple", ple)) > 1e-3
        w = model.layers[2].mlp_hc.block_inject_weight.weight
        kept = w.clone()
        assert moved(lambda: w.zero_(), lambda: w.copy_(kept)) > 1e-3


def test_qwen4_exp_checkpoint_that_does_not_match_its_config_is_refused(saved, tmp_path):
    from safetensors.torch import load_file

    d = saved[1]
    tensors = load_file(d / "model.safetensors")
    mults = "model.layers.0.ple.ple_embedding.layer_multipliers"
    cases = {
        "missing": ({k: v for k, v in tensors.items() if "indexer.index_qk_proj" not in k}, "indexer.index_qk_proj"),
        "no_table": ({k: v for k, v in tensors.items() if "ngram_embedding.shard_" not in k}, "shard_0"),
        "short_table": ({k: v for k, v in tensors.items() if "ngram_embedding.shard_2" not in k}, "ple.ngram.weight"),
        "extra": ({**tensors, "model.layers.1.ple.key_proj.weight": torch.zeros(2)}, "layers.1.ple.key_proj"),
        "misshapen": ({**tensors, "model.layers.1.attn_hyper_connection.block_inject_weight.weight":
                       torch.zeros(2, 192)}, "attn_hc.block_inject_weight"),
        "other_hash": ({**tensors, mults: tensors[mults] + 2}, "layer_multipliers"),
    }
    check_refused(d, tmp_path, cases)
    cfg = json.loads((d / "config.json").read_text())
    assert ModelConfig.from_hf_dict({**cfg, "layer_types": ["linear_attention", "full_attention",
                                                            "linear_attention"]}).layer_types[1] == "indexed_attention"
    for bad, match in (({"output_gate_type": "sigmoid"}, "output_gate_type"),
                       ({"ple_layer_ids": [2]}, "ple_layer_ids"),
                       ({"indexer_budget": 6}, "indexer_budget"),
                       ({"indexer_kv_heads": 2}, "indexer_kv_heads"),
                       ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention"]}, "layer_types")):
        with pytest.raises(ModelLoadError, match=match):
            ModelConfig.from_hf_dict({**cfg, **bad})
    with pytest.raises(ModelLoadError, match="indexer_budget"):
        ModelConfig.from_hf_dict({k: v for k, v in cfg.items() if k != "indexer_budget"})


def test_qwen4_exp_native_build_saves_and_reloads(saved, tmp_path):
    """A random native build (its n-gram tables rebuilt after the meta-device construction) saves and
    reloads to the same logits, and transformers reads it to the same logits too."""
    model = build_model(load_model(saved[1]).config, seed=3)
    save_hf(model, tmp_path)
    hf = transformers.Qwen4ExpForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ours = model.compute_logits(IDS)
        assert torch.equal(load_model(tmp_path).compute_logits(IDS), ours)
        assert (hf_logits(hf, IDS) - ours).abs().max().item() <= 1e-4


def test_qwen4_exp_activation_checkpointing_same_loss_and_grads(saved):
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
    assert "layers.0.ple.ngram.weight" in out[False][1] and "layers.1.attn.indexer.index_qk_proj.weight" not in out[False][1]


# ---- a sweep of configs against transformers --------------------------------------------------------
# transformers' Qwen4ExpTextConfig defaults with only the sizes shrunk (and the QSA sizes, which have
# none): 4 streams, trigrams with 8 heads per order, ple_embed_dim = hidden, 512 checkpoint shards for
# a table of fewer rows (torch.chunk then writes fewer), full rotary, conv kernel 4
SHRUNK = {
    "vocab_size": V, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "layer_types": ["linear_attention", "indexed_attention"], "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8, "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24, "hc_lowrank": 8,
    "ple_layer_ids": [1], "ngram_vocab_size_base": 300, "indexer_n_heads": 8, "indexer_kv_heads": 1,
    "indexer_head_dim": 16, "indexer_budget": 8, "indexer_compress_ratio": 4, "eos_token_id": EOS,
    "max_position_embeddings": 256,
}
SWEEP = {
    "shrunk_defaults": {},
    "budget_above_prompt": {"indexer_budget": 64},  # every complete block selected
    "single_token_blocks": {"indexer_compress_ratio": 1, "indexer_budget": 5},
    "no_ple": {"ple_layer_ids": []},
    "fourgrams_two_ple_layers": {"num_hidden_layers": 3, "ple_layer_ids": [1, 2], "ngram_size": 4,
                                 "heads_per_ngram": 2, "ple_embed_dim": 48, "ple_conv_kernel_size": 2,
                                 "layer_types": ["linear_attention", "linear_attention", "indexed_attention"]},
    "default_pattern_eos_list": {"num_hidden_layers": 4, "layer_types": None, "eos_token_id": [EOS, 3]},
    "tied_half_rotary_two_streams": {"tie_word_embeddings": True, "hc_count": 2, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
}
SWEEP_IDS = torch.randint(3, V, (2, 48), generator=torch.Generator().manual_seed(2))


def build_shrunk(out, seed=4, **overrides):
    """`build` on SHRUNK (transformers' defaults, sizes shrunk) plus `overrides`; a None value leaves
    that setting at transformers' default."""
    overrides = {**SHRUNK, **overrides}
    return build(out, seed, **{k: None for k in CONFIG if k not in overrides}, **overrides)


@pytest.mark.parametrize("case", list(SWEEP))
def test_qwen4_exp_sweep_matches_transformers(case, tmp_path):
    """Each config: logits, packed rows, cached decode, and a bit-exact round trip of the checkpoint."""
    from safetensors.torch import load_file

    hf = build_shrunk(tmp_path / "hf", **SWEEP[case])
    model = load_model(tmp_path / "hf")
    with torch.no_grad():
        diff = (model.compute_logits(SWEEP_IDS) - hf_logits(hf, SWEEP_IDS)).abs().max().item()
    assert diff <= 1e-4, f"{case}: max abs logit diff {diff}"
    check_packed_rows(model, SWEEP_IDS)
    check_cached_decode(model, SWEEP_IDS, prefill=37)
    save_hf(model, tmp_path / "ours")
    a, b = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "ours" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_qwen4_exp_layers_refuse_context_parallel_slices(saved):
    """A PLE layer (conv, n-gram history) and a QSA layer (blocks over the whole row) cannot run on a
    rank's slice: both refuse (exit 2) rather than compute as if the slice were the row."""
    from vf.models.context_parallel import ContextShard

    from vf.errors import UsageError

    model = load_model(saved[1])
    pos = torch.arange(8)[None]
    mask = ContextShard(None, 2, 0, "ring", pos).mask()
    h, (cos, sin) = torch.zeros(1, 4, 3 * 64), model.rotary(pos[:, :4], torch.float32)
    for layer, what in ((model.layers[0], "PLE"), (model.layers[1], "QSA")):
        with pytest.raises(UsageError, match=f"does not support {what}"):
            layer(h, cos, sin, mask, None, pos[:, :4], IDS[:1, :4])


@pytest.mark.slow
def test_vf_train_runs_rl_steps_on_qwen4_exp(saved, tmp_path):
    check_vf_train(saved[1], tmp_path)


# ---- the vision-language checkpoint (Qwen4ExpForConditionalGeneration) on text prompts ----------------
VL_TEXT = {k: v for k, v in CONFIG.items() if k != "rope_parameters"} | {
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True,
                        "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5}}
VL_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
             "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 16}
VL_TOKENS = {"image_token_id": 500, "video_token_id": 501, "vision_start_token_id": 502, "vision_end_token_id": 503}


@pytest.fixture(scope="module")
def saved_vl(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen4_exp_vl")
    cfg = transformers.Qwen4ExpConfig(text_config=VL_TEXT, vision_config=VL_VISION, **VL_TOKENS)
    torch.manual_seed(1)
    hf = transformers.Qwen4ExpForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.uniform_(-0.5, 0.5) if "norm" in name else p.normal_(0, 0.2 if name.endswith("gate.weight") else 0.1)
    hf.config._attn_implementation = hf.config.text_config._attn_implementation = "eager"
    return save_with_tiny_tokenizer(hf, d), d


def test_qwen4_exp_vl_text_prompts_match_transformers_round_trip_and_engine(saved_vl, tmp_path):
    hf, d = saved_vl
    model = load_model(d)
    assert type(model).__name__ == "Qwen4ExpVLModel" and model.config.vl_architecture == "qwen4_exp"
    with torch.no_grad():
        assert (model.compute_logits(IDS) - hf_logits(hf, IDS)).abs().max().item() <= 1e-4
    check_packed_rows(model, IDS)
    save_hf(model, tmp_path)
    from safetensors.torch import load_file

    orig, ours = load_file(d / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert orig.keys() == ours.keys() and all(torch.equal(orig[k], ours[k]) for k in orig)
    back = transformers.Qwen4ExpForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert torch.equal(hf_logits(back, IDS), hf_logits(hf, IDS))
    check_engine_greedy(hf, d, [IDS[0, :13].tolist(), IDS[1, :5].tolist()], [(2, 16), (2, 16), (1, 16), (1, 16)], new_tokens=12)


def _image_prompt(grids, text=(5, 6), gap=(7, 8, 9), tail=(10, 11)):
    """Token ids: text, then per image <start> pads <end> and some text; and random patches."""
    ids = list(text)
    for i, (t, h, w) in enumerate(grids):
        ids += [502] + [500] * (t * h * w // 4) + [503] + list(gap if i < len(grids) - 1 else tail)
    g = torch.Generator().manual_seed(len(ids))
    return ids, torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 4 * 4, generator=g)


def test_qwen4_exp_vl_image_prompts_match_transformers(saved_vl):
    """Two images in a 33-token prompt (M-RoPE positions jump after them; QSA blocks start on image
    tokens): logits equal transformers'; without the pixels they move; a wrong image-token count is
    refused; packed with a text document it gives the documents' own logits; the engine's greedy continuation of an image prompt (beside a text one) equals
    transformers.generate."""
    import asyncio

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine
    from vf.errors import UsageError

    hf, d = saved_vl
    model = load_model(d)
    grids = [(1, 8, 8), (1, 4, 6)]
    p, px = _image_prompt(grids)
    ids = torch.tensor([p])
    kw = {"pixel_values": px, "image_grid_thw": torch.tensor(grids)}
    with torch.no_grad():
        ref = hf(input_ids=ids, mm_token_type_ids=(ids == 500).int(), **kw).logits
        out = model.compute_logits(ids, **kw)
        assert (out - ref).abs().max().item() <= 1e-4
        assert (model.compute_logits(ids) - out).abs().max().item() > 1e-3
        with pytest.raises(UsageError, match="image tokens"):
            model.compute_logits(IDS[:1, :10], **kw)  # images without their pad tokens
        text = IDS[1, :12]  # packed after the image prompt: each document as if alone
        packed, pos = torch.cat([ids[0], text])[None], torch.cat([torch.arange(len(p)), torch.arange(12)])[None]
        got = model.compute_logits(packed, pos, **kw)[0]
        sep = torch.cat([out[0], model.compute_logits(text[None])[0]])
        assert (got - sep).abs().max().item() <= 1e-5
    one = [(1, 8, 8)]
    p, px = _image_prompt(one)
    mm = {"pixel_values": px, "image_grid_thw": torch.tensor(one), "rope_delta": model.rope_delta(p, one)}
    engine = LocalEngine(model, None, max_batch=4)

    async def go():
        try:
            return await asyncio.gather(
                engine.generate_ids(p, Sampling(temperature=0.0, max_tokens=12), ignore_eos=True, mm=mm),
                engine.generate_ids(IDS[0, :7].tolist(), Sampling(temperature=0.0, max_tokens=6), ignore_eos=True))
        finally:
            await engine.close()

    seq, _ = asyncio.run(go())
    x = torch.tensor([p])
    with torch.no_grad():
        want = hf.generate(input_ids=x, pixel_values=mm["pixel_values"], image_grid_thw=mm["image_grid_thw"],
                           mm_token_type_ids=(x == 500).int(), max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert mm["rope_delta"] < 0 and seq.token_ids == want[0, len(p):].tolist()
