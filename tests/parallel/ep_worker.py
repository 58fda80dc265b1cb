"""One expert-parallel check, run by tests/test_expert_parallel.py under torchrun (gloo on CPU):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node N tests/parallel/ep_worker.py OUT.json --ep P

Every rank builds the same seeded tiny Qwen3-MoE-like native model (8 experts, top-2, hidden 32,
2 MoE layers; `--shared`: plus a shared expert; `--latent W`: the experts run in a W-wide latent
space between the MoE's latent_in/latent_out projections, so W-wide rows are exchanged) and the same packed batch (4 rows of 24 tokens,
position_ids restarting: several documents per row). The world's N ranks form N/P expert groups of
P ranks (group g = ranks [g*P, (g+1)*P)); the ranks holding the same expert block are replicas.

Reference (on every rank, no collectives): the whole model over the whole batch, loss = Σ over all
tokens of the cross-entropy, backward. EP: a copy with `shard_experts`, each rank's loss = Σ over its
own rows (rows split evenly by rank), backward; non-expert grads all-reduced (SUM) over the world,
expert grads by `reduce_expert_grads(model, replicas, 1.0)`. Compared: the loss (summed over ranks),
every parameter's grad (an expert grad against its slice of the reference's), the routed expert ids,
`global_moe_stats` against the reference's `moe_stats`, `full_expert_state` against the reference's
expert weights and its round trip through `load_expert_state`.

`--replay skew`: router replay sends every token to the last ep rank's experts (the other ranks send
it all their rows, none to themselves, and receive none). `--replay random`: replay ids on half the
rows (−1 elsewhere): the routed ids must equal them where given. `--ckpt`: activation checkpointing
on the EP model (its backward re-runs each layer's forward, collectives included).

Rank 0 writes {errors: {what: max error over ranks (`err`)}, ...} to OUT.json; exit 1 on a mismatch
(errors > TOL, routing differing from the reference or the replay).
"""

import argparse
import copy
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from vf.models.config import ModelConfig
from vf.models.expert_parallel import (
    expert_params,
    full_expert_state,
    global_moe_stats,
    load_expert_state,
    reduce_expert_grads,
    shard_experts,
)
from vf.models.moe import moe_layers, moe_stats, replay_routing
from vf.models.transformer import build_model, init_weights

TOL = 1e-5
E, K, B, T, V = 8, 2, 4, 24, 64


def tiny_moe(impl: str, shared: bool, latent: int | None = None):
    cfg = ModelConfig(architecture="qwen3_moe", vocab_size=V, hidden_size=32, num_layers=2, num_heads=2,
                      num_kv_heads=2, head_dim=16, intermediate_size=48, num_experts=E, num_experts_per_tok=K,
                      moe_intermediate_size=16, norm_topk_prob=True, n_shared_experts=int(shared), moe_impl=impl,
                      moe_latent_size=latent)
    # std 0.2, not the init's 0.02: decisive routing and gradients well above float32 noise
    return init_weights(build_model(cfg, seed=0), seed=0, std=0.2)


def packed_batch(g: torch.Generator):
    """input_ids, position_ids (restarting at document starts), labels: [B, T] each."""
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)
    pos = torch.empty(B, T, dtype=torch.long)
    for r in range(B):
        cuts = sorted(torch.randperm(T - 2, generator=g)[:2].add(1).tolist())  # 3 documents per row
        starts = [0, *cuts]
        for i, s in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else T
            pos[r, s:end] = torch.arange(end - s)
    return ids, pos, labels


def replay_ids(mode: str, ep: int, g: torch.Generator) -> torch.Tensor | None:
    """[B, T, L, k] replayed expert ids (−1: the router's own choice) or None."""
    L = 2
    if mode == "none":
        return None
    if mode == "skew":  # the last ep rank's block holds experts [E - E/ep, E)
        return torch.tensor([E - 1, E - 2]).expand(B, T, L, K).clone()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(B * T * L)]).view(B, T, L, K)
    ids[::2] = -1  # even rows: route normally
    return ids


def err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| relative to the reference's scale (absolute below 1): float32 sums taken in
    another order (per rank, then across ranks) differ by a few ulps of the values, ~1e-7 relative;
    a routing or reduction bug moves them by whole terms."""
    return ((got - want).abs().max() / want.abs().max().clamp(min=1.0)).item()


def loss_of(model, ids, pos, labels):
    logits = model.compute_logits(ids, pos)
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="sum")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ep", type=int, required=True)
    ap.add_argument("--impl", choices=["grouped", "loop"], default="grouped")
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--replay", choices=["none", "skew", "random"], default="none")
    ap.add_argument("--ckpt", action="store_true", help="activation checkpointing on the EP model")
    ap.add_argument("--latent", type=int, default=None, help="a latent MoE: experts in this width (Nemotron-H Super)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=90))  # a hung collective raises, not waits 30 min
    world, rank = dist.get_world_size(), dist.get_rank()
    ep = args.ep
    assert world % ep == 0 and B % world == 0, (world, ep)
    # every rank creates every group, in the same order (new_group is collective)
    ep_groups = [dist.new_group(list(range(i * ep, (i + 1) * ep))) for i in range(world // ep)]
    rep_groups = [dist.new_group(list(range(j, world, ep))) for j in range(ep)] if world > ep else None
    ep_group = ep_groups[rank // ep]
    replicas = rep_groups[rank % ep] if rep_groups else None

    ref = tiny_moe(args.impl, args.shared, args.latent)
    model = copy.deepcopy(ref)
    sharded = shard_experts(model, ep_group)
    model.activation_checkpointing = args.ckpt  # backward recomputes each layer: its exchanges run again
    g = torch.Generator().manual_seed(1)
    ids, pos, labels = packed_batch(g)
    routed = replay_ids(args.replay, ep, g)
    rows = slice(rank * B // world, (rank + 1) * B // world)
    for m in moe_layers(ref) + moe_layers(model):
        m.record_routing = True

    with replay_routing(ref, routed):  # the 1-process reference: everything, every token
        loss_ref = loss_of(ref, ids, pos, labels)
        loss_ref.backward()
    ref_routed = [m.routed.view(B, T, K)[rows] for m in moe_layers(ref)]
    stats_ref = moe_stats(ref)

    with replay_routing(model, None if routed is None else routed[rows]):
        loss = loss_of(model, ids[rows], pos[rows], labels[rows])
        loss.backward()
    ep_routed = [m.routed.view(-1, T, K) for m in moe_layers(model)]
    experts = dict(expert_params(model))
    for name, p in model.named_parameters():
        if name not in experts and p.grad is not None:
            dist.all_reduce(p.grad)
    reduce_expert_grads(model, replicas, 1.0)
    total = loss.detach().clone()
    dist.all_reduce(total)

    errors = {"loss": err(total, loss_ref.detach())}
    ref_params = dict(ref.named_parameters())
    first = moe_layers(model)[0].ep.first
    grad_max = 0.0
    for name, p in model.named_parameters():
        want = ref_params[name].grad
        if name in experts:
            want = want[first:first + p.shape[0]]
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        want = want if want is not None else torch.zeros_like(p)
        errors[f"grad/{name}"] = err(got, want)
        grad_max = max(grad_max, want.abs().max().item())
    routing_ok = all(torch.equal(a, b) for a, b in zip(ep_routed, ref_routed))
    replay_ok = True
    if routed is not None:
        given = routed[rows]
        replay_ok = all(torch.equal(r[given[:, :, i] >= 0], given[:, :, i][given[:, :, i] >= 0])
                        for i, r in enumerate(ep_routed))

    stats = global_moe_stats(model)
    errors["stats"] = max(abs(stats[k] - stats_ref[k]) for k in stats_ref) if stats.keys() == stats_ref.keys() else 1.0

    full = full_expert_state(model)
    errors["full_state"] = max((full[n] - ref_params[n].detach()).abs().max().item() for n in experts)
    saved = {n: p.detach().clone() for n, p in experts.items()}
    with torch.no_grad():
        for p in experts.values():
            p.zero_()
    load_expert_state(model, full)
    errors["load_state"] = max((experts[n].detach() - saved[n]).abs().max().item() for n in experts)

    expert_bytes = sum(p.numel() * p.element_size() for p in experts.values())
    ref_bytes = sum(ref_params[n].numel() * ref_params[n].element_size() for n in experts)
    # the worst over ranks: MAX-reduce errors, MIN-reduce the flags
    vals = torch.tensor(list(errors.values()), dtype=torch.float64)
    dist.all_reduce(vals, op=dist.ReduceOp.MAX)
    flags = torch.tensor([float(routing_ok), float(replay_ok)], dtype=torch.float64)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    errors = dict(zip(errors, vals.tolist()))
    ok = max(errors.values()) <= TOL and bool(flags.min() == 1)
    if rank == 0:
        report = {"world": world, "ep": ep, "impl": args.impl, "shared": args.shared, "replay": args.replay, "ckpt": args.ckpt,
                  "layers_sharded": sharded, "loss": loss_ref.item(), "grad_max": grad_max,
                  "max_error": max(errors.values()), "errors": errors, "routing_ok": bool(flags[0] == 1),
                  "replay_ok": bool(flags[1] == 1), "expert_bytes": expert_bytes, "ref_expert_bytes": ref_bytes,
                  "stats": stats, "stats_ref": stats_ref, "ok": ok}
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
