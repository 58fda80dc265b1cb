"""The MoE / attention-variant families (glm4_moe, deepseek_v3, gpt_oss) against transformers on
random-initialised tiny configs: fp32 logits, packed rows, HF round trip, the embedded engine's
greedy continuation and log-probs, broken checkpoints; a sweep of glm_moe_dsa configs from
transformers' defaults (logits up to the order of exact top-k ties, packed rows, cached decode);
plus the MoE runtime's router features."""

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import first_then_matrix
from test_models_parity import hf_logits, make_hf
from vf.models import ModelConfig, ModelLoadError, load_model, save_hf

V = 512  # the built-in tiny tokenizer's vocabulary, so the checkpoints also run under vf-train
FAMILIES = {
    # partial rotary, qk-norm, biased q/k/v (o_proj without bias), sigmoid router with expert bias,
    # group-limited top-k, 2 shared experts, routed scaling, first layer dense
    "glm4_moe": ("Glm4Moe", {
        "num_key_value_heads": 2, "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 8,
        "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "use_qk_norm": True,
        "n_shared_experts": 2, "routed_scaling_factor": 1.7, "attention_bias": True}),
    # MLA with low-rank q, interleaved decoupled rope, yarn with mscale (softmax scale changes)
    "deepseek_v3": ("DeepseekV3", {
        "num_key_value_heads": 4, "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "q_lora_rank": 24,
        "kv_lora_rank": 16, "qk_rope_head_dim": 8, "head_dim": 8, "qk_nope_head_dim": 12, "v_head_dim": 10,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                            "rope_theta": 10000.0, "mscale": 1.0, "mscale_all_dim": 1.0}}),
    # GLM-5: MLA plus the DSA indexer; index_topk 6 < the 40-token rows, so the selection drops keys
    "glm_moe_dsa": ("GlmMoeDsa", {
        "num_key_value_heads": 4, "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "q_lora_rank": 24,
        "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 12, "v_head_dim": 10,
        "index_topk": 6, "index_head_dim": 16, "index_n_heads": 8, "routed_scaling_factor": 1.5}),
    # sinks, alternating sliding (window 5) / full layers, biased router and experts, clamped SwiGLU
    # (a low limit so the clamp matters), yarn rope
    "gpt_oss": ("GptOss", {
        "num_key_value_heads": 2, "intermediate_size": 16, "num_local_experts": 8, "num_experts_per_tok": 2,
        "sliding_window": 5, "swiglu_limit": 0.5,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                            "rope_theta": 10000.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}}),
}
IDS = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))


def build_family(family: str, out, seed: int = 0):
    """A random tiny HF checkpoint of `family` in `out`, with the tiny tokenizer; returns the HF model."""
    cls, overrides = FAMILIES[family]
    hf = make_hf(cls, {"vocab_size": V, **overrides}, seed=seed)
    with torch.no_grad():  # transformers zero-inits the selection bias (a buffer): make it matter
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.3, 0.3, generator=torch.Generator().manual_seed(seed))
        for name, p in hf.named_parameters():  # positive index-head weights, as randomize_buffers (this
            if name.endswith("indexer.weights_proj.weight"):  # config's seed has no tied top-k selection)
                p.abs_()
    return save_with_tiny_tokenizer(hf, out)


def save_with_tiny_tokenizer(hf, out):
    """`hf.save_pretrained(out)` plus the built-in tiny tokenizer's files; returns `hf`."""
    from vf.models.tiny import ensure_tiny_model

    hf.save_pretrained(out)
    tiny = ensure_tiny_model()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(tiny / f, out / f)
    return hf


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = {}
    for family in FAMILIES:
        d = tmp_path_factory.mktemp(family)
        out[family] = (build_family(family, d), d)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_logits_match_transformers_both_moe_impls(family, saved):
    check_logits_parity(family, *saved[family], IDS)


def check_logits_parity(family, hf, d, ids):
    """Our model loaded from `d` gives `hf`'s fp32 logits within 1e-4, with either MoE path."""
    native = load_model(d)
    assert native.config.architecture == family
    ref = hf_logits(hf, ids)
    for impl in ("loop", "grouped"):
        native.set_moe_impl(impl)
        with torch.no_grad():
            diff = (native.compute_logits(ids) - ref).abs().max().item()
        assert diff <= 1e-4, f"{family}/{impl}: max abs logit diff {diff}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_packed_rows_match_separate_documents(family, saved):
    check_packed_rows(load_model(saved[family][1]), IDS)


def check_packed_rows(model, ids):
    """Two documents packed into one row give the logits they give apart."""
    a, b = ids[0, :15], ids[1, :25]
    packed, pos = torch.cat([a, b])[None], torch.cat([torch.arange(15), torch.arange(25)])[None]
    with torch.no_grad():
        got = model.compute_logits(packed, pos)[0]
        sep = torch.cat([model.compute_logits(a[None])[0], model.compute_logits(b[None])[0]])
    assert (got - sep).abs().max().item() <= 1e-5


def test_family_features_matter(saved):
    """The parity above would not notice a feature that has no effect in the tiny config."""
    oss = load_model(saved["gpt_oss"][1])
    ds = load_model(saved["deepseek_v3"][1])
    with torch.no_grad():
        base = oss.compute_logits(IDS)
        oss.layers[0].attn.window = None  # sliding layer made full
        assert (oss.compute_logits(IDS) - base).abs().max().item() > 1e-3
        oss.layers[0].attn.window = 5
        oss.layers[0].mlp.limit = 1e9  # clamp off
        assert (oss.compute_logits(IDS) - base).abs().max().item() > 1e-3
        oss.layers[0].mlp.limit = 0.5
        oss.layers[1].attn.sinks.fill_(-1e4)  # sinks off
        assert (oss.compute_logits(IDS) - base).abs().max().item() > 1e-3
        base = ds.compute_logits(IDS)
        ds.layers[1].mlp.router.expert_bias.zero_()  # selection bias off
        assert (ds.compute_logits(IDS) - base).abs().max().item() > 1e-3


def test_dsa_selection_drops_keys_and_matters(saved):
    """index_topk (6) < the row length: each late query attends to exactly 6 keys, and switching the
    selection off (dense MLA over every visible key) changes the logits."""
    from vf.models.dsa import DSAttention

    model = load_model(saved["glm_moe_dsa"][1])
    attn = model.layers[0].attn
    seen = {}
    attn.register_forward_hook(lambda m, a, out: seen.setdefault("x", a[0]))
    with torch.no_grad():
        base = model.compute_logits(IDS)
        x, (cos, sin) = seen["x"], model.rotary(torch.arange(40).expand(2, 40), torch.float32)
        _, q_lat, _, _ = attn.project(x, cos, sin)
        causal = torch.ones(40, 40, dtype=torch.bool).tril()[None, None]
        picked = attn.indexer.select(x, q_lat, attn.indexer.key(x, cos, sin), cos, sin, causal)
        assert (picked & causal).sum(-1).flatten().tolist() == [min(t + 1, 6) for t in range(40)] * 2
        for m in model.modules():
            if isinstance(m, DSAttention):
                m.sparse = False
        assert (model.compute_logits(IDS) - base).abs().max().item() > 1e-3


def test_dsa_shared_indexer_layers_match_transformers(tmp_path):
    """A "shared" layer has no indexer and reuses the previous full layer's top-k (transformers'
    indexer_types); logits match transformers, and decoding through a KV cache matches the full pass."""
    from vf.models.cache import SimpleKVCache

    cls, overrides = FAMILIES["glm_moe_dsa"]
    hf = make_hf(cls, {"vocab_size": V, **overrides, "num_hidden_layers": 3,
                       "indexer_types": ["full", "shared", "full"]}, seed=3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("indexer.weights_proj.weight"):
                p.abs_()
    hf.save_pretrained(tmp_path)
    model = load_model(tmp_path)
    assert [layer.attn.indexer is None for layer in model.layers] == [False, True, False]
    with torch.no_grad():
        full = model.compute_logits(IDS)
        assert (full - hf_logits(hf, IDS)).abs().max().item() <= 1e-4
        cache = SimpleKVCache(batch=2)
        steps = [model.compute_logits(IDS[:, :30], cache=cache)]
        steps += [model.compute_logits(IDS[:, t : t + 1], cache=cache) for t in range(30, 40)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-4


# ---- indexed sparse attention against transformers on a sweep of configs ---------------------------
# transformers' defaults (GlmMoeDsaConfig) with only the sizes shrunk: one dense and one MoE layer,
# 4 index heads (few heads: exact top-k ties happen, see check_parity_up_to_ties), index_topk 8 on
# 48-token rows, 16 experts with the default 8 per token, 1 shared expert, n_group 1, default rope
DSA_SHRUNK = {
    "vocab_size": V, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
    "first_k_dense_replace": 1, "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 16,
    "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 12, "v_head_dim": 10,
    "index_head_dim": 16, "index_n_heads": 4, "index_topk": 8, "max_position_embeddings": 256,
}
DSA_SWEEP = {
    "shrunk_defaults": {},
    "topk_above_prompt": {"index_topk": 64},  # every visible key selected: dense MLA
    "shared_indexer_layers": {"num_hidden_layers": 3, "indexer_types": ["full", "shared", "full"]},
    "moe_first_then_dense": {"mlp_layer_types": ["sparse", "dense"]},
    "yarn_mscale_biased": {"attention_bias": True, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0,
        "mscale": 1.0, "mscale_all_dim": 1.0}},
    "grouped_router_unnormed": {"n_group": 4, "topk_group": 2, "num_experts_per_tok": 3, "norm_topk_prob": False,
                                "n_shared_experts": 2, "routed_scaling_factor": 1.0, "tie_word_embeddings": True},
}
SWEEP_IDS = torch.randint(0, V, (2, 48), generator=torch.Generator().manual_seed(2))


def randomize_buffers(hf, seed):
    """transformers zero-inits the expert-selection bias and the hash table (buffers the tests' make_hf
    leaves alone): random values so they matter. Index-head weights made positive: a score then ties
    only where every head's ReLU is 0 (those ties remain: see check_parity_up_to_ties)."""
    g = torch.Generator().manual_seed(seed)
    E, k = hf.config.n_routed_experts, hf.config.num_experts_per_tok
    with torch.no_grad():
        for name, b in hf.named_buffers():
            if name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(b.shape[0])]))
            elif name.endswith("e_score_correction_bias"):
                b.uniform_(-0.3, 0.3, generator=g)
        for name, p in hf.named_parameters():
            if name.endswith("weights_proj.weight"):
                p.abs_()
    return hf


def check_parity_up_to_ties(hf, d, ids, hf_indexers, native_indexers):
    """fp32 logits of our model (loaded from `d`) against `hf` for a model with top-k indexers.

    `hf_indexers`: transformers' indexer modules (forward -> top-k indices [B, T, k], -1 = none);
    `native_indexers`: ours, in the same order. An exact tie at the k-th score (every index head's
    ReLU at 0) has no defined order in transformers (torch.topk), and ours gives it to the earlier key
    (dsa.top_k_mask), so: (1) run with transformers' selections, ours gives its logits within 1e-4
    (the rest of the model agrees, ties or not); (2) in that run every key transformers selects and
    ours would not (or the reverse) scores exactly the row's k-th best: a tie, nothing else; (3) with
    no such tie, our own logits match within 1e-4 too. A later layer's selection is compared on the
    forced run because one tie resolved otherwise changes every later layer's input.
    Returns (ties, own max diff) for the caller's figures."""
    from vf.models.dsa import top_k_mask

    native = load_model(d)
    indexers = native_indexers(native)
    assert len(indexers) == len(hf_indexers) > 0
    picked = {}
    hooks = [m.register_forward_hook(lambda m, a, out, i=i: picked.__setitem__(i, out.long()))
             for i, m in enumerate(hf_indexers)]
    try:
        ref = hf_logits(hf, ids)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        own = (native.compute_logits(ids) - ref).abs().max().item()
    scores, theirs = {}, {}

    def forced(i, ix, *a):  # transformers' selection; our scores of the same (up to rounding) inputs
        s = scores[i] = type(ix).index_scores(ix, *a)  # [B, T, S], -inf where not visible
        idx = picked[i].where(picked[i] >= 0, s.shape[-1])
        theirs[i] = torch.zeros(*s.shape[:-1], s.shape[-1] + 1, dtype=torch.bool).scatter_(-1, idx, True)[..., :-1]
        return (theirs[i] & (s > float("-inf"))).view_as(type(ix).select(ix, *a))

    for i, ix in enumerate(indexers):
        ix.select = lambda *a, i=i, ix=ix: forced(i, ix, *a)
    with torch.no_grad():
        diff = (native.compute_logits(ids) - ref).abs().max().item()
    assert diff <= 1e-4, f"with transformers' selections: max abs logit diff {diff}"
    ties = 0
    for i, s in scores.items():
        k = min(indexers[i].topk, s.shape[-1])
        differ = (theirs[i] & (s > float("-inf"))) ^ top_k_mask(s, k)
        kth = s.sort(dim=-1, descending=True).values[..., k - 1 : k].expand_as(s)
        assert torch.equal(s[differ], kth[differ]), f"indexer {i}: a selection differs beyond a tie"
        ties += int(differ.any(-1).sum())
    if ties == 0:
        assert own <= 1e-4, f"no tied selections, max abs logit diff {own}"
    print(f"tied rows {ties}, own max abs logit diff {own:.1e}, with transformers' selections {diff:.1e}")
    return ties, own


def check_cached_decode(model, ids, prefill, tol=1e-5):
    """A prefill of `prefill` tokens then single tokens through a KV cache give the full forward's
    logits: the selection does not depend on the row layout, ties included."""
    from vf.models.cache import SimpleKVCache

    with torch.no_grad():
        full = model.compute_logits(ids)
        cache = SimpleKVCache(batch=ids.shape[0])
        steps = [model.compute_logits(ids[:, :prefill], cache=cache)]
        steps += [model.compute_logits(ids[:, t : t + 1], cache=cache) for t in range(prefill, ids.shape[1])]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= tol


@pytest.mark.parametrize("case", list(DSA_SWEEP))
def test_dsa_sweep_matches_transformers(case, tmp_path):
    """glm_moe_dsa on each config of the sweep: logits (up to tie order), packed rows, cached decode."""
    hf = randomize_buffers(make_hf("GlmMoeDsa", {**DSA_SHRUNK, **DSA_SWEEP[case]}, seed=4), seed=4)
    hf.save_pretrained(tmp_path)
    check_parity_up_to_ties(hf, tmp_path, SWEEP_IDS, [la.self_attn.indexer for la in hf.model.layers
                                                        if la.self_attn.indexer is not None],
                            lambda m: [la.attn.indexer for la in m.layers if la.attn.indexer is not None])
    model = load_model(tmp_path)
    check_packed_rows(model, SWEEP_IDS)
    check_cached_decode(model, SWEEP_IDS, prefill=40)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_round_trip_bit_exact_and_loadable_by_transformers(family, saved, tmp_path):
    check_round_trip(*saved[family], tmp_path, IDS)


def check_round_trip(hf, d, tmp_path, ids):
    """HF dir -> native -> save -> native: bit-exact tensors and config, the same safetensors as
    transformers wrote, and transformers loads our save to identical logits."""
    from safetensors.torch import load_file

    a = load_model(d)
    save_hf(a, tmp_path)
    b = load_model(tmp_path)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert b.config.to_hf_dict() == a.config.to_hf_dict()
    orig, ours = load_file(d / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert orig.keys() == ours.keys() and all(torch.equal(orig[k], ours[k]) for k in orig)
    reloaded = type(hf).from_pretrained(tmp_path).eval()
    reloaded.config._attn_implementation = "eager"
    assert (hf_logits(reloaded, ids) - hf_logits(hf, ids)).abs().max().item() == 0.0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_engine_greedy_equals_transformers_generate_and_logprobs(family, saved):
    hf, d = saved[family]
    streams = {"deepseek_v3": [(1, 16), (1, 8)],  # the compact latent cache, not expanded per-head keys/values
               "glm_moe_dsa": [(1, 16), (1, 8), (1, 16)]}  # plus the indexer's key
    check_engine_greedy(hf, d, [IDS[0, :9].tolist(), IDS[1, :4].tolist()], streams.get(family))


def check_engine_greedy(hf, d, prompts, stream_shapes=None, new_tokens=12):
    """The embedded engine's greedy continuation of `prompts` (different lengths: a padded prefill)
    equals `hf.generate`, and its log-probs equal a full forward's within 1e-5."""
    import asyncio

    from transformers import AutoTokenizer

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    hf.generation_config.eos_token_id = None  # run all new tokens, as the engine with ignore_eos
    model = load_model(d)
    engine = LocalEngine(model, AutoTokenizer.from_pretrained(str(d)), max_batch=4, path=d)
    if stream_shapes is not None:
        assert engine.scheduler.cache.stream_shapes == stream_shapes
    assert engine.scheduler.fast is None  # these attentions run through the module forward

    async def go():
        return await asyncio.gather(*[
            engine.generate_ids(p, Sampling(temperature=0.0, max_tokens=new_tokens), ignore_eos=True) for p in prompts])

    try:
        seqs = asyncio.run(go())
    finally:
        asyncio.run(engine.close())
    for p, s in zip(prompts, seqs):
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
            full = model.compute_logits(torch.tensor([p + s.token_ids]))[0]
        assert s.token_ids == out[0, len(p):].tolist(), model.config.architecture
        ref = torch.log_softmax(full, -1)[len(p) - 1 : -1].gather(1, torch.tensor(s.token_ids)[:, None])[:, 0]
        assert (ref - torch.tensor(s.logprobs)).abs().max().item() < 1e-5


def test_family_checkpoint_that_does_not_match_its_config_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    d = saved["deepseek_v3"][1]
    tensors = load_file(d / "model.safetensors")
    cases = {
        "missing": ({k: v for k, v in tensors.items() if "kv_b_proj" not in k}, "kv_b_proj"),
        "extra": ({**tensors, "model.layers.0.self_attn.q_proj.weight": torch.zeros(2)}, "q_proj"),
        "misshapen": ({**tensors, "model.layers.1.mlp.gate.weight": torch.zeros(9, 64)}, "mlp.router.weight"),
    }
    check_refused(d, tmp_path, cases)
    # multi-token-prediction layers after the last decoder layer are skipped, as transformers does
    mtp = tmp_path / "mtp"
    shutil.copytree(d, mtp)
    save_file({**tensors, "model.layers.2.eh_proj.weight": torch.zeros(2, 2)}, mtp / "model.safetensors")
    assert load_model(mtp).config.num_layers == 2
    cfg = json.loads((d / "config.json").read_text())
    quant = tmp_path / "quant"
    shutil.copytree(d, quant)
    (quant / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(ModelLoadError, match="quantized"):
        load_model(quant)
    with pytest.raises(ModelLoadError, match="unknown MoE implementation 'fast'"):
        load_model(d, moe_impl="fast")
    with pytest.raises(ModelLoadError, match="gpt_oss"):
        ModelConfig.from_hf_dict({**cfg, "model_type": "mixtral"})
    d = saved["glm_moe_dsa"][1]
    tensors = load_file(d / "model.safetensors")
    no_indexer = tmp_path / "no_indexer"
    shutil.copytree(d, no_indexer)
    save_file({k: v for k, v in tensors.items() if "indexer.wk" not in k}, no_indexer / "model.safetensors")
    with pytest.raises(ModelLoadError, match="indexer.wk"):
        load_model(no_indexer)
    cfg = json.loads((d / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="first layer's indexer"):
        ModelConfig.from_hf_dict({**cfg, "indexer_types": ["shared", "full"]})
    with pytest.raises(ModelLoadError, match="indexer_types has 3 entries"):
        ModelConfig.from_hf_dict({**cfg, "indexer_types": ["full"] * 3})
    derived = ModelConfig.from_hf_dict({k: v for k, v in cfg.items() if k != "indexer_types"} | {"index_topk_pattern": "FS"})
    assert derived.indexer_types == ["full", "shared"]


def check_refused(d, tmp_path, cases):
    """`cases` {name: (HF tensors, key)}: each set of tensors, saved over a copy of the checkpoint `d`,
    fails to load with a ModelLoadError naming `key`."""
    from safetensors.torch import save_file

    for name, (t, key) in cases.items():
        bad = tmp_path / name
        shutil.copytree(d, bad)
        save_file(t, bad / "model.safetensors")
        with pytest.raises(ModelLoadError, match=key):
            load_model(bad)


# ---- the MoE runtime ------------------------------------------------------------------------------


def _moe(**kw):
    from vf.models.moe import MoE

    sizes = {"hidden_size": 24, "num_experts": 12, "num_experts_per_tok": 3, "moe_intermediate_size": 10}
    cfg = ModelConfig(architecture="qwen3_moe", vocab_size=8, num_layers=1, num_heads=2,
                      num_kv_heads=2, head_dim=4, intermediate_size=8, **{**sizes, **kw})
    layer = MoE(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return layer


@pytest.mark.parametrize("kw", [
    {"router_scoring": "sqrt_softplus", "norm_topk_prob": True},
    {"router_scoring": "sigmoid", "expert_bias": True, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
     "n_shared_experts": 1},
    {"router_bias": True, "expert_bias_terms": True, "expert_act": "clamped_swiglu", "swiglu_limit": 0.3,
     "norm_topk_prob": True},
    # 16-byte aligned sizes: `grouped` runs torch's grouped_mm (the odd sizes above: the padded bmm)
    {"hidden_size": 32, "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2},
    {"hidden_size": 32, "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
     "router_bias": True, "expert_bias_terms": True, "expert_act": "clamped_swiglu", "swiglu_limit": 0.3},
], ids=["sqrt_softplus", "grouped_sigmoid_shared", "gpt_oss_experts", "grouped_mm", "grouped_mm_gpt_oss"])
def test_moe_loop_and_grouped_agree_forward_and_backward(kw):
    layer = _moe(**kw)
    x = torch.randn(2, 17, kw.get("hidden_size", 24), generator=torch.Generator().manual_seed(1))
    outs, grads = {}, {}
    for impl in ("loop", "grouped"):
        layer.impl = impl
        layer.zero_grad()
        xi = x.clone().requires_grad_(True)
        out = layer(xi)
        out.square().sum().backward()
        outs[impl], grads[impl] = out.detach(), (xi.grad, layer.gate_up_proj.grad.clone(), layer.router.weight.grad)
    assert (outs["loop"] - outs["grouped"]).abs().max().item() <= 1e-5
    for a, b in zip(grads["loop"], grads["grouped"]):
        assert (a - b).abs().max().item() <= 1e-5 * a.abs().max().item() and a.abs().sum() > 0


def test_router_scoring_grouping_bias_and_scaling():
    layer = _moe(router_scoring="sigmoid", expert_bias=True, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                 norm_topk_prob=True)
    r = layer.router
    x = torch.randn(64, 24, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        r.expert_bias.zero_()
        w, idx, conf = r(x)
        groups = idx // 3  # 12 experts in 4 groups of 3
        assert all(len(set(row.tolist())) <= 2 for row in groups)  # only topk_group groups are eligible
        assert torch.allclose(w.sum(-1), torch.full((64,), 2.5))  # renormalised, then scaled
        scores = torch.sigmoid(x @ r.weight.t())
        assert torch.allclose(w / 2.5, scores.gather(1, idx) / scores.gather(1, idx).sum(-1, keepdim=True))
        assert torch.allclose(conf, scores.gather(1, idx).sum(-1) / scores.sum(-1))
        r.expert_bias.copy_(torch.tensor([10.0] + [0.0] * 11))  # selection only: expert 0 always chosen
        w2, idx2, _ = r(x)
        assert (idx2 == 0).any(-1).all()
        assert torch.allclose(w2[idx2 == 0] / 2.5, (scores[:, 0] / scores.gather(1, idx2).sum(-1)))
    r2 = _moe(router_scoring="sqrt_softplus").router
    with torch.no_grad():
        w, idx, _ = r2(x)
        assert torch.allclose(w, torch.nn.functional.softplus(x @ r2.weight.t()).sqrt().gather(1, idx))


def test_moe_load_balance_stats_and_per_layer_impls(saved):
    from vf.models.moe import MoE, moe_stats

    layer = _moe(norm_topk_prob=True)
    x = torch.randn(1, 40, 24, generator=torch.Generator().manual_seed(3))
    x[..., 0] = 1.0
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[:3, 0] = 50.0
        layer(x)  # every token picks experts 0-2
    stats = moe_stats(layer)
    assert stats["moe/max_vio"] == pytest.approx(12 / 3 - 1)  # E/k − 1: fully collapsed routing
    assert stats["moe/routing_confidence"] == pytest.approx(1.0, abs=1e-3)
    assert moe_stats(layer) == {}  # popped
    model = load_model(saved["glm4_moe"][1], moe_impl=["loop", "loop"])
    model.set_moe_impl(["grouped", "loop"])
    assert [m.impl for m in model.modules() if isinstance(m, MoE)] == ["loop"]  # layer 0 is dense
    with pytest.raises(ModelLoadError, match="2 layers"):
        model.set_moe_impl(["loop"])
    with torch.no_grad():
        model(IDS)
    s = moe_stats(model)
    assert 0 <= s["moe/max_vio"] <= 8 / 3 - 1 and 0 < s["moe/routing_confidence"] <= 1


# ---- vf-train on each family ------------------------------------------------------------------------


def _train(*args):
    import os
    import subprocess
    import sys

    env = {**os.environ, "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vf.commands.train", *args], capture_output=True, text=True,
                          timeout=240, env=env, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("family", first_then_matrix(FAMILIES))
def test_vf_train_runs_rl_steps_on_family(family, saved, tmp_path):
    check_vf_train(saved[family][1], tmp_path)


def check_vf_train(model_dir, tmp_path):
    """Two RL steps of vf-train on the MoE checkpoint in `model_dir`, with MoE metrics and an engine
    that agrees with the trainer before the first update."""
    run = tmp_path / "run"
    proc = _train("-o", str(run), "--model", str(model_dir), "--warmup.steps", "0", "--steps", "2",
                  "--batch-size", "8", "--group-size", "4", "--eval.at-start", "false", "--eval.at-end", "false",
                  "--seed", "7", "--trainer.threads", "1", "--model.moe.impl", "grouped")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["num_loss_tokens"] > 0 and abs(r["loss"]) < 10 and r["grad_norm"] > 0
        assert 0 < r["moe/routing_confidence"] <= 1 and r["moe/max_vio"] >= 0
    assert rows[0]["mismatch_kl"] < 1e-6  # engine and trainer agree before the first update


def test_vf_train_unknown_moe_impl_exits_2(tmp_path):
    proc = _train("-o", str(tmp_path / "run"), "--model.moe.impl", "fast", "--steps", "1")
    assert proc.returncode == 2
    assert "model.moe.impl" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_moe_grouped_mm_on_cuda_matches_loop(dtype):
    """The CUDA `torch._grouped_mm` path (GPT-OSS-style biased experts) against the loop."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    layer = _moe(router_bias=True, expert_bias_terms=True, expert_act="clamped_swiglu", norm_topk_prob=True)
    layer = layer.to("cuda", dtype)
    x = torch.randn(2, 64, 24, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
    outs = {}
    for impl in ("loop", "grouped"):
        layer.impl = impl
        outs[impl] = layer(x).float()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert (outs["loop"] - outs["grouped"]).abs().max().item() <= tol * outs["loop"].abs().max().item()

