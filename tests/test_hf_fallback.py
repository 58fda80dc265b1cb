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
