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

Each configuration runs as `torchrun --standalone --nproc_per_node W -m vf.bench.parallel`
(the worker below); rank 0 writes every rank's figures to a JSON file.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vf.bench.common import Case, ChildFailed, PeakMemory, Ratio, peak_allocated_mib, ratio, suite_result

DENSE = {"architecture": "qwen3", "vocab_size": 256, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
         "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 65536}
MOE = {"architecture": "qwen3_moe", "vocab_size": 256, "hidden_size": 128, "num_layers": 2, "num_heads": 4,
       "num_kv_heads": 2, "head_dim": 32, "intermediate_size": 256, "num_experts": 32, "num_experts_per_tok": 4,
       "moe_intermediate_size": 256, "norm_topk_prob": True, "max_position_embeddings": 4096}

SIZES: dict[str, dict[str, Any]] = {
    "full": {"cp_tokens": 16384, "cp_styles": ["ring", "ulysses"], "ep_tokens": 4096, "steps": 3,
             "grow": [1.5, 1.8, 2.0, 2.5, 3.0]},
    "quick": {"cp_tokens": 2048, "cp_styles": ["ring"], "ep_tokens": 1024, "steps": 2, "grow": [1.5, 1.8, 2.0]},
    "tiny": {"cp_tokens": 512, "cp_styles": ["ring"], "ep_tokens": 128, "steps": 1, "grow": []},
}


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


def launch(spec: dict[str, Any], world: int, timeout: float = 1200) -> list[dict[str, Any]]:
    """Run the worker on `world` processes; every rank's figures (rank order)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world)]
               if world > 1 else [sys.executable]) + ["-m", "vf.bench.parallel", json.dumps({**spec, "out": str(out)})]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if p.returncode != 0 or not out.exists():
            raise ChildFailed(f"parallel worker {spec} on {world} failed (exit {p.returncode}):\n"
                              + "\n".join(p.stderr.strip().splitlines()[-15:]))
        return json.loads(out.read_text())


# -- the suite ----------------------------------------------------------------------------------


def run(size: str = "full", **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = {**SIZES[size], "size": size}
    steps, T = cfg["steps"], cfg["cp_tokens"]
    cases: list[Case] = []
    for style in cfg["cp_styles"]:
        one = launch({"kind": "cp", "tokens": T, "steps": steps}, 1)[0]
        two = launch({"kind": "cp", "tokens": T, "steps": steps, "style": style}, 2)
        per_rank = max(r["allocated_mib"] for r in two)
        # the longest row (of these multiples of T) that fits at cp 2 under the cp-1 peak of T
        longest = 1.0
        for grow in cfg["grow"]:
            tokens = math.ceil(T * grow / 64) * 64
            tried = launch({"kind": "cp", "tokens": tokens, "steps": 1, "style": style}, 2)
            if max(r["allocated_mib"] for r in tried) > one["allocated_mib"]:
                break
            longest = tokens / T
        cases.append(Case(
            name=f"cp2-{style}/T{T}", ours={"allocated_mib_per_rank": per_rank,
                                            "rss_extra_mib_per_rank": max(r["rss_extra_mib"] for r in two),
                                            "seconds": max(r["seconds"] for r in two), "longest_within_cap": longest},
            ref=one, ours_label=f"cp 2 ({style})", ref_label="cp 1",
            ratios={"memory": Ratio(ratio(per_rank, one["allocated_mib"]), "lower", 0.6),
                    "longest_sequence": Ratio(longest, "higher", 1.8)}))
    N = cfg["ep_tokens"]
    one = launch({"kind": "ep", "tokens": N, "steps": steps}, 1)[0]
    two = launch({"kind": "ep", "tokens": N, "steps": steps}, 2)
    slowest = max(two, key=lambda r: r["seconds"])
    ours = {"expert_mib_per_rank": two[0]["expert_mib"], "tokens_per_s": round(2 * N / slowest["seconds"], 1),
            "all_to_all_s_per_step": slowest["all_to_all_s"], "seconds": slowest["seconds"]}
    cases.append(Case(
        name=f"ep2/N{N}", ours=ours, ref=one, ours_label="ep 2", ref_label="ep 1",
        ratios={"expert_memory": Ratio(ratio(ours["expert_mib_per_rank"], one["expert_mib"]), "lower", 0.5),
                "tokens_per_s": Ratio(ratio(ours["tokens_per_s"], one["tokens_per_s"]), "higher")}))
    return suite_result("parallel", cfg, cases, wall_s=round(time.perf_counter() - t0, 1), notes=[
        ("torchrun on gloo (CPU), one thread per rank; cp memory = the most bytes torch had allocated at once "
         "during one forward + backward (torch's memory profiler; peak RSS above the loaded model is reported "
         "beside it, and also counts the allocator's cached pages); "
         "ep tokens/s counts every rank's tokens (ep 2 does twice the work of ep 1 per step)")])


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
