"""The recurrent layers under context parallelism against one process, run by
tests/test_context_parallel_recurrent.py under torchrun (gloo):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node N tests/parallel/cp_recurrent_worker.py \
        STYLE MODEL OUT.json [--single] [--checkpointing]

STYLE ring | ulysses (the attention layers'); MODEL qwen3_next (gated DeltaNet, 2 key / 4 value heads,
then gated attention, MoE MLPs) | nemotron_h (Mamba-2 with 4 heads in 2 groups, chunk 8, attention
without rope, relu² MLP, Mamba-2 again) | nemotron_h_g1 (the same with 1 group: the ranks do not
divide it, groups are replicated per head). Batch: 2 rows × 128 tokens packed with documents whose
starts fall inside the ranks' chunks (13, 83 and 5, 105), so a document is longer than DeltaNet's
64-token chunk and crosses the chunk edges of every CP size up to 4; --single: one document per row.

Checks (rank 0 writes the max errors to OUT; every rank exits 1 when one is >= 1e-5):
  loss, logprob, grad   the CP run (each rank its slices, loss = sum over its tokens, grads SUMmed
                        over ranks) against the whole rows in one process (loss in fp64 sums, relative; a
                        parameter's grad error relative to its grad's max where that is above 1)
  separate              the CP log-probs against each document run ALONE in one process: the state
                        restarts at a document start inside a rank's chunk
Sensitivity (reported, the test asserts it is large): `unreset`, the largest change of one-process
log-probs when the same rows run as ONE document (nothing resets) — what a state carried across a
document start would do.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist
from cp_worker import token_logprobs
from vf.models.config import ModelConfig
from vf.models.context_parallel import ContextShard, context_parallel, shard_columns, split_sequence
from vf.models.transformer import build_model

TOL = 1e-5
V, T = 96, 128
DOCS = [[13, 70, 45], [5, 100, 23]]


def config(kind: str) -> ModelConfig:
    common = {"vocab_size": V, "hidden_size": 32, "intermediate_size": 48, "num_heads": 4, "num_kv_heads": 2,
              "head_dim": 8}
    if kind == "qwen3_next":
        return ModelConfig(architecture="qwen3_next", num_layers=2, layer_types=["linear_attention", "full_attention"],
                           linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                           linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                           shared_expert_intermediate_size=12, shared_expert_gate=True, norm_topk_prob=True,
                           partial_rotary_factor=0.25, **common)
    groups = 1 if kind == "nemotron_h_g1" else 2
    return ModelConfig(architecture="nemotron_h", num_layers=4, mlp_act="relu2",
                       layer_types=["linear_attention", "full_attention", "mlp", "linear_attention"],
                       ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8, mamba_n_groups=groups,
                       mamba_chunk_size=8, mamba_dt_min=0.001, **common)


def randomise(model) -> None:
    """Every parameter random at a scale where the recurrences matter (the default init leaves the
    decays near 1 and the zero-centred norms at 0): matrices N(0, 0.2), norms 1 ± 0.5 (zero-centred:
    ± 0.5), dt_bias U(-1, 1), A_log U(-1, 0.5), biases and D N(0, 0.2). Same seed on every rank."""
    g = torch.Generator().manual_seed(2)
    zero_centered = {id(m.weight) for m in model.modules() if getattr(m, "zero_centered", False)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.rsplit(".", 2)[-2]:  # every RMSNorm's weight
                p.uniform_(0.5, 1.5, generator=g).sub_(1.0 if id(p) in zero_centered else 0.0)
            elif name.endswith("dt_bias"):
                p.uniform_(-1.0, 1.0, generator=g)
            elif name.endswith("A_log"):
                p.uniform_(-1.0, 0.5, generator=g)
            else:
                p.normal_(0.0, 0.2, generator=g)


def batch(single: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (len(DOCS), T), generator=g)
    docs = [[T] for _ in DOCS] if single else DOCS
    pos = torch.cat([torch.cat([torch.arange(n) for n in row])[None] for row in docs])
    return ids, pos, torch.roll(ids, -1, dims=1), docs


def separately(model, ids, targets, docs) -> torch.Tensor:
    """Per-token log-probs with every document run alone (its own row, positions from 0)."""
    out = torch.empty(ids.shape)
    with torch.no_grad():
        for b, row in enumerate(docs):
            s = 0
            for n in row:
                out[b, s:s + n] = token_logprobs(model, ids[b:b + 1, s:s + n], torch.arange(n)[None],
                                                 targets[b:b + 1, s:s + n])[0]
                s += n
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("style", choices=["ring", "ulysses"])
    ap.add_argument("model", choices=["qwen3_next", "nemotron_h", "nemotron_h_g1"])
    ap.add_argument("out")
    ap.add_argument("--single", action="store_true", help="one document per row")
    ap.add_argument("--checkpointing", action="store_true",
                    help="activation checkpointing in the CP run (backward re-runs the all-to-alls)")
    a = ap.parse_args(argv)
    dist.init_process_group("gloo")
    group, size, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = build_model(config(a.model), seed=0)
    randomise(model)
    ids, pos, targets, docs = batch(a.single)

    ref_lp = token_logprobs(model, ids, pos, targets)
    ref_lp.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        unreset = float((token_logprobs(model, ids, torch.arange(T).expand(len(DOCS), T), targets) - ref_lp).abs().max())

    model.activation_checkpointing = a.checkpointing
    shard = ContextShard(group, size, rank, a.style, pos)
    with context_parallel(shard):
        local = token_logprobs(model, *(split_sequence(t, size, rank) for t in (ids, pos, targets)))
        local.sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)
    total = local.detach().double().sum()
    dist.all_reduce(total, group=group)
    gathered = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(gathered, local.detach().contiguous(), group=group)
    cp_lp = torch.empty_like(ref_lp)
    for r, part in enumerate(gathered):
        cp_lp[:, shard_columns(T, size, r)] = part

    # relative to the parameter's gradient scale where it is above 1 (sums over many tokens)
    grad_errors = {n: float((p.grad - ref_grads[n]).abs().max()) / max(1.0, float(ref_grads[n].abs().max()))
                   for n, p in model.named_parameters()}
    errors = {
        "loss": abs(float(total) - float(ref_lp.detach().double().sum())) / max(1.0, abs(float(ref_lp.detach().sum()))),
        "logprob": float((cp_lp - ref_lp.detach()).abs().max()),
        "grad": max(grad_errors.values()),
        "separate": float((cp_lp - separately(model, ids, targets, docs)).abs().max()),
    }
    report = {"style": a.style, "model": a.model, "size": size, "single": a.single, "checkpointing": a.checkpointing, "errors": errors,
              "worst_grad_param": max(grad_errors, key=grad_errors.get), "loss": float(ref_lp.detach().sum()),
              "unreset": unreset, "grad_scale": max(float(g.abs().max()) for g in ref_grads.values()),
              "recurrent_grads": {n: float(g.abs().max()) for n, g in ref_grads.items()
                                  if n.endswith(("conv_weight", "A_log", "dt_bias"))},
              "params": sum(1 for _ in model.parameters())}
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()
    return 1 if max(errors.values()) >= TOL else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
