"""Peak memory of one forward+backward, with and without context parallelism (a measurement, not a test):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node N tests/parallel/cp_memory.py STYLE T [--layers L]

STYLE none (one process, the plain model) | ring | ulysses. A tiny-width dense GQA model (hidden 64,
4 q / 2 kv heads × 16, 2 layers, vocab 96) on one row of T tokens in 4 documents; loss = the sum of
the next-token log-probs of this rank's tokens. Measured with torch's CPU memory profiler
(`vf.bench.common.peak_allocated_mib`): bytes allocated inside the step that are
live at once (parameters, made before, are not in it; their gradients are). tracemalloc cannot
see these: torch's CPU allocator bypasses Python's.
Rank 0 prints one JSON line (with the wall time of an unprofiled step before it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed as dist
from vf.models import context_parallel as cp_module
from vf.models.config import ModelConfig
from vf.models.context_parallel import ContextShard, context_parallel, split_sequence
from vf.models.transformer import build_model

from vf.bench.common import peak_allocated_mib


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("style", choices=["none", "ring", "ulysses"])
    ap.add_argument("T", type=int)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--q-tile", type=int, default=cp_module.Q_TILE, help="ring: query rows per score tile")
    a = ap.parse_args(argv)
    cp_module.Q_TILE = a.q_tile
    cfg = ModelConfig(architecture="qwen3", vocab_size=96, hidden_size=64, num_layers=a.layers, num_heads=4,
                      num_kv_heads=2, head_dim=16, intermediate_size=128)
    model = build_model(cfg, seed=0)
    ids = torch.randint(0, 96, (1, a.T), generator=torch.Generator().manual_seed(0))
    q = a.T // 4
    pos = torch.cat([torch.arange(q)] * 3 + [torch.arange(a.T - 3 * q)])[None]
    targets = torch.roll(ids, -1, 1)
    size, rank, shard = 1, 0, None
    if a.style != "none":
        dist.init_process_group("gloo")
        size, rank = dist.get_world_size(), dist.get_rank()
        shard = ContextShard(dist.group.WORLD, size, rank, a.style, pos)
        ids, pos, targets = (split_sequence(t, size, rank) for t in (ids, pos, targets))
    def step():
        with context_parallel(shard):
            logits = model(ids, pos) @ model.lm_head_weight.t()
            lp = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])
            lp.sum().backward()
        model.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()  # unprofiled: the time (and a warm-up)
    seconds = time.perf_counter() - t0
    peak = peak_allocated_mib(step)
    if rank == 0:
        print(json.dumps({"style": a.style, "cp": size, "T": a.T, "layers": a.layers, "q_tile": a.q_tile,
                          "peak_mib": round(peak, 1), "seconds": round(seconds, 2)}))
    if shard is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
