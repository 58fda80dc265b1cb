"""The RL loss fused into the LM head (`fused_head_loss`, the trainer's path for per-token losses)
gives the same loss, metrics and gradients as log-probs + autograd through the loss."""

import math

import pytest
import torch
from vf.models import ModelConfig, build_model
from vf.trainer import losses
from vf.trainer.logprobs import chunked_logprobs, fused_head_loss
from vf.trainer.samples import MicroBatch
from vf.trainer.step import PolicyLogprobs, forward_backward

CFG = ModelConfig(architecture="qwen3", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, intermediate_size=48, tie_word_embeddings=True)
PARAMS = {"ipo": {"kl_tau": 1e-2}, "ppo": {"eps_low": 0.05, "eps_high": 0.05}, "cispo": {"eps_high": 0.1},
          "icepop": {"low": 0.9, "high": 1.1}}


def micro_batch(model, seed=0):
    """Two packed rows (documents of several lengths), a partial loss mask, inference log-probs near
    the policy's (so masks and clips engage) with one NaN, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    R, T = 2, 24
    ids = torch.randint(0, CFG.vocab_size, (R, T), generator=g)
    pos = torch.stack([torch.cat([torch.arange(10), torch.arange(14)]),
                       torch.cat([torch.arange(7), torch.arange(9), torch.arange(8)])])
    tgt = torch.randint(0, CFG.vocab_size, (R, T), generator=g)
    with torch.no_grad():
        lp = chunked_logprobs(model(ids, pos).reshape(-1, CFG.hidden_size), model.lm_head_weight, tgt.reshape(-1))
    mu = (lp + torch.randn(R * T, generator=g) * 0.3).reshape(R, T)
    mu[0, 5] = float("nan")
    mask = torch.rand(R, T, generator=g) > 0.3
    mask[0, 5] = True
    adv = torch.randn(R, T, generator=g)
    return MicroBatch(ids, pos, tgt, mask, mu, adv)


@pytest.mark.parametrize("name", losses.BUILTINS)
def test_fused_equals_unfused_loss_metrics_and_grads(name):
    model = build_model(CFG, seed=1).train()
    mbs = [micro_batch(model, 0), micro_batch(model, 1)]
    loss_fn, params = losses.get(name), PARAMS.get(name, {})
    assert loss_fn.per_token
    n = int(sum(losses.loss_token_mask(None if name == "sft" else m.inference_logprobs, m.loss_mask).sum()
                for m in mbs))
    results = {}
    for fused in (False, True):
        policy = PolicyLogprobs(model, chunk_size=40, fused_loss=fused, fused_block_elements=97 * 7)  # 7-token blocks
        model.zero_grad(set_to_none=True)
        total, stats = forward_backward(policy, mbs, loss_fn, params, n, temperature=0.7)
        results[fused] = (float(total), losses.reduce_metrics(stats),
                          {k: p.grad.clone() for k, p in model.named_parameters()})
    (l0, m0, g0), (l1, m1, g1) = results[False], results[True]
    assert math.isclose(l0, l1, rel_tol=1e-5, abs_tol=1e-6)
    assert m0.keys() == m1.keys()
    for k in m0:
        assert (math.isnan(m0[k]) and math.isnan(m1[k])) or math.isclose(m0[k], m1[k], rel_tol=1e-5, abs_tol=1e-6), k
    if name != "sft":
        assert m1["num_invalid_tokens"] == 2  # one NaN inference log-prob per micro-batch
    for k in g0:
        assert (g0[k] - g1[k]).abs().max().item() < 1e-5, k
    assert max(g.abs().max().item() for g in g1.values()) > 1e-3  # the gradient is not trivially zero


def test_fused_head_loss_direct_matches_naive_with_grad_scale_and_padding_targets():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(13, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    tgt = torch.randint(0, 50, (13,), generator=g)
    tgt[4] = -100
    temp = torch.rand(13, generator=g, dtype=torch.float64) + 0.5
    adv = torch.randn(13, generator=g, dtype=torch.float64)

    def token_loss(lp, a, b):  # a per-token loss written plainly (−A·exp(logp))
        return losses.LossOutput(loss=-(adv[a:b] * lp.exp()).sum())

    loss, logp, outs = fused_head_loss(h, w, tgt, token_loss, temp, grad_scale=0.25, block_elements=50 * 4)
    assert len(outs) == 4
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    z = (h @ w.t()) / temp[:, None]
    ref_lp = torch.log_softmax(z, -1).gather(1, tgt.clamp(min=0)[:, None])[:, 0]
    ref_lp = torch.where(tgt >= 0, ref_lp, -torch.logsumexp(z, -1))  # out-of-range target: −logZ
    ref = -(adv * ref_lp.exp()).sum() * 0.25
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-10
    assert (logp - ref_lp.detach()).abs().max() < 1e-10
    assert (gh - h.grad).abs().max() < 1e-10 and (gw - w.grad).abs().max() < 1e-10


@pytest.mark.parametrize("fused", [True, False])
def test_nonfinite_logits_skip_the_step_and_training_continues(fused):
    from vf.trainer.step import make_optimizer, make_scheduler, train_step

    model = build_model(CFG, seed=1)
    policy = PolicyLogprobs(model, fused_loss=fused)
    opt = make_optimizer(policy, lr=1e-2)
    sched = make_scheduler(opt)
    mb = micro_batch(model, 0)
    loss_fn, n = losses.get("ipo"), int(mb.loss_mask.sum())
    poison = {"on": True}

    def inject(_module, _inp, out):  # NaN in one loss token's hidden state -> NaN logits
        if poison["on"]:
            out = out.clone()
            out[0, 3] = float("nan")
        return out

    hook = model.norm.register_forward_hook(inject)
    mb.loss_mask[0, 3] = True
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    r1 = train_step(policy, opt, sched, [mb], loss_fn, {}, n)
    assert r1.skipped and r1.metrics["skipped_step"] == 1.0 and r1.metrics["nonfinite_logits"] == 1
    assert all(torch.equal(before[k], p) for k, p in model.named_parameters())  # no update
    assert all(p.grad is None for p in model.parameters())
    poison["on"] = False
    r2 = train_step(policy, opt, sched, [mb], loss_fn, {}, n)
    hook.remove()
    assert not r2.skipped and r2.metrics["nonfinite_logits"] == 0 and math.isfinite(r2.loss)
    assert any(not torch.equal(before[k], p) for k, p in model.named_parameters())  # training went on


@pytest.mark.slow
def test_compiled_blocks_give_equal_losses_and_grads():
    """`--model.compile`: torch.compile of each decoder block; same loss and gradients (packed rows,
    two layouts, so the attention graph break and dynamic shapes are exercised)."""
    from vf.trainer.step import compile_blocks

    torch._dynamo.reset()
    eager, compiled = build_model(CFG, seed=1).train(), build_model(CFG, seed=1).train()
    try:
        compile_blocks(compiled)
    except Exception as e:  # noqa: BLE001 (a CPU build without a working compiler)
        pytest.skip(f"torch.compile unavailable: {e}")
    loss_fn = losses.get("ipo")
    for seed in (0, 1):
        mbs = [micro_batch(eager, seed)]
        n = int(mbs[0].loss_mask.sum())
        out = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            try:
                total, _ = forward_backward(PolicyLogprobs(model), mbs, loss_fn, {}, n)
            except Exception as e:
                if model is compiled and "compile" in type(e).__module__ + str(e).lower():
                    pytest.skip(f"torch.compile unavailable on this build: {str(e)[:200]}")
                raise
            out.append((float(total), {k: p.grad.clone() for k, p in model.named_parameters()}))
        (l0, g0), (l1, g1) = out
        assert abs(l0 - l1) < 1e-5
        for k in g0:
            assert (g0[k] - g1[k]).abs().max().item() < 1e-5, k
    assert set(dict(compiled.named_parameters())) == set(dict(eager.named_parameters()))
