"""A zero-latency OpenAI-compatible chat server (stdlib only) for the `harness` suite.

Answers every /v1/chat/completions at once: the last user message reversed inside
<reversed_text> tags (what the reverse-text taskset rewards), with per-token log-probs and token
ids (UTF-8 bytes) when asked, so the client does the same parsing work as against a real server.

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
        text = f"<reversed_text>{_last_user(body.get('messages') or [])[::-1]}</reversed_text>"
        out_ids = list(text.encode())
        prompt_ids = list(json.dumps(body.get("messages")).encode())[:256]
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": -0.5} for t in out_ids]}
        resp = {"id": "cmpl-bench", "object": "chat.completion", "model": body.get("model") or "stub",
                "choices": [choice], "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out_ids),
                                               "total_tokens": len(prompt_ids) + len(out_ids)}}
        if body.get("return_token_ids"):
            choice["token_ids"] = out_ids
            resp["prompt_token_ids"] = prompt_ids
        return self._send(200, resp)


def main(port: int) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    print("ready", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
