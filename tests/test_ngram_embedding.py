"""Hashed n-gram (PLE) embeddings (models/ngram_embedding.py) against transformers' qwen4_exp
`Qwen4ExpTextNGramEmbedding` built from the same config with the same table: the derived tables,
the ids (a table whose row r holds r reads them back) and the outputs bit for bit, over several PLE
layer indices and n-gram sizes with eos tokens in the input; gradients; decoding with transformers'
cached context; packed rows equal to their documents alone; hostile ids, shapes and configs.

transformers itself hashes any id it is given: an id ≥ vocab_size can overflow t·m and land on an
arbitrary row. vf refuses it (UsageError, exit 2) instead."""

import pytest
import torch
from transformers.models.qwen4_exp import modeling_qwen4_exp as hf_mod
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
from vf.models.errors import ModelLoadError
from vf.models.ngram_embedding import (
    NGramEmbedding,
    NGramSpec,
    head_offsets,
    head_vocab_sizes,
    layer_multipliers,
    padded_rows,
    primes_from,
)

from vf.errors import UsageError

V, EOS, OTHER_EOS = 97, 5, 6  # eos_token_id [5, 6]: only the first ends a document


def config(ngram_size=3, heads_per_ngram=2, divisor=8, base=300, seed=7, **kw) -> Qwen4ExpTextConfig:
    dim = 2 * (ngram_size - 1) * heads_per_ngram  # two columns per head
    return Qwen4ExpTextConfig(vocab_size=V, eos_token_id=[EOS, OTHER_EOS], ngram_size=ngram_size,
                              heads_per_ngram=heads_per_ngram, ngram_vocab_size_base=base,
                              make_ngram_vocab_size_divisible_by=divisor, seed=seed, hidden_size=dim,
                              ple_embed_dim=dim, **kw)


def pair(layer=0, **kw) -> tuple[torch.nn.Module, NGramEmbedding]:
    """(transformers' module, ours) for PLE layer index `layer`, ours holding transformers' table."""
    cfg = config(**kw)
    torch.manual_seed(layer)
    hf = hf_mod.Qwen4ExpTextNGramEmbedding(cfg, cfg.ple_embed_dim, layer_idx=2 * layer + 1, ple_layer_index=layer)
    ours = NGramEmbedding(NGramSpec.from_hf(cfg, layer))
    with torch.no_grad():
        ours.weight.copy_(hf.ngram_embedding.weight)
    return hf, ours


def batch(g: torch.Generator, B=4, T=24) -> torch.Tensor:
    """Random ids with eos in every place that matters: none (row 0), at column 0 (row 1), twice in a
    row (row 2), last (row 3), plus the second listed eos id, which is an ordinary token."""
    ids = torch.randint(0, V, (B, T), generator=g)
    ids[ids == EOS] = 7
    ids[1, 0] = ids[1, 9] = EOS
    ids[2, 4:6] = EOS
    ids[2, 15] = ids[3, 3] = OTHER_EOS
    ids[3, -1] = ids[3, 11] = EOS
    return ids


def index_table(m: NGramEmbedding, hf=None) -> None:
    """Row r of the table holds (r, −r): an output reads back the ids (exact in float32 below 2²⁴)."""
    r = torch.arange(m.rows, dtype=torch.float32)
    with torch.no_grad():
        for w in [m.weight] + ([hf.ngram_embedding.weight] if hf is not None else []):
            w.copy_(torch.stack([r, -r], 1))


CASES = [  # (ngram_size, heads_per_ngram, PLE layer index)
    (2, 1, 0), (3, 2, 0), (3, 2, 3), (4, 3, 1), (5, 2, 7),
]


# ---- derived tables ---------------------------------------------------------------------------------


def test_primes_multipliers_and_head_tables_match_transformers():
    for start in (-3, 0, 1, 2, 3, 4, 100, 997, 20_000_000):
        assert primes_from(start, 12) == [hf_mod._find_nth_prime_after(start - 1, i + 1) for i in range(12)]
    for vocab in (1, 97, 248320):
        for layer in (0, 1, 9):
            for seed in (0, 1234):
                assert layer_multipliers(vocab, 4, layer, seed) == hf_mod._build_layer_multipliers(vocab, 4, layer, seed).tolist()
    # the real config: base 20M, 16 heads per layer; transformers searches prime by prime
    sizes = head_vocab_sizes(20_000_000, 3, 8, 2)
    assert sizes == [hf_mod._find_nth_prime_after(20_000_000 - 1, 2 * 16 + j + 1) for j in range(16)]
    assert sizes[0] > 20_000_000 and len(set(sizes)) == 16
    assert padded_rows(sum(sizes), 128) % 128 == 0 and 0 <= padded_rows(sum(sizes), 128) - sum(sizes) < 128
    for n, h, layer in CASES:
        hf, ours = pair(layer, ngram_size=n, heads_per_ngram=h)
        assert torch.equal(ours.multipliers, hf.layer_multipliers)
        assert ours.head_sizes.tolist() == hf.head_vocab_sizes and ours.head_offsets.tolist() == hf.head_offsets
        assert head_offsets(hf.head_vocab_sizes) == hf.head_offsets
        assert ours.weight.shape == hf.ngram_embedding.weight.shape  # [P, D]: the checkpoint's tensor as is
        assert set(ours.state_dict()) == {"weight"}  # the derived buffers are not saved
        ours.check_hf_buffers({k: v for k, v in hf.state_dict().items() if k != "ngram_embedding.weight"})


def test_check_hf_buffers_refuses_other_hash_constants():
    hf, ours = pair(1)
    bad = hf.layer_multipliers.clone()
    bad[1] += 2  # still odd: a plausible multiplier, just not the config's
    with pytest.raises(ModelLoadError, match="layer_multipliers differs"):
        ours.check_hf_buffers({"layer_multipliers": bad})
    with pytest.raises(ModelLoadError, match="ngram_heads_offsets differs"):
        ours.check_hf_buffers({"ngram_heads_offsets": hf.ngram_heads_offsets[:-1]})
    with pytest.raises(ModelLoadError, match="unknown buffer"):
        ours.check_hf_buffers({"seed": torch.tensor(7)})


# ---- parity with transformers -----------------------------------------------------------------------


@pytest.mark.parametrize("n,h,layer", CASES)
def test_ids_and_outputs_match_transformers(n, h, layer):
    hf, ours = pair(layer, ngram_size=n, heads_per_ngram=h)
    ids = batch(torch.Generator().manual_seed(n * 10 + layer))
    out = ours(ids)
    assert out.shape == (4, 24, 2 * (n - 1) * h) and out.dtype == torch.float32
    assert torch.equal(out, hf(ids, None))  # bit for bit: both only copy rows
    index_table(ours, hf)
    got = ours.ngram_ids(ids)
    want = hf(ids, None).view(4, 24, -1, 2)[..., 0].long()
    assert torch.equal(got, want)
    assert torch.equal(ours(ids).view(4, 24, -1, 2)[..., 0].long(), got)
    # sanity of the comparison itself: ids spread over every head's range, and history matters
    assert all(((got[..., j] >= o) & (got[..., j] < o + s)).all() for j, (o, s) in
               enumerate(zip(ours.head_offsets.tolist(), ours.head_sizes.tolist())))
    assert len(got.unique()) > 0.5 * got.numel()
    other = ids.clone()
    other[0, 10] = (ids[0, 10] + 1) % V if ids[0, 10] + 1 != EOS else 0
    moved = ours.ngram_ids(other)[0] != got[0]  # [T, H]: what changes when token 10 does
    order = torch.arange((n - 1) * h) // h + 2  # head j hashes an n-gram of this many tokens
    assert not moved[:10].any() and not moved[10 + n:].any()
    for k in range(n):  # k places after the change, exactly the heads whose n-grams reach back to it
        assert torch.equal(moved[10 + k], order > k), k


def test_bfloat16_table_and_gradients_match_transformers():
    hf, ours = pair(2, ngram_size=4, heads_per_ngram=2)
    ids = batch(torch.Generator().manual_seed(3))
    g = torch.randn(4, 24, 12, generator=torch.Generator().manual_seed(4))
    (ours(ids) * g).sum().backward()
    (hf(ids, None) * g).sum().backward()
    assert (ours.weight.grad - hf.ngram_embedding.weight.grad).abs().max() <= 1e-6
    assert ours.weight.grad.abs().max() > 1.0 and (ours.weight.grad == 0).any(dim=1).sum() > 0  # rows not hit stay zero
    hf.to(torch.bfloat16)
    ours.to(torch.bfloat16)
    assert ours.multipliers.dtype == torch.long  # integer buffers survive a dtype cast
    out = ours(ids)
    assert out.dtype == torch.bfloat16 and torch.equal(out, hf(ids, None))


class ConvStateCache:
    """What transformers' n-gram module reads of its cache: conv state 2, the last C token ids."""

    def __init__(self):
        self.ctx = None

    def get_conv_state(self, layer_idx, state_idx):
        assert state_idx == 2
        return self.ctx

    def update_conv_state(self, ids, layer_idx, state_idx, conv_kernel_size):
        hist = ids if self.ctx is None else torch.cat([self.ctx, ids], 1)
        self.ctx = hist[:, -conv_kernel_size:]


@pytest.mark.parametrize("prefill", [2, 10])  # 2 < C = 3 (transformers pads its cache with eos)
def test_decoding_with_context_matches_transformers_cache(prefill):
    hf, ours = pair(1, ngram_size=4, heads_per_ngram=1)
    ids = batch(torch.Generator().manual_seed(5))
    full = ours(ids)
    cache, ctx = ConvStateCache(), None
    for s, e in [(0, prefill), *((t, t + 1) for t in range(prefill, 24))]:
        step = ids[:, s:e]
        got = ours(step, context=ctx)
        assert torch.equal(got, hf(step, cache)) and torch.equal(got, full[:, s:e]), (s, e)
        ctx = ours.next_context(step, ctx)
        assert torch.equal(ctx, cache.ctx)


# ---- packed rows ------------------------------------------------------------------------------------


def test_packed_row_equals_each_document_alone():
    hf, ours = pair(3, ngram_size=4, heads_per_ngram=2)
    g = torch.Generator().manual_seed(6)
    docs = [torch.randint(0, V, (n,), generator=g) for n in (5, 1, 9, 2, 7)]
    docs[2][3] = EOS  # an eos inside a document still cuts its history
    docs[4][0] = EOS
    rows = [docs[:3], docs[3:]]  # two packed rows of 15 and 9 tokens, padded to 15 with a fresh document
    pad = torch.full((6,), 11)
    flat = [torch.cat(rows[0]), torch.cat([*rows[1], pad])]
    ids = torch.stack(flat)
    pos = torch.stack([torch.cat([torch.arange(len(d)) for d in r]) for r in (rows[0], [*rows[1], pad])])
    out = ours(ids, pos)
    for b, r in enumerate(rows):
        s = 0
        for d in r:
            alone = ours(d[None])
            assert torch.equal(out[b, s:s + len(d)], alone[0])
            assert torch.equal(alone, hf(d[None], None))  # a document alone is what transformers computes
            s += len(d)
    # the check can fail: without position_ids the second document's first tokens see the first's
    assert not torch.equal(ours(ids)[0, 5:6], out[0, 5:6])
    # a document start at column 0 hides the context; a continuation (no 0) reads it
    ctx = ids[:1, :3]
    assert torch.equal(ours(ids[:1, 3:], pos[:1, 3:] * 0 + torch.arange(12), context=ctx), ours(ids[:1, 3:]))
    assert torch.equal(ours(ids[:1, 5:], pos[:1, 5:] + 5, context=ids[:1, 2:5]), ours(ids[:1])[:, 5:])


def test_empty_batches():
    _, ours = pair(0)
    assert ours(torch.zeros(0, 7, dtype=torch.long)).shape == (0, 7, 8)
    assert ours(torch.zeros(3, 0, dtype=torch.long)).shape == (3, 0, 8)
    assert ours.next_context(torch.zeros(3, 0, dtype=torch.long)).tolist() == [[EOS, EOS]] * 3


# ---- hostile inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where,bad", [("ids", V), ("ids", -1), ("ids", 2**40), ("context", V + 3)])
def test_ids_outside_the_vocabulary_are_refused(where, bad):
    _, ours = pair(0)
    ids = torch.randint(0, V, (2, 6))
    ctx = torch.full((2, 2), EOS)
    (ids if where == "ids" else ctx)[1, 1] = bad
    with pytest.raises(UsageError, match=rf"token id {bad} is outside the vocabulary \[0, {V}\)") as e:
        ours(ids, context=ctx)
    assert e.value.exit_code == 2


def test_bad_shapes_are_refused():
    _, ours = pair(0)
    ids = torch.randint(0, V, (2, 6))
    with pytest.raises(UsageError, match=r"input_ids must be \[B, T\]"):
        ours(ids[0])
    with pytest.raises(UsageError, match="position_ids shape"):
        ours(ids, torch.arange(5).expand(2, 5))
    with pytest.raises(UsageError, match=r"context must be \[B, 2\]"):
        ours(ids, context=ids[:, :3])


@pytest.mark.parametrize("field,value,message", [
    ("ngram_size", 1, "ngram_size 1 < 2"),
    ("embed_dim", 10, "ple_embed_dim 10 is not a positive multiple of the 4 heads"),
    ("eos_token_id", V, f"eos_token_id {V} is outside the vocabulary"),
    ("divisible_by", 0, "must be ≥ 1"),
])
def test_bad_configs_are_refused(field, value, message):
    spec = {"vocab_size": V, "embed_dim": 8, "eos_token_id": EOS, "ngram_size": 3, "heads_per_ngram": 2,
            "vocab_size_base": 300}
    with pytest.raises(ModelLoadError, match=message):
        NGramSpec(**{**spec, field: value})
    cfg = config()
    cfg.eos_token_id = []
    with pytest.raises(ModelLoadError, match="eos_token_id must be set"):
        NGramSpec.from_hf(cfg, 0)
