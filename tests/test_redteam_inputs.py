"""Red team, bounded input (issue 22): each hostile input gets exit 2 or an HTTP 4xx with a
message, within seconds and bounded memory; never a 500, a dropped connection, exit 1, or a stall.

CLI attacks run the real console scripts (under a 3 GiB address-space limit, so a regression fails
instead of taking the machine); HTTP attacks run a real vf-serve on loopback (in-process for the
fast ones, a subprocess where the event loop's latency is what is measured)."""

from __future__ import annotations

import asyncio
import json
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import BIN
from test_serve_security import KEY, request, serving


MEM_LIMIT = 3 << 30


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))


def run_limited(*args: str, timeout: float = 30) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of a console script under MEM_LIMIT; a timeout is exit -9."""
    t0 = time.time()
    try:
        p = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout,
                           preexec_fn=_limited, env={"NO_COLOR": "1", "PATH": str(BIN), "HOME": str(Path.home())})
    except subprocess.TimeoutExpired:
        return -9, "timed out", time.time() - t0
    return p.returncode, p.stderr, time.time() - t0


def alias_bomb(levels: int = 12, under: str = "taskset") -> str:
    """'Billion laughs': ~0.5 KB that expands to 9**levels strings."""
    lines = [f"{under}:", '  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# -- configs -----------------------------------------------------------------------------------

def test_alias_bomb_config_exits_2_fast(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert bomb.stat().st_size < 1024
    code, err, secs = run_limited("vf-eval", "reverse-text", "--config", str(bomb), "-n", "1", "-o", str(tmp_path / "r"))
    assert code == 2 and "alias" in err and secs < 15, (code, err[-500:], secs)
    assert not (tmp_path / "r").exists()


def test_alias_bomb_in_a_run_dirs_config_exits_2_fast(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(alias_bomb())
    code, err, secs = run_limited("vf-eval", "--resume", str(run))
    assert code == 2 and "alias" in err and str(run / "config.yaml") in err and secs < 15, (code, err[-500:], secs)


@pytest.mark.parametrize("kind", ["yaml", "json", "toml"])
def test_deeply_nested_config_exits_2(tmp_path, kind):
    depth = 100_000 if kind != "toml" else 3_000
    nested = "[" * depth + "]" * depth
    f = tmp_path / f"deep.{kind}"
    f.write_text({"yaml": f"taskset: {{x: {nested}}}\n", "json": f'{{"taskset": {{"x": {nested}}}}}',
                  "toml": f"x = {nested}\n"}[kind])
    args = ["--config", str(f)] if kind == "yaml" else ["@", str(f)]
    code, err, _ = run_limited("vf-eval", "reverse-text", *args, "-n", "1", "-o", str(tmp_path / "r"))
    assert code == 2 and "nested" in err and "Traceback" not in err, (code, err[-800:])


def test_deeply_nested_traces_line_exits_2(tmp_path, cli):
    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"traces": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    r = cli("vf-eval", "reverse-text", "--score", str(traces))
    assert r.returncode == 2 and f"{traces}:1: nested deeper than" in r.stderr, (r.returncode, r.stderr[-500:])


@pytest.mark.parametrize("value", [".inf", "nan"])
def test_non_finite_sampling_value_exits_2(tmp_path, cli, value):
    r = cli("vf-eval", "reverse-text", "-n", "1", "--sampling.temperature", value, "-o", str(tmp_path / "r"))
    assert r.returncode == 2 and "sampling.temperature" in r.stderr, (r.returncode, r.stderr[-500:])
    assert not (tmp_path / "r").exists()


def test_bounded_yaml_keeps_ordinary_aliases_and_refuses_recursive_ones():
    from vf.bounded import BoundsError, load_yaml

    assert load_yaml("a: &x {b: 1}\nc: *x\n") == {"a": {"b": 1}, "c": {"b": 1}}
    with pytest.raises(BoundsError, match="recursive"):
        load_yaml("a: &x [*x]\n")
    chain = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 5000))
    with pytest.raises(BoundsError, match="deeper"):  # depth grows through aliases, not the text
        load_yaml(chain)


def test_deeply_nested_model_config_exits_2(tmp_path, cli):
    from vf.models.tiny import ensure_tiny_model

    model = tmp_path / "deep-model"
    shutil.copytree(ensure_tiny_model(), model)
    cfg = (model / "config.json").read_text().rstrip().removesuffix("}")
    (model / "config.json").write_text(cfg + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    r = cli("vf-eval", "reverse-text", "-m", str(model), "-n", "1", "-o", str(tmp_path / "r"))
    assert r.returncode == 2 and "nested deeper" in r.stderr and "Traceback" not in r.stderr, r.stderr[-800:]


def test_unallocatable_context_exits_2(tmp_path):
    from vf.models.tiny import ensure_tiny_model

    model = tmp_path / "huge-context"
    shutil.copytree(ensure_tiny_model(), model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["max_position_embeddings"] = 10**12
    (model / "config.json").write_text(json.dumps(cfg))
    code, err, _ = run_limited("vf-eval", "reverse-text", "-m", str(model), "-n", "1", "-o", str(tmp_path / "r"),
                               timeout=60)
    assert code == 2 and "cannot be allocated" in err and "Traceback" not in err, (code, err[-800:])


def test_unreachable_server_is_named_in_the_summary(tmp_path, cli):
    r = cli("vf-eval", "reverse-text", "-n", "2", "--base-url", "http://127.0.0.1:9/v1", "-m", "tiny",
            "-o", str(tmp_path / "r"), "--engine.max-retries", "0", "--json")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["num_errors"] == 2
    assert "ConnectionError" in summary["first_error"] and "http://127.0.0.1:9/v1" in summary["first_error"]


# -- vf-serve, in process ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine():
    from vf.engines.local import LocalEngine

    return LocalEngine.from_model("tiny", max_batch=4)


async def raw(port: int, data: bytes, timeout: float = 30) -> tuple[int, dict]:
    """Send bytes as they are; (status, JSON body). A dropped connection fails the test."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    resp = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    assert resp, "connection dropped without an answer"
    return int(resp.split(b" ", 2)[1]), json.loads(resp.split(b"\r\n\r\n", 1)[1] or b"{}")


def post(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


CHAT = '{"model": "tiny", "messages": [{"role": "user", "content": %s}], "max_tokens": 2%s}'


def test_hostile_http_inputs_answer_4xx(engine):
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases = {
        "nul in target": (b"GET /v1/mo\x00dels HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 400),
        "lone surrogate": (post("/v1/chat/completions", (CHAT % ('"\\ud800"', "")).encode()), 400),
        "deep json": (post("/v1/chat/completions", deep), 400),
        "negative chunk": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                           b"Connection: close\r\n\r\n-5\r\nabc\r\n0\r\n\r\n", 400),
        "NaN temperature": (post("/v1/chat/completions", (CHAT % ('"hi"', ', "temperature": NaN')).encode()), 400),
        "inf temperature": (post("/v1/chat/completions", (CHAT % ('"hi"', ', "temperature": 1e999')).encode()), 400),
        "inf top_p": (post("/v1/chat/completions", (CHAT % ('"hi"', ', "top_p": -Infinity')).encode()), 400),
        "huge seed": (post("/v1/chat/completions", (CHAT % ('"hi"', ', "seed": ' + "9" * 30)).encode()), 400),
        "huge top_k": (post("/v1/chat/completions", (CHAT % ('"hi"', ', "top_k": ' + "9" * 30)).encode()), 400),
        "unknown model": (post("/v1/chat/completions", (CHAT % ('"hi"', "")).replace('"tiny"', '"gpt-9"').encode()), 404),
        "nul in weight path": (post("/v1/load_weights", b'{"path": "/tmp/a\\u0000b"}'), 400),
    }

    async def go(port, app):
        return {name: await raw(port, data) for name, (data, _) in cases.items()}

    got = serving(engine, go, api_key=KEY, weights_roots=["/tmp"])
    for name, (status, body) in got.items():
        assert status == cases[name][1], (name, status, body)
        assert body["error"]["message"], name
    assert "nested deeper" in got["deep json"][1]["error"]["message"]
    assert "gpt-9" in got["unknown model"][1]["error"]["message"]


def test_unknown_model_through_the_openai_client(engine):
    import openai

    async def go(port, app):
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
        try:
            ok = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=2)
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model="other", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=2)
            return ok
        finally:
            await client.close()

    assert serving(engine, go, api_key=KEY).choices[0].message is not None


def test_weight_versions_never_go_backwards(engine, tmp_path):
    from vf.models.tiny import ensure_tiny_model

    root = tmp_path / "root"
    shutil.copytree(ensure_tiny_model(), root / "ckpt")

    async def go(port, app):
        path = str(root / "ckpt")
        return [await request(port, "POST", "/v1/load_weights", {"path": path, "version": 7}),
                await request(port, "POST", "/v1/load_weights", {"path": path, "version": 3}),
                await request(port, "POST", "/v1/load_weights", {"path": path, "version": 3, "rollback": True})]

    forward, backward, rollback = serving(engine, go, api_key=KEY, weights_roots=[root])
    assert forward == (200, {"status": "ok", "policy_version": 7, "path": str(root / "ckpt")})
    assert backward[0] == 409 and "older than the served policy's 7" in backward[1]["error"]["message"]
    assert rollback[0] == 200 and rollback[1]["policy_version"] == 3


def test_shard_index_cannot_name_files_outside_the_weights_root(engine, tmp_path):
    """An index naming a file outside (absolute, `..`, or a symlink out) is refused before anything
    is read, and the answer is the same whether that file exists or not."""
    from safetensors import safe_open

    from vf.models.tiny import ensure_tiny_model

    tiny = ensure_tiny_model()
    with safe_open(str(tiny / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    root = tmp_path / "root"
    outside = tmp_path / "outside.safetensors"
    shutil.copy(tiny / "model.safetensors", outside)  # a real, loadable file: the old code loaded it

    def model_dir(name: str, shard: str, link: Path | None = None) -> Path:
        d = root / name
        d.mkdir(parents=True)
        shutil.copy(tiny / "config.json", d / "config.json")
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
        if link is not None:
            (d / shard).symlink_to(link)
        return d

    missing = tmp_path / "missing.safetensors"
    pairs = {
        "absolute": (model_dir("abs-e", str(outside)), model_dir("abs-m", str(missing))),
        "dotdot": (model_dir("dd-e", "../../outside.safetensors"), model_dir("dd-m", "../../missing.safetensors")),
        "symlink": (model_dir("ln-e", "w.safetensors", outside), model_dir("ln-m", "w.safetensors", missing)),
    }

    async def go(port, app):
        return {k: [await request(port, "POST", "/v1/load_weights", {"path": str(d)}) for d in ds]
                for k, ds in pairs.items()}

    before = engine.policy_version
    for kind, (exists, absent) in serving(engine, go, api_key=KEY, weights_roots=[root]).items():
        assert 400 <= exists[0] < 500 and exists[0] == absent[0], (kind, exists, absent)
        same = absent[1]["error"]["message"].replace("missing", "outside").replace("-m", "-e")
        assert exists[1]["error"]["message"] == same, (kind, exists, absent)
        assert "outside" in exists[1]["error"]["message"]
    assert engine.policy_version == before  # nothing was loaded


def test_api_key_is_compared_in_constant_time(engine, monkeypatch):
    import hmac

    import vf.serve.app as app_module

    calls = []

    def spy(a, b):
        calls.append((a, b))
        return hmac.compare_digest(a, b)

    monkeypatch.setattr(app_module, "hmac", type("H", (), {"compare_digest": staticmethod(spy)}), raising=False)

    async def go(port, app):
        return [await request(port, "GET", "/v1/models", key="wrong"), await request(port, "GET", "/v1/models")]

    wrong, right = serving(engine, go, api_key=KEY)
    assert wrong[0] == 401 and right[0] == 200 and len(calls) == 2


def test_hostile_server_reply_nested_100k_deep_is_an_engine_error():
    """The client side: a provider answering 100k nested brackets is a recorded provider error,
    not a RecursionError escaping the engine."""
    from vf.engines.base import GenerateRequest, Sampling
    from vf.engines.openai_client import OpenAIEngine
    from vf.errors import EngineError
    from vf.serve.http import Response, serve

    async def hostile(_req):
        return Response(200, b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")

    async def go():
        server = await serve(hostile, "127.0.0.1", 0)
        engine = OpenAIEngine(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", model="m", max_retries=0)
        try:
            with pytest.raises(EngineError, match="malformed response"):
                await engine.generate(GenerateRequest(messages=[{"role": "user", "content": "hi"}],
                                                      sampling=Sampling(max_tokens=2)))
        finally:
            await engine.close()
            server.close()

    asyncio.run(go())


# -- vf-serve, a subprocess: its event loop must keep answering -----------------------------------

def test_huge_body_does_not_stall_health(tmp_path):
    """A 15 MB chat body (under the 16 MiB limit) is answered 400 (prompt too long) while /health,
    polled all along, answers every time in under a second (it took 19-33 s before)."""
    from test_serve import start_server as start_vf_serve

    proc, base = start_vf_serve("tiny", "--threads", "1")
    try:
        body = (CHAT % (json.dumps("word " * 3_000_000), "")).encode()
        result = {}

        def send():
            r = httpx.post(base + "/v1/chat/completions", content=body, timeout=120,
                           headers={"content-type": "application/json"})
            result["r"] = r

        sender = threading.Thread(target=send)
        sender.start()
        worst, polls = 0.0, 0
        while sender.is_alive() or polls < 3:
            t0 = time.time()
            assert httpx.get(base + "/health", timeout=60).status_code == 200
            worst, polls = max(worst, time.time() - t0), polls + 1
            time.sleep(0.05)
        sender.join()
        assert result["r"].status_code == 400 and "context" in result["r"].json()["error"]["message"]
        assert worst < 1.0, worst
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
