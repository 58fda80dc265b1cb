"""Indexed sparse attention with the selection active, against transformers: GLM-5 (`glm_moe_dsa`, DSA
top-k over tokens), GLM-5.3 (`glm5_next`, top-k over k-pools plus the query's tail) and DeepSeek-V4
(`deepseek_v4`, top-k over CSA entries). Each on a tiny config of transformers' defaults with only the
sizes shrunk (4 index heads, head weights of either sign: nothing tuned to avoid ties), random weights,
fp32, two 48-token rows: logits and the selected keys of every query with top-k below, equal to and
above what the row offers (early queries always see fewer than k); cached decode from a prefill shorter
than k; packed rows of documents shorter than k (and than one CSA window); the engine's greedy
continuation and log-probs on prompts longer than k (KV and indexer caches); gradients; context
parallelism (this file is also the torchrun worker, see `cp_worker`).

Why transformers runs here with its indexers' ties pinned (`cuda_tie_order`). An index score is
Σ_h w_h · relu(q_h · k): where every index head's ReLU is 0 the score is exactly 0, for many keys of a
row at once, and perturbing the weights does not move it. With few index heads such exact ties reach
the k-th place often, and `torch.topk` leaves their order unspecified. On CUDA (where the reference
models run) it returns the lowest indices of the tied values (TensorTopK.cu: "choose the first seen
set"); on CPU it returns whatever std::nth_element / std::partial_sort leave, which depends on the row's
length: transformers' CPU logits of a prefix then depend on the tokens after it
(`test_transformers_cpu_tie_order_makes_a_prefix_depend_on_later_tokens`), so no causal model matches
them, and no engine's cached decode matches a trainer's full forward under them. Ours take CUDA's order
(`dsa.top_k_mask`: exact ties go to the earlier key, whatever the row's layout). That order was the
whole of the logit divergence the issue measured (up to ~1 in max abs logit here, by seed); the
reference below is transformers' own code with only `Tensor.topk`'s order of ties, inside its indexers,
set to CUDA's. (DeepSeek-V4 also failed outright on a row, packed document or engine prefill shorter
than one CSA window: `Compressor.pool`, fixed.)"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_models_deepseek_v4 import CSA, HCA
from test_models_deepseek_v4 import SHRUNK as DSV4_SHRUNK
from test_models_families import (
    DSA_SHRUNK,
    check_cached_decode,
    check_engine_greedy,
    randomize_buffers,
    save_with_tiny_tokenizer,
)
from test_models_parity import make_hf
from vf.models import load_model

IDS = torch.randint(3, 500, (2, 48), generator=torch.Generator().manual_seed(2))
SEED = 1
POOL = 4  # glm5_next's index_kpool and DeepSeek-V4's CSA compress rate here
# index_topk below / equal to / above what a 48-token row offers: 48 tokens (DSA), 12 pools of 4 tokens
# (glm5_next, whose index_topk counts tokens: 8 = 2 pools), 12 CSA entries of 4 tokens (DeepSeek-V4)
FAMILIES = {
    "glm_moe_dsa": {"below": 8, "equal": 48, "above": 64},
    "glm5_next": {"below": 8, "equal": 48, "above": 64},
    "deepseek_v4": {"below": 4, "equal": 12, "above": 64},
}
CASES = [(f, c) for f in FAMILIES for c in ("below", "equal", "above")]


# ---- transformers' reference with CUDA's order of exact ties -------------------------------------

def hf_indexers(hf) -> list[torch.nn.Module]:
    """transformers' indexer modules (GlmMoeDsaIndexer, Glm5NextTextIndexer, DeepseekV4Indexer)."""
    return [m for m in hf.modules() if type(m).__name__.endswith("Indexer")]


def _stable_topk(self, k, dim=-1, largest=True, sorted=True):
    s = self.sort(dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((s.values.narrow(dim, 0, k), s.indices.narrow(dim, 0, k)))


@contextlib.contextmanager
def cuda_tie_order(hf):
    """While one of `hf`'s indexers runs, `Tensor.topk` returns what CUDA's does: the values greater
    than the k-th, then the tied ones in index order (a stable sort). Nothing else changes."""
    own = "topk" in vars(torch.Tensor)
    original = torch.Tensor.topk

    def restore(*_):
        if own:
            torch.Tensor.topk = original
        elif "topk" in vars(torch.Tensor):
            del torch.Tensor.topk

    hooks = []
    for m in hf_indexers(hf):
        hooks.append(m.register_forward_pre_hook(lambda *_: setattr(torch.Tensor, "topk", _stable_topk)))
        hooks.append(m.register_forward_hook(restore))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        restore()


def hf_logits(hf, ids, pinned=True):
    with torch.no_grad(), (cuda_tie_order(hf) if pinned else contextlib.nullcontext()):
        return hf(input_ids=ids).logits


# ---- the models -----------------------------------------------------------------------------------

def _mixed_sign_buffers(hf, seed):
    """tests' randomize_buffers (the expert-selection bias and the hash table made to matter) but the
    index-head weights keep both signs: the untuned case, where exact top-k ties happen."""
    kept = {n: p.detach().clone() for n, p in hf.named_parameters() if n.endswith("weights_proj.weight")}
    randomize_buffers(hf, seed)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n in kept:
                p.copy_(kept[n])
    return hf


def build(family: str, topk: int, out: Path):
    """A random tiny HF checkpoint of `family` with `index_topk` = topk in `out` (with a tokenizer, so
    the engine can load it); returns the HF model (eager attention)."""
    if family == "glm5_next":
        from test_models_glm5_next import build as build_glm5

        return build_glm5(out, seed=SEED, index_topk=topk, index_n_heads=4)
    if family == "glm_moe_dsa":
        hf = make_hf("GlmMoeDsa", {**DSA_SHRUNK, "index_topk": topk}, seed=SEED)
    else:  # HCA pools of 8 (the default 128 closes no entry in 48 tokens)
        hf = make_hf("DeepseekV4", {**DSV4_SHRUNK, "compress_rates": {CSA: POOL, HCA: 8}, "index_topk": topk},
                     seed=SEED)
    return save_with_tiny_tokenizer(_mixed_sign_buffers(hf, SEED), out)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(family, case) -> (HF model, checkpoint dir), built on first use."""
    made = {}

    def get(family, case):
        if (family, case) not in made:
            d = tmp_path_factory.mktemp(f"{family}-{case}")
            made[family, case] = build(family, FAMILIES[family][case], d), d
        return made[family, case]

    return get


# ---- the selection each query makes ---------------------------------------------------------------

def native_indexers(model) -> list:
    return [layer.attn.indexer for layer in model.layers if getattr(layer.attn, "indexer", None) is not None]


@contextlib.contextmanager
def recorded(model, hf):
    """Each side's selections, per full indexer in layer order, as bool [B, T, N] over what it ranks
    (N: keys for DSA and the k-pool indexer, whose picks are tokens; compressed entries for CSA)."""
    ours, theirs, scores = [], [], []
    for ix in native_indexers(model):
        def select(*a, _select=ix.select):
            picked = _select(*a)
            ours.append(picked[:, 0] if picked.dim() == 4 else picked)
            return picked

        def index_scores(*a, _scores=ix.index_scores):
            scores.append(_scores(*a))
            return scores[-1]

        ix.select, ix.index_scores = select, index_scores
    hooks = [m.register_forward_hook(lambda m, a, out: theirs.append(out.long())) for m in hf_indexers(hf)]
    try:
        yield ours, theirs, scores
    finally:
        for ix in native_indexers(model):
            del ix.select, ix.index_scores
        for h in hooks:
            h.remove()


def ties_at_kth(scores: torch.Tensor, k: int) -> int:
    """How many queries (rows of fp32 scores, -inf: not visible) have more visible keys scoring their
    k-th best score than places left for them: rows whose selection depends on the order of ties."""
    kth = scores.sort(dim=-1, descending=True).values[..., k - 1 : k]
    above, equal = (scores > kth).sum(-1), (scores == kth).sum(-1)
    return int(((above + equal > k) & (kth[..., 0] > float("-inf"))).sum())


def as_mask(indices: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """transformers' picks [B, T, k] (-1: none) -> bool [B, T, n]. DSA's top-k fills up with keys the
    query may not see when it sees fewer than k (its attention mask drops them): `causal` drops them."""
    idx = indices.where(indices >= 0, n)
    mask = torch.zeros(*indices.shape[:2], n + 1, dtype=torch.bool).scatter_(-1, idx, True)[..., :n]
    if causal:
        mask &= torch.ones(indices.shape[1], n, dtype=torch.bool).tril(n - indices.shape[1])
    return mask


@pytest.mark.parametrize("family,case", CASES)
def test_logits_and_every_selection_match_transformers(family, case, checkpoints):
    """fp32 logits within 1e-4 and, query by query, the same selected keys as transformers: early
    queries that see fewer than k keys, tied scores at the k-th place, and (below) keys dropped."""
    hf, d = checkpoints(family, case)
    model = load_model(d)
    with recorded(model, hf) as (ours, theirs, scores), torch.no_grad():
        got = model.compute_logits(IDS)
        ref = hf_logits(hf, IDS)
    diff = (got - ref).abs().max().item()
    assert diff <= 1e-4, f"{family}/{case}: max abs logit diff {diff}"
    assert len(ours) == len(theirs) > 0
    for i, (mine, picks) in enumerate(zip(ours, theirs)):
        want = as_mask(picks, mine.shape[-1], causal=family == "glm_moe_dsa")
        assert torch.equal(mine, want), f"{family}/{case}: indexer {i} selects other keys than transformers"
    counts = ours[0].sum(-1)  # [B, T]: how many keys / entries / tokens each query keeps
    p = torch.arange(IDS.shape[1])
    k = FAMILIES[family][case] // (POOL if family == "glm5_next" else 1)  # in what the indexer ranks
    kept = (p + 1 if family == "glm_moe_dsa" else (p + 1) // POOL).clamp(max=k)  # early queries: all they see
    if family == "glm5_next":  # the picked pools' tokens, then the query's incomplete pool (itself included)
        kept = POOL * kept + (p + 1) % POOL
    assert torch.equal(counts, kept.expand_as(counts)), f"{family}/{case}: sizes {counts[0].tolist()}"
    if case == "below":  # keys some query may see are dropped, and exact ties reach the k-th place
        assert (kept < p + 1).any() and ties_at_kth(scores[0], k) > 0
        unpinned = (got - hf_logits(hf, IDS, pinned=False)).abs().max().item()
        print(f"{family}: max abs logit diff {diff:.1e}; against CPU torch.topk's tie order {unpinned:.1e}, "
              f"{ties_at_kth(scores[0], k)} queries with a tie at the k-th place")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cached_decode_from_a_prefill_shorter_than_k(family, checkpoints):
    """A 2-token prefill (fewer keys than k, no CSA entry yet) then one token at a time through the
    KV and indexer caches up to 20: the full forward's logits at every step, as the selection grows
    past k."""
    check_cached_decode(load_model(checkpoints(family, "below")[1]), IDS[:1, :20], prefill=2)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_documents_shorter_than_k_match_transformers_apart(family, checkpoints):
    """One row of four documents (3, 5 and 7 tokens: fewer than k, the first not even one CSA window;
    then 33, where the selection drops keys) gives each document the logits our model and
    transformers give it alone: selections never cross a document."""
    hf, d = checkpoints(family, "below")
    model = load_model(d)
    lengths = [3, 5, 7, 33]
    docs = list(IDS[0].split(lengths))
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        packed = model.compute_logits(IDS[:1], pos)[0].split(lengths)
        for doc, got in zip(docs, packed):
            alone = model.compute_logits(doc[None])[0]
            assert (got - alone).abs().max().item() <= 1e-5, f"{family}: a {len(doc)}-token document"
            ref = hf_logits(hf, doc[None])[0]
            assert (got - ref).abs().max().item() <= 1e-4, f"{family}: {len(doc)} tokens vs transformers"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_engine_greedy_equals_generate_and_trainer_logprobs(family, checkpoints):
    """Prompts of 20 and 13 tokens (longer than k; for DeepSeek-V4 the first: 5 entries for its top 4),
    prefilled together (padded), and 8 greedy tokens through the engine's KV and indexer caches:
    transformers' `generate`, and log-probs within 1e-5 of the trainer's full forward of prompt +
    completion."""
    hf, d = checkpoints(family, "below")
    with cuda_tie_order(hf):
        check_engine_greedy(hf, d, [IDS[0, :20].tolist(), IDS[1, :13].tolist()], new_tokens=8)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradients_through_the_selected_keys_match_transformers(family, checkpoints, tmp_path):
    """The mean next-token log-prob's gradients equal transformers' for every parameter; neither side
    gives the indexer one. Ours are written as a checkpoint (our names -> the checkpoint's) and loaded
    by transformers, so each lands on transformers' own parameter whatever its layout."""
    import shutil

    from safetensors.torch import save_file
    from vf.models.convert import native_to_hf

    hf, d = checkpoints(family, "below")
    model = load_model(d)

    def loss(logits):
        return torch.log_softmax(logits, -1)[:, :-1].gather(2, IDS[:, 1:, None]).mean()

    hf.zero_grad(set_to_none=True)
    with cuda_tie_order(hf):
        loss(hf(input_ids=IDS).logits).backward()
    loss(model.compute_logits(IDS)).backward()
    params = dict(model.named_parameters())
    assert all(p.grad is None for n, p in params.items() if ".indexer." in n)
    grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in params.items()}
    save_file(native_to_hf(grads, model.config), tmp_path / "model.safetensors")
    shutil.copy(d / "config.json", tmp_path / "config.json")
    ours = dict(type(hf).from_pretrained(tmp_path).named_parameters())
    checked = 0
    for n, p in hf.named_parameters():
        if p.grad is None:  # the indexers (run under no_grad or only through top-k indices) and unused parts
            assert ".indexer." in n or "visual" in n or not ours[n].any(), f"{family}: {n}: ours only"
            continue
        scale = p.grad.abs().max().item()
        assert (ours[n] - p.grad).abs().max().item() <= 1e-6 + 1e-4 * scale, f"{family}: {n}"
        checked += 1
    assert checked >= 10 and any(".indexer." in n for n, p in hf.named_parameters() if p.grad is None)
    hf.zero_grad(set_to_none=True)


def test_transformers_cpu_tie_order_makes_a_prefix_depend_on_later_tokens(checkpoints):
    """Why the reference pins the order of ties: with CPU torch.topk, transformers' logits for a
    prefix change when more tokens follow it (the tie order depends on the row's length: 0.3 to 1 in
    max abs logit here, where rounding alone moves them 1e-6); with CUDA's order they do not, and
    ours do not either."""
    hf, d = checkpoints("glm_moe_dsa", "below")
    model = load_model(d)
    cpu, pinned, own = [], [], []
    full, full_pinned = hf_logits(hf, IDS, pinned=False), hf_logits(hf, IDS)
    with torch.no_grad():
        full_own = model.compute_logits(IDS)
        for n in (16, 24, 32, 40):
            cpu.append((full[:, :n] - hf_logits(hf, IDS[:, :n], pinned=False)).abs().max().item())
            pinned.append((full_pinned[:, :n] - hf_logits(hf, IDS[:, :n])).abs().max().item())
            own.append((full_own[:, :n] - model.compute_logits(IDS[:, :n])).abs().max().item())
    if max(cpu) <= 1e-5:
        pytest.skip("this torch build's CPU top-k happens to order these ties alike at every length")
    assert max(cpu) > 1e-2 and max(pinned) <= 1e-5 and max(own) <= 1e-5, (cpu, pinned, own)


# ---- context parallelism: the key side gathered over ranks ----------------------------------------
# glm5_next's k-pool layers refuse a context shard (models/glm5_next.py); DSA and DeepSeek-V4 run
# the gather path (every rank's keys, this rank's queries)

# one 64-token row: 3, 5 and 7 are shorter than k (3: not one CSA window), 27 and 22 straddle the chunk
# edges of the load-balanced split at 2 ranks (columns 0-15 and 48-63 on rank 0)
CP_DOCS = [3, 5, 27, 7, 22]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def cp_batch():
    ids = torch.randint(3, 500, (1, sum(CP_DOCS)), generator=torch.Generator().manual_seed(3))
    pos = torch.cat([torch.arange(n) for n in CP_DOCS])[None]
    return ids, pos, torch.roll(ids, -1, dims=1)


def token_logprobs(model, ids, pos, targets):
    logits = model(ids, pos) @ model.lm_head_weight.t()
    return torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]


def cp_worker(style: str, model_dir: str, out: str) -> int:
    """Under torchrun (gloo): one process's per-token log-probs and gradients of the packed row, then
    the same with each rank running its columns under `context_parallel` (loss = its tokens' sum,
    gradients all-reduced). Rank 0 writes the max errors and the CP log-probs in column order."""
    import torch.distributed as dist
    from vf.models.context_parallel import ContextShard, context_parallel, shard_columns, split_sequence

    dist.init_process_group("gloo")
    size, rank = dist.get_world_size(), dist.get_rank()
    model = load_model(model_dir)
    ids, pos, targets = cp_batch()
    ref = token_logprobs(model, ids, pos, targets)
    ref.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    with context_parallel(ContextShard(dist.group.WORLD, size, rank, style, pos)):
        local = token_logprobs(model, *(split_sequence(t, size, rank) for t in (ids, pos, targets)))
        local.sum().backward()
    assert {n for n, p in model.named_parameters() if p.grad is not None} == set(ref_grads)
    for n in sorted(ref_grads):
        dist.all_reduce(model.get_parameter(n).grad)
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.detach().contiguous())
    got = torch.empty_like(ref)
    for r, part in enumerate(parts):
        got[:, shard_columns(ids.shape[1], size, r)] = part
    if rank == 0:
        Path(out).write_text(json.dumps({
            "logprob": float((got - ref.detach()).abs().max()),
            "grad": max(float((model.get_parameter(n).grad - g).abs().max()) for n, g in ref_grads.items()),
            "logprobs": got[0].tolist()}))
    dist.destroy_process_group()
    return 0


CP_CASES = [("glm_moe_dsa", "ring")] + [  # the rest: -m matrix
    pytest.param(*c, marks=pytest.mark.matrix) for c in (("glm_moe_dsa", "ulysses"), ("deepseek_v4", "ring"))]


@pytest.mark.parametrize("family,style", CP_CASES)
def test_context_parallel_matches_one_process_and_transformers(family, style, checkpoints, tmp_path):
    """2 ranks (gloo): the packed row's per-token log-probs and gradients equal one process's (1e-5),
    and each document's log-probs equal transformers' on it alone (1e-4)."""
    hf, d = checkpoints(family, "below")
    out = tmp_path / "cp.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           "2", __file__, "cp-worker", style, str(d), str(out)],
                          capture_output=True, text=True, timeout=300, env=ENV, check=False)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["logprob"] < 1e-5 and report["grad"] < 1e-5, report
    ids, _, targets = cp_batch()
    want = torch.cat([torch.log_softmax(hf_logits(hf, doc), -1)[0] for doc in ids.split(CP_DOCS, dim=1)])
    want = want.gather(-1, targets[0, :, None])[:, 0]
    assert (torch.tensor(report["logprobs"]) - want).abs().max().item() <= 1e-4


if __name__ == "__main__" and sys.argv[1:2] == ["cp-worker"]:
    sys.exit(cp_worker(*sys.argv[2:]))
