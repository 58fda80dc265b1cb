"""The family registry (models/families/): one spec file per family, shared code that names none, typed
sections of a family's own fields, and a new family added by dropping in a file."""

import ast
import dataclasses
import importlib
import textwrap
from pathlib import Path

import pytest
import torch

import vf.models.families as families
from vf.models import ModelConfig, ModelLoadError, build_model
from vf.models.families import family, native_model_types, vision_language

MODELS = Path(families.__file__).resolve().parents[1]
SHARED = ("config.py", "convert.py", "transformer.py", "checkpoint.py", "layers.py", "image_processor.py")


def test_shared_modules_name_no_family():
    """No string constant in the shared modules is a registered model_type (docstrings aside)."""
    types = set(native_model_types())
    for name in SHARED:
        tree = ast.parse((MODELS / name).read_text())
        named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in types}
        assert not named, f"models/{name} names {sorted(named)}"


def test_every_spec_key_targets_a_field_of_the_config_or_its_section():
    shared = {f.name for f in dataclasses.fields(ModelConfig)}
    for model_type in native_model_types():
        spec = family(model_type)
        if spec.model_type != model_type:  # a vision-language checkpoint: its text family is checked
            vl = vision_language(model_type)
            assert family(vl.text).model_type == vl.text, model_type
            continue
        own = {f.name for f in dataclasses.fields(spec.section)} if spec.section else set()
        assert not own & shared, (model_type, own & shared)
        for hf_key, (name, _default) in spec.hf_keys.items():
            assert name in shared | own, (model_type, hf_key, name)
        for name in spec.fixed:
            assert name in shared | own, (model_type, name)


def test_section_fields_are_the_familys_own():
    cfg = ModelConfig(architecture="nemotron_h", vocab_size=8, hidden_size=8, num_layers=1, num_heads=1,
                      num_kv_heads=1, head_dim=8, intermediate_size=8, mamba_num_heads=4)
    assert cfg.mamba_num_heads == cfg.section.mamba_num_heads == 4
    cfg.mamba_num_heads = 6  # writes go to the section
    assert cfg.section.mamba_num_heads == 6 and "mamba_num_heads" not in vars(cfg)
    copy = dataclasses.replace(cfg, vocab_size=16)  # the copy's section is its own
    copy.mamba_num_heads = 2
    assert cfg.mamba_num_heads == 6 and copy.vocab_size == 16
    dense = ModelConfig(architecture="qwen3", vocab_size=8, hidden_size=8, num_layers=1, num_heads=1,
                        num_kv_heads=1, head_dim=8, intermediate_size=8)
    with pytest.raises(AttributeError, match="mamba_num_heads"):
        dense.mamba_num_heads  # noqa: B018
    with pytest.raises(TypeError, match="mamba_num_heads"):
        ModelConfig(architecture="qwen3", vocab_size=8, hidden_size=8, num_layers=1, num_heads=1, num_kv_heads=1,
                    head_dim=8, intermediate_size=8, mamba_num_heads=4)


TOY_SPEC = '''
"""A test family: Qwen3 with one field of its own and a check on it."""
from dataclasses import dataclass

from vf.models.errors import ModelLoadError
from vf.models.families._spec import Family


@dataclass
class ToySection:
    toy_scale: float = 1.0


def check(cfg, d, source):
    if cfg.toy_scale <= 0:
        raise ModelLoadError(f"{source}: toy_scale must be positive, got {cfg.toy_scale}")


FAMILIES = (Family(model_type="toy_qwen", hf_class="ToyQwenForCausalLM", section=ToySection, qk_norm=True,
                   hf_keys={"toy_scale": ("toy_scale", 1.0)}, check=check),)
'''
QWEN3 = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48}


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """A spec file in a second folder of the families package: the registry finds it by listing."""
    (tmp_path / "toy_qwen.py").write_text(textwrap.dedent(TOY_SPEC))
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    families._registry.cache_clear()
    families.hf_keys_read.cache_clear()
    yield
    families._registry.cache_clear()
    families.hf_keys_read.cache_clear()
    importlib.invalidate_caches()


def test_a_new_family_is_one_file(toy_family):
    cfg = ModelConfig.from_hf_dict({**QWEN3, "model_type": "toy_qwen", "toy_scale": 2.5})
    assert cfg.toy_scale == 2.5 and cfg.qk_norm
    out = cfg.to_hf_dict()
    assert out["architectures"] == ["ToyQwenForCausalLM"] and out["toy_scale"] == 2.5
    assert ModelConfig.from_hf_dict(out) == cfg
    with pytest.raises(ModelLoadError, match="toy_scale must be positive"):
        ModelConfig.from_hf_dict({**QWEN3, "model_type": "toy_qwen", "toy_scale": -1})
    # built from the shared mechanisms alone: the same model as Qwen3 with the same weights
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    toy = build_model(cfg, seed=3)
    qwen = build_model(ModelConfig.from_hf_dict(QWEN3), seed=3)
    assert torch.equal(toy.compute_logits(ids), qwen.compute_logits(ids))


def test_unknown_model_type_names_the_native_ones():
    with pytest.raises(ModelLoadError) as e:
        ModelConfig.from_hf_dict({**QWEN3, "model_type": "nope"})
    assert "nope" in e.value.message and "deepseek_v4" in (e.value.hint or "")
