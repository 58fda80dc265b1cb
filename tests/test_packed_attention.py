"""Packed training attends within documents without a dense T×T mask (`layers.Documents`):
log-probs of packed rows equal each document run alone, and so do the gradients."""

import torch
from vf.models import ModelConfig, build_model
from vf.models.layers import Documents, sdpa
from vf.trainer.logprobs import chunked_logprobs

CFG = ModelConfig(architecture="qwen3", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, intermediate_size=48, tie_word_embeddings=True)


def _logprobs(model, ids, pos=None):
    h = model(ids, pos)
    return chunked_logprobs(h[0, :-1], model.lm_head_weight, ids[0, 1:], chunk_size=40)


def test_documents_layout_spans_and_dense_mask():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    d = Documents(pos)
    assert d.spans == [[(0, 3), (3, 5), (5, 6)], [(0, 6)]]
    assert d.cu_seqlens.tolist() == [0, 3, 5, 6, 12] and d.max_seqlen == 6
    m = d.dense()[0, 0]
    assert m[4].tolist() == [False, False, False, True, True, False]
    assert m[2].tolist() == [True, True, True, False, False, False]
    assert not d.single and Documents(pos[1:]).single


def test_per_document_sdpa_equals_dense_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 10, 8, generator=g) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA
    d = Documents(torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 2, 3, 4, 5, 6, 7]]))
    got = sdpa(q, k, v, d)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=d.dense(), enable_gqa=True)
    assert (got - ref).abs().max().item() < 1e-6


def test_packed_logprobs_and_grads_equal_per_document():
    model = build_model(CFG, seed=3).train()
    lens = [9, 14, 6]
    ids = torch.randint(0, CFG.vocab_size, (sum(lens),), generator=torch.Generator().manual_seed(1))
    docs = list(ids.split(lens))
    pos = torch.cat([torch.arange(n) for n in lens])[None]

    # packed: one row, targets are next tokens inside each document (doc-final positions dropped)
    h = model(ids[None], pos)[0]
    keep = torch.cat([torch.arange(n) < n - 1 for n in lens])
    tgt = torch.roll(ids, -1)
    packed = chunked_logprobs(h[keep], model.lm_head_weight, tgt[keep], chunk_size=40)
    packed.sum().backward()
    g_packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    single = torch.cat([_logprobs(model, d[None]) for d in docs])
    single.sum().backward()
    assert (packed - single).abs().max().item() < 1e-5
    for n, p in model.named_parameters():
        assert (g_packed[n] - p.grad).abs().max().item() < 1e-5, n
