"""`parallel` suite: what context and expert parallelism buy per rank, measured under torchrun (gloo
on CPU) against the 1-process run of the same work in the same suite run.

    cp:  one packed row of T tokens (a tiny-width dense model: the activations, not the weights,
         are what grows with T), forward + backward with the log-prob loss. Per-rank peak of the
         bytes torch allocates in the step (`common.peak_allocated_mib`) at cp 2 ÷ cp 1 (target
         ≤ 0.6); then the longest row that fits under the cp-1 peak of the base length, tried at
         cp 2 at 1.5, 1.8, 2, 2.5 and 3× (target ≥ 1.8×; quick: up to 2×).
    ep:  one MoE layer stack with many experts on N tokens per rank: expert-parameter bytes per
         rank at ep 2 ÷ ep 1 (0.5 by construction, checked), tokens/s of forward + backward at ep 2
         vs ep 1 (each rank its own N tokens, so ep 2 does twice the work in the same time when
         the all-to-all is free), and the seconds per step spent in all-to-all.
    moe: the MoE block alone at Qwen3-30B-A3B /4 (hidden 512, 128 experts of 192, top-8; the
         trainer suite's shape), forward + backward on N tokens per rank, one thread per rank:
         MFU = 6·(E·H + 3·k·I·H)·N / step time / the same process's peak (the best fp32 matmul
         rate on its one thread: 512², 1024², or one expert's six GEMMs of forward and backward at
         its balanced share of N·k/E rows), ours at ep 1 and at ep vs transformers' Qwen3MoeSparseMoeBlock (its default
         grouped_mm experts). The expert-shape rate is reported beside it as a share of the peak.

The layouts come from vf-train's flags (`vf-bench parallel --parallel.cp 4 --parallel.cp-style
ulysses --parallel.ep 4`, checked by the trainer's `plan`; default cp 2 in both styles and ep 2).
Each configuration runs as `torchrun --standalone --nproc_per_node W -m vf.bench.parallel`
(the worker below); rank 0 writes every rank's figures to a JSON file.
"""

from __future__ import annotations

import faulthandler
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from vf.bench.common import Case, ChildFailed, PeakMemory, Ratio, peak_allocated_mib, ratio, suite_result

DENSE = {"architecture": "qwen3", "vocab_size": 256, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
         "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 65536}
MOE = {"architecture": "qwen3_moe", "vocab_size": 256, "hidden_size": 128, "num_layers": 2, "num_heads": 4,
       "num_kv_heads": 2, "head_dim": 32, "intermediate_size": 256, "num_experts": 32, "num_experts_per_tok": 4,
       "moe_intermediate_size": 256, "norm_topk_prob": True, "max_position_embeddings": 4096}

SIZES: dict[str, dict[str, Any]] = {
    "full": {"cp_tokens": 16384, "cp_styles": ["ring", "ulysses"], "ep_tokens": 4096, "moe_tokens": 4096,
             "steps": 3, "grow": [1.5, 1.8, 2.0, 2.5, 3.0]},
    "quick": {"cp_tokens": 2048, "cp_styles": ["ring"], "ep_tokens": 1024, "moe_tokens": 1024, "steps": 2,
              "grow": [1.5, 1.8, 2.0]},
    "tiny": {"cp_tokens": 512, "cp_styles": ["ring"], "ep_tokens": 128, "moe_tokens": 128, "steps": 1, "grow": []},
}
# the MoE block of the trainer suite's Qwen3-30B-A3B /4 shape (vf/bench/trainer.py)
MOE_BLOCK = {"architecture": "qwen3_moe", "vocab_size": 256, "hidden_size": 512, "num_layers": 1, "num_heads": 4,
             "num_kv_heads": 1, "head_dim": 128, "intermediate_size": 1536, "num_experts": 128,
             "num_experts_per_tok": 8, "moe_intermediate_size": 192, "norm_topk_prob": True,
             "max_position_embeddings": 4096}


def layouts(parallel: dict[str, Any] | None, size: str) -> dict[str, Any]:
    """The layouts to measure, from vf-train's `--parallel.*` flags as given (a dict of the section's
    fields): {"cp": N, "cp_styles": [...], "ep": N}. Checked by the trainer's `plan` against the
    suite's models, so a split they cannot take exits 2 with the trainer's reason."""
    from types import SimpleNamespace

    from vf.config import validate
    from vf.errors import UsageError
    from vf.trainer.config import ParallelSection
    from vf.trainer.parallel import plan

    given = parallel or {}
    section = validate(ParallelSection, given)
    if section.dp_shard not in ("auto", 1):
        raise UsageError("--parallel.dp-shard: the parallel suite measures cp and ep against 1 process",
                         hint="data parallelism is measured by running vf-train under torchrun")
    cp = section.cp if "cp" in given else 2
    ep = 2 if section.ep == "auto" else section.ep if "ep" in given else 2
    for name, n in (("cp", cp), ("ep", ep)):
        if n < 2:
            raise UsageError(f"--parallel.{name} {n}: the suite compares a split against 1 process",
                             hint=f"--parallel.{name} 2 or more")
    styles = [section.cp_style] if "cp_style" in given else list(SIZES[size]["cp_styles"])
    for style in styles:
        plan(ParallelSection(cp=cp, cp_style=style), cp, 0, SimpleNamespace(num_experts=0, num_heads=DENSE["num_heads"]))
    for spec in (MOE, MOE_BLOCK):
        plan(ParallelSection(ep=ep), ep, 0, SimpleNamespace(num_experts=spec["num_experts"], num_heads=spec["num_heads"]))
    return {"cp": cp, "cp_styles": styles, "ep": ep}


# -- the worker (one per rank, under torchrun) --------------------------------------------------


def _model(spec: dict[str, Any]):
    import torch

    from vf.models import ModelConfig, build_model

    return build_model(ModelConfig(**spec), dtype=torch.float32, seed=0).train()


def _row(T: int, vocab: int):
    """One packed row of 4 documents: ids, positions, next-token targets [1, T]."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (1, T + 1), generator=g)
    doc = T // 4
    pos = torch.cat([torch.arange(doc)] * 3 + [torch.arange(T - 3 * doc)])[None]
    return ids[:, :-1].contiguous(), pos, ids[:, 1:].contiguous()


def _logprob_loss(model, ids, pos, targets):
    import torch

    hidden = model(ids, pos)
    logits = hidden @ model.lm_head_weight.t()
    return -torch.log_softmax(logits, -1).gather(-1, targets[..., None]).sum()


def _cp_step(T: int, cp: int, style: str, steps: int) -> dict[str, Any]:
    import torch.distributed as dist

    from vf.models.context_parallel import ContextShard, context_parallel, split_sequence

    model = _model(DENSE)
    ids, pos, tgt = _row(T, DENSE["vocab_size"])
    shard = None
    if cp > 1:
        rank = dist.get_rank()
        shard = ContextShard(group=dist.group.WORLD, size=cp, rank=rank, style=style, position_ids=pos)
        ids, pos, tgt = (split_sequence(t, cp, rank, dim=1) for t in (ids, pos, tgt))
    def step():
        with context_parallel(shard):
            _logprob_loss(model, ids, pos, tgt).backward()
        model.zero_grad(set_to_none=True)

    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    pm = PeakMemory()
    pm.reset()
    allocated = peak_allocated_mib(step)
    return {"tokens": T, "allocated_mib": round(allocated, 1), "rss_extra_mib": round(pm.extra_mib, 1),
            "seconds": round(min(times), 4)}


def _ep_step(tokens: int, ep: int, steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    model = _model(MOE)
    if ep > 1:
        from vf.models.expert_parallel import expert_params, shard_experts

        shard_experts(model, dist.group.WORLD)
        expert_bytes = sum(p.numel() * p.element_size() for _, p in expert_params(model))
    else:
        expert_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                           if n.endswith(("mlp.gate_up_proj", "mlp.down_proj")))
    spent = [0.0]
    real = dist.all_to_all_single if dist.is_initialized() else None
    if real is not None:  # the autograd all-to-all calls this in forward and backward
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        dist.all_to_all_single = timed
    seed = dist.get_rank() if dist.is_initialized() else 0
    ids = torch.randint(0, MOE["vocab_size"], (1, tokens + 1), generator=torch.Generator().manual_seed(seed))
    times, a2a = [], []
    for i in range(steps + 1):  # the first step warms up
        spent[0] = 0.0
        t0 = time.perf_counter()
        _logprob_loss(model, ids[:, :-1], None, ids[:, 1:]).backward()
        if i:
            times.append(time.perf_counter() - t0)
            a2a.append(spent[0])
        model.zero_grad(set_to_none=True)
    best = min(range(len(times)), key=times.__getitem__)
    return {"tokens_per_rank": tokens, "expert_mib": round(expert_bytes / 2**20, 3),
            "seconds": round(times[best], 4), "tokens_per_s": round(tokens * max(ep, 1) / times[best], 1),
            "all_to_all_s": round(a2a[best], 4)}


def _best_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _moe_step(tokens: int, ep: int, steps: int, impl: str) -> dict[str, Any]:
    """One MoE block's forward + backward on `tokens` rows: seconds, MFU against the best matmul
    rate this process reaches (512², 1024² or one expert's balanced shape), and that expert-shape
    rate as a share of it."""
    import torch
    import torch.distributed as dist

    H, E, k, Im = (MOE_BLOCK[key] for key in ("hidden_size", "num_experts", "num_experts_per_tok",
                                              "moe_intermediate_size"))
    if impl == "ours":
        from vf.models.moe import moe_layers

        model = _model(MOE_BLOCK)
        if ep > 1:
            from vf.models.expert_parallel import shard_experts

            shard_experts(model, dist.group.WORLD)
        block = moe_layers(model)[0]
        run = block
    else:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        cfg = Qwen3MoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=k, moe_intermediate_size=Im,
                             norm_topk_prob=True)
        cfg._experts_implementation = "grouped_mm"  # what a loaded model gets (its default); standalone: None
        block = Qwen3MoeSparseMoeBlock(cfg).float()
        for p in block.parameters():  # transformers leaves these uninitialised until a model's init
            torch.nn.init.normal_(p, std=0.02)
        run = block
    seed = dist.get_rank() if dist.is_initialized() else 0
    x = torch.randn(1, tokens, H, generator=torch.Generator().manual_seed(seed), requires_grad=True)

    def step():
        run(x).float().pow(2).mean().backward()
        block.zero_grad(set_to_none=True)
        x.grad = None

    step()  # warm-up (the first grouped_mm call of a process sets up)
    seconds = _best_seconds(step, max(steps, 2))
    rows = max(1, tokens * k // E)  # one expert's rows when the routing is balanced
    xs, w1, w2, hs = torch.randn(rows, H), torch.randn(H, 2 * Im), torch.randn(Im, H), torch.randn(rows, Im)
    g1, g2 = torch.randn(rows, 2 * Im), torch.randn(rows, H)

    def expert_gemms():  # one expert's forward, input-gradient and weight-gradient GEMMs
        torch.mm(xs, w1), torch.mm(hs, w2)
        torch.mm(g2, w2.t()), torch.mm(g1, w1.t())
        torch.mm(xs.t(), g1), torch.mm(hs.t(), g2)

    shape = 3 * 2 * rows * H * 3 * Im / _best_seconds(expert_gemms, 20)
    square = []
    for n in (512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        square.append(2 * n**3 / _best_seconds(lambda a=a, b=b: torch.mm(a, b), 20))
    peak = max(shape, *square)  # the best matmul rate this process reached
    flops = 6 * (E * H + 3 * k * Im * H) * tokens
    return {"tokens_per_rank": tokens, "seconds": round(seconds, 4), "mfu_pct": round(100 * flops / seconds / peak, 1),
            "peak_gflops": round(peak / 1e9, 1),
            "expert_shape_peak_pct": round(100 * shape / peak, 1)}


def worker(spec: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    try:
        if spec["kind"] == "cp":
            out = _cp_step(spec["tokens"], world, spec.get("style", "ring"), spec["steps"])
        elif spec["kind"] == "moe":
            out = _moe_step(spec["tokens"], world, spec["steps"], spec["impl"])
        else:
            out = _ep_step(spec["tokens"], world, spec["steps"])
        figures = [None] * world
        if world > 1:
            dist.all_gather_object(figures, out)
        else:
            figures = [out]
        if int(os.environ.get("RANK", "0")) == 0:
            Path(spec["out"]).write_text(json.dumps(figures))
    finally:
        if world > 1:
            dist.destroy_process_group()


def launch_worker(spec: dict[str, Any], world: int, timeout: float = 1200,
                  retried: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the worker on `world` processes; every rank's figures (rank order).

    A run in which a rank was killed by a signal (torchrun reports a negative exit code: a C++
    `std::terminate` in a rank, SIGABRT) is run once more, and the first failure's summary is
    appended to `retried` for the suite's notes. That abort came twice in ~20 CI runs of 2-4 gloo
    ranks on 2 busy cores and never in 50 standalone runs; each launch measures afresh, so a rerun
    loses nothing. A rank's Python exception (a real bug, which would repeat) fails at once."""
    first = True
    while True:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world)]
                   if world > 1 else [sys.executable]) + ["-m", "vf.bench.parallel",
                                                           json.dumps({**spec, "out": str(out)})]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env)
            if p.returncode == 0 and out.exists():
                return json.loads(out.read_text())
        lines = p.stderr.strip().splitlines()  # a rank's own error, then torchrun's summary
        errors = [line for line in lines[:-15] if any(w in line for w in ("Error", "error:", "terminate", "what()"))]
        failure = f"parallel worker {spec} on {world} failed (exit {p.returncode}):\n" + "\n".join(errors[-10:] + lines[-15:])
        signalled = any(re.match(r"\s*exitcode\s*:\s*-\d", line) for line in lines)
        if not (first and signalled and retried is not None):
            raise ChildFailed(failure)
        retried.append(failure)
        first = False


# -- the suite ----------------------------------------------------------------------------------


def run(size: str = "full", parallel: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    lay = layouts(parallel, size)
    cfg = {**SIZES[size], "size": size, **lay}
    steps, T, cp, ep = cfg["steps"], cfg["cp_tokens"], lay["cp"], lay["ep"]
    cases: list[Case] = []
    retried: list[str] = []  # runs in which a rank was killed by a signal, run again
    launch = partial(launch_worker, retried=retried)

    for style in lay["cp_styles"]:
        one = launch({"kind": "cp", "tokens": T, "steps": steps}, 1)[0]
        split = launch({"kind": "cp", "tokens": T, "steps": steps, "style": style}, cp)
        per_rank = max(r["allocated_mib"] for r in split)
        # the longest row (of these multiples of T) that fits at cp N under the cp-1 peak of T
        longest = 1.0
        for grow in cfg["grow"]:
            tokens = math.ceil(T * grow / 64) * 64
            tried = launch({"kind": "cp", "tokens": tokens, "steps": 1, "style": style}, cp)
            if max(r["allocated_mib"] for r in tried) > one["allocated_mib"]:
                break
            longest = tokens / T
        cases.append(Case(
            name=f"cp{cp}-{style}/T{T}", ours={"allocated_mib_per_rank": per_rank,
                                               "rss_extra_mib_per_rank": max(r["rss_extra_mib"] for r in split),
                                               "seconds": max(r["seconds"] for r in split), "longest_within_cap": longest},
            ref=one, ours_label=f"cp {cp} ({style})", ref_label="cp 1",
            ratios={"memory": Ratio(ratio(per_rank, one["allocated_mib"]), "lower", 0.6 if cp == 2 else None),
                    "longest_sequence": Ratio(longest, "higher", 1.8 if cp == 2 else None)}))
    N = cfg["ep_tokens"]
    one = launch({"kind": "ep", "tokens": N, "steps": steps}, 1)[0]
    split = launch({"kind": "ep", "tokens": N, "steps": steps}, ep)
    slowest = max(split, key=lambda r: r["seconds"])
    ours = {"expert_mib_per_rank": split[0]["expert_mib"], "tokens_per_s": round(ep * N / slowest["seconds"], 1),
            "all_to_all_s_per_step": slowest["all_to_all_s"], "seconds": slowest["seconds"]}
    cases.append(Case(
        name=f"ep{ep}/N{N}", ours=ours, ref=one, ours_label=f"ep {ep}", ref_label="ep 1",
        ratios={"expert_memory": Ratio(ratio(ours["expert_mib_per_rank"], one["expert_mib"]), "lower", 1 / ep),
                "tokens_per_s": Ratio(ratio(ours["tokens_per_s"], one["tokens_per_s"]), "higher")}))
    M = cfg["moe_tokens"]
    moe = {"kind": "moe", "tokens": M, "steps": steps}
    hf = launch({**moe, "impl": "transformers"}, 1)[0]
    mine = launch({**moe, "impl": "ours"}, 1)[0]
    split = launch({**moe, "impl": "ours"}, ep)
    worst = min(split, key=lambda r: r["mfu_pct"])
    cases.append(Case(
        name=f"moe-block-qwen3-30b-a3b/N{M}", ref=hf, ours_label=f"ours (ep 1; ep {ep})", ref_label="transformers",
        ours={**mine, f"ep{ep}_mfu_pct": worst["mfu_pct"], f"ep{ep}_seconds": worst["seconds"]},
        ratios={"mfu": Ratio(ratio(mine["mfu_pct"], hf["mfu_pct"]), "higher"),
                f"mfu_ep{ep}": Ratio(ratio(worst["mfu_pct"], hf["mfu_pct"]), "higher")}))
    return suite_result("parallel", cfg, cases, wall_s=round(time.perf_counter() - t0, 1), notes=[
        ("torchrun on gloo (CPU), one thread per rank; cp memory = the most bytes torch had allocated at once "
         "during one forward + backward (torch's memory profiler; peak RSS above the loaded model is reported "
         "beside it, and also counts the allocator's cached pages); "
         f"ep tokens/s counts every rank's tokens (ep {ep} does {ep}× the work of ep 1 per step); "
         "MoE-block MFU is per rank against the rank's own one-thread matmul peak, each rank with its own N "
         "tokens (the lowest rank reported); peak = the best rate of a plain fp32 matmul in the same process "
         "(512², 1024², or one expert's six forward/backward GEMMs at its balanced share of rows); "
         "expert_shape_peak_pct: those six GEMMs as plain matmuls, as a percentage of the peak (the MoE "
         "block's ceiling: nearly all its FLOPs are these GEMMs)")]
        + [f"run again after a rank was killed by a signal: {failure}" for failure in retried])


if __name__ == "__main__":
    faulthandler.enable()  # a rank that aborts (SIGABRT from C++) prints where it was
    worker(json.loads(sys.argv[1]))
