"""One weight publish, run by tests/test_streamed_publish.py (plain python or torchrun, gloo on CPU):
a seeded native model (FSDP2-sharded under torchrun) is published to an HF checkpoint two ways,
the old one (the whole state dict gathered on rank 0, `save_hf`) and the streamed one
(`CheckpointFiles.write(stream_state)`), and rank 0 writes what it measured to OUT/report.json.

    [torchrun --standalone --nproc_per_node 2] tests/publish_worker.py OUT [--layers 8 --hidden 512]
"""

import argparse
import dataclasses
import json
import resource
import time
from pathlib import Path


def rss_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=0, help="0: the built-in tiny-random shape")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--only", choices=["old", "streamed", "both"], default="both")
    args = ap.parse_args(argv)

    import torch
    from vf.models import build_model, save_hf
    from vf.models.checkpoint import read_config
    from vf.models.tiny import builtin_model_path
    from vf.trainer import distributed
    from vf.trainer.step import PolicyLogprobs
    from vf.trainer.weights import CheckpointFiles

    torch.set_num_threads(1)
    d = distributed.init("cpu")
    config = read_config(builtin_model_path("tiny-random"))
    if args.layers:
        h = args.hidden
        config = dataclasses.replace(config, num_layers=args.layers, hidden_size=h, intermediate_size=3 * h,
                                     num_heads=h // 32, num_kv_heads=h // 64, head_dim=32)
    model = build_model(config, seed=0)
    groups: dict[str, int] = {}
    for name, p in model.named_parameters():
        key = distributed.param_group(name)
        groups[key] = groups.get(key, 0) + p.numel() * p.element_size()
    policy = distributed.shard(PolicyLogprobs(model), d)
    out = Path(args.out)
    report = {"world_size": d.world_size, "model_bytes": sum(groups.values()), "largest_group_bytes": max(groups.values()),
              "groups": len(groups)}

    if args.only in ("old", "both"):  # the old path: whole state dict on rank 0, a model built from it, save_hf
        distributed.barrier(d)
        rss0, t0 = rss_peak_mb(), time.perf_counter()
        state = distributed.full_state_dict(policy, d)
        if d.is_main:
            whole = build_model(config)
            whole.load_state_dict(state)
            save_hf(whole, out / "old")
            del whole
        del state
        distributed.barrier(d)
        report["old"] = {"seconds": time.perf_counter() - t0, "rss_peak_growth_mb": rss_peak_mb() - rss0}

    if args.only in ("streamed", "both"):
        distributed.barrier(d)
        distributed.METER.peak = distributed.METER.live
        rss0, t0 = rss_peak_mb(), time.perf_counter()
        stream = distributed.stream_state(policy, d)
        if d.is_main:
            CheckpointFiles(out, config).write(stream, 1)
        distributed.drain(stream)
        distributed.barrier(d)
        report["streamed"] = {"seconds": time.perf_counter() - t0, "rss_peak_growth_mb": rss_peak_mb() - rss0,
                              "gathered_peak_bytes": distributed.METER.peak, "gathered_live_after": distributed.METER.live}
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    distributed.shutdown(d)


if __name__ == "__main__":
    main()
