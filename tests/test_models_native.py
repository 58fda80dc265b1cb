"""Native-model behaviour without transformers: MoE paths agree, KV-cache decode equals the full
forward, random init from a config, import of vf.models stays torch-free."""

import subprocess
import sys

import pytest
import torch
from vf.models import ModelConfig, SimpleKVCache, build_model

MOE = ModelConfig(
    architecture="qwen3_moe",
    vocab_size=101,
    hidden_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=12,
    intermediate_size=64,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
    norm_topk_prob=True,
    tie_word_embeddings=False,
)
DENSE = ModelConfig(
    architecture="qwen3",
    vocab_size=101,
    hidden_size=48,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=12,
    intermediate_size=64,
    tie_word_embeddings=True,
)
LLAMA = ModelConfig(
    architecture="llama",
    vocab_size=101,
    hidden_size=48,
    num_layers=2,
    num_heads=6,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=64,
    attention_bias=True,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
)
IDS = torch.randint(0, 101, (3, 33), generator=torch.Generator().manual_seed(0))


def test_import_vf_models_does_not_import_torch():
    code = "import sys, vf.models, vf.models.tiny; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_build_model_is_seeded_and_shapes():
    a, b = build_model(MOE, seed=3), build_model(MOE, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert a.layers[0].attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 12, 48)
    assert a.layers[0].mlp.gate_up_proj.shape == (8, 48, 48)
    assert a.layers[0].mlp.down_proj.shape == (8, 48, 24)
    with torch.no_grad():
        h = a(IDS)
    assert h.shape == (3, 33, 48) and a.compute_logits(IDS).shape == (3, 33, 101)


@pytest.mark.parametrize("norm_topk", [True, False])
def test_moe_loop_and_grouped_agree_forward_and_backward(norm_topk):
    cfg = ModelConfig(**{**MOE.to_dict(), "norm_topk_prob": norm_topk})
    model = build_model(cfg, seed=0)
    grads, outs = {}, {}
    for impl in ("loop", "grouped"):
        model.set_moe_impl(impl)
        model.zero_grad()
        out = model.compute_logits(IDS)
        out.square().mean().backward()
        outs[impl] = out.detach()
        grads[impl] = model.layers[1].mlp.gate_up_proj.grad.clone()
    assert (outs["loop"] - outs["grouped"]).abs().max().item() <= 1e-5
    assert (grads["loop"] - grads["grouped"]).abs().max().item() <= 1e-6
    assert grads["loop"].abs().sum() > 0


@pytest.mark.parametrize("cfg", [DENSE, MOE, LLAMA], ids=["qwen3", "qwen3_moe", "llama"])
def test_kv_cache_prefill_then_decode_matches_full_forward(cfg):
    model = build_model(cfg, seed=1).eval()
    with torch.no_grad():
        full = model.compute_logits(IDS)
        cache = SimpleKVCache(batch=3)
        steps = [model.compute_logits(IDS[:, :20], cache=cache)]  # prefill
        steps.append(model.compute_logits(IDS[:, 20:24], cache=cache))  # a 4-token block
        for t in range(24, 33):  # token-by-token decode with explicit position_ids
            pos = torch.full((3, 1), t)
            steps.append(model.compute_logits(IDS[:, t : t + 1], pos, cache=cache))
    got = torch.cat(steps, dim=1)
    assert cache.seq_len == 33
    assert (got - full).abs().max().item() <= 1e-5


def test_packed_rows_with_three_documents_and_padding():
    model = build_model(DENSE, seed=2).eval()
    lens = [7, 12, 5]
    docs = [IDS[i, :n] for i, n in enumerate(lens)]
    packed = torch.cat(docs)[None]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    with torch.no_grad():
        got = model.compute_logits(packed, pos)[0]
        ref = torch.cat([model.compute_logits(d[None])[0] for d in docs])
    assert (got - ref).abs().max().item() <= 1e-5


def test_config_reads_transformers4_rope_keys_and_rejects_unsupported():
    from vf.models import ModelLoadError

    v4 = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "rope_theta": 5e5,
        "rope_scaling": {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "some_future_key": [1, 2],
    }
    cfg = ModelConfig.from_hf_dict(v4)
    assert cfg.rope_theta == 5e5 and cfg.rope_scaling["rope_type"] == "llama3" and cfg.head_dim == 8
    assert cfg.num_kv_heads == 2
    hf = cfg.to_hf_dict()
    assert hf["rope_parameters"]["rope_type"] == "llama3" and hf["rope_parameters"]["rope_theta"] == 5e5
    assert hf["some_future_key"] == [1, 2] and hf["architectures"] == ["LlamaForCausalLM"]
    assert ModelConfig.from_hf_dict(hf).to_hf_dict() == hf
    with pytest.raises(ModelLoadError, match="yarn"):
        ModelConfig.from_hf_dict({**v4, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(ModelLoadError, match="num_hidden_layers"):
        ModelConfig.from_hf_dict({k: v for k, v in v4.items() if k != "num_hidden_layers"})
    with pytest.raises(ModelLoadError, match="hidden_act"):
        ModelConfig.from_hf_dict({**v4, "hidden_act": "gelu"})


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_activation_checkpointing_same_loss_and_grads_fewer_saved_tensors(config):
    """Per-layer checkpointing recomputes each layer in backward: loss and every parameter grad
    equal the plain forward+backward, and autograd keeps far fewer tensors alive between the two."""
    model = build_model(config, seed=0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (2, 9), generator=g)
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4], list(range(9))])  # a packed row (block mask) too
    targets = torch.randint(0, config.vocab_size, (2, 9), generator=g)

    def run(flag):
        model.activation_checkpointing = flag
        model.zero_grad(set_to_none=True)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            logits = model.compute_logits(ids, pos)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, sum(saved)

    loss_plain, grads_plain, saved_plain = run(False)
    loss_ckpt, grads_ckpt, saved_ckpt = run(True)
    torch.testing.assert_close(loss_ckpt, loss_plain, rtol=0, atol=0)
    assert grads_ckpt.keys() == grads_plain.keys()
    for name in grads_plain:
        torch.testing.assert_close(grads_ckpt[name], grads_plain[name], rtol=1e-6, atol=1e-7, msg=name)
    assert saved_ckpt < 0.5 * saved_plain, (saved_ckpt, saved_plain)
