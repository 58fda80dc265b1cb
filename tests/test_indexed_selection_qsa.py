"""Qwen3.8 Flash Next's QSA selection (qsa.py) against transformers' `Qwen4ExpTextQSAIndexer`, swept
over the budget: fewer, as many and more blocks than the budget allows, on tiny configs of
transformers' Qwen4ExpTextConfig defaults with only the sizes shrunk (test_models_qwen4_exp.SHRUNK).

What each case checks: the keys every query of every indexed layer selects equal transformers'
exactly (early queries with fewer complete blocks than k see every causal key), the fp32 logits
match within 1e-4, and decoding through a KV cache gives the full pass's logits. Then, on the
budget-8 config: packed rows (documents shorter than the budget) against transformers' separate
forwards, the embedded engine's greedy decode (KV and index-key caches) against
`transformers.generate` on prompts longer than the budget, the trainer's log-probs of sampled
rollouts against the engine's, and gradients against transformers'.

Most cases have 1 or 2 index heads: a block score is a sum of ReLUs, so with few heads many blocks
score exactly 0 and ties reach the k-th place in most rows; the selection then follows torch.topk's
order on each query's own scores, as transformers (qsa.top_blocks). Context parallelism: QSA and PLE
layers refuse a rank's slice (test_models_qwen4_exp.test_qwen4_exp_layers_refuse_context_parallel_slices),
so there is no CP case here."""

import asyncio

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen4ExpTextConfig"):
    pytest.skip("transformers without qwen4_exp", allow_module_level=True)

from test_models_families import check_cached_decode, check_engine_greedy
from test_models_parity import hf_logits
from test_models_qwen4_exp import V, build_shrunk
from vf.models import load_model

IDS = torch.randint(3, V, (2, 48), generator=torch.Generator().manual_seed(2))  # 48 tokens: 12 blocks of 4
# overrides of SHRUNK (ratio 4, 16-dim index heads); k = indexer_budget / indexer_compress_ratio blocks
SWEEP = {
    "budget_8_one_head": {"indexer_n_heads": 1},  # k 2 of up to 12 blocks
    "budget_16_two_heads": {"indexer_n_heads": 2, "indexer_budget": 16},  # k 4
    "budget_16_one_head": {"indexer_n_heads": 1, "indexer_budget": 16},
    "budget_8_eight_heads": {},  # SHRUNK as is: few ties
    "budget_equals_prompt": {"indexer_n_heads": 2, "indexer_budget": 48},  # k 12: every block, all rows
    "budget_above_prompt": {"indexer_n_heads": 2, "indexer_budget": 64},
    "single_token_blocks": {"indexer_n_heads": 2, "indexer_compress_ratio": 1, "indexer_budget": 5},
    "blocks_of_8_two_indexed_layers": {"indexer_n_heads": 2, "indexer_compress_ratio": 8, "indexer_budget": 16,
                                       "num_hidden_layers": 4, "layer_types": None},  # default pattern: layer 3
}


def selections(model, hf, ids):
    """(ours, transformers') bool [B, T, S] selections of each indexed layer on `ids`, in layer order."""
    from vf.models.qsa import QSAIndexer

    ours, theirs = [], []
    hooks = [m.register_forward_hook(lambda m, a, out: theirs.append(out[:, 0]))
             for m in hf.modules() if type(m).__name__ == "Qwen4ExpTextQSAIndexer"]
    for m in model.modules():
        if isinstance(m, QSAIndexer):
            m.select = lambda *a, m=m: ours.append(QSAIndexer.select(m, *a)) or ours[-1]
    try:
        with torch.no_grad():
            got, ref = model.compute_logits(ids), hf_logits(hf, ids)
    finally:
        for h in hooks:
            h.remove()
        for m in model.modules():
            if isinstance(m, QSAIndexer):
                del m.select
    return ours, theirs, (got - ref).abs().max().item()


@pytest.mark.parametrize("case", list(SWEEP))
def test_qsa_selection_and_logits_match_transformers(case, tmp_path):
    hf = build_shrunk(tmp_path, **SWEEP[case])
    model = load_model(tmp_path)
    ours, theirs, diff = selections(model, hf, IDS)
    cfg = model.config
    r, k, T = cfg.indexer_compress_ratio, cfg.indexer_budget // cfg.indexer_compress_ratio, IDS.shape[1]
    assert len(ours) == len(theirs) == cfg.layer_types.count("indexed_attention") > 0
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    early = (torch.arange(T) + 1) // r <= k  # queries with at most k complete blocks
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.equal(a, b), f"{case}: layer {i}: {int((a ^ b).any(-1).sum())} queries select other keys"
        assert torch.equal(a[:, early], causal[early].expand_as(a[:, early]))  # early queries: every key
        if k * r < T:  # the budget drops keys: late queries see k blocks plus their incomplete tail
            assert a.sum(-1)[:, ~early].eq(k * r + (torch.arange(T)[~early] + 1) % r).all()
    print(f"{case}: max abs logit diff {diff:.1e}")
    assert diff <= 1e-4, f"{case}: max abs logit diff {diff}"
    check_cached_decode(model, IDS, prefill=7)  # blocks close and the budget starts dropping mid-decode


def test_top_blocks_is_a_per_query_topk_over_its_own_blocks_ties_included():
    """qsa.top_blocks against transformers' procedure (one torch.topk per query over its `count`
    scores): the same sets, on scores where most of each row ties at 0, for counts below, at and
    above k."""
    from vf.models.qsa import top_blocks

    g = torch.Generator().manual_seed(0)
    B, T, nb, k = 3, 40, 23, 5
    scores = torch.relu(torch.randn(B, T, nb, generator=g)) * (torch.rand(B, T, nb, generator=g) < 0.4)
    count = torch.randint(0, nb + 1, (B, T), generator=g)
    got = top_blocks(scores, count, k)
    want = torch.zeros(B, T, nb, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            n = int(count[b, t])
            want[b, t, scores[b, t, :n].topk(min(k, n), dim=0).indices] = True
    assert torch.equal(got, want)
    valid = torch.arange(nb) < count[..., None]
    assert ((count > k) & ((scores > 0) & valid).sum(-1).lt(k)).sum() > 20  # rows choosing among tied zeros
    naive = scores.masked_fill(~valid, float("-inf")).topk(k, dim=-1).indices  # one top-k over every block
    assert not torch.equal(torch.zeros_like(want).scatter_(-1, naive, True) & valid, want)  # breaks ties otherwise


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The budget-8 (k 2 blocks of 4), 1-index-head config."""
    d = tmp_path_factory.mktemp("qsa")
    return build_shrunk(d, **SWEEP["budget_8_one_head"]), d


def test_qsa_packed_documents_select_within_their_own_document(saved):
    """Two rows of 4 and 5 documents of 2 to 25 tokens (four shorter than the budget's 8, the rest
    longer): each document gives transformers' logits of the document alone (its blocks start at its
    first token, its queries count only its own blocks), and our own separate forwards' within 1e-5."""
    hf, d = saved
    model = load_model(d)
    lengths = [[5, 11, 7, 25], [3, 20, 2, 9, 14]]
    pos = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
    with torch.no_grad():
        got = model.compute_logits(IDS, pos)
        worst = own = 0.0
        for b, row in enumerate(lengths):
            s = 0
            for n in row:
                doc = IDS[b : b + 1, s : s + n]
                worst = max(worst, (got[b, s : s + n] - hf_logits(hf, doc)[0]).abs().max().item())
                own = max(own, (got[b, s : s + n] - model.compute_logits(doc)[0]).abs().max().item())
                s += n
    print(f"packed: vs transformers {worst:.1e}, vs our separate forwards {own:.1e}")
    assert worst <= 1e-4 and own <= 1e-5


def test_qsa_engine_greedy_equals_transformers_generate_on_prompts_longer_than_the_budget(saved):
    """Four prompts of 17, 11, 40 and 25 tokens (budget 8) decoded together for 16 tokens: the index
    keys and their rope come from the engine's cache, rows with different block counts share each
    decode step (the shorter rows' queries see fewer blocks than the step's widest row)."""
    hf, d = saved
    prompts = [IDS[0, :17].tolist(), IDS[1, :11].tolist(), IDS[1, 5:45].tolist(), IDS[0, 20:45].tolist()]
    check_engine_greedy(hf, d, prompts, [(2, 16), (2, 16), (1, 16), (1, 32)], new_tokens=16)


def test_qsa_trainer_logprobs_equal_the_engines_on_prompts_longer_than_the_budget(saved):
    """Sampled rollouts of four prompts (11 to 40 tokens, budget 8) packed in one training row: the
    trainer's log-probs (PolicyLogprobs) equal the engine's within 1e-5."""
    from vf.trainer.samples import Sample, micro_batches
    from vf.trainer.step import PolicyLogprobs

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    engine = LocalEngine(load_model(saved[1]), None, max_batch=4)
    prompts = [IDS[0, :17].tolist(), IDS[1, :11].tolist(), IDS[1, 5:45].tolist(), IDS[0, 20:45].tolist()]

    async def go():
        try:
            return await asyncio.gather(*[engine.generate_ids(p, Sampling(temperature=1.0, max_tokens=14, seed=i),
                                                              ignore_eos=True) for i, p in enumerate(prompts)])
        finally:
            await engine.close()

    seqs = asyncio.run(go())
    samples = [Sample(p + s.token_ids, [0] * len(p) + [1] * len(s.token_ids), [0.0] * len(p) + list(s.logprobs))
               for p, s in zip(prompts, seqs)]
    (mb,) = micro_batches(samples, seq_len=160, micro_batch_size=1)
    assert mb.input_ids.shape[0] == 1  # all rollouts in one row
    with torch.no_grad():
        logp = PolicyLogprobs(engine.model)(mb.input_ids, mb.position_ids, mb.targets, 1.0)
    mask = mb.loss_mask.reshape(-1)
    err = (logp[mask] - mb.inference_logprobs.reshape(-1)[mask]).abs().max().item()
    print(f"engine vs trainer log-probs: {err:.1e}")
    assert int(mask.sum()) == sum(len(s.token_ids) for s in seqs) and err < 1e-5


def test_qsa_gradients_through_the_selected_keys_match_transformers(saved):
    """The loss's gradients reach the attention through the selected keys only, as in transformers:
    the gradient of every parameter both models name alike (all but the MoE experts and the n-gram
    tables, whose layouts differ) equals transformers', and the indexer gets none."""
    from vf.models.convert import native_to_hf

    hf, d = saved
    model = load_model(d)
    ids = IDS[:, :40]

    def loss(logits):
        return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()

    hf.zero_grad()
    loss(hf(input_ids=ids).logits).backward()
    loss(model.compute_logits(ids)).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads and not any("indexer" in n for n in grads)
    ours = native_to_hf(grads, model.config)
    theirs = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None and n in ours}
    assert {"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
            "model.layers.1.self_attn.v_proj.weight", "model.layers.0.linear_attn.in_proj_qkv.weight"} <= set(theirs)
    assert not any("indexer" in n for n, p in hf.named_parameters() if p.grad is not None)
    scale = max(g.abs().max().item() for g in theirs.values())
    worst = max((ours[n] - g).abs().max().item() for n, g in theirs.items())
    print(f"gradients of {len(theirs)} tensors: max abs diff {worst:.1e} (largest gradient {scale:.1e})")
    assert worst <= 1e-5 * max(scale, 1.0)
