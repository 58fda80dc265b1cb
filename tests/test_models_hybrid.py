"""The linear-attention / SSM hybrids (qwen3_next, qwen3_5_text, qwen3_5_moe_text: gated DeltaNet +
gated attention; nemotron_h: Mamba-2 + attention + MLP/MoE by pattern, and Super's latent MoE) against transformers on
random-initialised tiny configs: fp32 logits, HF round trip, chunked vs recurrent forms, packed
documents resetting every recurrent and conv state, the embedded engine's greedy continuation on its
own cache (with sequences admitted and retired mid-batch), trainer/engine log-probs, vf-train."""

import asyncio
import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import first_then_matrix
from test_models_families import _train, check_logits_parity, check_refused, check_round_trip
from vf.models import ModelConfig, ModelLoadError, load_model

V = 512  # the built-in tiny tokenizer's vocabulary, so the checkpoints also run under vf-train
_DELTA = {"hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "intermediate_size": 24, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4}
_MOE = {"moe_intermediate_size": 8, "shared_expert_intermediate_size": 12, "num_experts": 4, "num_experts_per_tok": 2}
FAMILIES = {
    # layers: DeltaNet+MoE, DeltaNet+dense MLP (mlp_only_layers), DeltaNet+MoE, gated attention+MoE
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", {**_DELTA, **_MOE, "mlp_only_layers": [1]}),
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", _DELTA),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", {**_DELTA, **_MOE}),
    # Mamba-2 (2 groups, chunk 8 so rows span several chunks), MoE (sigmoid router, expert bias, 2 groups),
    # attention without rope, relu² MLP, Mamba-2 again
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", {
        "hidden_size": 32, "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp", "linear_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 24,
        "ssm_state_size": 8, "mamba_num_heads": 4, "mamba_head_dim": 8, "n_groups": 2, "chunk_size": 8,
        "moe_intermediate_size": 8, "moe_shared_expert_intermediate_size": 12, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5}),
    # Nemotron-H Super's latent MoE: one Mamba-2, one attention, one MoE layer whose routed experts run
    # in a 20-wide latent space (hidden 64); mlp_bias puts biases on the latent projections and the
    # shared expert
    "nemotron_h_latent": ("NemotronHConfig", "NemotronHForCausalLM", {
        "hidden_size": 64, "layers_block_type": ["linear_attention", "full_attention", "moe"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48,
        "ssm_state_size": 8, "mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 2, "chunk_size": 8,
        "moe_intermediate_size": 16, "moe_shared_expert_intermediate_size": 24, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "routed_scaling_factor": 1.5, "moe_latent_size": 20, "mlp_bias": True}),
}
ARCH = {"nemotron_h_latent": "nemotron_h"}  # test cases that are a variant of a family
IDS = torch.randint(0, V, (2, 150), generator=torch.Generator().manual_seed(1))  # > 2 DeltaNet chunks


def make_hybrid(family: str, seed: int = 0, **overrides):
    cfg_cls, model_cls, kw = FAMILIES[family]
    torch.manual_seed(seed)
    hf = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(vocab_size=V, **{**kw, **overrides})).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every tensor random (HF zero-inits norms, biases, routers, selection bias)
        for name, p in list(hf.named_parameters()) + list(hf.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                p.uniform_(-0.3, 0.3, generator=g)
            elif "norm" in name:  # zero-centred (1 + w) norms get w around 0
                p.uniform_(0.5, 1.5, generator=g).sub_(0.0 if "linear_attn.norm" in name or ARCH.get(family, family) == "nemotron_h" else 1.0)
            elif "embed" in name:  # a residual stream of unit scale: fp32 rounding is not blown up by the norms
                p.normal_(0, 1.0, generator=g)
            elif name.endswith(("bias", "gate.weight", "A_log", ".D")):
                p.normal_(0, 0.2, generator=g)
            elif p.is_floating_point() and p.dim() > 0 and "inv_freq" not in name:
                p.normal_(0, 0.1, generator=g)
    hf.config._attn_implementation = "eager"
    return hf


def build_hybrid(family: str, out, seed: int = 0, **overrides):
    """A random tiny HF checkpoint of `family` in `out`, with the tiny tokenizer; returns the HF model."""
    from vf.models.tiny import ensure_tiny_model

    hf = make_hybrid(family, seed, **overrides)
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
        out[family] = (build_hybrid(family, d), d)
    return out


def logprobs(logits, ids):
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hybrid_logits_match_transformers(family, saved):
    check_logits_parity(ARCH.get(family, family), *saved[family], IDS)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hybrid_packed_documents_reset_every_state(family, saved):
    """Three documents packed in one row (lengths not multiples of any chunk), plus a second row:
    log-probs equal each document run alone; and a row packed without the resets differs."""
    model = load_model(saved[family][1])
    docs = [IDS[0, :70], IDS[1, :53], IDS[0, 80:101], IDS[1, 60:150]]
    rows = [torch.cat(docs[:3]), docs[3]]
    T = max(len(r) for r in rows)
    packed = torch.zeros(2, T, dtype=torch.int64)
    pos = torch.zeros(2, T, dtype=torch.int64)
    for r, parts in enumerate((docs[:3], docs[3:])):
        at = 0
        for doc in parts:
            packed[r, at:at + len(doc)] = doc
            pos[r, at:at + len(doc)] = torch.arange(len(doc))
            at += len(doc)
        if at < T:  # tail padding: a document of its own
            pos[r, at:] = torch.arange(T - at)
    with torch.no_grad():
        got = torch.log_softmax(model.compute_logits(packed, pos), -1)
        at = 0
        for i, doc in enumerate(docs[:3]):
            alone = torch.log_softmax(model.compute_logits(doc[None]), -1)[0]
            assert (got[0, at:at + len(doc)] - alone).abs().max().item() <= 1e-5, (family, i)
            at += len(doc)
        alone = torch.log_softmax(model.compute_logits(docs[3][None]), -1)[0]
        assert (got[1, :len(docs[3])] - alone).abs().max().item() <= 1e-5
        # without resets (one document over the whole row) the later documents change
        joined = torch.log_softmax(model.compute_logits(packed[:1, :144]), -1)[0]
        assert (joined[70:123] - got[0, 70:123]).abs().max().item() > 1e-3


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hybrid_chunked_prefill_then_recurrent_decode_equals_full_pass(family, saved):
    from vf.models.cache import SimpleKVCache

    model = load_model(saved[family][1])
    with torch.no_grad():
        full = model.compute_logits(IDS)
        cache = SimpleKVCache(batch=2)
        steps = [model.compute_logits(IDS[:, :100], cache=cache)]  # chunked form, state saved
        steps += [model.compute_logits(IDS[:, 100:130], cache=cache)]  # chunked form from a state
        steps += [model.compute_logits(IDS[:, t:t + 1], cache=cache) for t in range(130, 138)]  # recurrent
    assert (torch.cat(steps, dim=1) - full[:, :138]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hybrid_round_trip_bit_exact_and_loadable_by_transformers(family, saved, tmp_path):
    check_round_trip(*saved[family], tmp_path, IDS)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hybrid_engine_greedy_equals_transformers_generate_with_mid_batch_admission(family, saved):
    """Greedy continuations on the engine's own cache (per-layer recurrent/conv state next to the
    KV blocks) equal transformers.generate; prompts of different lengths share a padded prefill, a
    short request finishes early (its row is retired and the last row moved into it) and later
    requests are admitted while others decode; log-probs equal the full-pass ones."""
    from transformers import AutoTokenizer

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    hf, d = saved[family]
    hf.generation_config.eos_token_id = None
    model = load_model(d)
    engine = LocalEngine(model, AutoTokenizer.from_pretrained(str(d)), max_batch=3, path=d)
    cache = engine.scheduler.cache
    n_state = sum(k == "state" for k in model.cache_kinds())
    assert engine.scheduler.fast is None and len(cache.states) == n_state > 0
    assert sum(b is not None for b in cache.k) == model.cache_kinds().count("kv") < model.config.num_layers
    prompts = [IDS[0, :9].tolist(), IDS[1, :4].tolist(), IDS[0, 20:37].tolist(), IDS[1, 40:46].tolist(),
               IDS[0, 60:62].tolist()]
    lengths = [12, 3, 10, 8, 6]

    async def go():
        tasks = []
        for i, (p, n) in enumerate(zip(prompts, lengths)):
            tasks.append(asyncio.ensure_future(
                engine.generate_ids(p, Sampling(temperature=0.0, max_tokens=n), ignore_eos=True)))
            if i == 2:
                await asyncio.sleep(0.05)  # the later ones join a running batch
        return await asyncio.gather(*tasks)

    try:
        seqs = asyncio.run(go())
    finally:
        asyncio.run(engine.close())
    assert engine.scheduler.peak_rows == 3
    for p, n, s in zip(prompts, lengths, seqs):
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, pad_token_id=0)
            full = model.compute_logits(torch.tensor([p + s.token_ids]))
        assert s.token_ids == out[0, len(p):].tolist(), family
        ref = logprobs(full, torch.tensor([p + s.token_ids]))[0, len(p) - 1:]
        assert (ref - torch.tensor(s.logprobs)).abs().max().item() < 1e-5


def test_hybrid_config_errors(saved):
    cfg = json.loads((saved["nemotron_h"][1] / "config.json").read_text())
    legacy = {k: v for k, v in cfg.items() if k != "layers_block_type"} | {"hybrid_override_pattern": "ME*-M"}
    assert ModelConfig.from_hf_dict(legacy).layer_types == cfg["layers_block_type"]
    assert ModelConfig.from_hf_dict({**cfg, "moe_latent_size": 16}).moe_latent_size == 16
    for bad in (0, -4, 2.5, "16", True):
        with pytest.raises(ModelLoadError, match="moe_latent_size must be a positive integer"):
            ModelConfig.from_hf_dict({**cfg, "moe_latent_size": bad})
    with pytest.raises(ModelLoadError, match="other than"):
        ModelConfig.from_hf_dict({**legacy, "hybrid_override_pattern": "MX"})
    cfg = json.loads((saved["qwen3_next"][1] / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="layer types"):
        ModelConfig.from_hf_dict({**cfg, "layer_types": ["linear_attention", "mamba", "full_attention", "full_attention"]})
    derived = ModelConfig.from_hf_dict({k: v for k, v in cfg.items() if k != "layer_types"} | {"full_attention_interval": 2})
    assert derived.layer_types == ["linear_attention", "full_attention"] * 2


def test_latent_moe_checkpoint_missing_or_misshapen_latent_key_exits_2(saved, tmp_path):
    """A latent-MoE checkpoint without (or with a wrongly shaped) latent projection is refused with
    the key named, by load_model and by vf-train (exit 2), never loaded half-initialised."""
    from safetensors.torch import load_file

    d = saved["nemotron_h_latent"][1]
    tensors = load_file(d / "model.safetensors")
    fc1, fc2 = "backbone.layers.2.mixer.fc1_latent_proj.weight", "backbone.layers.2.mixer.fc2_latent_proj.bias"
    assert fc1 in tensors and fc2 in tensors
    check_refused(d, tmp_path, {
        "missing": ({k: v for k, v in tensors.items() if k != fc1}, fc1),
        "misshapen": ({**tensors, fc2: torch.zeros(20)}, "layers.2.mixer.latent_out.bias"),
    })
    proc = _train("-o", str(tmp_path / "run"), "--model", str(tmp_path / "missing"), "--steps", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert fc1 in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("family", first_then_matrix(["qwen3_next", "nemotron_h", "nemotron_h_latent"]))
def test_vf_train_runs_rl_steps_on_hybrid(family, saved, tmp_path):
    run = tmp_path / "run"
    proc = _train("-o", str(run), "--model", str(saved[family][1]), "--warmup.steps", "0", "--steps", "2",
                  "--batch-size", "8", "--group-size", "4", "--eval.at-start", "false", "--eval.at-end", "false",
                  "--seed", "7", "--trainer.threads", "1", "--sampling.max-tokens", "12")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["num_loss_tokens"] > 0 and abs(r["loss"]) < 10 and r["grad_norm"] > 0
    assert rows[0]["mismatch_kl"] < 1e-6  # engine and trainer log-probs agree before the first update
