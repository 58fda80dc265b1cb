"""Chunked LM-head log-probs vs the naive full-logits reference: values, entropy, gradients for
hidden and weight (also tied to an embedding), temperature, and that no tokens×vocab tensor is
ever created."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from vf.trainer.logprobs import chunked_logprobs, naive_logprobs

N, H, V = 37, 16, 103


def inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=dtype).requires_grad_(True)
    weight = (torch.randn(V, H, generator=g, dtype=dtype) * 0.5).requires_grad_(True)
    targets = torch.randint(0, V, (N,), generator=g)
    upstream = torch.randn(N, generator=g, dtype=dtype)
    return hidden, weight, targets, upstream


TEMPS = {"1.0": 1.0, "0.7": 0.7, "per-token": torch.linspace(0.5, 1.5, N)}


@pytest.mark.parametrize("temp", list(TEMPS))
@pytest.mark.parametrize("chunk,token_chunk", [(1, 8192), (7, 5), (32, 8192), (50, 16), (103, 8192),
                                               (4096, 8192)])
def test_chunked_matches_naive_values_entropy_and_grads(chunk, token_chunk, temp):
    temperature = TEMPS[temp]
    hidden, weight, targets, up = inputs()
    lp, ent = chunked_logprobs(hidden, weight, targets, temperature, chunk_size=chunk,
                               token_chunk_size=token_chunk, return_entropy=True)
    gh, gw = torch.autograd.grad((lp * up).sum(), (hidden, weight))
    lp_ref, ent_ref = naive_logprobs(hidden, weight, targets, temperature, return_entropy=True)
    gh_ref, gw_ref = torch.autograd.grad((lp_ref * up).sum(), (hidden, weight))
    tol = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(lp, lp_ref, **tol)
    torch.testing.assert_close(ent, ent_ref, **tol)
    torch.testing.assert_close(gh, gh_ref, **tol)
    torch.testing.assert_close(gw, gw_ref, **tol)
    assert not ent.requires_grad  # entropy is forward-only


def test_logprobs_are_normalised_and_temperature_divides_logits():
    hidden, weight, _, _ = inputs()
    with torch.no_grad():
        every = torch.arange(V).repeat_interleave(N)  # each token scored against every vocab entry
        for t in (1.0, 0.5):
            lp = chunked_logprobs(hidden.repeat(V, 1), weight, every, t, chunk_size=10)
            total = lp.exp().view(V, N).sum(dim=0)
            torch.testing.assert_close(total, torch.ones(N), rtol=0, atol=1e-5)
        # T = 0.5 equals T = 1 with the logits doubled
        a = chunked_logprobs(hidden, weight, torch.arange(N), 0.5, chunk_size=10)
        b = chunked_logprobs(hidden * 2, weight, torch.arange(N), 1.0, chunk_size=10)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_float64_gradcheck():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 4, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (5,), generator=g)
    temps = torch.tensor([0.7, 1.0, 1.3, 2.0, 0.9], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_logprobs(h, w, targets, temps, chunk_size=3, token_chunk_size=2),
        (hidden, weight))
    # and the same function as the reference at float64 precision
    torch.testing.assert_close(chunked_logprobs(hidden, weight, targets, temps, chunk_size=4),
                               naive_logprobs(hidden, weight, targets, temps), rtol=1e-12, atol=1e-12)


def test_tied_embedding_weight_gets_both_gradients():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(V, H)
    ids = torch.randint(0, V, (N,))
    targets = torch.randint(0, V, (N,))
    proj = torch.nn.Linear(H, H)

    def step(fn, **kw):
        emb.zero_grad(), proj.zero_grad()
        hidden = torch.tanh(proj(emb(ids)))  # the tied weight is used as input embedding AND head
        fn(hidden, emb.weight, targets, 0.8, **kw).sum().backward()
        return emb.weight.grad.clone(), proj.weight.grad.clone()

    ge, gp = step(chunked_logprobs, chunk_size=16)
    ge_ref, gp_ref = step(naive_logprobs)
    torch.testing.assert_close(ge, ge_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gp, gp_ref, rtol=1e-5, atol=1e-5)


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_materialises_tokens_by_vocab():
    n, h, v = 64, 8, 1000
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    saved = []
    with _LargestTensor() as mode, torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.numel()) or t, lambda t: t):
        lp = chunked_logprobs(hidden, weight, targets, chunk_size=100, token_chunk_size=16)
        lp.sum().backward()
    # biggest tensors: the weight and its grad (v·h = 8000) and one 16×100 slice; never n·v = 64000
    assert mode.largest == v * h
    assert max(saved) <= v * h
    with _LargestTensor() as mode:
        naive_logprobs(hidden, weight, targets).sum().backward()
    assert mode.largest == n * v  # the reference does build it


def test_bad_shapes_raise():
    hidden, weight, targets, _ = inputs()
    with pytest.raises(ValueError, match="hidden"):
        chunked_logprobs(hidden, weight[:, :3], targets)
    with pytest.raises(ValueError, match="targets"):
        chunked_logprobs(hidden, weight, targets[:3])
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs(hidden, weight, targets, torch.ones(3))
