"""The Qwen-VL MoEs natively: `qwen3_vl_moe` (Qwen3-VL's tower and DeepStack on Qwen3-MoE layers, a
dense `mlp_only_layers` layer, fused experts) and `qwen3_5_moe` (Qwen3.5's tower on the gated-DeltaNet
MoE hybrid with a gated shared expert) against transformers' `…ForConditionalGeneration` on tiny
random checkpoints (tests/test_hf_fallback.py's CG_FAMILIES configs with tiny-vl's tokenizer): fp32
logits on text and image prompts, packed rows, the engine's greedy continuation, engine vs trainer
log-probs, the HF round trip, the released checkpoints' transposed expert layout, broken
checkpoints, and vf-train on image-colors. The checks are test_vl.py's and test_models_families.py's."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import first_then_matrix
from test_hf_fallback import CG_FAMILIES, build_conditional_generation
from test_models_families import (
    IDS,
    _train,
    check_logits_parity,
    check_packed_rows,
    check_refused,
    check_round_trip,
)
from test_vl import (
    check_engine_greedy,
    check_logits,
    check_packed,
    check_trainer_logprobs,
    save_with_tiny_vl_tokenizer,
    train_on_image_colors,
    user_node,
)
from vf.models import load_model
from vf.models.checkpoint import resolve_impl, save_hf

FAMILIES = {"qwen3_vl_moe": "qwen3_vl_moe", "qwen3_5_moe": "qwen3_5_moe_text"}  # VL model_type -> native text family
TOKENS = (513, 512, 514)  # tiny-vl's <|image_pad|>, <|vision_start|>, <|vision_end|>
# token ids of the configs: tiny-vl's, and a video token past its vocabulary (no text prompt holds it)
TOP = {"image_token_id": 513, "vision_start_token_id": 512, "vision_end_token_id": 514, "video_token_id": 515}


def save_centred(hf, out):
    """`save_with_tiny_vl_tokenizer`, after moving the zero-centred (1 + w) RMSNorm weights of Qwen3.5's
    text model from build_conditional_generation's U(0.5, 1.5) to U(-0.5, 0.5): scales of 0.5-1.5 per
    norm, as the other families' norms get. (At 1.5-2.5 per norm the activations grow so much that fp32
    rounding alone, GEMMs of other row counts, moves packed-vs-separate logits by up to 3e-5.)"""
    with torch.no_grad():
        for m in hf.modules():
            if type(m).__name__ == "Qwen3_5MoeRMSNorm":  # not the DeltaNet's gated norm (plain w)
                m.weight.sub_(1.0)
    return save_with_tiny_vl_tokenizer(hf, out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """VL model_type -> (transformers model, its save_pretrained directory)."""
    out = {}
    for family in FAMILIES:
        text, vision, _ = CG_FAMILIES[family]
        d = tmp_path_factory.mktemp(family)
        hf = build_conditional_generation(family, d, configs=({**text, "vocab_size": 516}, vision, TOP),
                                          save=save_centred)
        hf.set_attn_implementation("eager")  # as check_round_trip's reload (its logits must be identical)
        out[family] = (hf, d)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_transformers_on_text_and_image_prompts(family, saved):
    hf, d = saved[family]
    assert resolve_impl(d) == "native"  # `--model.impl auto` no longer takes the fallback
    ours = load_model(d)
    assert ours.config.architecture == FAMILIES[family] and ours.config.vl_architecture == family
    assert len(ours.visual.deepstack_merger_list) == (2 if family == "qwen3_vl_moe" else 0)
    check_logits(hf, ours, TOKENS)
    check_logits_parity(FAMILIES[family], hf, d, IDS)  # two 40-token rows, both MoE compute paths


def test_fused_experts_read_in_place_are_realigned_for_grouped_mm(saved):
    """transformers writes qwen3_vl_moe's fused experts where safetensors puts them (8-byte aligned, here
    8 mod 16): loaded in place, grouped_mm's 16-byte rule sent every MoE layer down the padded path."""
    from safetensors import safe_open

    from vf.models.moe import _aligned

    d = saved["qwen3_vl_moe"][1]
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        offsets = [f.get_tensor(k).data_ptr() % 16 for k in f.keys() if "experts" in k]
    assert any(offsets), "the fixture no longer has a misaligned expert tensor: the test would not bite"
    model = load_model(d)
    assert all(p.data_ptr() % 16 == 0 for p in model.parameters())
    layer = model.layers[0].mlp
    assert _aligned(layer.gate_up_proj, layer.down_proj)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_rows_equal_separate_documents(family, saved):
    ours = load_model(saved[family][1])
    check_packed(ours, TOKENS)
    check_packed_rows(ours, IDS)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_engine_greedy_equals_transformers_generate(family, saved):
    hf, d = saved[family]
    ids = check_engine_greedy(d, hf, text=IDS[0, :9].tolist())
    assert ids.count(TOKENS[0]) == 16  # a 32x32 image in 4-pixel patches, 2x2 merged


@pytest.mark.parametrize("family", list(FAMILIES))
def test_trainer_logprobs_equal_engine(family, saved):
    check_trainer_logprobs(saved[family][1])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_round_trip_bit_exact_and_loadable_by_transformers(family, saved, tmp_path):
    hf, d = saved[family]
    check_round_trip(hf, d, tmp_path, IDS)
    ours, theirs = (json.loads(p.read_text()) for p in (tmp_path / "config.json", d / "config.json"))
    assert ours["model_type"] == family and ours["text_config"]["model_type"] == f"{family}_text"
    for key in ("vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        assert ours[key] == theirs[key], key
    assert ours["text_config"]["rope_parameters"] == theirs["text_config"]["rope_parameters"]
    if family == "qwen3_vl_moe":  # for readers that take it from the file (vLLM); the router renormalises
        assert ours["text_config"]["norm_topk_prob"] is True


def test_released_transposed_expert_layout_round_trips(saved, tmp_path):
    """Qwen3-VL-MoE's released checkpoints store the fused experts transposed ([E, H, 2Im], [E, Im, H],
    what vLLM reads); transformers' save_pretrained writes its in-memory [E, 2Im, H], [E, H, Im]. Both
    load to the same model; each saves back in its own layout, bit-exact, and transformers loads it."""
    from safetensors.torch import load_file, save_file

    hf, d = saved["qwen3_vl_moe"]
    tensors = load_file(d / "model.safetensors")
    fused = [k for k in tensors if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]
    assert len(fused) == 2  # layer 0's (layer 1 is a dense mlp_only_layers layer)
    released = {k: v.transpose(1, 2).contiguous() if k in fused else v for k, v in tensors.items()}
    assert all(released[k].shape != tensors[k].shape for k in fused)  # the tiny config is not square
    shutil.copytree(d, tmp_path / "released")
    save_file(released, tmp_path / "released" / "model.safetensors")
    ours = load_model(tmp_path / "released")
    a, b = load_model(d).state_dict(), ours.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ours.config.experts_transposed and not load_model(d).config.experts_transposed
    save_hf(ours, tmp_path / "resaved")
    resaved = load_file(tmp_path / "resaved" / "model.safetensors")
    assert resaved.keys() == released.keys() and all(torch.equal(resaved[k], released[k]) for k in released)
    reloaded = type(hf).from_pretrained(tmp_path / "resaved").eval()
    reloaded.set_attn_implementation("eager")
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=IDS).logits, hf(input_ids=IDS).logits)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_checkpoint_with_a_missing_or_misshapen_expert_key_exits_2(family, saved, tmp_path):
    """Refused by load_model and by vf-train (exit 2) with the key named, never half-loaded."""
    from safetensors.torch import load_file

    _, d = saved[family]
    tensors = load_file(d / "model.safetensors")
    p = "model.language_model.layers.0.mlp.experts."
    gate_up = p + ("gate_up_proj" if family == "qwen3_vl_moe" else "1.up_proj.weight")
    assert gate_up in tensors
    bad = torch.zeros(*tensors[gate_up].shape[:-1], tensors[gate_up].shape[-1] + 1)
    check_refused(d, tmp_path, {
        "missing": ({k: v for k, v in tensors.items() if k != gate_up}, gate_up),
        "misshapen": ({**tensors, gate_up: bad}, "layers.0.mlp.gate_up_proj"),
    })
    proc = _train("-o", str(tmp_path / "run"), "--model", str(tmp_path / "missing"), "--steps", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert gate_up in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("family", first_then_matrix(FAMILIES))
def test_vf_train_on_image_colors_runs(family, saved, cli, tmp_path):
    """An SFT warm-up step on image prompts (gradients through the experts and the tower), then two RL
    steps on image rollouts with MoE metrics. (A random model earns no reward on image-colors, so the
    RL steps have no loss tokens; engine vs trainer log-probs on image rollouts: test_trainer_logprobs_equal_engine.)"""
    rows, episodes = train_on_image_colors(cli, saved[family][1], tmp_path / "run", "--warmup.steps", "1",
                                           "--steps", "2", "--trainer.threads", "1")
    assert [r["phase"] for r in rows] == ["warmup", "rl", "rl"] and len(episodes) == 4
    assert rows[0]["num_loss_tokens"] > 0 and rows[0]["grad_norm"] > 0
    assert all(0 < r["moe/routing_confidence"] <= 1 for r in rows)
    assert all(user_node(ep)["token_ids"].count(TOKENS[0]) == 16 for ep in episodes)  # 32x32 images
