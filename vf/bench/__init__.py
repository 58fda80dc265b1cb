"""`vf-bench`: our code and a reference implementation measured on the same work in the same run.

    from vf.bench import SUITES, run_suite
    result = run_suite("loss", size="quick")      # one suite's record (see vf.bench.common)

Suites (one module each): trainer, loss, engine, serve, harness, stability, stability_real, parallel. Sizes: "full" (the
recorded numbers), "quick" (minutes per suite on 2 CPU cores; a first look), "tiny"
(seconds; the CI smoke test and the CLI's own tests, no meaningful figures). Importing this package does not
import torch; every measurement runs in a child process.
"""

from __future__ import annotations

import importlib
from typing import Any

SUITES: dict[str, str] = {
    "trainer": "fwd+bwd tokens/s, peak memory and MFU: native model + chunked loss vs transformers + full logits",
    "loss": "chunked vs naive LM-head log-probs at 32k and 152k vocab: time and peak memory",
    "engine": "decode tokens/s: embedded engine vs transformers generate (and vLLM where installed)",
    "serve": "requests/s and latency percentiles through vf-serve with the openai client",
    "harness": ("episodes/s of the eval harness vs bare engine calls against a zero-latency server; program "
                "harnesses and whole vf-eval processes vs verifiers 0.4.0"),
    "stability": "a short RL run with injected drift/staleness under ipo/icepop/ppo/cispo/no-mask",
    "stability_real": "the same losses with real drift: a bf16 engine, staleness up to 64 steps, a higher LR",
    "parallel": "per-rank memory at context parallel 2 vs 1 and expert parallel 2 vs 1, tokens/s, all-to-all time",
}
SIZES = ("full", "quick", "tiny")


def run_suite(name: str, size: str = "full", **options: Any) -> dict[str, Any]:
    """Run one suite and return its record (raises KeyError for an unknown suite)."""
    if name not in SUITES:
        raise KeyError(name)
    module = importlib.import_module(f"vf.bench.{name}")
    return module.run(size=size, **options)
