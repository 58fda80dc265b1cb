"""A scripted OpenAI-compatible server on loopback (real HTTP, stdlib only).

It stands for a remote provider in tests. The reply depends on the requested model name:

    reverse          reverse the last user message and wrap it in <reversed_text> tags
    echo             repeat the last user message
    boxed            answer arithmetic prompts "What is A op B?" with \\boxed{result}
    calc             first call: a tool call add(a=2, b=3); after a tool result: "\\boxed{<result>}"
    fail500          always HTTP 500
    flaky-N          HTTP 500 for the first N requests of each distinct prompt, then like `reverse`
    hang             sleeps past any sane timeout
    slow-S           sleeps S seconds, then like `reverse`
    notokens         like reverse, but rejects the token-id extensions with HTTP 400
    vision           "images: N", N = the image_url content parts in the request
    yes              always "yes" (a judge that agrees)
    letter-G         a letter-grade judge: a scratchpad, then <grade>G</grade>
    bash:CMD         first call: a tool call bash(command=CMD); after a tool result: that result
    grader           an LLM judge (see `grade`): answers verifiers' reference-judge prompt with its
                     verdict label, and its rubric-judge prompt with a verdicts JSON object, both
                     wrapped in the prose, think blocks and echoed examples real judges send
    script           the Nth reply (N = assistant messages already in the request) is
                     `Handler.script[N]`, an assistant message (`bash_call(cmd)` makes a bash
                     tool call, `tool_call(name, args)` any tool; `{"status": 400}` answers
                     that HTTP error); past the end, the last one again. Real agent programs (tests)

A body with `questions` (verifiers' `decision` judge, POSTed to its evaluations URL) is graded by
`decide`: the answer wrapped in `result` as Workers AI sends it.

`"stream": true` is answered as server-sent events (role, content and tool-call deltas, a
finish chunk, a usage chunk when `stream_options.include_usage` is set, then `[DONE]`), as
OpenAI streams them: verifiers' harnesses stream.

Token ids are the UTF-8 bytes of the reply (and of the prompt), log-probs a fixed −0.5.
Run standalone: `python tests/openai_stub.py PORT`.
"""

from __future__ import annotations

import json
import os
import re
import socketserver
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar


def last_user(messages):
    for m in reversed(messages):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [])
    return ""


def arithmetic(text: str) -> str:
    m = re.search(r"(-?\d+)\s*([+\-*])\s*(-?\d+)", text)
    if not m:
        return "I don't know"
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return f"The answer is \\boxed{{{a + b if op == '+' else a - b if op == '-' else a * b}}}."


def fenced(text: str, title: str) -> str | None:
    """The body of the ``` block under `title:` in a judge prompt (fences of any length)."""
    m = re.search(re.escape(title) + r":\n(`{3,})\n(.*?)\n\1\n", text, re.DOTALL)
    return m.group(2) if m else None


def grade(prompt: str) -> str:
    """A scripted judge. Reference prompt: `positive` when the response contains one of the reference
    answers' lines (case-insensitive), else `negative`, the verdict after a think block or prose that
    names the other label. Rubric prompt: per criterion, the best choice when every word of its
    text is in the response, the middle one (of 3+) when some are, else the worst."""
    response = (fenced(prompt, "Response") or "").lower()
    labels = re.search(r'Respond either "(.*?)" or "(.*?)" only\.', prompt)
    if labels:
        positive, negative = labels.groups()
        answers = [a.strip().lower() for a in (fenced(prompt, "Reference answer") or "").splitlines() if a.strip()]
        if any(a in response for a in answers):
            return f"<think>Could it be {negative}? No.</think>\nFinal verdict: {positive}"
        return f"The response is {positive}-like at first glance, but it differs.\n\nVERDICT: {negative}"
    verdicts = []
    for name, text, choices in re.findall(r"^- (\S+?): (.*) \(answer one of, worst to best: (.*)\)$", prompt, re.MULTILINE):
        options = choices.split(", ")
        words = text.lower().split()
        found = sum(w in response for w in words)
        pick = options[-1] if found == len(words) else options[len(options) // 2] if found and len(options) > 2 \
            else options[0]
        verdicts.append({"name": name, "reason": f"{found} of {len(words)} words present", "verdict": pick})
    return ('Sure. The format is {"verdicts": [{"name": "<criterion name>", ...}, ...]}; here it is:\n```json\n'
            + json.dumps({"verdicts": verdicts}) + "\n```")


def decide(body: dict) -> dict:
    """verifiers' decision-judge API: the top level when the answer is in the response, the
    middle level when the response is non-empty, else the bottom, with token usage."""
    state, levels = body.get("state") or {}, body["questions"]["grade"]["criteria"]
    response, answer = str(state.get("response", "")).lower(), str(state.get("answer", "")).lower()
    score = len(levels) - 1 if answer and answer in response else (len(levels) - 1) // 2 if response else 0
    return {"result": {"answers": {"grade": {"score": score}},
                       "usage": {"inputTokens": len(json.dumps(state)), "outputTokens": 1, "cost": 0.001}}}


def tool_call(name: str, arguments: dict, text: str = "", call_id: str = "") -> dict:
    """A scripted assistant message that calls the tool `name` (an agent's own tool, e.g. Claude
    Code's `Bash` or Codex's `exec_command`) with `arguments`."""
    args = json.dumps(arguments)
    return {"content": text, "tool_calls": [{"id": call_id or f"call_{zlib.crc32((name + args).encode()):08x}",
                                             "type": "function", "function": {"name": name, "arguments": args}}]}


def bash_call(command: str, text: str = "", call_id: str = "") -> dict:
    """A scripted assistant message that calls the `bash` tool with `command`."""
    return {"content": text, "tool_calls": [{"id": call_id or f"call_{zlib.crc32(command.encode()):08x}",
                                             "type": "function",
                                             "function": {"name": "bash",
                                                          "arguments": json.dumps({"command": command})}}]}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    counts: dict = {}
    script: ClassVar[list] = []
    api_key: str | None = None
    lock = threading.Lock()
    requests: list = []
    auth: list = []
    headers_seen: list = []

    def log_message(self, *args):  # quiet
        pass

    def handle(self):
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeouts in tests)
            pass

    def _send(self, status: int, body: dict):
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
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        with Handler.lock:
            Handler.requests.append(body)
            Handler.auth.append(self.headers.get("Authorization"))
            Handler.headers_seen.append(dict(self.headers))
        if Handler.api_key is not None and self.headers.get("Authorization") != f"Bearer {Handler.api_key}":
            # OpenAI's shape for a bad key (vf's interception server answers the same): clients
            # that retry other errors (litellm: "invalid_request_error" is a retried 400) stop
            return self._send(401, {"error": {"message": "invalid api key", "type": "authentication_error",
                                              "code": "invalid_api_key"}})
        if isinstance(body.get("questions"), dict):
            return self._send(200, decide(body))
        model = body.get("model") or "reverse"
        messages = body.get("messages") or []
        prompt = last_user(messages)
        tool_calls = None
        if model == "fail500":
            return self._send(500, {"error": {"message": "scripted failure"}})
        if model == "hang":
            time.sleep(10)
            return self._send(500, {})
        if model.startswith("flaky-"):
            key = json.dumps(messages, sort_keys=True)
            with Handler.lock:
                Handler.counts[key] = Handler.counts.get(key, 0) + 1
                n = Handler.counts[key]
            if n <= int(model.split("-", 1)[1]):
                return self._send(500, {"error": {"message": f"flaky failure {n}"}})
        if model.startswith("slow-"):
            time.sleep(float(model.split("-", 1)[1]))
        if model == "notokens" and body.get("return_token_ids"):
            return self._send(400, {"error": {"message": "unknown field: return_token_ids"}})
        if model == "echo":
            text = prompt
        elif model == "vision":
            n = sum(1 for m in messages if isinstance(m.get("content"), list)
                    for p in m["content"] if isinstance(p, dict) and p.get("type") == "image_url")
            text = f"images: {n}"
        elif model == "yes":
            text = "yes"
        elif model == "grader":
            text = grade(prompt)
        elif model.startswith("letter-"):
            text = f"<scratchpad>Fluent and on topic.</scratchpad>\n<grade>{model[7:]}</grade>"
        elif model.startswith("bash:"):
            tool_msgs = [m for m in messages if m.get("role") == "tool"]
            text = tool_msgs[-1]["content"] if tool_msgs else ""
            if not tool_msgs:
                tool_calls = [{"id": "call_1", "type": "function",
                               "function": {"name": "bash", "arguments": json.dumps({"command": model[5:]})}}]
        elif model == "script":
            n = sum(1 for m in messages if m.get("role") == "assistant")
            step = Handler.script[min(n, len(Handler.script) - 1)] if Handler.script else {}
            if "status" in step:  # an error, in the shape vf's interception answers one
                return self._send(step["status"], {"error": {"message": step.get("content", "scripted error"),
                                                             "type": "invalid_request_error"}})
            text = step.get("content") or ""
            tool_calls = step.get("tool_calls")
        elif model == "boxed":
            text = arithmetic(prompt)
        elif model == "calc":
            tool_msgs = [m for m in messages if m.get("role") == "tool"]
            if tool_msgs:
                text = f"\\boxed{{{tool_msgs[-1]['content']}}}"
            else:
                text = ""
                nums = [int(x) for x in re.findall(r"-?\d+", prompt)][:2] or [2, 3]
                tool_calls = [{"id": "call_1", "type": "function",
                               "function": {"name": "add", "arguments": json.dumps({"a": nums[0], "b": nums[-1]})}}]
        else:
            text = f"<reversed_text>{prompt[::-1]}</reversed_text>"
        out_ids = list(text.encode())
        prompt_ids = list(json.dumps(messages).encode())[:64]
        choice = {"index": 0, "message": {"role": "assistant", "content": text or None},
                  "finish_reason": "tool_calls" if tool_calls else "stop"}
        if tool_calls:
            choice["message"]["tool_calls"] = tool_calls
        if body.get("logprobs") and model != "notokens":
            choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": -0.5} for t in out_ids]}
        if body.get("return_token_ids") and model != "notokens":
            choice["token_ids"] = out_ids
        # `created` as OpenAI sends it: verifiers' interception validates a non-streamed reply with it
        resp = {"id": "cmpl-stub", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [choice],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out_ids),
                          "total_tokens": len(prompt_ids) + len(out_ids)}}
        if body.get("return_token_ids") and model != "notokens":
            resp["prompt_token_ids"] = prompt_ids
        if body.get("stream"):
            return self._stream(resp, include_usage=bool((body.get("stream_options") or {}).get("include_usage")))
        return self._send(200, resp)

    def _stream(self, resp: dict, include_usage: bool):
        """The same reply as OpenAI streams it (SSE chunks), closing the connection at the end."""
        choice = resp["choices"][0]
        msg = choice["message"]
        base = {"id": resp["id"], "object": "chat.completion.chunk", "created": int(time.time()),
                "model": resp["model"]}
        chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]}]
        if msg.get("content"):
            chunks.append({**base, "choices": [{"index": 0, "delta": {"content": msg["content"]},
                                                "finish_reason": None}]})
        for i, call in enumerate(msg.get("tool_calls") or []):
            chunks.append({**base, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                {"index": i, "id": call["id"], "type": "function", "function": call["function"]}]}}]})
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
        if include_usage:
            chunks.append({**base, "choices": [], "usage": resp["usage"]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for c in chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


class UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def get_request(self):  # BaseHTTPRequestHandler wants a (host, port) client address
        conn, _ = super().get_request()
        return conn, ("unix", 0)


class StubServer:
    """`script`: the `script` model's replies. `api_key`: answer 401 to any other bearer key.
    `unix_socket`: also serve on that Unix socket (what vf's sandbox bridge connects to)."""

    def __init__(self, port: int = 0, script: list | None = None, api_key: str | None = None,
                 unix_socket: str | None = None):
        Handler.script = list(script or [])
        Handler.api_key = api_key
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.servers = [self.httpd]
        if unix_socket is not None:
            self.servers.append(UnixHTTPServer(unix_socket, Handler))
            os.chmod(unix_socket, 0o666)  # the sandbox's user (nobody, under a root vf) connects
        self.unix_socket = unix_socket
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]

    def __enter__(self):
        Handler.counts.clear()
        Handler.requests.clear()
        Handler.auth.clear()
        Handler.headers_seen.clear()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        for s in self.servers:
            s.shutdown()
            s.server_close()
        Handler.api_key = None

    @property
    def requests(self):
        return Handler.requests


if __name__ == "__main__":  # python tests/openai_stub.py [PORT [SCRIPT.json]]
    script = json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else None
    srv = StubServer(int(sys.argv[1]) if len(sys.argv) > 1 else 0, script=script)
    print(srv.port, flush=True)
    srv.httpd.serve_forever()
