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
    from vf.models.config import HYBRID_FAMILIES

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
    assert {f for f, o in outcome.items() if o == "engine refused: state"} == set(HYBRID_FAMILIES), outcome
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
