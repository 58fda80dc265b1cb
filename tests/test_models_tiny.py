"""The built-in tiny Qwen3 model: deterministic offline build, loads natively and in transformers,
tokenizer round trip and chat template."""

import time

import pytest
import torch
from vf.models import load_model
from vf.models.tiny import default_path, ensure_tiny_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    t0 = time.perf_counter()
    path = ensure_tiny_model(root / "a")
    return path, time.perf_counter() - t0, root


def test_build_is_fast_deterministic_and_idempotent(tiny, monkeypatch):
    path, seconds, root = tiny
    assert seconds < 2.0
    files = sorted(p.name for p in path.iterdir())
    assert files == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    other = ensure_tiny_model(root / "b")
    for name in files:
        assert (path / name).read_bytes() == (other / name).read_bytes(), name
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(path) == path and (path / "model.safetensors").stat().st_mtime_ns == mtime
    monkeypatch.setenv("VF_CACHE_DIR", str(root / "cache"))
    assert default_path().parent == root / "cache" and default_path().name.startswith("tiny-qwen3-")
    built = ensure_tiny_model()
    assert (
        built == default_path()
        and (built / "model.safetensors").read_bytes() == (path / "model.safetensors").read_bytes()
    )
    assert not [p for p in (root / "cache").iterdir() if p.name.startswith(".")]  # no temp dir left behind


def test_loads_natively_and_in_transformers_with_equal_logits(tiny):
    path = tiny[0]
    native = load_model(path)
    cfg = native.config
    assert (
        cfg.architecture,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.tie_word_embeddings,
        cfg.max_position_embeddings,
    ) == ("qwen3", 2, 128, 4, 2, 32, 384, True, 2048)
    assert cfg.vocab_size == 512
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (native.compute_logits(ids) - hf(input_ids=ids).logits).abs().max().item()
    assert diff <= 1e-4


def test_tokenizer_round_trip_and_chat_template(tiny):
    tok = transformers.AutoTokenizer.from_pretrained(tiny[0])
    assert len(tok) == 512
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    for text in [
        "Hello, World! 12+7=19",
        "<reversed_text>dlrow olleh</reversed_text>",
        "\\boxed{42}",
        "héllo ✓ <think>ok</think>",
        "ABC xyz\n\tTabs",
    ]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    assert len(tok("hello world the answer is", add_special_tokens=False)["input_ids"]) <= 8
    for special in [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
    ]:
        assert tok(special, add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(special)]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "\\boxed{5}"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n\\boxed{5}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with_tools = tok.apply_chat_template(messages[1:2], tools=tools, tokenize=False)
    assert with_tools.startswith("<|im_start|>system\n# Tools") and '"name": "add"' in with_tools
