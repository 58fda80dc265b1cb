"""`--model.impl auto|native|hf`: a family without a native model (a tiny random phi3) runs through
transformers' model behind the NativeModel interface — packed training log-probs, the embedded
engine's KV cache, vf-eval — and `native` refuses it with exit 2."""

import json
import shutil

import pytest
import torch
from vf.models.tiny import ensure_tiny_model

PHI3 = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True}  # tied: the harder state-dict case


@pytest.fixture(scope="module")
def phi3_dir(tmp_path_factory):
    from transformers import Phi3Config, Phi3ForCausalLM

    path = tmp_path_factory.mktemp("phi3")
    torch.manual_seed(0)
    Phi3ForCausalLM(Phi3Config(**PHI3)).save_pretrained(str(path))
    tiny = ensure_tiny_model()  # its byte-level tokenizer (512 ids) serves the phi3 vocabulary
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny / f).exists():
            shutil.copy(tiny / f, path / f)
    return path


def test_auto_wraps_transformers_and_logits_match(phi3_dir, capfd):
    from transformers import AutoModelForCausalLM
    from vf.models import load_model
    from vf.models.hf_fallback import HFModel

    model = load_model(phi3_dir)  # auto
    assert isinstance(model, HFModel)
    assert "no native implementation" in capfd.readouterr().err
    ref = AutoModelForCausalLM.from_pretrained(str(phi3_dir), dtype=torch.float32).eval()
    ids = torch.randint(3, 512, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model.compute_logits(ids)
        want = ref(input_ids=ids).logits
    assert (got - want).abs().max().item() < 1e-4


def test_native_refuses_other_families_with_exit_2(phi3_dir, cli):
    from vf.models import ModelLoadError, load_model

    with pytest.raises(ModelLoadError, match="qwen3") as e:
        load_model(phi3_dir, impl="native")
    assert "phi3" in e.value.message
    proc = cli("vf-train", "--model", str(phi3_dir), "--model.impl", "native", "--steps", "1")
    assert proc.returncode == 2, proc.stderr
    assert "native families" in proc.stderr and "Traceback" not in proc.stderr


def test_packed_training_logprobs_and_engine_logprobs_agree(phi3_dir):
    import asyncio

    from transformers import AutoTokenizer
    from vf.models import load_model
    from vf.trainer.logprobs import chunked_logprobs

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    trainer_model = load_model(phi3_dir, impl="hf")
    engine = LocalEngine(load_model(phi3_dir), AutoTokenizer.from_pretrained(str(phi3_dir)), max_batch=4)
    try:
        prompts = [[5, 9, 33, 7], [11, 12, 13, 14, 15, 16]]

        async def gen():
            return await asyncio.gather(*(engine.generate_ids(p, Sampling(temperature=1.0, max_tokens=8, seed=i))
                                          for i, p in enumerate(prompts)))

        seqs = asyncio.run(gen())
    finally:
        asyncio.run(engine.close())
    # pack both episodes into one training row (documents restart positions at 0)
    rows = [p + list(s.token_ids) for p, s in zip(prompts, seqs)]
    ids = torch.tensor([t for r in rows for t in r])[None]
    pos = torch.cat([torch.arange(len(r)) for r in rows])[None]
    with torch.no_grad():
        h = trainer_model(ids, pos)[0]
    got, want, start = [], [], 0
    for p, s, r in zip(prompts, seqs, rows):
        n = len(s.token_ids)
        idx = torch.arange(start + len(p) - 1, start + len(p) - 1 + n)
        got.append(chunked_logprobs(h[idx], trainer_model.lm_head_weight, torch.tensor(s.token_ids)))
        want.append(torch.tensor(s.logprobs))
        start += len(r)
    assert sum(len(s.token_ids) for s in seqs) >= 4
    assert (torch.cat(got) - torch.cat(want)).abs().max().item() < 1e-5


def test_save_round_trip_is_exact(phi3_dir, tmp_path):
    from vf.models import load_model, save_hf

    model = load_model(phi3_dir, impl="hf")
    save_hf(model, tmp_path / "out")
    again = load_model(tmp_path / "out", impl="hf")
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "phi3"


@pytest.mark.slow
def test_vf_eval_runs_on_the_fallback(phi3_dir, tmp_path, cli):
    proc = cli("vf-eval", "reverse-text", "-m", str(phi3_dir), "-n", "3", "--sampling.max-tokens", "6",
               "-o", str(tmp_path / "run"), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["num_episodes"] == 3 and summary["num_errors"] == 0, summary
    assert summary["output_tokens"] > 0
    traces = [json.loads(line) for line in (tmp_path / "run" / "traces.jsonl").read_text().splitlines()]
    assert len(traces) == 3


@pytest.mark.slow
def test_vf_train_runs_rl_steps_on_the_fallback(phi3_dir, tmp_path):
    import subprocess
    import sys

    run = tmp_path / "train"
    proc = subprocess.run([sys.executable, "-m", "vf.commands.train", "-o", str(run), "--model", str(phi3_dir),
                           "--warmup.steps", "1", "--warmup.batch-size", "8", "--batch-size", "8", "--group-size", "4",
                           "--eval.at-start", "false", "--eval.at-end", "false", "--steps", "2",
                           "--trainer.threads", "1"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("no native implementation") == 1  # the notice, once
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 2 and all(r["skipped_step"] == 0 for r in rl)
    assert rl[0]["mismatch_kl"] < 1e-6  # trainer and engine log-probs agree on the same weights


def _native_family_checkpoints(root):
    """family -> a tiny random checkpoint dir with the tiny tokenizer, one per native text family
    (the builders of the families' own parity tests)."""
    from test_models_deepseek_v4 import build as build_dsv4
    from test_models_families import FAMILIES, build_family, save_with_tiny_tokenizer
    from test_models_hybrid import FAMILIES as HYBRIDS
    from test_models_hybrid import build_hybrid
    from test_models_parity import make_hf

    dense = {"qwen3": ("Qwen3", {"num_key_value_heads": 2, "intermediate_size": 96}),
             "llama": ("Llama", {"num_key_value_heads": 2, "intermediate_size": 96}),
             "qwen3_moe": ("Qwen3Moe", {"num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 16,
                                        "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1})}
    out = {}
    for family, (cls, kw) in dense.items():
        out[family] = root / family
        save_with_tiny_tokenizer(make_hf(cls, {**kw, "vocab_size": 512}), out[family])
    for family in FAMILIES:
        out[family] = root / family
        build_family(family, out[family])
    for family in HYBRIDS:
        out[family] = root / family
        build_hybrid(family, out[family])
    out["deepseek_v4"] = root / "deepseek_v4"
    build_dsv4(out["deepseek_v4"])
    return out


def test_every_native_family_through_the_fallback_matches_native_or_is_refused(tmp_path):
    """`--model.impl hf` on each native family: packed-row logits and the engine's greedy tokens and
    log-probs equal the native model's, or the fallback refuses (exit-2 errors); never silently off.
    The recurrent hybrids must come out exact on packed rows (run one document at a time) and be
    refused by the engine (their state is not in our KV cache)."""
    import asyncio

    from transformers import AutoTokenizer
    from vf.errors import UsageError
    from vf.models import ModelLoadError, load_model
    from vf.models.families import family as family_spec
    from vf.models.families import native_model_types

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    def greedy(model, d, prompt):
        engine = LocalEngine(model, AutoTokenizer.from_pretrained(str(d)), max_batch=2, path=d)
        try:
            return asyncio.run(engine.generate_ids(prompt, Sampling(temperature=0.0, max_tokens=6), ignore_eos=True))
        finally:
            asyncio.run(engine.close())

    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(3, 500, (9,), generator=g), torch.randint(3, 500, (14,), generator=g)
    packed, pos = torch.cat([a, b])[None], torch.cat([torch.arange(9), torch.arange(14)])[None]
    outcome = {}
    for family, d in _native_family_checkpoints(tmp_path).items():
        native = load_model(d, impl="native")
        try:
            fallback = load_model(d, impl="hf")
        except ModelLoadError:
            outcome[family] = "refused at load"
            continue
        with torch.no_grad():
            diff = (fallback.compute_logits(packed, pos) - native.compute_logits(packed, pos)).abs().max().item()
        assert diff <= 1e-4, f"{family}: packed logits through the fallback differ by {diff}"
        try:
            got = greedy(fallback, d, a.tolist())
        except UsageError as e:
            assert "through the transformers fallback" in e.message
            outcome[family] = "engine refused: " + ("state" if "state outside attention" in e.message else "cache layout")
            continue
        want = greedy(native, d, a.tolist())
        assert got.token_ids == want.token_ids, family
        assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs)) < 1e-4, family
        outcome[family] = "matches"
    from test_models_hybrid import ARCH  # hybrid test cases that are a variant of a family (Nemotron-H Super)

    refused = {f for f, o in outcome.items() if o == "engine refused: state"}
    hybrids = {t for t in native_model_types() if family_spec(t).hybrid}
    assert {ARCH.get(f, f) for f in refused} == hybrids and set(ARCH) <= refused, outcome
    assert outcome["qwen3"] == outcome["llama"] == outcome["qwen3_moe"] == "matches", outcome
    assert outcome["deepseek_v3"] == "engine refused: cache layout", outcome  # MLA: k dim 20, v dim 10


def test_vf_train_refuses_a_recurrent_model_on_the_fallback_engine_with_exit_2(tmp_path, cli):
    from test_models_hybrid import build_hybrid

    build_hybrid("qwen3_next", tmp_path / "m")
    proc = cli("vf-train", "--model", str(tmp_path / "m"), "--model.impl", "hf", "--steps", "1",
               "-o", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "keeps state outside attention" in proc.stderr and "--engine.type vllm" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- vision-language `…ForConditionalGeneration` checkpoints, on text prompts -----------------------
# Each tiny config shrinks every size of the family's default and keeps each of its layer types.
# Special token ids (image, video, vision start/end) are moved under the tiny tokenizer's 512.
_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
           "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 16}
_TOKENS = {"image_token_id": 500, "video_token_id": 501, "vision_start_token_id": 502, "vision_end_token_id": 503}
_TEXT = {"vocab_size": 512, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 256}
_DELTA_MOE = {"linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2,
              "linear_num_value_heads": 4, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
              "num_experts": 4, "num_experts_per_tok": 2}
_MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True}
CG_FAMILIES = {  # model_type -> (text_config, vision_config, top-level fields)
    # attention + MoE layer, attention + dense MLP layer; deepstack vision features
    "qwen3_vl_moe": ({**_TEXT, "num_hidden_layers": 2, "intermediate_size": 96, "moe_intermediate_size": 16,
                      "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [1],
                      "rope_parameters": {**_MROPE, "mrope_section": [2, 3, 3]}},
                     {**_VISION, "deepstack_visual_indexes": [0, 1]}, _TOKENS),
    # 3 gated-DeltaNet layers + 1 gated attention layer, MoE with a shared expert
    "qwen3_5_moe": ({**_TEXT, **_DELTA_MOE, "num_hidden_layers": 4,
                     "rope_parameters": {**_MROPE, "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5}},
                    _VISION, _TOKENS),
    # 3 KDA linear-attention layers + 1 DSA layer (MLA whose top-k indexer keeps 4 keys per query), a dense
    # then sparse MLPs, 2 hyper-connection streams
    "glm5_next": ({"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 16,
                   "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "kv_lora_rank": 16,
                   "q_lora_rank": 24, "qk_nope_head_dim": 16, "v_head_dim": 16, "index_topk": 4, "index_kpool": 2,
                   "index_head_dim": 16, "index_n_heads": 4, "linear_head_dim": 16, "linear_num_heads": 4,
                   "hc_mult": 2, "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
                   "max_position_embeddings": 256, "pad_token_id": 0},
                  {"depth": 2, "hidden_size": 32, "num_heads": 2, "image_size": 16, "patch_size": 4,
                   "out_hidden_size": 64, "intermediate_size": 64, "projection_intermediate_size": 64},
                  {"image_token_id": 500, "video_token_id": 501, "image_start_token_id": 502,
                   "image_end_token_id": 503, "video_start_token_id": 504, "video_end_token_id": 505}),
    # a DeepSeek-V3 text model (MLA: k dim 20, v dim 10; dense then MoE layer, grouped routing), tied head
    "kimi_k25": ({**_TEXT, "model_type": "deepseek_v3", "num_hidden_layers": 2, "num_key_value_heads": 4,
                  "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 4,
                  "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
                  "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "head_dim": 8,
                  "qk_nope_head_dim": 12, "v_head_dim": 10},
                 {"patch_size": 4, "pos_emb_height": 8, "pos_emb_width": 8, "pos_emb_time": 2,
                  "num_attention_heads": 2, "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64},
                 {**_TOKENS, "projection_hidden_size": 32}),
    # 3 gated-DeltaNet layers (the first with per-layer n-gram embeddings) + 1 QSA-indexed attention
    # layer, MoE, 2 hyper-connection streams
    "qwen4_exp": ({**_TEXT, **_DELTA_MOE, "num_hidden_layers": 4, "hc_count": 2, "hc_lowrank": 8,
                   "ple_layer_ids": [1], "ple_embed_dim": 16, "ngram_size": 3, "heads_per_ngram": 2,
                   "ngram_vocab_size_base": 1000, "make_ngram_vocab_size_divisible_by": 8, "split_ngram_parts": 2,
                   "eos_token_id": 2, "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16,
                   "indexer_budget": 4, "indexer_compress_ratio": 2,
                   "rope_parameters": {**_MROPE, "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5}},
                  _VISION, _TOKENS),
}
# what `--model.impl hf` does with each (see the test below for why)
CG_OUTCOME = {"qwen3_vl_moe": "matches", "qwen3_5_moe": "engine refused: state", "glm5_next": "engine refused: state",
              "kimi_k25": "engine refused: cache layout", "qwen4_exp": "refused at load"}


def build_conditional_generation(family: str, out, seed: int = 0, configs=None, save=None):
    """A random tiny `…ForConditionalGeneration` checkpoint of `family` in `out` with the tiny tokenizer;
    every tensor random (transformers zero-inits norms, biases, routers and selection biases).
    `configs`: (text, vision, top-level) instead of CG_FAMILIES[family]; `save(hf, out)` instead of
    `save_with_tiny_tokenizer`."""
    from test_models_families import save_with_tiny_tokenizer
    from transformers import AutoConfig, AutoModelForImageTextToText

    text, vision, top = configs or CG_FAMILIES[family]
    torch.manual_seed(seed)
    hf = AutoModelForImageTextToText.from_config(
        AutoConfig.for_model(family, text_config=text, vision_config=vision, **top)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(hf.named_parameters()) + list(hf.named_buffers()):
            if not p.is_floating_point() or p.dim() == 0 or "inv_freq" in name:
                continue
            if name.endswith("e_score_correction_bias"):
                p.uniform_(-0.3, 0.3, generator=g)
            elif "norm" in name:
                p.uniform_(0.5, 1.5, generator=g)
            elif "embed" in name:  # a residual stream of unit scale; a tied head keeps logits O(10), not O(100)
                p.normal_(0, 0.25 if hf.config.tie_word_embeddings else 1.0, generator=g)
            elif name.endswith(("bias", "gate.weight", "A_log", ".D")):
                p.normal_(0, 0.2, generator=g)
            else:
                p.normal_(0, 0.1, generator=g)
    return (save or save_with_tiny_tokenizer)(hf, out)


@pytest.fixture(scope="module")
def cg_dirs(tmp_path_factory):
    out = {}
    for family in CG_FAMILIES:
        out[family] = tmp_path_factory.mktemp(family)
        build_conditional_generation(family, out[family])
    return out


def _greedy(model, d, prompt):
    import asyncio

    from transformers import AutoTokenizer

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    engine = LocalEngine(model, AutoTokenizer.from_pretrained(str(d)), max_batch=2, path=d)
    try:
        return asyncio.run(engine.generate_ids(prompt, Sampling(temperature=0.0, max_tokens=6), ignore_eos=True))
    finally:
        asyncio.run(engine.close())


def test_conditional_generation_families_on_text_prompts_match_transformers_or_are_refused(cg_dirs):
    """Each vision-language family loads through its own `…ForConditionalGeneration` class and, on
    text prompts: fp32 logits equal transformers' (eager attention) within 1e-4; packed rows equal the
    documents apart within 1e-5; the engine's greedy tokens and log-probs equal a full forward's, or the
    engine refuses (UsageError naming why); or the load refuses. glm5_next's DSA layer attends through
    its own top-k mask, which the seam applies (ignored, its logits were off by ~1)."""
    import transformers
    from vf.errors import UsageError
    from vf.models import ModelLoadError, load_model
    from vf.models.hf_fallback import HFModel

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 500, (2, 17), generator=g)
    a, b = ids[0, :9], ids[1, :14]
    packed, pos = torch.cat([a, b])[None], torch.cat([torch.arange(9), torch.arange(14)])[None]
    outcome = {}
    for family, d in cg_dirs.items():
        arch = json.loads((d / "config.json").read_text())["architectures"][0]
        assert arch.endswith("ForConditionalGeneration"), arch
        try:
            model = load_model(d, impl="hf")
        except ModelLoadError as e:
            assert "does not run through the transformers fallback's attention seam" in e.message, e.message
            outcome[family] = "refused at load"
            continue
        assert isinstance(model, HFModel) and type(model.hf).__name__ == arch
        ref = getattr(transformers, arch).from_pretrained(str(d), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        with torch.no_grad():
            diff = (model.compute_logits(ids) - ref(input_ids=ids).logits).abs().max().item()
            got = model.compute_logits(packed, pos)[0]
            sep = torch.cat([model.compute_logits(a[None])[0], model.compute_logits(b[None])[0]])
        assert diff <= 1e-4, f"{family}: logits differ from transformers' by {diff}"
        assert (got - sep).abs().max().item() <= 1e-5, family
        with torch.no_grad():  # every one of these families is native too: the fallback agrees with it
            native = load_model(d, impl="native")
            assert (native.compute_logits(packed, pos)[0] - got).abs().max().item() <= 1e-4, family
        try:
            out = _greedy(model, d, a.tolist())
        except UsageError as e:
            assert "through the transformers fallback" in e.message and "vllm" in e.hint, e.message
            outcome[family] = "engine refused: " + ("state" if "state outside attention" in e.message else "cache layout")
            continue
        seq, want_lp = a.tolist(), []
        with torch.no_grad():  # the same greedy continuation by full forwards, no cache
            for _ in range(6):
                lp = torch.log_softmax(model.compute_logits(torch.tensor([seq]))[0, -1], -1)
                seq.append(int(lp.argmax()))
                want_lp.append(lp[seq[-1]].item())
        assert list(out.token_ids) == seq[len(a):], family
        assert max(abs(x - y) for x, y in zip(out.logprobs, want_lp)) < 1e-5, family
        outcome[family] = "matches"
    assert outcome == CG_OUTCOME, outcome


def test_a_model_built_mask_is_applied_within_documents_and_an_additive_bias_is_refused():
    """The seam's handling of a mask the model brings itself (`_visible`): kept causal and inside packed
    documents; an additive mask with a real bias (not 0/-inf) is refused rather than dropped."""
    from vf.models import ModelLoadError
    from vf.models.hf_fallback import _visible
    from vf.models.layers import Documents

    T = 5
    allow = torch.ones(1, 1, T, T, dtype=torch.bool)
    allow[..., 3, 0] = False  # the model drops key 0 for query 3
    docs = Documents(torch.tensor([[0, 1, 2, 0, 1]]))
    got = _visible(allow, docs, T)[0, 0]
    want = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]).bool()
    assert torch.equal(got, want)
    additive = torch.zeros(1, 1, T, T).masked_fill(~allow, torch.finfo(torch.float32).min)
    single = _visible(additive, None, T)[0, 0]
    assert torch.equal(single, torch.ones(T, T).tril().bool() & allow[0, 0])
    with pytest.raises(ModelLoadError, match="adds a bias"):
        _visible(additive + 0.5, None, T)


@pytest.mark.slow
def test_vf_train_runs_rl_steps_on_a_vision_language_checkpoint_through_the_fallback(tmp_path):
    """qwen3_vl_moe (the one the engine's cache serves, see CG_OUTCOME) trains on text prompts."""
    import subprocess
    import sys

    build_conditional_generation("qwen3_vl_moe", tmp_path / "m")
    run = tmp_path / "train"
    proc = subprocess.run([sys.executable, "-m", "vf.commands.train", "-o", str(run), "--model", str(tmp_path / "m"),
                           "--model.impl", "hf", "--warmup.steps", "1", "--warmup.batch-size", "8", "--batch-size", "8",
                           "--group-size", "4", "--eval.at-start", "false", "--eval.at-end", "false", "--steps", "2",
                           "--trainer.threads", "1"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert len(rl) == 2 and all(r["skipped_step"] == 0 for r in rl)
    assert rl[0]["mismatch_kl"] < 1e-6  # trainer and engine log-probs agree on the same weights
