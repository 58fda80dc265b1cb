"""A zero-latency OpenAI-compatible chat server (stdlib only) for the `harness` suite.

Answers every /v1/chat/completions at once, streamed (SSE, with a usage chunk when
`stream_options.include_usage`; verifiers' harness streams) or not. The reply depends on the model:
- any name: the last user message reversed inside <reversed_text> tags (what the reverse-text
  taskset rewards), with per-token log-probs and token ids (UTF-8 bytes) when asked, so the
  client does the same parsing work as against a real server;
- `echo`: the last user message;
- `tool`: when tools are offered and none was called yet, a call of the first tool with
  {"text": <last user message>}; after a tool result, that result as the reply.

    python -m vf.bench.stub_server PORT      # serves until killed; prints "ready" when bound
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _last_user(messages) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [])
    return ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: don't wait for a delayed ACK

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            return self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
        return self._send(200 if self.path.endswith("health") else 404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        messages = body.get("messages") or []
        text, tool_calls = _reply(body.get("model") or "", messages, body.get("tools") or [])
        if body.get("stream"):
            return self._stream(body, text, tool_calls)
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
        return self._send(200, resp)


    def _stream(self, body: dict, text: str, tool_calls: list | None) -> None:
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
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _reply(model: str, messages: list, tools: list) -> tuple[str, list | None]:
    """(text, tool calls) for one request."""
    last = _last_user(messages)
    if model == "echo":
        return last, None
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
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    print("ready", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
