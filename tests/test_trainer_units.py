"""Trainer building blocks: advantages, packing, staleness filter, gradient-accumulation invariance."""

import math

import pytest
import torch
from vf.trainer import advantages
from vf.trainer.orchestrator import TaskSource, build_batch, derive_seed
from vf.trainer.samples import Sample, collate, count_loss_tokens, micro_batches, pack, trace_samples

from vf.trace import Episode, MessageNode, RewardValue, Trace

# ---- advantages -----------------------------------------------------------------------------


def test_advantages_hand_computed_and_zero_variance_skipped():
    out = advantages.compute([[1.0, 0.0, 0.5, 0.5], [0.3, 0.3, 0.3], [0.0, 1.0]])
    assert out.kept == [0, 2]
    assert out.zero_variance == 1
    assert out.advantages[0] == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert out.advantages[1] == pytest.approx([-0.5, 0.5])
    normed = advantages.compute([[1.0, 0.0, 0.5, 0.5]], std_norm=True)
    std = math.sqrt((0.25 + 0.25) / 4)  # population std
    assert normed.advantages[0] == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0], rel=1e-5)


# ---- samples and packing ----------------------------------------------------------------------


def make_trace(prompt, completion, logprobs, reset_second_turn=None, reward=1.0, version=0):
    t = Trace()
    t.nodes.append(MessageNode(message={"role": "system", "content": "s"}))
    t.nodes.append(MessageNode(parent=0, message={"role": "user", "content": "u"}, token_ids=prompt,
                               mask=[0] * len(prompt)))
    t.nodes.append(MessageNode(parent=1, message={"role": "assistant", "content": "a"}, sampled=True,
                               token_ids=completion, mask=[1] * len(completion), logprobs=logprobs))
    if reset_second_turn:
        p2, c2 = reset_second_turn
        n = MessageNode(parent=2, message={"role": "user", "content": "u2"}, token_ids=p2, mask=[0] * len(p2))
        n.token_reset = True
        t.nodes.append(n)
        t.nodes.append(MessageNode(parent=3, message={"role": "assistant", "content": "b"}, sampled=True,
                                   token_ids=c2, mask=[1] * len(c2), logprobs=None))
    t.rewards["r"] = RewardValue(score=reward)
    t.policy = {"start": version, "end": version}
    return t


def test_trace_samples_concatenate_and_split_on_token_reset():
    t = make_trace([1, 2, 3], [4, 5], [-0.1, -0.2], reset_second_turn=([7, 8], [9]))
    s1, s2 = trace_samples(t, advantage=0.5)
    assert s1.token_ids == [1, 2, 3, 4, 5] and s1.loss_mask == [0, 0, 0, 1, 1]
    assert s1.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2] and s1.advantage == 0.5
    assert s2.token_ids == [7, 8, 9] and s2.loss_mask == [0, 0, 1]
    assert math.isnan(s2.logprobs[2])  # missing μ → NaN: masked and counted by the loss
    assert count_loss_tokens([s1, s2]) == 2 and count_loss_tokens([s1, s2], needs_logprobs=False) == 3


def test_packing_restarts_positions_and_shifts_masks():
    a = Sample([10, 11, 12, 13], [0, 0, 1, 1], [0, 0, -1.0, -2.0], 1.0)
    b = Sample([20, 21, 22], [0, 1, 1], [0, -3.0, -4.0], -1.0)
    c = Sample([30, 31, 32, 33, 34, 35], [0, 0, 0, 1, 1, 1], [0, 0, 0, -5, -6, -7], 2.0)
    bins = pack([a, b, c], seq_len=8)
    # first-fit decreasing: c (5 inputs) opens bin 0, a (3) fits beside it, b (2) opens bin 1
    assert [[s.token_ids[0] for s in bn.samples] for bn in bins] == [[30, 10], [20]]
    mb = collate(bins, pad_id=0)
    assert mb.input_ids.tolist() == [[30, 31, 32, 33, 34, 10, 11, 12], [20, 21, 0, 0, 0, 0, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 0, 1, 2, 3, 4, 5]]
    assert mb.targets.tolist()[0] == [31, 32, 33, 34, 35, 11, 12, 13]
    assert mb.loss_mask.int().tolist() == [[0, 0, 1, 1, 1, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert mb.inference_logprobs.tolist()[0] == [0, 0, -5, -6, -7, 0, -1, -2]
    assert mb.advantages.tolist()[1] == [-1, -1, 0, 0, 0, 0, 0, 0]
    # every rank gets the same number of micro-batches (padding ones carry no loss)
    r0 = micro_batches([a, b, c], 8, 1, rank=0, world_size=3)
    r2 = micro_batches([a, b, c], 8, 1, rank=2, world_size=3)
    assert len(r0) == len(r2) == 1 and not r2[0].loss_mask.any()


def test_long_sample_is_truncated_to_seq_len():
    s = Sample(list(range(20)), [0] * 5 + [1] * 15, [0.0] * 20)
    (bn,) = pack([s], seq_len=8)
    assert bn.used == 8 and bn.samples[0].info["truncated"]
    assert count_loss_tokens([s], seq_len=8) == 4


# ---- staleness and task order -------------------------------------------------------------------


def episode(reward, version, ok=True):
    t = make_trace([1, 2], [3, 4], [-0.5, -0.5], reward=reward, version=version)
    ep = Episode(traces=[t])
    ep.ok = ok
    return ep


def test_stale_groups_dropped_and_counted():
    fresh = [episode(1.0, 9), episode(0.0, 9)]
    stale = [episode(1.0, 6), episode(0.0, 9)]  # oldest rollout is 4 steps behind step 10
    flat = [episode(0.5, 9), episode(0.5, 9)]
    broken = [episode(1.0, 9), episode(0.0, 9, ok=False), episode(0.0, 9)]
    b = build_batch(10, [fresh, stale, flat, broken], std_norm=False, max_off_policy_steps=2)
    assert b.metrics["dropped"] == 1
    assert b.metrics["zero_variance_groups"] == 1
    assert b.metrics["errored_rollouts"] == 1
    # staleness of the groups trained on (the dropped one is not), and its histogram
    assert b.metrics["off_policy/max"] == 1 and b.metrics["off_policy/hist"] == {1: 3}
    assert len(b.episodes) == 7  # the dropped group's rollouts are not recorded as trained on
    assert sorted(s.advantage for s in b.samples) == pytest.approx([-0.5, -0.5, 0.5, 0.5])
    b2 = build_batch(10, [stale], std_norm=False, max_off_policy_steps=4)
    assert b2.metrics["dropped"] == 0 and len(b2.samples) == 2
    assert b2.metrics["off_policy/mean"] == 4 and b2.metrics["off_policy/max"] == 4


def test_task_order_is_a_function_of_seed_and_step():
    src1, src2 = TaskSource(list(range(10)), seed=3), TaskSource(list(range(10)), seed=3)
    assert src1.take(5, 4) == src2.take(5, 4)
    assert sorted(src1.take(0, 5) + src1.take(1, 5)) == list(range(10))  # one epoch covers every task
    assert TaskSource(list(range(10)), seed=4).take(0, 10) != src1.take(0, 10)
    assert derive_seed(1, "a", 2) == derive_seed(1, "a", 2) != derive_seed(1, "a", 3)


# ---- gradient accumulation ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from vf.models import load_model
    from vf.models.tiny import ensure_tiny_model

    return load_model(ensure_tiny_model())


def random_samples(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        L = int(torch.randint(8, 30, (1,), generator=g))
        p = int(torch.randint(3, L - 2, (1,), generator=g))
        ids = torch.randint(0, 500, (L,), generator=g).tolist()
        lps = (-torch.rand(L, generator=g) * 3).tolist()
        out.append(Sample(ids, [0] * p + [1] * (L - p), [0.0] * p + lps[p:], float(torch.randn(1, generator=g))))
    return out


@pytest.mark.parametrize("loss_name", ["ipo", "sft"])
def test_grad_accumulation_invariance(tiny, loss_name):
    from vf.trainer import losses
    from vf.trainer.step import PolicyLogprobs, forward_backward

    samples = random_samples()
    n_tok = count_loss_tokens(samples, 64, needs_logprobs=loss_name != "sft")
    fn = losses.get(loss_name)
    params = {"eps": 0.3} if loss_name == "ipo" else {}
    results = []
    for seq_len, mbs in ((64, 8), (32, 1)):  # one micro-batch vs several, different packing
        batches = micro_batches(samples, seq_len, mbs)
        tiny.zero_grad()
        total, _ = forward_backward(PolicyLogprobs(tiny, 128), batches, fn, params, n_tok, temperature=0.7)
        grads = {k: p.grad.clone() for k, p in tiny.named_parameters()}
        results.append((len(batches), float(total) / n_tok, grads))
    (n1, l1, g1), (n3, l3, g3) = results
    assert n1 == 1 and n3 >= 3
    assert l1 == pytest.approx(l3, rel=1e-5, abs=1e-7)
    for k in g1:
        torch.testing.assert_close(g1[k], g3[k], rtol=1e-4, atol=1e-6)
