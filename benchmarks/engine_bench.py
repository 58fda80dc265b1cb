"""Engine throughput on the built-in tiny model (a script, not a test).

    python benchmarks/engine_bench.py [--tokens 64] [--prompt-len 32] [--skip-serve] [--model tiny|DIR]

1. Decode tokens/s at batch 1, 16, 64: LocalEngine (continuous batching, KV cache) vs
   `transformers` `generate` on the same weights (greedy, fixed length: EOS ignored on both sides).
2. 64 concurrent requests through a real `vf-serve` subprocess vs the same 64 requests one by one.
Prints one line per measurement and the ratios against the targets (batch-16 >= 2x, serve >= 5x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def bench_engine(model: str, tokens: int, prompt_len: int, batches: list[int], repeats: int = 3) -> dict[int, tuple[float, float]]:
    import torch
    from transformers import AutoModelForCausalLM

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    engine = LocalEngine.from_model(model, max_batch=max(batches))
    hf = AutoModelForCausalLM.from_pretrained(str(engine.path), dtype=torch.float32).eval()
    V = engine.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    results = {}

    async def run_local(prompts):
        s = Sampling(temperature=0.0, max_tokens=tokens)
        return await asyncio.gather(*[engine.generate_ids(p, s, ignore_eos=True) for p in prompts])

    for B in batches:
        prompts = torch.randint(10, V, (B, prompt_len), generator=gen)
        local_s = hf_s = float("inf")
        asyncio.run(run_local(prompts.tolist()))  # warm-up (cache buffers, thread pools)
        hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=2, min_new_tokens=2,
                    do_sample=False, pad_token_id=0)
        # best of N, the two sides interleaved: the machine is shared, so both see the same load
        for _ in range(repeats):
            t = time.perf_counter()
            seqs = asyncio.run(run_local(prompts.tolist()))
            local_s = min(local_s, time.perf_counter() - t)
            with torch.inference_mode():
                t = time.perf_counter()
                out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=tokens,
                                  min_new_tokens=tokens, do_sample=False, pad_token_id=0)
                hf_s = min(hf_s, time.perf_counter() - t)
        assert all(len(s.token_ids) == tokens for s in seqs)
        assert out.shape[1] == prompt_len + tokens
        local_tps, hf_tps = B * tokens / local_s, B * tokens / hf_s
        same = sum(s.token_ids == out[i, prompt_len:].tolist() for i, s in enumerate(seqs))
        print(f"batch {B:3d}: local {local_tps:9.1f} tok/s | transformers generate {hf_tps:9.1f} tok/s | "
              f"ratio {local_tps / hf_tps:5.2f}x | greedy rows identical {same}/{B}", flush=True)
        results[B] = (local_tps, hf_tps)
    asyncio.run(engine.close())
    return results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_serve(model: str, tokens: int, n: int = 64) -> tuple[float, float]:
    import httpx

    port = free_port()
    import torch

    cmd = [sys.executable, "-m", "vf.commands.serve", model, "--port", str(port), "--max-queue", "1024",
           "--threads", str(torch.get_num_threads())]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"vf-serve exited: {proc.stderr.read()}") from None
                time.sleep(0.1)
        bodies = [{"model": "tiny", "messages": [{"role": "user", "content": f"request number {i}: reverse me"}],
                   "temperature": 1.0, "seed": i, "max_tokens": tokens, "ignore_eos": True} for i in range(n)]

        async def one(client, body):
            r = await client.post(base + "/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        async def sequential():
            async with httpx.AsyncClient(timeout=600) as c:
                return [await one(c, b) for b in bodies]

        async def concurrent():
            async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=n)) as c:
                return await asyncio.gather(*[one(c, b) for b in bodies])

        asyncio.run(sequential())  # warm-up (and the same work as measured below)
        t = time.perf_counter()
        seq_tokens = sum(asyncio.run(sequential()))
        seq_s = time.perf_counter() - t
        t = time.perf_counter()
        con_tokens = sum(asyncio.run(concurrent()))
        con_s = time.perf_counter() - t
        seq_tps, con_tps = seq_tokens / seq_s, con_tokens / con_s
        print(f"vf-serve {n} requests x {tokens} tokens: one by one {seq_s:6.2f}s ({seq_tps:8.1f} tok/s) | "
              f"concurrent {con_s:6.2f}s ({con_tps:8.1f} tok/s) | ratio {con_tps / seq_tps:5.2f}x", flush=True)
        return seq_tps, con_tps
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--repeats", type=int, default=5, help="best of N timings per measurement")
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads for both sides (default: torch's; 1 is fastest for the tiny "
                         "model on a busy machine)")
    ap.add_argument("--json", action="store_true", help="also print the numbers as one JSON line")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    out: dict = {"torch_threads": None}
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    out["torch_threads"] = torch.get_num_threads()
    eng = bench_engine(a.model, a.tokens, a.prompt_len, batches, a.repeats)
    out["engine"] = {str(b): {"local_tok_s": v[0], "hf_tok_s": v[1], "ratio": v[0] / v[1]} for b, v in eng.items()}
    if 16 in eng:
        r = eng[16][0] / eng[16][1]
        print(f"target batch-16 decode >= 2x transformers generate: {r:.2f}x {'OK' if r >= 2 else 'MISSED'}")
    if not a.skip_serve:
        seq_tps, con_tps = bench_serve(a.model, a.tokens)
        r = con_tps / seq_tps
        out["serve"] = {"sequential_tok_s": seq_tps, "concurrent_tok_s": con_tps, "ratio": r}
        print(f"target 64 concurrent through vf-serve >= 5x sequential: {r:.2f}x {'OK' if r >= 5 else 'MISSED'}")
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
