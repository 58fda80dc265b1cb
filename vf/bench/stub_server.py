"""A zero-latency OpenAI-compatible chat server (stdlib asyncio) for the `harness` suite.

Answers every /v1/chat/completions at once, streamed (SSE, with a usage chunk when
`stream_options.include_usage`; verifiers' harness streams) or not. The reply depends on the model:
- any name: the last user message reversed inside <reversed_text> tags (what the reverse-text
  taskset rewards), with per-token log-probs and token ids (UTF-8 bytes) when asked, so the
  client does the same parsing work as against a real server;
- `echo`: the last user message;
- `tool`: when tools are offered and none was called yet, a call of the first tool with
  {"text": <last user message>}; after a tool result, that result as the reply;
- `bash:CMD`: first a call of the `bash` tool with {"command": CMD}; after a tool result, that
  result as the reply (tests/openai_stub.py's model of the same name, for agent programs).

    python -m vf.bench.stub_server PORT      # serves until killed; prints "ready" when bound
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys


def _last_user(messages) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [])
    return ""


def respond(method: str, path: str, raw: bytes) -> tuple[int, str, bytes]:
    """(status, content type, body) for one request."""
    if method == "GET":
        if path.rstrip("/").endswith("/models"):
            return _json(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        return _json(200 if path.endswith("health") else 404, {})
    body = json.loads(raw or b"{}")
    messages = body.get("messages") or []
    text, tool_calls = _reply(body.get("model") or "", messages, body.get("tools") or [])
    if body.get("stream"):
        return 200, "text/event-stream", _stream(body, text, tool_calls)
    out_ids = list(text.encode())
    prompt_ids = list(json.dumps(messages).encode())[:256]
    choice = {"index": 0, "message": {"role": "assistant", "content": text or None},
              "finish_reason": "tool_calls" if tool_calls else "stop"}
    if tool_calls:
        choice["message"]["tool_calls"] = tool_calls
    if body.get("logprobs"):
        choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": -0.5} for t in out_ids]}
    resp = {"id": "cmpl-bench", "object": "chat.completion", "model": body.get("model") or "stub",
            "choices": [choice], "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out_ids),
                                           "total_tokens": len(prompt_ids) + len(out_ids)}}
    if body.get("return_token_ids"):
        choice["token_ids"] = out_ids
        resp["prompt_token_ids"] = prompt_ids
    return _json(200, resp)


def _json(status: int, body: dict) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body).encode()


def _stream(body: dict, text: str, tool_calls: list | None) -> bytes:
    model = body.get("model") or "stub"
    head = {"id": "cmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": model}
    delta: dict = {"role": "assistant", "content": text or None}
    if tool_calls:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(tool_calls)]
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if tool_calls else "stop"}]}]
    if (body.get("stream_options") or {}).get("include_usage"):
        n = len(text.encode())
        chunks.append({**head, "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n,
                                                        "total_tokens": 8 + n}})
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 with keep-alive and Content-Length bodies: all the OpenAI clients send."""
    sock = writer.get_extra_info("socket")
    if sock is not None:  # one write per reply, but never wait for a delayed ACK
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path = head[0].split(" ")[:2]
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
            n = int(headers.get("content-length") or 0)
            raw = await reader.readexactly(n) if n else b""
            status, ctype, data = respond(method, path, raw)
            writer.write(f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\nContent-Type: {ctype}\r\n"
                         f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                break
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


def _reply(model: str, messages: list, tools: list) -> tuple[str, list | None]:
    """(text, tool calls) for one request."""
    last = _last_user(messages)
    if model == "echo":
        return last, None
    if model.startswith("bash:"):
        results = [m for m in messages if m.get("role") == "tool"]
        if results:
            c = results[-1].get("content")
            return (c if isinstance(c, str) else json.dumps(c)), None
        return "", [{"id": "call_0", "type": "function",
                     "function": {"name": "bash", "arguments": json.dumps({"command": model[5:]})}}]
    if model == "tool":
        results = [m for m in messages if m.get("role") == "tool"]
        if results:
            c = results[-1].get("content")
            return (c if isinstance(c, str) else json.dumps(c)), None
        if tools:
            name = tools[0]["function"]["name"]
            return "", [{"id": "call_0", "type": "function",
                         "function": {"name": name, "arguments": json.dumps({"text": last})}}]
        return last, None
    return f"<reversed_text>{last[::-1]}</reversed_text>", None


def main(port: int) -> None:
    async def serve() -> None:
        server = await asyncio.start_server(_serve_connection, "127.0.0.1", port)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main(int(sys.argv[1]))
