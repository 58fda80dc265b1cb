"""The two built-in models: `tiny` (trained, shipped) and `tiny-random` (built on first use)."""

from __future__ import annotations

import json

import pytest
from conftest import json_out
from vf.models.tiny import TOKENIZER_FILES, TRAINED_PATH, builtin_model_path, ensure_tiny_model


def test_trained_model_ships_small_with_its_recipe_and_the_random_models_tokenizer():
    assert builtin_model_path("tiny") == builtin_model_path(None) == TRAINED_PATH
    assert builtin_model_path("tiny-random") == ensure_tiny_model()
    assert builtin_model_path("./some/dir") is None
    assert (TRAINED_PATH / "model.safetensors").stat().st_size < 3_000_000
    info = json.loads((TRAINED_PATH / "build.json").read_text())
    assert info["reward_before"] < 0.2 and info["reward_after"] > 0.7
    assert info["base"] == ensure_tiny_model().name, "models/tiny.py changed: rebuild with python -m vf.models.build_tiny"
    for name in TOKENIZER_FILES:  # same tokenizer as the model it was trained from
        assert (TRAINED_PATH / name).read_bytes() == (ensure_tiny_model() / name).read_bytes()


@pytest.mark.slow
def test_main_job_scores_well_on_tiny_and_poorly_on_tiny_random(tmp_path, cli):
    args = ("vf-eval", "reverse-text", "-n", "4", "-r", "1", "--sampling.seed", "0", "--json")
    trained = json_out(cli(*args, "-o", str(tmp_path / "a"), check=True))
    random = json_out(cli(*args, "-m", "tiny-random", "-o", str(tmp_path / "b"), check=True))
    assert trained["model"] == "tiny" and trained["mean_reward"] > 0.5
    assert random["mean_reward"] < 0.25
