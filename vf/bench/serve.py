"""`serve` suite: requests/s and latency percentiles through a real `vf-serve` subprocess, driven
by the real `openai` client (AsyncOpenAI) at concurrency 1, 16 and 64.

Reference: the same requests (same messages, sampling, seeds, fixed reply length with EOS
ignored) sent to the same embedded engine in-process (`LocalEngine.generate`) at the same
concurrency. `vs_inprocess` = served req/s ÷ in-process req/s — the cost of the HTTP API (1.0 is
free); `vs_c1` = served req/s at this concurrency ÷ at concurrency 1 — what continuous batching
buys a client that sends requests in parallel. Server and client are separate processes.
"""

from __future__ import annotations

import time
from typing import Any

from vf.bench.common import Case, Ratio, percentile, ratio, run_child, suite_result

SIZES = {
    "full": {"concurrency": [1, 16, 64], "requests_per_level": 128, "tokens": 32},
    "quick": {"concurrency": [1, 16, 64], "requests_per_level": 64, "tokens": 16},
    "tiny": {"concurrency": [1, 4], "requests_per_level": 4, "tokens": 4},
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, max_batch: int):
    """A `vf-serve` subprocess on 127.0.0.1:port, returned once /health answers."""
    import subprocess
    import sys
    import urllib.request

    cmd = [sys.executable, "-m", "vf.commands.serve", model, "--port", str(port), "--max-queue", "4096",
           "--max-batch", str(max_batch)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"vf-serve exited: {proc.stderr.read()[-2000:]}") from None
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("vf-serve did not become healthy within 180 s")


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"request number {i}: please reverse the words in this sentence"}]


def _stats(lat: list[float], wall: float, n: int, tokens: int) -> dict[str, Any]:
    return {"requests_per_s": round(n / wall, 2), "tokens_per_s": round(tokens / wall, 1),
            "p50_ms": round(1000 * percentile(lat, 50), 1), "p90_ms": round(1000 * percentile(lat, 90), 1),
            "p99_ms": round(1000 * percentile(lat, 99), 1)}


def measure(model: str, concurrency: list[int], requests_per_level: int, tokens: int) -> dict[str, Any]:
    """(child) {c: {"served": stats, "inprocess": stats}} for every concurrency level."""
    import asyncio
    import subprocess

    from openai import AsyncOpenAI

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    port = free_port()
    proc = start_server(model, port, max(concurrency))
    engine = LocalEngine.from_model(model, max_batch=max(concurrency))
    out: dict[str, Any] = {}

    async def level(c: int, call) -> dict[str, Any]:
        sem = asyncio.Semaphore(c)
        lat, toks = [], []

        async def one(i):
            async with sem:
                t = time.perf_counter()
                toks.append(await call(i))
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*[one(i) for i in range(min(c, 4))])  # warm-up
        lat.clear(), toks.clear()
        t = time.perf_counter()
        await asyncio.gather(*[one(i) for i in range(requests_per_level)])
        return _stats(lat, time.perf_counter() - t, requests_per_level, sum(toks))

    async def main():
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=600)

        async def served(i):
            r = await client.chat.completions.create(
                model=model, messages=_messages(i), temperature=1.0, seed=i, max_tokens=tokens,
                extra_body={"ignore_eos": True})
            return r.usage.completion_tokens

        async def inproc(i):
            s = Sampling(temperature=1.0, seed=i, max_tokens=tokens, logprobs=True)
            prompt = engine.encode_chat(_messages(i))
            seq = await engine.generate_ids(prompt, s, ignore_eos=True)
            engine.build_message(engine.finish_text(seq), False)  # the same decode work as the server
            return len(seq.token_ids)

        for c in concurrency:
            out[str(c)] = {"served": await level(c, served), "inprocess": await level(c, inproc)}
        await client.close()
        await engine.close()

    try:
        asyncio.run(main())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def run(size: str = "full", model: str = "tiny", **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = {**SIZES[size], "size": size, "model": model}
    res = run_child("vf.bench.serve:measure", {"model": model, "concurrency": cfg["concurrency"],
                                              "requests_per_level": cfg["requests_per_level"],
                                              "tokens": cfg["tokens"]})
    base = res[str(cfg["concurrency"][0])]["served"]["requests_per_s"]
    cases = []
    for c in cfg["concurrency"]:
        s, ip = res[str(c)]["served"], res[str(c)]["inprocess"]
        rs = {"vs_inprocess": Ratio(ratio(s["requests_per_s"], ip["requests_per_s"]), "higher")}
        if c != cfg["concurrency"][0]:
            rs["vs_c1"] = Ratio(ratio(s["requests_per_s"], base), "higher")
        cases.append(Case(name=f"concurrency {c}", ours=s, ref=ip, ours_label="vf-serve + openai client",
                          ref_label="same engine in-process", ratios=rs))
    notes = [(f"{cfg['requests_per_level']} chat requests per level, {cfg['tokens']} tokens each (EOS ignored), "
              "temperature 1 with per-request seeds; latency = request start to full response")]
    return suite_result("serve", cfg, cases, notes=notes, wall_s=round(time.perf_counter() - t0, 1))
