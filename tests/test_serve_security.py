"""vf-serve's admin surface and request limits: keys, weight roots, body/message/tool/max_tokens
limits, slow clients, and a bounded load test that leaves the server serving."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from vf.serve import start_server

KEY = "sec-key-9"


def msgs(text="hi"):
    return [{"role": "user", "content": text}]


async def request(port: int, method: str, path: str, body=None, key: str | None = KEY, raw: bytes | None = None,
                  timeout: float = 60) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    writer.write(head.encode() + b"\r\n" + data)
    await writer.drain()
    resp = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    status = int(resp.split(b" ", 2)[1])
    return status, json.loads(resp.split(b"\r\n\r\n", 1)[1] or b"{}")


@pytest.fixture(scope="module")
def engine():
    from vf.engines.local import LocalEngine

    return LocalEngine.from_model("tiny", max_batch=8)


def serving(engine, fn, **kw):
    async def go():
        server, app = await start_server(engine, "127.0.0.1", 0, **kw)
        try:
            return await fn(server.sockets[0].getsockname()[1], app)
        finally:
            server.close()

    return asyncio.run(go())


def test_weight_loading_needs_a_key_and_a_weights_root(engine, tmp_path):
    from vf.models.tiny import ensure_tiny_model

    tiny = ensure_tiny_model()
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to(tiny)  # a link out of the root is judged by where it points

    async def no_key(port, app):
        return await request(port, "POST", "/v1/load_weights", {"path": str(tiny)}, key=None)

    status, body = serving(engine, no_key, weights_roots=[tiny])
    assert status == 403 and "no API key" in body["error"]["message"]

    async def keyed(port, app):
        return [await request(port, "POST", "/v1/load_weights", {"path": str(tiny)}, key="wrong"),
                await request(port, "POST", "/v1/load_weights", {"path": str(tiny)}),
                await request(port, "POST", "/load_weights", {"path": str(root / "escape")}),
                await request(port, "POST", "/v1/load_weights", {"path": str(root / ".." / "..")})]

    wrong, outside, link, dotdot = serving(engine, keyed, api_key=KEY, weights_roots=[root])
    assert wrong[0] == 401
    assert outside[0] == 403 and "not under an allowed weights root" in outside[1]["error"]["message"]
    assert link[0] == 403 and dotdot[0] == 403
    none_allowed = serving(engine, keyed, api_key=KEY)[1]
    assert none_allowed[0] == 403 and "--weights-root" in none_allowed[1]["error"]["message"]
    assert engine.policy_version == 0  # nothing was loaded

    async def allowed(port, app):
        return await request(port, "POST", "/v1/load_weights", {"path": str(tiny), "version": 3})

    assert serving(engine, allowed, api_key=KEY, weights_roots=[tiny.parent])[0] == 200
    assert engine.policy_version == 3


def test_non_loopback_host_without_key_exits_2():
    env = {k: v for k, v in os.environ.items() if k != "VF_SERVE_API_KEY"}
    proc = subprocess.run([sys.executable, "-m", "vf.commands.serve", "tiny", "--host", "0.0.0.0", "--port", "0"],
                          capture_output=True, text=True, timeout=60, env={**env, "NO_COLOR": "1"}, check=False)
    assert proc.returncode == 2 and "without an API key" in proc.stderr and "--insecure" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_request_limits_answer_400_and_413(engine):
    async def go(port, app):
        big = {"model": "tiny", "messages": msgs(), "max_tokens": 2, "user": "x" * 5000}
        return {
            "body": await request(port, "POST", "/v1/chat/completions", big),
            "messages": await request(port, "POST", "/v1/chat/completions", {"messages": msgs() * 2000}),
            "tools": await request(port, "POST", "/v1/chat/completions", {
                "messages": msgs(), "tools": [{"type": "function", "function": {"name": f"t{i}"}} for i in range(300)]}),
            "max_tokens": await request(port, "POST", "/v1/chat/completions",
                                        {"messages": msgs(), "max_tokens": engine.max_len + 1}),
            "completions": await request(port, "POST", "/v1/completions",
                                         {"prompt": "a", "max_tokens": engine.max_len * 10}),
            "ok": await request(port, "POST", "/v1/chat/completions", {"messages": msgs(), "max_tokens": 2}),
        }

    r = serving(engine, go)
    assert r["body"][0] == 200  # 5 kB is fine by default ...
    r["body"] = serving(engine, go, max_body=4096)["body"]  # ... and not under a 4 kB limit
    assert r["body"][0] == 413 and r["body"][1]["error"]["type"] == "RequestTooLarge"
    assert r["messages"][0] == 400 and "at most 1024" in r["messages"][1]["error"]["message"]
    assert r["tools"][0] == 400 and "at most 256" in r["tools"][1]["error"]["message"]
    assert r["max_tokens"][0] == 400 and "context" in r["max_tokens"][1]["error"]["message"]
    assert r["completions"][0] == 400
    assert r["ok"][0] == 200 and r["ok"][1]["usage"]["completion_tokens"] == 2


def test_a_client_that_sends_its_whole_oversized_body_still_reads_the_413(engine):
    """Most HTTP clients send the whole body before they read: the server lets it arrive (and drops
    it, never kept), so the client reads the 413 instead of a broken pipe."""
    body = b"x" * (8 << 20)

    async def go(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await asyncio.wait_for(writer.drain(), 30)
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        return answer

    answer = serving(engine, go, max_body=4096)
    assert answer.startswith(b"HTTP/1.1 413") and b"RequestTooLarge" in answer


def test_slow_and_idle_connections_time_out(engine):
    async def go(port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Le")  # ... and then nothing more
        await writer.drain()
        slow = await asyncio.wait_for(reader.read(), 10)
        idle_r, _idle_w = await asyncio.open_connection("127.0.0.1", port)
        idle = await asyncio.wait_for(idle_r.read(), 10)  # sends nothing: closed without a word
        return slow, idle

    slow, idle = serving(engine, go, request_timeout=0.5, idle_timeout=0.5)
    assert slow.startswith(b"HTTP/1.1 408") and idle == b""


@pytest.mark.slow
def test_bounded_load_with_oversize_and_slow_requests_leaves_the_server_serving(engine):
    async def slowloris(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for b in b"GET /health HTTP/1.1\r\n":  # one byte at a time, never finishing the head
            writer.write(bytes([b]))
            await writer.drain()
            await asyncio.sleep(0.05)
            if reader.at_eof():
                break
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return data[:12]

    async def go(port, app):
        normal = [request(port, "POST", "/v1/chat/completions", {"messages": msgs(f"q{i}"), "max_tokens": 2})
                  for i in range(60)]
        oversize = [request(port, "POST", "/v1/chat/completions", raw=b"{" + b" " * 20000 + b"}") for _ in range(20)]
        garbage = [request(port, "POST", "/v1/chat/completions", raw=os.urandom(512)) for _ in range(20)]
        slow = [slowloris(port) for _ in range(20)]
        results = await asyncio.gather(*normal, *oversize, *garbage, *slow)
        after = await request(port, "POST", "/v1/chat/completions", {"messages": msgs(), "max_tokens": 3})
        health = await request(port, "GET", "/health")
        return results, after, health, app.in_flight

    results, after, health, in_flight = serving(engine, go, max_body=8192, request_timeout=0.5, max_queue=64)
    normal, oversize, garbage, slow = results[:60], results[60:80], results[80:100], results[100:]
    assert sorted({s for s, _ in normal}) == [200]
    assert {s for s, _ in oversize} == {413}
    assert {s for s, _ in garbage} == {400}
    assert set(slow) == {b"HTTP/1.1 408"}
    assert after[0] == 200 and after[1]["usage"]["completion_tokens"] == 3
    assert health[0] == 200 and in_flight == 0
