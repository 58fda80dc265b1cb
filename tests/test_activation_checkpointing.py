"""`trainer.activation_checkpointing`: the config key, and the trainer's forward (native model +
chunked LM-head log-probs) giving the same log-probs and gradients with per-layer recompute."""

import torch
from vf.models import ModelConfig, build_model
from vf.trainer.config import resolve
from vf.trainer.step import PolicyLogprobs

CFG = ModelConfig(architecture="qwen3", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, intermediate_size=48, tie_word_embeddings=True)


def test_config_key_defaults_off_and_parses():
    assert resolve({}).trainer.activation_checkpointing is False
    assert resolve({"trainer": {"activation_checkpointing": True}}).trainer.activation_checkpointing is True


def test_policy_logprobs_same_with_checkpointing():
    model = build_model(CFG, seed=3)
    policy = PolicyLogprobs(model, chunk_size=40)  # 3 vocabulary slices
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CFG.vocab_size, (2, 12), generator=g)
    pos = torch.arange(12).expand(2, 12)
    targets = torch.randint(0, CFG.vocab_size, (2, 12), generator=g)
    weights = torch.randn(24, generator=g)

    def run(flag):
        model.activation_checkpointing = flag
        model.zero_grad(set_to_none=True)
        logp = policy(ids, pos, targets, temperature=0.8)
        (logp * weights).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    lp_plain, g_plain = run(False)
    lp_ckpt, g_ckpt = run(True)
    torch.testing.assert_close(lp_ckpt, lp_plain, rtol=0, atol=0)
    for name, grad in g_plain.items():
        torch.testing.assert_close(g_ckpt[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    assert g_plain["embed_tokens.weight"].abs().sum() > 0  # the tied head got its gradient
