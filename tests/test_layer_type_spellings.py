"""Checkpoints written by transformers 5.17 (the GPU machines' version) name the indexed layers
of GLM-5.3 and Qwen3.8 Flash Next with the older spellings `deepseek_sparse_attention` and
`qwen_sparse_attention`; 5.25 writes `indexed_attention`. Both load as the same model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from vf.models import load_model


def respell(src, dst, old: str):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    text = config.get("text_config", config)
    text["layer_types"] = [old if t in ("indexed_attention", "full_attention") else t for t in text["layer_types"]]
    (dst / "config.json").write_text(json.dumps(config))
    return text["layer_types"]


@pytest.mark.parametrize("family, old", [("glm5_next", "deepseek_sparse_attention"),
                                         ("qwen4_exp", "qwen_sparse_attention")])
def test_transformers_5_17_layer_spellings_load_as_the_same_model(family, old, tmp_path):
    import test_models_glm5_next
    import test_models_qwen4_exp

    builder = {"glm5_next": test_models_glm5_next, "qwen4_exp": test_models_qwen4_exp}[family]
    builder.build(tmp_path / "new")
    assert old in respell(tmp_path / "new", tmp_path / "old", old)
    ids = torch.randint(0, 200, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        new, legacy = (load_model(tmp_path / d)(ids) for d in ("new", "old"))
    assert torch.equal(new, legacy)
