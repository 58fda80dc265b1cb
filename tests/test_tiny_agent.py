"""The built-in agent model `tiny-agent`: its name resolves (or says how to rebuild it), its base
has an 8192-token context and a tokenizer made for code, so a whole gold bash-harness episode
fits with room to spare, and registering it left `tiny-random` byte for byte what it was."""

from __future__ import annotations

import json

import pytest
from vf.models import tiny
from vf.models.build_agent import (
    AGENT_MODEL,
    RECIPE,
    ensure_base,
    gated_sft,
    ipo_config,
    sft_config,
    two_proportion_p,
    wilson,
)

from vf.errors import UsageError

from vf.environments.swe_gen.generate import KINDS, generate  # isort: skip
from vf.environments.swe_gen.gold_server import gold_reply, token_ids  # isort: skip
from vf.episode.harnesses import BashHarness  # isort: skip


def test_the_name_resolves_or_says_how_to_rebuild(monkeypatch, tmp_path):
    assert "tiny-agent" in tiny.BUILTIN_MODELS
    folder = tmp_path / "tiny_agent_trained"
    monkeypatch.setattr(tiny, "AGENT_TRAINED_PATH", folder)
    with pytest.raises(UsageError, match="agent model is missing") as caught:
        tiny.builtin_model_path("tiny-agent")
    assert "vf.models.build_agent" in caught.value.hint
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).write_text("{}")
    with pytest.raises(UsageError):  # a partial folder is still missing the model
        tiny.builtin_model_path("tiny-agent")
    (folder / "tokenizer_config.json").write_text("{}")
    assert tiny.builtin_model_path("tiny-agent") == folder
    assert tiny.builtin_model_path("tiny") == tiny.TRAINED_PATH  # the others are untouched


def test_tiny_random_is_unchanged_by_the_new_build_parameters():
    """The trained `tiny` records the random base it was built from; the hash must still match."""
    shipped = json.loads((tiny.TRAINED_PATH / "build.json").read_text())["base"]
    assert tiny.default_path().name == shipped


def test_the_agent_base_fits_a_whole_gold_episode(tmp_path, monkeypatch):
    from transformers import AutoTokenizer  # heavy: only this test renders with the template

    monkeypatch.setenv("VF_CACHE_DIR", str(tmp_path))
    base = ensure_base(tmp_path)
    config = json.loads((base / "config.json").read_text())
    assert config["max_position_embeddings"] == AGENT_MODEL["max_position_embeddings"] >= 8192
    tok = AutoTokenizer.from_pretrained(str(base))
    tools = [BashHarness.BASH, BashHarness.EDIT]
    longest = 0
    for kind in KINDS:
        gen = generate(kind, 5)
        messages = [{"role": "system", "content": BashHarness.PROMPT + " " + BashHarness.EDIT_PROMPT},
                    {"role": "user", "content": "x" * 600}]
        for turn in range(5):
            reply = gold_reply(gen, turn)
            ids = token_ids(tok, messages, tools, reply)
            assert ids is not None  # the template renders every prompt as a prefix of the next
            messages += [reply] + ([{"role": "tool", "content": gen.repo.files[gen.repo.test] * 2}]
                                   if reply.get("tool_calls") else [])
        longest = max(longest, len(ids[0]) + len(ids[1]))
    assert longest < RECIPE["seq_len"] < config["max_position_embeddings"]


def test_the_recipe_runs_vf_commands_on_swe_gen_with_a_held_out_eval(tmp_path):
    sft = sft_config(tmp_path / "base", tmp_path / "gold")
    assert sft["loss"] == {"name": "sft"} and sft["data"]["path"] == str(tmp_path / "gold")
    ipo = ipo_config(tmp_path / "sft")
    assert ipo["taskset"]["id"] == "swe-gen" and ipo["env"]["agent"]["harness"]["id"] == "bash"
    assert ipo["eval"]["taskset"]["seed"] != ipo["taskset"]["seed"]  # held out
    assert ipo["eval"]["taskset"]["kinds"] == ipo["taskset"]["kinds"]  # of the same kinds
    # enough held-out episodes to tell a clear margin from noise, every task of the held-out set used
    assert ipo["eval"]["select"]["limit"] * ipo["eval"]["num_rollouts"] >= 96
    assert ipo["eval"]["select"]["limit"] == ipo["eval"]["taskset"]["size"]


def test_a_gated_sft_stops_on_validation_tasks_neither_trained_on_nor_reported(tmp_path):
    """SFT stops on vf-train's early stopping, on its own third seed of the same kinds; the recipe's
    rate by default, `--sft-stop-at R` another."""
    gated = sft_config(tmp_path / "base", tmp_path / "gold", gated_sft(0.2))
    ev, ipo = gated["eval"], ipo_config(tmp_path / "sft")
    assert ev["stop_at"] == 0.2 and ev["every"] == 10 and gated["steps"] == 400
    assert ev["taskset"]["seed"] not in (ipo["taskset"]["seed"], ipo["eval"]["taskset"]["seed"])
    assert ev["taskset"]["kinds"] == ipo["taskset"]["kinds"]
    assert gated["env"] == ipo["env"]  # validated through the harness it is trained through
    assert sft_config(tmp_path / "base", tmp_path / "gold")["eval"]["stop_at"] == RECIPE["sft"]["stop_at"] == 0.1


def test_the_margin_statistics_match_textbook_values():
    """build.json's claim of a clear margin rests on these: Wilson intervals and a one-sided
    pooled two-proportion z test (textbook values; a swapped sign or a missing z² term breaks them)."""
    assert wilson(5, 10) == [0.2366, 0.7634]
    assert wilson(0, 10) == [0.0, 0.2775]
    assert two_proportion_p(20, 128, 40, 128) == pytest.approx(0.00158, abs=2e-5)  # z = 2.95
    assert two_proportion_p(40, 128, 20, 128) == pytest.approx(1 - 0.00158, abs=2e-5)  # a fall is no gain
    assert two_proportion_p(7, 96, 7, 96) == 0.5
    assert two_proportion_p(0, 96, 0, 96) == 1.0  # no variance, no evidence


SHIPPED = pytest.mark.skipif(not tiny._complete(tiny.AGENT_TRAINED_PATH),
                             reason="tiny-agent is not shipped in this checkout")


@SHIPPED
def test_the_shipped_model_is_the_recipes_and_ipo_raised_it_beyond_noise():
    path = tiny.builtin_model_path("tiny-agent")
    config = json.loads((path / "config.json").read_text())
    build = json.loads((path / "build.json").read_text())
    assert config["max_position_embeddings"] >= 8192 and config["num_hidden_layers"] == AGENT_MODEL["num_layers"]
    assert json.loads(json.dumps(RECIPE)) == build["recipe"]  # built by the recipe this checkout runs
    before, after = build["held_out"]["before"], build["held_out"]["after"]
    assert before["episodes"] == after["episodes"] >= 96
    assert after["solved"] >= before["solved"] + 12  # ≥ 9 points on the same held-out episodes
    assert build["held_out"]["p_one_sided"] < 0.05
    assert build["built_by"]["commit"] and not build["built_by"]["commit"].endswith("-dirty")  # a clean checkout
    assert two_proportion_p(before["solved"], before["episodes"], after["solved"], after["episodes"]) \
        == pytest.approx(build["held_out"]["p_one_sided"], abs=1e-5)
    assert (path / "metrics.png").stat().st_size > 10_000


@SHIPPED
def test_vf_eval_with_the_shipped_model_fixes_held_out_bugs(tmp_path):
    """What README's agentic example promises: the embedded default scores above zero. Held-out
    `import` tasks (seed 2, never trained on), through the bash harness and the sandbox."""
    import subprocess
    import sys
    from pathlib import Path

    vf_eval = Path(sys.executable).parent / "vf-eval"
    run = subprocess.run([str(vf_eval), "swe-gen", "-n", "8", "-m", "tiny-agent", "--taskset.seed", "2",
                          "--taskset.kinds", '["import"]', "-o", str(tmp_path / "run"), "--json"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["num_episodes"] == 8 and summary["mean_reward"] >= 0.125, summary
