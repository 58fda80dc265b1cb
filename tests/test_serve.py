"""`vf-serve` as a real subprocess on loopback, driven by the real `openai` client, httpx and vf-eval."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_QUEUE = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*args: str, timeout: float = 60):
    port = free_port()
    cmd = [sys.executable, "-m", "vf.commands.serve", *args, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1"})
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vf-serve exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("vf-serve did not come up")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from vf.models.tiny import ensure_tiny_model

    roots = ["--weights-root", str(tmp_path_factory.getbasetemp()), "--weights-root", str(ensure_tiny_model())]
    proc, base = start_server("tiny", "--api-key", KEY, "--max-queue", str(MAX_QUEUE), "--threads", "1", *roots)
    yield base
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert KEY not in out + err  # the server never logs its key, nor a wrong one a client sent
    assert WRONG_KEY not in out + err


WRONG_KEY = "sk-planted-wrong-key-77"


def leaked(secret: str, *roots, texts=()) -> list[str]:
    """Every file under `roots` (and every text) that contains `secret`."""
    hits = [str(f) for root in roots for f in Path(root).rglob("*") if f.is_file() and secret.encode() in f.read_bytes()]
    return hits + [t[:80] for t in texts if secret in t]


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)


def msgs(text="hello"):
    return [{"role": "user", "content": text}]


def test_models_health_and_api_key(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server + "/health").json()["status"] == "ok"  # health needs no key
    r = httpx.get(server + "/v1/models")
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/chat/completions", json={"messages": msgs()},
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


def test_chat_nonstreaming_logprobs_and_token_ids(server, client):
    r = client.chat.completions.create(
        model="tiny", messages=msgs(), max_tokens=8, temperature=0.0, logprobs=True,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
    choice = r.choices[0]
    extra = r.model_extra
    assert choice.finish_reason == "length" and r.usage.completion_tokens == 8
    ids = choice.model_extra["token_ids"]
    assert [t.token for t in choice.logprobs.content] == [f"token_id:{i}" for i in ids]
    assert all(t.logprob < 0 for t in choice.logprobs.content)
    assert extra["policy_version"] == 0 and len(extra["prompt_token_ids"]) == r.usage.prompt_tokens

    # same request via vf's own openai engine: token ids + log-probs come through
    from vf.engines.base import GenerateRequest, Sampling
    from vf.engines.openai_client import OpenAIEngine

    os.environ["VF_TEST_SERVE_KEY"] = KEY

    async def via_engine():
        e = OpenAIEngine(server + "/v1", model="tiny", api_key_var="VF_TEST_SERVE_KEY")
        try:
            return await e.generate(GenerateRequest(msgs(), Sampling(temperature=0.0, max_tokens=8)))
        finally:
            await e.close()

    g = asyncio.run(via_engine())
    assert g.token_ids == ids and g.prompt_token_ids == extra["prompt_token_ids"]
    assert g.logprobs == pytest.approx([t.logprob for t in choice.logprobs.content], abs=1e-6)
    assert g.policy_version == 0


def test_chat_streaming_with_usage(client):
    full = client.chat.completions.create(model="tiny", messages=msgs("stream me"), max_tokens=12, seed=3)
    stream = client.chat.completions.create(model="tiny", messages=msgs("stream me"), max_tokens=12, seed=3,
                                            stream=True, stream_options={"include_usage": True}, logprobs=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    n_lp = sum(len(c.choices[0].logprobs.content) for c in chunks if c.choices and c.choices[0].logprobs)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == full.choices[0].message.content  # seeded: same sample streamed or not
    assert finish == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens == n_lp


def test_tools_accepted_and_completions_endpoint(server, client):
    tools = [{"type": "function", "function": {"name": "add", "description": "add two ints", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    plain = client.chat.completions.create(model="tiny", messages=msgs("add 2 3"), max_tokens=4)
    r = client.chat.completions.create(model="tiny", messages=msgs("add 2 3"), tools=tools, max_tokens=4)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the schema is in the prompt
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    c = client.completions.create(model="tiny", prompt="hello", max_tokens=5, logprobs=1, temperature=0)
    assert c.choices[0].finish_reason == "length" and len(c.choices[0].logprobs.token_logprobs) == 5
    r = httpx.post(server + "/v1/completions", headers=AUTH,
                   json={"prompt": [1, 50, 60], "max_tokens": 3, "return_token_ids": True})
    assert r.status_code == 200 and r.json()["prompt_token_ids"] == [1, 50, 60]
    assert len(r.json()["choices"][0]["token_ids"]) == 3


def test_concurrent_requests_share_batches_and_match_sequential(server, client):
    prompts = [f"request {i}" for i in range(MAX_QUEUE)]
    seq = [client.chat.completions.create(model="tiny", messages=msgs(p), max_tokens=16, temperature=1.0, seed=i)
           .choices[0].message.content for i, p in enumerate(prompts)]

    async def concurrent():
        import openai

        c = openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)
        rs = await asyncio.gather(*[c.chat.completions.create(
            model="tiny", messages=msgs(p), max_tokens=16, temperature=1.0, seed=i) for i, p in enumerate(prompts)])
        await c.close()
        return [r.choices[0].message.content for r in rs]

    assert asyncio.run(concurrent()) == seq
    assert httpx.get(server + "/health").json()["peak_batch"] >= 2


def test_queue_full_answers_503(server):
    slow = {"model": "tiny", "messages": msgs("slow"), "max_tokens": 600, "ignore_eos": True}

    async def go():
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as c:
            running = [asyncio.ensure_future(c.post(server + "/v1/chat/completions", json=slow))
                       for _ in range(MAX_QUEUE)]
            for _ in range(500):
                if (await c.get(server + "/health")).json()["in_flight"] == MAX_QUEUE:
                    break
                await asyncio.sleep(0.01)
            extra = await c.post(server + "/v1/chat/completions", json={**slow, "max_tokens": 2})
            done = await asyncio.gather(*running)
            after = await c.post(server + "/v1/chat/completions", json={**slow, "max_tokens": 2})
            return extra, done, after

    extra, done, after = asyncio.run(go())
    assert extra.status_code == 503 and "capacity" in extra.json()["error"]["message"]
    assert [r.status_code for r in done] == [200] * MAX_QUEUE
    assert all(r.json()["usage"]["completion_tokens"] == 600 for r in done)
    assert after.status_code == 200


def test_bad_requests_answer_400_and_server_keeps_serving(server, client):
    import openai

    url = server + "/v1/chat/completions"
    r = httpx.post(url, content=b'{"messages": [', headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    for body, needle in [({"messages": "hi"}, "messages"), ({"messages": msgs(), "temperature": -1}, "temperature"),
                         ({"messages": msgs(), "max_tokens": 0}, "max_tokens"),
                         ({"messages": msgs(), "stop": 5}, "stop"), ([1, 2], "JSON object")]:
        r = httpx.post(url, json=body, headers=AUTH)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (body, r.text)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model="tiny", messages=msgs("word " * 2100), max_tokens=4)
    # raw garbage on the socket: 400, connection closed, server fine
    with socket.create_connection(("127.0.0.1", int(server.rsplit(":", 1)[1]))) as s:
        s.sendall(b"NOT HTTP\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert httpx.get(server + "/v1/nope", headers=AUTH).status_code == 404
    r = client.chat.completions.create(model="tiny", messages=msgs(), max_tokens=3)
    assert r.usage.completion_tokens == 3


def test_load_weights_bumps_policy_version(server, client, tmp_path):
    from test_engine_local import make_varied_dir
    from vf.models.tiny import builtin_model_path

    varied = make_varied_dir(tmp_path / "varied")
    before = client.chat.completions.create(model="tiny", messages=msgs(), max_tokens=10, temperature=0)
    r = httpx.post(server + "/v1/load_weights", json={"path": str(varied), "version": 7}, headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.json()["policy_version"] == 7
    assert httpx.get(server + "/v1/policy_version", headers=AUTH).json() == {"policy_version": 7}
    after = client.chat.completions.create(model="tiny", messages=msgs(), max_tokens=10, temperature=0)
    assert after.model_extra["policy_version"] == 7
    assert after.choices[0].message.content != before.choices[0].message.content
    r = httpx.post(server + "/update_weights", json={"path": str(tmp_path / "missing")}, headers=AUTH)
    assert r.status_code == 400 and "does not exist" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/update_weights", json={"path": str(builtin_model_path("tiny"))}, headers=AUTH, timeout=60)
    assert r.json()["policy_version"] == 8
    again = client.chat.completions.create(model="tiny", messages=msgs(), max_tokens=10, temperature=0)
    assert again.choices[0].message.content == before.choices[0].message.content


def test_vf_eval_through_vf_serve_records_tokens(server, cli, tmp_path):
    out = tmp_path / "run"
    proc = cli("vf-eval", "reverse-text", "-n", "4", "-r", "2", "--base-url", server + "/v1", "-m", "tiny",
               "-c", str(MAX_QUEUE), "--api-key-var", "VF_TEST_KEY", "-o", str(out), "--json",
               "--sampling.max-tokens", "32", env={"VF_TEST_KEY": KEY}, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["num_errors"] == 0
    assert leaked(KEY, out, texts=[proc.stdout, proc.stderr]) == []
    episodes = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert len(episodes) == 8
    for ep in episodes:
        nodes = [n for t in ep["traces"] for n in t["nodes"] if n["message"]["role"] == "assistant"]
        assert nodes
        for n in nodes:
            assert len(n["token_ids"]) == len(n["logprobs"]) > 0
            assert all(lp <= 0 for lp in n["logprobs"])


def test_api_keys_never_reach_run_dirs_traces_logs_or_errors(server, cli, tmp_path):
    rollout = cli("vf-rollout", "reverse-text", "-n", "2", "-r", "2", "--base-url", server + "/v1", "-m", "tiny",
                  "--api-key-var", "VF_TEST_KEY", "-o", str(tmp_path / "rollout"), "--sampling.max-tokens", "8",
                  env={"VF_TEST_KEY": KEY}, check=True)
    assert (tmp_path / "rollout" / "traces.jsonl").read_text().count("\n") == 4
    # a wrong key: every episode fails with an auth error, which is recorded without the key
    wrong = cli("vf-eval", "reverse-text", "-n", "2", "--base-url", server + "/v1", "-m", "tiny",
                "--api-key-var", "VF_TEST_KEY", "-o", str(tmp_path / "wrong"), "--json",
                env={"VF_TEST_KEY": WRONG_KEY}, check=False)
    assert "401" in (tmp_path / "wrong" / "traces.jsonl").read_text() or wrong.returncode != 0
    assert leaked(KEY, tmp_path, texts=[rollout.stdout, rollout.stderr]) == []
    assert leaked(WRONG_KEY, tmp_path, texts=[wrong.stdout, wrong.stderr]) == []


def test_vf_eval_embedded_engine(cli, tmp_path):
    out = tmp_path / "local"
    proc = cli("vf-eval", "reverse-text", "-n", "3", "-r", "2", "-o", str(out), "--json",
               "--sampling.max-tokens", "32", check=True)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["num_episodes"] == 6 and summary["num_errors"] == 0 and summary["model"] in (None, "tiny")
    ep = json.loads((out / "traces.jsonl").read_text().splitlines()[0])
    node = next(n for t in ep["traces"] for n in t["nodes"] if n["message"]["role"] == "assistant")
    assert len(node["token_ids"]) == len(node["logprobs"]) > 0


def test_serve_bad_model_path_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vf.commands.serve", str(tmp_path / "nope"), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 2 and "not a local directory" in proc.stderr and "Traceback" not in proc.stderr
