"""`loss` suite: chunked vs naive per-token log-probs over the LM head (vf.trainer.logprobs).

Cases, per vocabulary size: forward (no grad) and forward+backward (grads wrt hidden and the LM
head weight, what a training step needs). Each variant runs in its own child process so peak
memory is its own; the figure is the extra resident memory above the inputs (hidden, weight,
targets), i.e. what the log-prob computation itself allocates.

Ratios (chunked ÷ naive): `speedup` = naive time ÷ chunked time (higher is better) and
`memory` = chunked peak ÷ naive peak (lower is better; target ≤ 0.25 at the 152k vocabulary).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from vf.bench.common import Case, PeakMemory, Ratio, ratio, run_child, suite_result

SIZES = {
    # tokens N, hidden H, vocabularies, timed repeats
    "full": {"tokens": 4096, "hidden": 256, "vocabs": [32000, 151936], "repeats": 2},
    "quick": {"tokens": 1024, "hidden": 256, "vocabs": [32000, 151936], "repeats": 1},
    "tiny": {"tokens": 64, "hidden": 32, "vocabs": [4096], "repeats": 1},
}
MEMORY_TARGET_VOCAB = 151936


def measure(variant: str, tokens: int, hidden: int, vocab: int, repeats: int, chunk: int) -> dict[str, Any]:
    """(child) Time and peak extra memory of one variant: forward no-grad, then forward+backward."""
    import torch

    from vf.trainer.logprobs import chunked_logprobs, naive_logprobs

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden)
    w = torch.randn(vocab, hidden) * 0.05
    tgt = torch.randint(0, vocab, (tokens,))

    def fn(hh, ww):
        if variant == "chunked":
            return chunked_logprobs(hh, ww, tgt, chunk_size=chunk)
        return naive_logprobs(hh, ww, tgt)

    out: dict[str, Any] = {}
    pm = PeakMemory()
    for phase in ("fwd", "fwd_bwd"):
        times = []
        for i in range(repeats + 1):  # the first run is the warm-up; peak memory is over all
            hh = h.clone().requires_grad_(phase == "fwd_bwd")
            ww = w.clone().requires_grad_(phase == "fwd_bwd")
            if i == 0:
                pm.reset()
            t = time.perf_counter()
            if phase == "fwd":
                with torch.no_grad():
                    lp = fn(hh, ww)
            else:
                lp = fn(hh, ww)
                lp.sum().backward()
            dt = time.perf_counter() - t
            if i > 0:
                times.append(dt)
            del lp, hh, ww
        med = statistics.median(times)
        out[phase] = {"seconds": round(med, 4), "tokens_per_s": round(tokens / med, 1), **pm.figures()}
    return out


def run(size: str = "full", chunk: int | None = None, **_: Any) -> dict[str, Any]:
    from vf.trainer.logprobs import DEFAULT_CHUNK_SIZE

    t0 = time.perf_counter()
    cfg = {**SIZES[size], "size": size, "chunk": chunk or DEFAULT_CHUNK_SIZE}
    cases: list[Case] = []
    for vocab in cfg["vocabs"]:
        kw = {"tokens": cfg["tokens"], "hidden": cfg["hidden"], "vocab": vocab, "repeats": cfg["repeats"],
              "chunk": cfg["chunk"]}
        ours = run_child("vf.bench.loss:measure", {"variant": "chunked", **kw})
        ref = run_child("vf.bench.loss:measure", {"variant": "naive", **kw})
        for phase in ("fwd", "fwd_bwd"):
            o, r = ours[phase], ref[phase]
            target = 0.25 if vocab == MEMORY_TARGET_VOCAB else None
            cases.append(Case(
                name=f"V{vocab}/{phase}", ours=o, ref=r, ours_label=f"chunked {cfg['chunk']}",
                ref_label="naive log_softmax",
                ratios={"speedup": Ratio(ratio(r["seconds"], o["seconds"]), "higher"),
                        "memory": Ratio(ratio(o["extra_mib"], r["extra_mib"]), "lower", target)},
            ))
    return suite_result("loss", cfg, cases, wall_s=round(time.perf_counter() - t0, 1),
                        notes=[(f"N={cfg['tokens']} tokens, H={cfg['hidden']}, fp32; memory = peak RSS above the "
                                "inputs, each variant in a fresh process")])
