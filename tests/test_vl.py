"""Vision-language models: Qwen3-VL against transformers, the Pillow image processor, images
inline through the embedded engine, and multimodal samples for the trainer.

References: a random-initialised tiny transformers Qwen3-VL (from_config + save_pretrained) and
transformers' own PIL image processor; no downloads. The `check_*` helpers take any VL family's
model (tests/test_vl_moe.py runs them on the Qwen-VL MoEs)."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pytest
import torch

IMAGE_TOKEN, START, END = 290, 292, 293
TOKENS = (IMAGE_TOKEN, START, END)  # (image pad, vision start, vision end) ids of the configs here
VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4, "out_hidden_size": 64,
              "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 1]}
TEXT = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                             "mrope_interleaved": True}}
PROCESSOR = {"patch_size": 4, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5],
                 "image_std": [0.5, 0.5, 0.5], "size": {"shortest_edge": 64, "longest_edge": 1024}}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = tmp_path_factory.mktemp("qwen3vl")
    cfg = Qwen3VLConfig(text_config=TEXT, vision_config=VISION, image_token_id=IMAGE_TOKEN, video_token_id=291,
                        vision_start_token_id=START, vision_end_token_id=END)
    torch.manual_seed(0)
    Qwen3VLForConditionalGeneration(cfg).save_pretrained(path)
    Qwen2VLImageProcessorPil(**PROCESSOR).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(hf_dir):
    from transformers import Qwen3VLForConditionalGeneration
    from vf.models import load_model

    return Qwen3VLForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval(), load_model(hf_dir)


def prompt(grids, text=(5, 6), gap=(7, 8, 9), tail=(10, 11), tokens=TOKENS):
    """Token ids: text, then per image <start> pads <end> and some text (`tokens`: image, start, end ids)."""
    image, start, end = tokens
    ids = list(text)
    for i, (t, h, w) in enumerate(grids):
        ids += [start] + [image] * (t * h * w // 4) + [end] + list(gap if i < len(grids) - 1 else tail)
    return ids


def pixels(grids, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(t * h * w for t, h, w in grids), 3 * 2 * 4 * 4, generator=g)


def test_logits_equal_transformers(models):
    check_logits(*models)


def check_logits(hf, ours, tokens=TOKENS) -> tuple[float, float]:
    """fp32 logits of a two-image prompt and of a text-only prompt equal transformers' within 1e-4,
    and the images matter; returns the two max abs differences."""
    grids = [(1, 8, 8), (1, 4, 6)]
    ids = torch.tensor([prompt(grids, tokens=tokens)])
    kw = {"pixel_values": pixels(grids), "image_grid_thw": torch.tensor(grids), "mm_token_type_ids": (ids == tokens[0]).int()}
    with torch.no_grad():
        ref = hf(input_ids=ids, **kw).logits
        out = ours.compute_logits(ids, **kw)
        text_only = torch.tensor([[1, 2, 3, 4, 5, 6]])
        text_err = (hf(input_ids=text_only).logits - ours.compute_logits(text_only)).abs().max().item()
        no_images = ours.compute_logits(ids)  # the same tokens without pixels: the images must matter
    image_err = (ref - out).abs().max().item()
    assert image_err < 1e-4
    assert text_err < 1e-4
    assert (no_images - out).abs().max().item() > 1e-3
    return image_err, text_err


def test_packed_documents_equal_separate(models):
    check_packed(models[1])


def check_packed(ours, tokens=TOKENS) -> float:
    """Two image prompts packed into one row (positions restart at 0) give the logits of each alone
    within 1e-5; returns the max abs difference."""
    a, b = [(1, 4, 4)], [(1, 8, 4)]
    ids_a, ids_b = prompt(a, tokens=tokens), prompt(b, text=(3,), tokens=tokens)
    pa, pb = pixels(a, 1), pixels(b, 2)
    with torch.no_grad():
        sep_a = ours.compute_logits(torch.tensor([ids_a]), pixel_values=pa, image_grid_thw=torch.tensor(a))
        sep_b = ours.compute_logits(torch.tensor([ids_b]), pixel_values=pb, image_grid_thw=torch.tensor(b))
        pos = torch.tensor([list(range(len(ids_a))) + list(range(len(ids_b)))])
        packed = ours.compute_logits(torch.tensor([ids_a + ids_b]), pos, pixel_values=torch.cat([pa, pb]),
                                     image_grid_thw=torch.tensor(a + b))
    err = max((packed[0, :len(ids_a)] - sep_a[0]).abs().max().item(), (packed[0, len(ids_a):] - sep_b[0]).abs().max().item())
    assert err < 1e-5
    return err


def test_save_round_trip_is_exact(models, hf_dir, tmp_path):
    from safetensors.torch import load_file
    from vf.models.checkpoint import save_hf

    _, ours = models
    save_hf(ours, tmp_path)
    want, got = load_file(hf_dir / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_vl" and cfg["image_token_id"] == IMAGE_TOKEN
    assert cfg["text_config"]["rope_parameters"]["mrope_section"] == [2, 3, 3]
    assert cfg["vision_config"] == json.loads((hf_dir / "config.json").read_text())["vision_config"]
    from vf.models.image_processor import ImageProcessor

    assert ImageProcessor.from_dir(tmp_path) == ImageProcessor.from_dir(hf_dir)  # the processor travels with it


def _image(w, h, seed=0, mode="RGB"):
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(arr).convert(mode)


def test_image_processor_equals_transformers(hf_dir):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from vf.models.image_processor import ImageProcessor

    images = [_image(53, 37), _image(16, 16, 1, "L"), _image(90, 200, 2), _image(8, 500, 3)]
    ref = Qwen2VLImageProcessorPil.from_pretrained(hf_dir)(images, return_tensors="np")
    ours = ImageProcessor.from_dir(hf_dir)(images)
    assert np.array_equal(ref["image_grid_thw"], ours["image_grid_thw"])
    assert np.abs(ref["pixel_values"] - ours["pixel_values"]).max() == 0.0


def _data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_load_image_reads_only_data_urls_and_local_files_under_roots(tmp_path):
    from vf.models.image_processor import load_image

    from vf.errors import EngineError

    assert load_image(_data_url(_image(9, 7))).size == (9, 7)
    inside = tmp_path / "ok.png"
    _image(5, 6).save(inside)
    assert load_image(str(inside), [tmp_path]).size == (5, 6)
    assert load_image(f"file://{inside}", [tmp_path]).size == (5, 6)
    bad = {
        "http://127.0.0.1:9/x.png": "not read",
        str(inside): "outside",  # no roots given
        "data:image/png;base64,!!!": "base64",
        "data:image/png;base64," + base64.b64encode(b"not a png").decode(): "cannot be decoded",
        str(tmp_path / "missing.png"): "cannot be read",
    }
    for ref, words in bad.items():
        with pytest.raises(EngineError, match=words) as e:
            load_image(ref, [tmp_path] if "missing" in ref else [])
        assert e.value.type == "BadImage" and e.value.status_code == 400
    with pytest.raises(EngineError, match="over 0 MiB"):
        load_image(_data_url(_image(64, 64)), max_bytes=100)


def test_truncation_cuts_only_at_whole_images():
    from vf.trainer.samples import Sample, pack

    ids = [1, 2, START] + [IMAGE_TOKEN] * 4 + [END, 3, START] + [IMAGE_TOKEN] * 4 + [END, 4, 5]
    s = Sample(ids, [0] * (len(ids) - 2) + [1, 1], [0.0] * len(ids), images=["a", "b"])
    cut_inside_second = pack([s], seq_len=12, image_token_id=IMAGE_TOKEN)[0].samples[0]
    assert cut_inside_second.token_ids == ids[:10] and cut_inside_second.images == ["a"]
    cut_after_first = pack([s], seq_len=9, image_token_id=IMAGE_TOKEN)[0].samples[0]
    assert cut_after_first.token_ids == ids[:10] and cut_after_first.images == ["a"]
    cut_inside_first = pack([s], seq_len=4, image_token_id=IMAGE_TOKEN)[0].samples[0]
    assert cut_inside_first.token_ids == ids[:3] and cut_inside_first.images == []
    with pytest.raises(ValueError, match="image token id"):
        pack([s], seq_len=4)


def test_trace_samples_keep_image_references():
    from vf.trainer.samples import micro_batches, trace_samples

    from vf.trace import MessageNode, Trace

    user = {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image_url", "image_url": {"url": "data:A"}}]}
    user2 = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:B"}}]}
    t = Trace(nodes=[
        MessageNode(message={"role": "system", "content": "s"}),
        MessageNode(parent=0, message=user, token_ids=[1, IMAGE_TOKEN, 2], mask=[0, 0, 0]),
        MessageNode(parent=1, message={"role": "assistant", "content": "x"}, sampled=True, token_ids=[7, 8], mask=[1, 1],
                    logprobs=[-1.0, -2.0]),
        MessageNode(parent=2, message=user2, token_ids=[IMAGE_TOKEN, IMAGE_TOKEN], mask=[0, 0]),
        MessageNode(parent=3, message={"role": "assistant", "content": "y"}, sampled=True, token_ids=[9], mask=[1],
                    logprobs=[-0.5]),
    ])
    (s,) = trace_samples(t)
    assert s.images == ["data:A", "data:B"]
    assert "data:" not in json.dumps(s.token_ids)  # references stay references; tokens stay tokens
    (mb,) = micro_batches([s, s], seq_len=64, micro_batch_size=2, image_token_id=IMAGE_TOKEN)
    assert mb.images == ["data:A", "data:B", "data:A", "data:B"]


def save_with_tiny_vl_tokenizer(hf, out):
    """`hf.save_pretrained(out)` plus tiny-vl's tokenizer files (its chat template writes one
    <|image_pad|> = 513 per image part, between <|vision_start|> = 512 and <|vision_end|> = 514) and
    the image processor PROCESSOR; returns `hf`."""
    import shutil

    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from vf.models.tiny_vl import ensure_tiny_vl_model

    hf.save_pretrained(out)
    Qwen2VLImageProcessorPil(**PROCESSOR).save_pretrained(out)
    tiny = ensure_tiny_vl_model()
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(tiny / f, out / f)
    return hf


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory):
    from vf.models.tiny_vl import ensure_tiny_vl_model

    return ensure_tiny_vl_model(tmp_path_factory.mktemp("tinyvl") / "m")


def _image_messages(color=(200, 30, 30), seed=0):
    from PIL import Image

    url = _data_url(Image.new("RGB", (32, 32), color))
    return [{"role": "user", "content": [{"type": "text", "text": "colour?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}], url


def test_engine_greedy_equals_transformers_generate(tiny_vl):
    """The embedded engine (KV cache, rope delta after the image) continues greedily as transformers does."""
    from transformers import Qwen3VLForConditionalGeneration

    hf = Qwen3VLForConditionalGeneration.from_pretrained(tiny_vl, dtype=torch.float32).eval()
    ids = check_engine_greedy(tiny_vl, hf)
    assert ids.count(513) == 4  # a 32x32 image is 4 <|image_pad|> tokens


def check_engine_greedy(path, hf, text=None, new_tokens=12) -> list[int]:
    """The embedded engine's greedy continuation of an image chat prompt (and, decoded beside it in
    the same batch, of the text-only prompt `text`) equals `hf.generate`'s; returns the image
    prompt's token ids."""
    from vf.engines.base import Sampling
    from vf.engines.chat import render_multimodal
    from vf.engines.local import LocalEngine

    engine = LocalEngine.from_model(str(path))
    messages, _ = _image_messages()
    ids, mm = render_multimodal(engine.tokenizer, engine.model, messages)
    greedy = Sampling(temperature=0.0, max_tokens=new_tokens)

    prompts = [(ids, mm)] + ([(list(text), None)] if text else [])

    async def go():
        try:
            return await asyncio.gather(*[engine.generate_ids(p, greedy, ignore_eos=True, mm=m) for p, m in prompts])
        finally:
            await engine.close()

    seqs = asyncio.run(go())
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = hf.generate(input_ids=x, pixel_values=mm["pixel_values"], image_grid_thw=mm["image_grid_thw"],
                          mm_token_type_ids=(x == engine.model.image_token_id).int(), max_new_tokens=new_tokens,
                          do_sample=False, eos_token_id=None)
        assert seqs[0].token_ids == ref[0, len(ids):].tolist()
        if text:
            ref = hf.generate(input_ids=torch.tensor([text]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
            assert seqs[1].token_ids == ref[0, len(text):].tolist()
    return ids


def test_trainer_logprobs_equal_engine_on_image_rollouts(tiny_vl):
    check_trainer_logprobs(tiny_vl)


def check_trainer_logprobs(path) -> float:
    """Sampled image rollouts: the trainer's log-probs (pixels recomputed from the references) equal
    the engine's within 1e-5; returns the max abs difference."""
    from vf.trainer.samples import Sample, micro_batches
    from vf.trainer.step import PolicyLogprobs

    from vf.engines.base import GenerateRequest, Sampling
    from vf.engines.local import LocalEngine

    engine = LocalEngine.from_model(str(path))
    requests = [_image_messages(c) for c in ((200, 30, 30), (30, 30, 200), (30, 200, 30))]

    async def go():
        try:
            return await asyncio.gather(*[engine.generate(GenerateRequest(m, Sampling(temperature=1.0, max_tokens=10, seed=i)))
                                          for i, (m, _) in enumerate(requests)])
        finally:
            await engine.close()

    results = asyncio.run(go())
    samples = [Sample(r.prompt_token_ids + r.token_ids, [0] * len(r.prompt_token_ids) + [1] * len(r.token_ids),
                      [0.0] * len(r.prompt_token_ids) + r.logprobs, images=[url]) for r, (_, url) in zip(results, requests)]
    (mb,) = micro_batches(samples, seq_len=256, micro_batch_size=1, image_token_id=engine.model.image_token_id)
    assert len(mb.images) == 3  # all three packed in one row
    with torch.no_grad():
        logp = PolicyLogprobs(engine.model)(mb.input_ids, mb.position_ids, mb.targets, 1.0, images=mb.images)
    mask = mb.loss_mask.reshape(-1)
    err = (logp[mask] - mb.inference_logprobs.reshape(-1)[mask]).abs().max().item()
    assert mask.sum() == sum(len(r.token_ids) for r in results) and err < 1e-5
    return err


def test_text_only_engine_refuses_images():
    from vf.engines.chat import render_prompt
    from vf.errors import EngineError

    messages, _ = _image_messages()

    class Tok:
        def apply_chat_template(self, *a, **k):
            raise AssertionError("must refuse before rendering")

    with pytest.raises(EngineError, match="reads text only") as e:
        render_prompt(Tok(), messages)
    assert e.value.status_code == 400


@pytest.mark.slow
def test_vf_serve_reads_image_url_parts_and_vf_eval_keeps_references(tiny_vl, cli, tmp_path):
    """vf-eval image-colors → the OpenAI client → vf-serve (tiny-vl): image parts reach the model
    (prompt tokens include each image's tokens), traces keep the data URLs inline; a URL we may not
    fetch answers 400 (a text-only model's 400: test_text_only_engine_refuses_images)."""
    import httpx
    from test_serve import start_server

    proc, base = start_server(str(tiny_vl), "--threads", "1", "--served-model-name", "tiny-vl")
    try:
        out = tmp_path / "run"
        r = cli("vf-eval", "image-colors", "-n", "3", "-r", "1", "--base-url", base + "/v1", "-m", "tiny-vl",
                "-o", str(out), "--json", "--sampling.max-tokens", "4", check=True)
        assert json.loads(r.stdout.strip().splitlines()[-1])["num_errors"] == 0
        for line in (out / "traces.jsonl").read_text().splitlines():
            nodes = json.loads(line)["traces"][0]["nodes"]
            user = next(n for n in nodes if n["message"]["role"] == "user")
            assert user["message"]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
            assert user["token_ids"].count(513) == 4  # <|image_pad|> x 4: the server saw the image
            assert "pixel" not in line
        messages, _ = _image_messages()
        body = {"model": "m", "messages": messages, "max_tokens": 2}
        assert httpx.post(base + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        body["messages"][0]["content"][1]["image_url"]["url"] = "http://127.0.0.1:9/cat.png"
        remote = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
        assert remote.status_code == 400 and remote.json()["error"]["type"] == "BadImage"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


BAD_IMAGES_ENV = '''
import vf
from vf.environments.image_colors import ColorData, ColorTask, ImageColorsTaskset, draw
from vf.utils.image import image_data_url
import random


class Bad(ImageColorsTaskset):
    def load(self):
        urls = [image_data_url(draw("red", random.Random(0))), "http://127.0.0.1:9/cat.png",
                "data:image/png;base64,aGVsbG8=", "/etc/hostname"]
        for i, url in enumerate(urls):
            yield ColorData(id=f"bad-{i}", answer="red", prompt=[{"role": "user", "content": [
                {"type": "text", "text": "colour?"}, {"type": "image_url", "image_url": {"url": url}}]}])


__all__ = ["Bad"]
'''


@pytest.mark.slow
def test_bad_images_fail_their_episode_and_the_run_goes_on(tiny_vl, cli, tmp_path):
    env = tmp_path / "bad_images.py"
    env.write_text(BAD_IMAGES_ENV)
    r = cli("vf-eval", str(env), "-m", str(tiny_vl), "-n", "4", "-r", "1", "-o", str(tmp_path / "run"), "--json",
            "--sampling.max-tokens", "2", "--max-errors", "3")  # the three bad images fail their episodes
    assert r.returncode == 0, r.stderr[-2000:]
    episodes = {e["task"]["data"]["id"]: e for e in map(json.loads, (tmp_path / "run" / "traces.jsonl").read_text().splitlines())}
    assert episodes["bad-0"]["ok"]
    for key, words in {"bad-1": "not read", "bad-2": "cannot be decoded", "bad-3": "outside"}.items():
        (err,) = [c["error"] for t in episodes[key]["traces"] for c in t["calls"]]
        assert not episodes[key]["ok"] and err["type"] == "BadImage" and words in err["message"], err


def test_sft_warmup_on_image_prompts_learns(tiny_vl):
    """Gold SFT samples of image-colors on tiny-vl: samples carry the images, loss falls over steps."""
    from transformers import AutoTokenizer
    from vf.models import load_model
    from vf.trainer import losses
    from vf.trainer.batches import gold_samples
    from vf.trainer.samples import count_loss_tokens, micro_batches
    from vf.trainer.step import PolicyLogprobs, make_optimizer, make_scheduler, train_step

    from vf.loading import load_taskset

    torch.manual_seed(0)
    model = load_model(tiny_vl).train()
    tasks = list(load_taskset("image-colors", {"size": 8}).taskset.tasks())
    samples = gold_samples(tasks, AutoTokenizer.from_pretrained(str(tiny_vl)), model)
    assert [len(s.images) for s in samples] == [1] * 8 and samples[0].token_ids.count(model.image_token_id) == 4
    policy = PolicyLogprobs(model)
    opt = make_optimizer(policy, 3e-3)
    sched = make_scheduler(opt)
    mbs = micro_batches(samples, 128, 4, image_token_id=model.image_token_id)
    n = count_loss_tokens(samples, 128, needs_logprobs=False)
    first = train_step(policy, opt, sched, mbs, losses.get("sft"), {}, n).loss
    for _ in range(4):
        last = train_step(policy, opt, sched, mbs, losses.get("sft"), {}, n).loss
    assert last < 0.7 * first


@pytest.mark.slow
def test_vf_train_on_image_colors_runs(tiny_vl, cli, tmp_path):
    """vf-train on tiny-vl: an SFT warm-up step on image prompts, then an RL step on image rollouts
    whose traces keep the images as data URLs (the trainer-engine log-prob parity of such rollouts:
    test_trainer_logprobs_equal_engine_on_image_rollouts)."""
    rows, episodes = train_on_image_colors(cli, tiny_vl, tmp_path / "run", "--warmup.steps", "1", "--steps", "1")
    assert [r["phase"] for r in rows] == ["warmup", "rl"] and rows[0]["num_loss_tokens"] > 0
    assert len(episodes) == 2
    assert all(user_node(ep)["token_ids"].count(513) == 4 for ep in episodes)


def train_on_image_colors(cli, model, out, *args):
    """`vf-train -m MODEL --taskset image-colors ARGS` (batch 2, group 2, 3 new tokens, deterministic);
    checks the traces keep each image as a data URL; returns (metrics rows, episodes)."""
    cli("vf-train", "-m", str(model), "--taskset", "image-colors", "--batch-size", "2", "--group-size", "2",
        "--sampling.max-tokens", "3", "--async.deterministic", "true", "--async.level", "0",
        "--eval.at-start", "false", "--eval.at-end", "false", "-o", str(out), *args, check=True, timeout=300)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    for ep in episodes:
        assert user_node(ep)["message"]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    return rows, episodes


def user_node(episode) -> dict:
    return next(n for n in episode["traces"][0]["nodes"] if n["message"]["role"] == "user")


def test_qwen3_5_vl_logits_round_trip_and_engine_greedy(tmp_path):
    """Qwen3.5 with its vision tower (no DeepStack) on the gated-DeltaNet hybrid text model, partial
    M-RoPE: logits equal transformers', the checkpoint round-trips exactly, and the embedded engine
    (recurrent + KV cache, rope delta after the image) continues greedily as transformers does."""
    from safetensors.torch import load_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from vf.models import load_model
    from vf.models.checkpoint import save_hf

    from vf.engines.base import Sampling
    from vf.engines.local import LocalEngine

    text = {"vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 24, "linear_key_head_dim": 8,
            "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 0],
                                "mrope_interleaved": True, "partial_rotary_factor": 0.25}}
    vision = {k: v for k, v in VISION.items() if k != "deepstack_visual_indexes"} | {"out_hidden_size": 32}
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN, video_token_id=291,
                        vision_start_token_id=START, vision_end_token_id=END)
    torch.manual_seed(0)
    hf = Qwen3_5ForConditionalGeneration(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert ours.config.architecture == "qwen3_5_text" and not ours.visual.deepstack_merger_list
    grids = [(1, 8, 8), (1, 4, 6)]
    ids = torch.tensor([prompt(grids)])
    kw = {"pixel_values": pixels(grids), "image_grid_thw": torch.tensor(grids)}
    with torch.no_grad():
        err = (hf(input_ids=ids, mm_token_type_ids=(ids == IMAGE_TOKEN).int(), **kw).logits
               - ours.compute_logits(ids, **kw)).abs().max().item()
    assert err < 1e-4
    save_hf(ours, tmp_path / "rt")
    a, b = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "rt" / "model.safetensors")
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "rt" / "config.json").read_text())["model_type"] == "qwen3_5"

    one = [(1, 8, 8)]
    p = prompt(one)
    mm = {"pixel_values": pixels(one, 3), "image_grid_thw": torch.tensor(one), "rope_delta": ours.rope_delta(p, one)}
    engine = LocalEngine(ours, None, max_batch=4)

    async def go():
        try:  # a text-only prompt decodes beside it in the same batch
            return await asyncio.gather(engine.generate_ids(p, Sampling(temperature=0.0, max_tokens=10), ignore_eos=True, mm=mm),
                                        engine.generate_ids([1, 2, 3], Sampling(temperature=0.0, max_tokens=6), ignore_eos=True))
        finally:
            await engine.close()

    seq, _ = asyncio.run(go())
    x = torch.tensor([p])
    with torch.no_grad():
        ref = hf.generate(input_ids=x, pixel_values=mm["pixel_values"], image_grid_thw=mm["image_grid_thw"],
                          mm_token_type_ids=(x == IMAGE_TOKEN).int(), max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert mm["rope_delta"] < 0 and seq.token_ids == ref[0, len(p):].tolist()
