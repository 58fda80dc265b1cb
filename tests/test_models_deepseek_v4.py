"""DeepSeek-V4 (`deepseek_v4`) against transformers on a random-initialised tiny config: fp32 logits,
packed rows, HF round trip, the engine's cached greedy decode and log-probs, each mechanism
mattering, broken checkpoints, and vf-train; plus a sweep of configs from transformers' defaults
(logits up to the order of exact top-k ties, packed rows, cached decode)."""

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_models_families import (
    SWEEP_IDS,
    check_cached_decode,
    check_engine_greedy,
    check_logits_parity,
    check_packed_rows,
    check_parity_up_to_ties,
    check_refused,
    check_round_trip,
    check_vf_train,
    randomize_buffers,
    save_with_tiny_tokenizer,
)
from test_models_parity import hf_logits, make_hf
from vf.models import ModelConfig, ModelLoadError, load_model, save_hf

V = 512  # the built-in tiny tokenizer's vocabulary, so the checkpoint also runs under vf-train
CSA, HCA, SLIDING = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
# one layer of each kind: sliding window 6, CSA pooling 4 tokens (overlapping windows, index top-3 of
# 10 entries at 40 tokens), HCA pooling 8; a hash-routed MoE layer then two top-k ones; 3 hyper-
# connection streams; 2 output groups; yarn on the compress rope; a low SwiGLU limit so it clips
CONFIG = {
    "vocab_size": V, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "head_dim": 16,
    "q_lora_rank": 24, "moe_intermediate_size": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "partial_rotary_factor": 0.5, "layer_types": [SLIDING, CSA, HCA], "mlp_layer_types": ["hash_moe", "moe", "moe"],
    "compress_rates": {CSA: 4, HCA: 8}, "sliding_window": 6, "o_groups": 2, "o_lora_rank": 8,
    "index_n_heads": 4, "index_head_dim": 8, "index_topk": 3, "hc_mult": 3, "swiglu_limit": 0.3,
    "max_position_embeddings": 256,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1e4},
}
IDS = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))


def build(out, seed=0, **overrides):
    """A random tiny DeepSeek-V4 HF checkpoint in `out` with the tiny tokenizer; returns the HF model."""
    hf = randomize_buffers(make_hf("DeepseekV4", {**CONFIG, **overrides}, seed=seed), seed)
    return save_with_tiny_tokenizer(hf, out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("deepseek_v4")
    return build(d), d


def test_dsv4_logits_match_transformers_both_moe_impls(saved):
    check_logits_parity("deepseek_v4", *saved, IDS)


def test_dsv4_default_layer_schedule_matches_transformers(tmp_path):
    """Without layer_types / mlp_layer_types / compress_rates in the config, both derive transformers'
    defaults (two HCA layers then CSA/HCA alternating; three hash layers) and the logits agree."""
    over = {k: None for k in ("layer_types", "mlp_layer_types", "compress_rates")}
    hf = build(tmp_path, seed=2, num_hidden_layers=4, **over)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for k in over:
        cfg.pop(k, None)
    native = ModelConfig.from_hf_dict(cfg)
    assert native.layer_types == [HCA, HCA, HCA, CSA] and native.mlp_layer_types == ["hash_moe"] * 3 + ["moe"]
    assert native.compress_rates == {CSA: 4, HCA: 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(tmp_path)
    with torch.no_grad():
        assert (model.compute_logits(IDS) - hf_logits(hf, IDS)).abs().max().item() <= 1e-4


# ---- a sweep of configs against transformers --------------------------------------------------------
# transformers' defaults (DeepseekV4Config) with only the sizes shrunk: one layer of each kind, default
# compress rates (HCA 128: no entry closes in 48 tokens), 4 hyper-connection streams, 20 Sinkhorn
# iterations, 6 of 8 experts, sqrt-softplus, rope on 1/8 of the head, swiglu_limit 10, o_groups 2,
# sliding window 8, index_topk 8, 4 index heads (few heads: exact top-k ties happen)
SHRUNK = {
    "vocab_size": V, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "head_dim": 16,
    "q_lora_rank": 24, "moe_intermediate_size": 16, "n_routed_experts": 8, "layer_types": [SLIDING, CSA, HCA],
    "mlp_layer_types": ["hash_moe", "moe", "moe"], "o_groups": 2, "o_lora_rank": 8, "sliding_window": 8,
    "index_n_heads": 4, "index_head_dim": 8, "index_topk": 8, "max_position_embeddings": 256,
}
SWEEP = {
    "shrunk_defaults": {},
    "hca_pools": {"compress_rates": {CSA: 4, HCA: 8}},
    "topk_above_entries": {"index_topk": 64, "compress_rates": {CSA: 4, HCA: 8}},
    "default_schedule": {"num_hidden_layers": 4, "layer_types": None, "mlp_layer_types": None,
                         "compress_rates": {CSA: 4, HCA: 16}},  # HCA, HCA, HCA, CSA; 3 hash layers
    "yarn_half_rotary_two_streams": {"partial_rotary_factor": 0.5, "hc_mult": 2,
                                     "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                         "original_max_position_embeddings": 64}},
    "sigmoid_one_stream_clipped": {"scoring_func": "sigmoid", "hc_mult": 1, "swiglu_limit": 0.3,
                                   "num_experts_per_tok": 2, "sliding_window": 64},
}


@pytest.mark.parametrize("case", list(SWEEP))
def test_dsv4_sweep_matches_transformers(case, tmp_path):
    """Each config of the sweep: logits (up to the order of exact top-k ties), packed rows, cached decode."""
    hf = randomize_buffers(make_hf("DeepseekV4", {**SHRUNK, **SWEEP[case]}, seed=4), seed=4)
    hf.save_pretrained(tmp_path)
    csa = [la.self_attn.compressor.indexer for la in hf.model.layers if la.self_attn.layer_type == CSA]
    check_parity_up_to_ties(hf, tmp_path, SWEEP_IDS, csa,
                            lambda m: [la.attn.indexer for la in m.layers if la.attn.indexer is not None])
    model = load_model(tmp_path)
    check_packed_rows(model, SWEEP_IDS)
    check_cached_decode(model, SWEEP_IDS, prefill=37)


def test_dsv4_packed_rows_match_separate_documents(saved):
    check_packed_rows(load_model(saved[1]), IDS)


def test_dsv4_activation_checkpointing_same_loss_and_grads(saved):
    """Packed rows through the training path: per-layer recompute gives the same loss and gradients
    (the hash table and the frozen selection bias get none)."""
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
    assert "layers.0.mlp.router.tid2eid" not in out[False][1] and "layers.1.attn_hc.fn" in out[False][1]


def test_dsv4_round_trip_bit_exact_and_loadable_by_transformers(saved, tmp_path):
    check_round_trip(*saved, tmp_path, IDS)
    tensors = json.loads((tmp_path / "config.json").read_text())
    assert tensors["scoring_func"] == "sqrtsoftplus" and "intermediate_size" not in tensors


def test_dsv4_cache_decode_matches_full_forward(saved):
    """Prefill then chunks and single tokens through a KV cache: the stored key=value and compressor
    projections give the full forward's logits (windows close and the sliding window moves mid-decode)."""
    from vf.models.cache import SimpleKVCache

    model = load_model(saved[1])
    with torch.no_grad():
        full = model.compute_logits(IDS)
        cache = SimpleKVCache(batch=2)
        steps = [model.compute_logits(IDS[:, :13], cache=cache), model.compute_logits(IDS[:, 13:22], cache=cache)]
        steps += [model.compute_logits(IDS[:, t : t + 1], cache=cache) for t in range(22, 40)]
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= 1e-5


def test_dsv4_engine_greedy_equals_transformers_generate_and_logprobs(saved):
    # key=value [1, hd], compressor kv / gate [1, 2hd], indexer kv / gate [1, 2di]; 5 + 20 and 13 + 20
    # tokens: CSA / HCA windows close and the window slides during decode
    check_engine_greedy(*saved, [IDS[0, :13].tolist(), IDS[1, :5].tolist()],
                        [(1, 16), (1, 32), (1, 32), (1, 16), (1, 16)], new_tokens=20)


def test_dsv4_each_mechanism_matters(saved):
    """The parity above would not notice a mechanism that has no effect in the tiny config: switching
    each off moves the logits."""
    model = load_model(saved[1])
    attn_csa, attn_hca = model.layers[1].attn, model.layers[2].attn

    def moved(change, undo):
        with torch.no_grad():
            base = model.compute_logits(IDS)
            change()
            out = model.compute_logits(IDS)
            undo()
            assert (model.compute_logits(IDS) - base).abs().max().item() == 0.0
        return (out - base).abs().max().item()

    table = model.layers[0].mlp.router.tid2eid
    saved_table = table.clone()
    assert moved(lambda: table.copy_(table.roll(1, dims=0)), lambda: table.copy_(saved_table)) > 1e-3  # hash routing
    hcs = [m for layer in model.layers for m in (layer.attn_hc, layer.mlp_hc)]
    bases = [hc.base.detach().clone() for hc in hcs]
    eye = torch.eye(3).flatten() * 1e4  # comb = identity: each stream keeps its own residual, no mixing
    assert moved(lambda: [hc.base.data[6:].copy_(eye) for hc in hcs],
                 lambda: [hc.base.data.copy_(b) for hc, b in zip(hcs, bases)]) > 1e-3
    topk = attn_csa.indexer.topk
    assert moved(lambda: setattr(attn_csa.indexer, "topk", 100), lambda: setattr(attn_csa.indexer, "topk", topk)) > 1e-3
    for attn in (attn_csa, attn_hca):  # compressed entries emptied (zero keys/values)
        w = attn.compressor.kv_norm.weight
        kept = w.detach().clone()
        assert moved(lambda w=w: w.data.zero_(), lambda w=w, k=kept: w.data.copy_(k)) > 1e-3
    assert moved(lambda: setattr(attn_hca, "window", 1000), lambda: setattr(attn_hca, "window", 6)) > 1e-3  # window
    sinks = attn_hca.sinks.detach().clone()
    assert moved(lambda: attn_hca.sinks.data.fill_(-1e4), lambda: attn_hca.sinks.data.copy_(sinks)) > 1e-3
    mlp = model.layers[2].mlp
    assert moved(lambda: setattr(mlp, "limit", 1e9), lambda: setattr(mlp, "limit", 0.3)) > 1e-3  # SwiGLU clip


def test_dsv4_checkpoint_that_does_not_match_its_config_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    d = saved[1]
    tensors = load_file(d / "model.safetensors")
    cases = {
        "missing": ({k: v for k, v in tensors.items() if "indexer.compressor.wkv" not in k}, "indexer.compressor.wkv"),
        "no_table": ({k: v for k, v in tensors.items() if "tid2eid" not in k}, "tid2eid"),
        "extra": ({**tensors, "model.layers.0.attn.compressor.wkv.weight": torch.zeros(2)}, "compressor.wkv"),
        "misshapen": ({**tensors, "model.layers.1.hc_attn_fn": torch.zeros(15, 8)}, "attn_hc.fn"),
    }
    check_refused(d, tmp_path, cases)
    mtp = tmp_path / "mtp"  # the multi-token-prediction module is skipped, as transformers does
    shutil.copytree(d, mtp)
    save_file({**tensors, "model.mtp.0.eh_proj.weight": torch.zeros(2, 2)}, mtp / "model.safetensors")
    assert load_model(mtp).config.num_layers == 3
    cfg = json.loads((d / "config.json").read_text())
    for bad, match in (({"layer_types": [SLIDING, "full_attention", HCA]}, "layer_types entries"),
                       ({"mlp_layer_types": ["moe"] * 2}, "mlp_layer_types has 2 entries"),
                       ({"o_groups": 3}, "o_groups=3"),
                       ({"scoring_func": "relu"}, "scoring_func"),
                       ({"compress_rates": {CSA: 4}}, "compress_rates")):
        with pytest.raises(ModelLoadError, match=match):
            ModelConfig.from_hf_dict({**cfg, **bad})


def test_dsv4_legacy_config_keys_fold_in(saved):
    """Older V4 configs: compress_ratios per layer, compress_rate_*, num_hash_layers, qk_rope_head_dim."""
    cfg = json.loads((saved[1] / "config.json").read_text())
    for k in ("layer_types", "mlp_layer_types", "compress_rates", "partial_rotary_factor", "rope_parameters"):
        cfg.pop(k)
    cfg.update(compress_ratios=[0, 4, 128], compress_rate_hca=8, num_hash_layers=1, qk_rope_head_dim=8)
    native = ModelConfig.from_hf_dict(cfg)
    assert native.layer_types == [SLIDING, CSA, HCA] and native.compress_rates == {CSA: 4, HCA: 8}
    assert native.mlp_layer_types == ["hash_moe", "moe", "moe"] and native.rotary_dim == 8
    assert "compress_ratios" not in native.to_hf_dict()


@pytest.mark.slow
def test_vf_train_runs_rl_steps_on_dsv4(saved, tmp_path):
    check_vf_train(saved[1], tmp_path)


def test_dsv4_saved_native_model_reloads(saved, tmp_path):
    """A native build (random init, integer hash table) saves and reloads to the same logits."""
    from vf.models import build_model

    cfg = load_model(saved[1]).config
    model = build_model(cfg, seed=3)
    assert model.layers[0].mlp.router.tid2eid.dtype == torch.int64
    save_hf(model, tmp_path)
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path).compute_logits(IDS), model.compute_logits(IDS))
