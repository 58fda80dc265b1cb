"""One vocabulary-sharded n-gram check, run by tests/test_ngram_parallel.py under torchrun (gloo on CPU):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node N tests/parallel/ngram_worker.py OUT.json \
        --case DIVISOR:EMPTY_RANK [--case ...]

Every rank builds the same seeded pair of NGramEmbedding tables (PLE layers 0 and 1: vocabulary 61,
eos 3, trigrams, 2 heads per order, base 200, so 890 and 964 hashed rows, padded to a multiple of
DIVISOR) and the same packed batch (6 rows of 16 tokens, position_ids restarting: several
documents per row, eos tokens inside). Rows go round-robin to the ranks other than EMPTY_RANK,
which gets none (a [0, 16] batch). Each `--case` runs in the same process group, one after another.

Reference (on every rank, no collectives): the whole tables over the whole batch,
loss = Σ_layers Σ out·G (G a fixed random [6, 16, 8] per layer), backward. Sharded: a copy with
`shard_ngram_embeddings` over the world, each rank's loss over its own rows, backward. Compared: each
rank's outputs against the reference's rows (bit-exact: a lookup only copies rows), the gathered
table gradient (`gather_table`) against the reference's, `full_ngram_state` against the reference
weights and its round trip through `load_ngram_state`. A large DIVISOR leaves whole blocks of
padding: their ranks own no row any id reaches, so every other rank's ids go elsewhere and they
receive none.

Rank 0 writes {cases: [{errors: {what: max over ranks}, sent: per table [world, world] ids rank i
sent to owner j, held: per table the rows each rank holds, ...}], ok} to OUT.json; exit 1 on a mismatch.
"""

import argparse
import copy
import itertools
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from vf.models.ngram_embedding import NGramEmbedding, NGramSpec
from vf.models.ngram_parallel import (
    full_ngram_state,
    gather_table,
    load_ngram_state,
    ngram_tables,
    shard_ngram_embeddings,
)

TOL = 1e-6
V, EOS, B, T, DIM = 61, 3, 6, 16, 8


def tables(divisor: int) -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(NGramEmbedding(NGramSpec(vocab_size=V, embed_dim=DIM, eos_token_id=EOS, layer=layer,
                                                  ngram_size=3, heads_per_ngram=2, vocab_size_base=200,
                                                  divisible_by=divisor, seed=5), std=1.0)
                         for layer in (0, 1))


def packed_batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (about one token in eight an eos) and position_ids restarting at document starts: [B, T]."""
    ids = torch.randint(0, V, (B, T), generator=g)
    ids[torch.rand(B, T, generator=g) < 0.125] = EOS
    pos = torch.empty(B, T, dtype=torch.long)
    for r in range(B):
        cuts = sorted(torch.randperm(T - 2, generator=g)[:2].add(1).tolist())  # 3 documents per row
        starts = [0, *cuts, T]
        for s, e in itertools.pairwise(starts):
            pos[r, s:e] = torch.arange(e - s)
    return ids, pos


def err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| relative to the reference's scale (absolute below 1): gradients summed in
    another order differ by float32 ulps; a misrouted row moves them by whole terms."""
    return ((got - want).abs().max() / want.abs().max().clamp(min=1.0)).item()


def run_case(divisor: int, empty_rank: int, world: int, rank: int) -> dict:
    """One comparison (module docstring); every rank returns the same report (errors max-reduced)."""
    ref = tables(divisor)
    model = copy.deepcopy(ref)
    sharded = shard_ngram_embeddings(model, dist.group.WORLD)
    g = torch.Generator().manual_seed(1)
    ids, pos = packed_batch(g)
    G = [torch.randn(B, T, DIM, generator=g) for _ in ref]
    takers = [r for r in range(world) if r != empty_rank]
    rows = [b for b in range(B) if rank in takers and takers[b % len(takers)] == rank]

    outs_ref = [m(ids, pos) for m in ref]
    sum((o * w).sum() for o, w in zip(outs_ref, G)).backward()
    outs = [m(ids[rows], pos[rows]) for m in model]
    sum((o * w[rows]).sum() for o, w in zip(outs, G)).backward()

    errors = {}
    exact = all(torch.equal(o, r[rows]) for o, r in zip(outs, outs_ref))
    sent = []
    for (name, m), r in zip(ngram_tables(model), ref):
        local_grad = m.weight.grad if m.weight.grad is not None else torch.zeros_like(m.weight)
        errors[f"grad/{name}"] = err(gather_table(local_grad, m.shard), r.weight.grad)
        owner = m.ngram_ids(ids[rows], pos[rows]).reshape(-1) // m.shard.block
        counts = torch.bincount(owner, minlength=world)
        everyone = [torch.empty_like(counts) for _ in range(world)]
        dist.all_gather(everyone, counts)
        sent.append(torch.stack(everyone).tolist())
    full = full_ngram_state(model)
    ref_weights = {name: m.weight.detach() for name, m in ngram_tables(ref)}
    errors["full_state"] = max((full[n] - ref_weights[n]).abs().max().item() for n in ref_weights)
    saved = {n: m.weight.detach().clone() for n, m in ngram_tables(model)}
    with torch.no_grad():
        for _, m in ngram_tables(model):
            m.weight.zero_()
    load_ngram_state(model, full)
    errors["load_state"] = max((m.weight.detach() - saved[n]).abs().max().item() for n, m in ngram_tables(model))

    vals = torch.tensor(list(errors.values()), dtype=torch.float64)
    dist.all_reduce(vals, op=dist.ReduceOp.MAX)
    flag = torch.tensor([float(exact)], dtype=torch.float64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    errors = dict(zip(errors, vals.tolist()))
    local_rows = torch.tensor([m.weight.shape[0] for m in model])
    held = [torch.empty_like(local_rows) for _ in range(world)]
    dist.all_gather(held, local_rows)
    ok = max(errors.values()) <= TOL and bool(flag.item() == 1)
    return {"divisor": divisor, "empty_rank": empty_rank, "tables": sharded, "rows": [m.rows for m in ref],
            "hashed_rows": [m.total_rows for m in ref], "held": torch.stack(held).T.tolist(), "sent": sent,
            "forward_exact": bool(flag.item() == 1), "grad_max": max(m.weight.grad.abs().max().item() for m in ref),
            "errors": errors, "ok": ok}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--case", action="append", required=True, metavar="DIVISOR:EMPTY_RANK",
                    help="make_ngram_vocab_size_divisible_by, and the rank that gets no tokens (-1: none)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a hung collective raises, not waits 30 min
    world, rank = dist.get_world_size(), dist.get_rank()
    cases = [run_case(*map(int, c.split(":")), world, rank) for c in args.case]
    ok = all(c["ok"] for c in cases)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "cases": cases, "ok": ok}, f, indent=1)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
