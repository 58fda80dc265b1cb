"""The vLLM engine's parts that need no vLLM: the missing-package error, the server command, and
the multi-turn token cache (nothing re-tokenised between turns). The integration tests against real
vLLM servers are in test_vllm_train.py (marked `vllm`, run by .ci/run)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import run_cli

from vf.engines.vllm_engine import SERVER_FLAGS, TurnCache, server_command


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vf_train_vllm_without_vllm_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.delenv("VF_VLLM_PYTHON", raising=False)
    p = run_cli("vf-train", "--engine.type", "vllm", "--steps", "1", "--warmup.steps", "0", "-o", str(tmp_path / "r"),
                env={"VF_VLLM_PYTHON": ""}, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "needs the vllm package" in p.stderr and "Traceback" not in p.stderr
    assert "rstrip" not in p.stderr  # the old crash in weights.py


def test_server_command_has_the_rl_flags():
    cmd = server_command("/py", "/m", "tiny", 8001, max_model_len=512)
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    i = cmd.index("--weight-transfer-config")
    assert json.loads(cmd[i + 1]) == {"backend": "vf_safetensors"}
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert "--enable-scale-out" in cmd and cmd[cmd.index("--max-model-len") + 1] == "512"
    assert all(f in cmd for f in SERVER_FLAGS)


def test_turn_cache_extends_the_sampled_ids_without_retokenising():
    from transformers import AutoTokenizer

    from vf.engines.chat import render_prompt
    from vf.engines.local import resolve_model_path

    tok = AutoTokenizer.from_pretrained(str(resolve_model_path("tiny")))
    cache = TurnCache()
    turn1 = [{"role": "user", "content": "reverse: abc"}]
    p1 = cache.prompt(tok, turn1, None)
    assert p1 == render_prompt(tok, turn1) and cache.misses == 1
    # a sampled reply whose ids are NOT what re-tokenising its text gives ("c" "b" "a" one by one)
    reply_ids = [tok.convert_tokens_to_ids(t) for t in ("c", "b", "a")] + [tok.eos_token_id]
    reply = {"role": "assistant", "content": tok.decode(reply_ids, skip_special_tokens=True)}
    cache.put(turn1 + [reply], None, p1 + reply_ids)
    turn2 = turn1 + [reply, {"role": "user", "content": "again"}]
    p2 = cache.prompt(tok, turn2, None)
    assert cache.hits == 1
    assert p2[:len(p1) + len(reply_ids)] == p1 + reply_ids  # the model's own tokens, verbatim
    assert tok.decode(p2) == tok.decode(render_prompt(tok, turn2))  # same text as a fresh render
    # an unknown history (edited reply) falls back to a fresh render
    edited = turn1 + [{"role": "assistant", "content": "xyz"}, {"role": "user", "content": "again"}]
    assert cache.prompt(tok, edited, None) == render_prompt(tok, edited) and cache.misses == 2
