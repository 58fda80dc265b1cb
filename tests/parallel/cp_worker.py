"""Context parallelism against one process, run by tests/test_context_parallel.py under torchrun (gloo):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node N tests/parallel/cp_worker.py \
        STYLE MODEL OUT.json [--checkpointing] [--q-tile N]

STYLE ring | ulysses; MODEL dense (qwen3-like GQA: 4 q heads, 2 kv heads, head_dim 16, 2 layers) |
gated (the same with Qwen3.5's gated attention) | mla (deepseek_v3-like, dense MLP) | dsa (glm_moe_dsa:
MLA with the indexer's top-6 selection, layer 1 sharing layer 0's; every document is longer than 6) |
sinks (gpt_oss attention: sinks, a sliding layer of window 8 and a full layer) | dsv4 (DeepSeek-V4:
sliding, CSA and HCA layers, compressed entries pooled across the chunk edges, hash and top-k MoE,
hyper-connections). dsa, sinks and dsv4 run the gather path in either style (models/context_parallel.py). Every rank builds the same seeded model and the same packed
batch (2 rows × 64 tokens, documents straddling the chunk boundaries of every CP size up to 4).
Reference: the whole rows in this process, no CP: per-token log-probs of the next token, loss =
their sum, backward. CP: each rank runs its slices under `context_parallel`, loss = the sum over
its tokens, backward, then all-reduce (SUM) of the parameter grads. Rank 0 writes the max errors
(loss, every token's log-prob gathered back to its global column, every parameter grad) to OUT and
every rank exits 1 when one is >= 1e-5.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist
from vf.models import context_parallel as cp_module
from vf.models.config import ModelConfig
from vf.models.context_parallel import ContextShard, context_parallel, shard_columns, split_sequence
from vf.models.transformer import build_model

TOL = 1e-5
V, T = 96, 64
DOCS = [[13, 30, 21], [5, 50, 9]]  # lengths per row: boundaries at 13, 43 and 5, 55 cross chunk edges


def config(kind: str) -> ModelConfig:
    common = {"vocab_size": V, "hidden_size": 32, "num_layers": 2, "intermediate_size": 48}
    if kind == "dense":
        return ModelConfig(architecture="qwen3", num_heads=4, num_kv_heads=2, head_dim=16, **common)
    if kind == "gated":  # Qwen3.5's gated attention (output · sigmoid(gate), zero-centred norms), no DeltaNet layer
        return ModelConfig(architecture="qwen3_5_text", num_heads=4, num_kv_heads=2, head_dim=16,
                           layer_types=["full_attention"] * 2, **common)
    mla = {"num_heads": 4, "num_kv_heads": 4, "head_dim": 8, "q_lora_rank": 16, "kv_lora_rank": 16,
           "qk_rope_head_dim": 8, "qk_nope_head_dim": 12, "v_head_dim": 10}
    if kind == "dsa":
        return ModelConfig(architecture="glm_moe_dsa", index_topk=6, index_head_dim=16, index_n_heads=2,
                           indexer_types=["full", "shared"], **mla, **common)
    if kind == "sinks":
        return ModelConfig(architecture="gpt_oss", num_heads=4, num_kv_heads=2, head_dim=16,
                           sliding_window=8, layer_types=["sliding_attention", "full_attention"], **common)
    if kind == "dsv4":  # one layer of each kind: sliding window 6, CSA (pool 4, overlapping, index top-3), HCA (pool 8)
        kinds = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
        return ModelConfig.from_hf_dict({
            "model_type": "deepseek_v4", "vocab_size": V, "hidden_size": 32, "num_hidden_layers": 3,
            "num_attention_heads": 4, "head_dim": 16, "q_lora_rank": 24, "moe_intermediate_size": 16,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "partial_rotary_factor": 0.5, "layer_types": kinds,
            "mlp_layer_types": ["hash_moe", "moe", "moe"], "compress_rates": {kinds[1]: 4, kinds[2]: 8},
            "sliding_window": 6, "o_groups": 2, "o_lora_rank": 8, "index_n_heads": 2, "index_head_dim": 8,
            "index_topk": 3, "hc_mult": 2, "max_position_embeddings": 256})
    return ModelConfig(architecture="deepseek_v3", **mla, **common)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (len(DOCS), T), generator=g)
    pos = torch.cat([torch.cat([torch.arange(n) for n in row])[None] for row in DOCS])
    return ids, pos, torch.roll(ids, -1, dims=1)  # target: the next token of the full row


def token_logprobs(model, ids, pos, targets) -> torch.Tensor:
    hidden = model(ids, pos)
    logits = hidden @ model.lm_head_weight.t()
    return torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]  # [B, T]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("style", choices=["ring", "ulysses"])
    ap.add_argument("model", choices=["dense", "gated", "mla", "dsa", "sinks", "dsv4"])
    ap.add_argument("out")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing in the CP run")
    ap.add_argument("--q-tile", type=int, default=cp_module.Q_TILE,
                    help="ring: query rows per score tile (small: several tiles, a ragged last one)")
    a = ap.parse_args(argv)
    cp_module.Q_TILE = a.q_tile
    dist.init_process_group("gloo")
    group, size, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = build_model(config(a.model), seed=0)
    ids, pos, targets = batch()

    ref_lp = token_logprobs(model, ids, pos, targets)
    ref_lp.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}  # DSA's indexer: none
    model.zero_grad(set_to_none=True)

    model.activation_checkpointing = a.checkpointing
    shard = ContextShard(group, size, rank, a.style, pos)
    with context_parallel(shard):
        local = token_logprobs(model, *(split_sequence(t, size, rank) for t in (ids, pos, targets)))
        loss = local.sum()
        loss.backward()
    got = {n for n, p in model.named_parameters() if p.grad is not None}
    assert got == set(ref_grads), got ^ set(ref_grads)
    for n in sorted(got):
        dist.all_reduce(model.get_parameter(n).grad, group=group)
    total = local.detach().double().sum()  # fp64 sums: the loss check is not 1 ulp of a different summation order
    dist.all_reduce(total, group=group)
    gathered = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(gathered, local.detach().contiguous(), group=group)
    cp_lp = torch.empty_like(ref_lp)
    for r, part in enumerate(gathered):
        cp_lp[:, shard_columns(T, size, r)] = part

    errors = {
        "loss": abs(float(total) - float(ref_lp.detach().double().sum())),
        "logprob": float((cp_lp - ref_lp.detach()).abs().max()),
        "grad": max(float((model.get_parameter(n).grad - g).abs().max()) for n, g in ref_grads.items()),
    }
    worst = max((float((model.get_parameter(n).grad - g).abs().max()), n) for n, g in ref_grads.items())
    report = {"style": a.style, "model": a.model, "size": size, "checkpointing": a.checkpointing,
              "errors": errors, "worst_grad_param": worst[1], "loss": float(ref_lp.sum()),
              "grad_scale": max(float(g.abs().max()) for g in ref_grads.values()),
              "params": len(ref_grads)}
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()
    return 1 if max(errors.values()) >= TOL else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
