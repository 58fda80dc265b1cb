"""The OpenAI-compatible API in front of a `LocalEngine` (what `vf-serve` runs).

Routes (all JSON; errors are {"error": {"message", "type", "code"}}):
    GET  /health                      -> {"status": "ok", "policy_version": N}   (no auth)
    GET  /v1/models                   -> the served model
    POST /v1/chat/completions         -> chat (stream or not; logprobs; tools -> tool_calls)
    POST /v1/completions              -> plain text / token-id prompts
    POST /v1/load_weights             {"path": HF_DIR, "version": N?} -> {"policy_version": N}
         (/v1/update_weights, /load_weights, /update_weights are aliases)
    GET  /v1/policy_version           -> {"policy_version": N}

vLLM extensions kept compatible with `vf/engines/openai_client.py`: `return_token_ids` adds
`choices[i].token_ids` and top-level `prompt_token_ids`; `return_tokens_as_token_ids` writes
logprob tokens as "token_id:<id>"; also `top_k`, `min_p`, `ignore_eos`, `min_tokens`,
`stop_token_ids`. Every completion carries `policy_version`. With `vf-serve --router-replay` (MoE)
a non-streamed chat choice that asks for `return_token_ids` also gets `routed_experts`: per token,
per MoE layer, the k expert ids of the forward that sampled it (`docs/router-replay.md`). `top_logprobs` > 0 is accepted and
answered with empty lists (only the sampled token's log-prob is computed).

Admin routes (`/v1/load_weights` and its aliases: everything that changes server state) need the
API key (compared in constant time) and are off when the server has none; a weight path must
resolve (symlinks followed) to a directory under one of `weights_roots` (none = weight loading
off), and so must every file the load reads (a shard index naming a file elsewhere is refused,
400, saying nothing about whether that file exists). A `version` below the served one is refused
(409) unless the body says `"rollback": true` (a trainer resumed from an earlier checkpoint).
Request limits, checked before any work: body size (413, see vf.serve.http); strict JSON nested at
most 64 levels, no NaN/Infinity or lone surrogates (vf.bounded; bodies over 64 KiB are parsed on a
worker thread, and prompts are tokenized there, so a big request never stalls the loop); finite
sampling values; `messages`, `tools`, `n`, and `max_tokens` larger than the model's context (400);
a `model` that is neither a served name nor a checkpoint path under a weights root (404). A
`max_tokens` that fits the context but not next to the prompt is clamped to the room left.

Admission: at most `max_queue` generation requests in flight (running + waiting); one more gets
HTTP 503 at once so clients back off instead of piling up. Concurrent requests share the
engine's continuous batch.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from vf.bounded import BoundsError, load_json
from vf.engines import textstream
from vf.engines.base import Sampling
from vf.errors import EngineError, VfError
from vf.serve.http import Request, Response, json_response


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param


def error_response(e: ApiError) -> Response:
    return json_response({"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.status}},
                         e.status)


# -- request parsing -------------------------------------------------------------------------

INT_MAX = 2**63 - 1 - 2**20
"""Largest integer a request may give (the engine keeps them as int64, and adds to seeds)."""


def _num(body: dict, key: str, default, lo=None, hi=None, integer=False, lo_open=False):
    v = body.get(key, default)
    if v is None:
        return default
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type or not math.isfinite(v):  # NaN passes every range check
        raise ApiError(400, f"'{key}' must be {'an integer' if integer else 'a finite number'}, got {v!r}",
                       param=key)
    if integer:  # the engine keeps integers as int64
        hi = INT_MAX if hi is None else min(hi, INT_MAX)
    if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
        rng = f"{'(' if lo_open else '['}{lo}, {hi if hi is not None else 'inf'}]"
        raise ApiError(400, f"'{key}' must be in {rng}, got {v!r}", param=key)
    return v


def parse_sampling(body: dict, default_max_tokens: int) -> tuple[Sampling, dict[str, Any]]:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _num({"max_tokens": max_tokens}, "max_tokens", default_max_tokens, lo=1, integer=True)
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
    top_k = _num(body, "top_k", 0, lo=-1, integer=True)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -INT_MAX <= seed <= INT_MAX):
        raise ApiError(400, f"'seed' must be an integer in [{-INT_MAX}, {INT_MAX}], got {seed!r}", param="seed")
    sampling = Sampling(
        temperature=float(_num(body, "temperature", 1.0, lo=0, hi=100)),
        top_p=float(_num(body, "top_p", 1.0, lo=0, hi=1, lo_open=True)),
        top_k=max(0, top_k),
        min_p=float(_num(body, "min_p", 0.0, lo=0, hi=1)),
        max_tokens=max_tokens,
        seed=seed,
        stop=stop,
    )
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids):
        raise ApiError(400, "'stop_token_ids' must be a list of integers", param="stop_token_ids")
    extra = {"ignore_eos": bool(body.get("ignore_eos", False)),
             "min_tokens": _num(body, "min_tokens", 0, lo=0, integer=True),
             "stop_token_ids": stop_ids}
    return sampling, extra


def _flag(body: dict, key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be true or false, got {v!r}", param=key)
    return v


ADMIN_ROUTES = ("/v1/load_weights", "/v1/update_weights", "/load_weights", "/update_weights")
INLINE_BODY = 64 * 1024
"""Bodies up to this size are parsed on the event loop; bigger ones on a worker thread, so one
large request cannot stall every other connection (and /health)."""


def parse_body(raw: bytes) -> dict:
    try:
        body = load_json(raw or b"null")
    except BoundsError as e:
        raise ApiError(400, f"request body is refused: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


class ServeApp:
    def __init__(self, engine, served_model_name: str, api_key: str | None = None, max_queue: int = 256,
                 default_max_tokens: int = 1024, weights_roots: list[str | Path] = (),
                 max_messages: int = 1024, max_tools: int = 256):
        self.engine = engine
        self.model_name = served_model_name
        # names a request may use: the served name, and the engine's own (its model dir and that
        # dir's name), as clients pass what they started the server with
        path = getattr(engine, "path", None)
        self.model_names = {served_model_name, getattr(engine, "model_name", served_model_name),
                            *((str(path), str(Path(path).resolve()), Path(path).name) if path else ())}
        self.api_key = api_key
        self.weights_roots = [Path(r).resolve() for r in weights_roots]
        self.max_messages = max_messages
        self.max_tools = max_tools
        self.max_queue = max_queue
        self.default_max_tokens = default_max_tokens
        self.in_flight = 0
        self.created = int(time.time())

    # -- dispatch ----------------------------------------------------------------------------
    async def __call__(self, req: Request) -> Response:
        try:
            return await self._dispatch(req)
        except ApiError as e:
            return error_response(e)
        except EngineError as e:
            status = e.status_code or (400 if e.type in ("PromptTooLong", "BadRequest") else 500)
            return error_response(ApiError(status, e.message, type=e.type))
        except VfError as e:
            return error_response(ApiError(400, str(e), type=type(e).__name__))
        except Exception as e:  # noqa: BLE001 (a bug: answer 500, keep serving)
            import traceback

            traceback.print_exc()
            return error_response(ApiError(500, f"internal error: {type(e).__name__}: {e}", type="InternalServerError"))

    async def _dispatch(self, req: Request) -> Response:
        path = req.path.rstrip("/") or "/"
        if path in ("/health", "/v1/health", "/ping"):
            sch = self.engine.scheduler
            return json_response({"status": "ok", "policy_version": self.engine.policy_version,
                                  "in_flight": self.in_flight, "running": len(sch.rows), "peak_batch": sch.peak_rows})
        if self.api_key is not None:
            # constant time: how much of a guess matched must not show in the answer's timing
            auth = req.headers.get("authorization", "").encode("latin-1")  # the header's own bytes
            if not hmac.compare_digest(auth, f"Bearer {self.api_key}".encode()):
                raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                               type="AuthenticationError")
        routes = {
            ("GET", "/v1/models"): self.models,
            ("GET", "/v1/policy_version"): self.policy_version,
            ("POST", "/v1/chat/completions"): self.chat,
            ("POST", "/v1/completions"): self.completions,
        }
        for alias in ADMIN_ROUTES:
            routes[("POST", alias)] = self.load_weights
        if path in ADMIN_ROUTES and self.api_key is None:
            raise ApiError(403, "weight loading is off: this server has no API key",
                           type="PermissionDenied")
        fn = routes.get((req.method, path))
        if fn is None:
            if any(p == path for _, p in routes):
                raise ApiError(405, f"{req.method} is not allowed on {path}", type="MethodNotAllowed")
            raise ApiError(404, f"no route {req.method} {path}", type="NotFoundError")
        body = None
        if req.method == "POST":
            big = len(req.body) > INLINE_BODY
            body = await asyncio.to_thread(parse_body, req.body) if big else parse_body(req.body)
        return await fn(body)

    async def models(self, _body) -> Response:
        return json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "vf",
            "max_model_len": self.engine.max_len}]})

    async def policy_version(self, _body) -> Response:
        return json_response({"policy_version": self.engine.policy_version})

    async def load_weights(self, body: dict) -> Response:
        path = body.get("path") or body.get("model_path")
        if not isinstance(path, str) or not path:
            raise ApiError(400, "'path' (a checkpoint directory) is required", param="path")
        if "\x00" in path or len(path) > 4096:
            raise ApiError(400, "'path' must be a directory path (no NUL byte, at most 4096 characters)", param="path")
        version = body.get("version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
            raise ApiError(400, f"'version' must be a non-negative integer, got {version!r}", param="version")
        rollback = _flag(body, "rollback")
        current = self.engine.policy_version
        if version is not None and version < current and not rollback:
            # traces label rollouts by version: reusing an older number would make two policies one
            raise ApiError(409, f"'version' {version} is older than the served policy's {current}; versions "
                                "only go forward (send \"rollback\": true to load an older policy on purpose, "
                                "e.g. a trainer resumed from an earlier checkpoint)", type="Conflict", param="version")
        real = Path(path).resolve()
        root = next((r for r in self.weights_roots if real.is_relative_to(r)), None)
        if root is None:
            where = ", ".join(map(str, self.weights_roots)) or "none: start vf-serve with --weights-root DIR"
            raise ApiError(403, f"weight path {path} is not under an allowed weights root ({where})",
                           type="PermissionDenied", param="path")
        v = await asyncio.to_thread(self.engine.load_checkpoint, real, version, root=root)
        return json_response({"status": "ok", "policy_version": v, "path": path})

    # -- generation --------------------------------------------------------------------------
    def _sampling(self, body: dict, default_max_tokens: int):
        sampling, extra = parse_sampling(body, default_max_tokens)
        asked = body.get("max_completion_tokens", body.get("max_tokens")) is not None
        if asked and sampling.max_tokens > self.engine.max_len:
            raise ApiError(400, f"'max_tokens' is {sampling.max_tokens}; the model's context is "
                                f"{self.engine.max_len} tokens", param="max_tokens")
        return sampling, extra

    def _admit(self, n: int = 1) -> None:
        if self.in_flight + n > self.max_queue:
            raise ApiError(503, f"server is at capacity ({self.max_queue} requests in flight); retry later",
                           type="ServiceUnavailable")
        self.in_flight += n

    def _check_model(self, body: dict) -> str:
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise ApiError(400, "'model' must be a string", param="model")
        if model and model not in self.model_names and not self._checkpoint_name(model):
            # a client that means another model must hear so, not get this one's replies
            raise ApiError(404, f"model {model[:200]!r} is not served here; this server serves "
                                f"{self.model_name!r}", type="NotFoundError", param="model")
        return model or self.model_name

    def _checkpoint_name(self, model: str) -> bool:
        """A path under a weights root names a checkpoint of the served model (a trainer names the
        weights it evaluates by their directory)."""
        if not self.weights_roots or "/" not in model or "\x00" in model or len(model) > 4096:
            return False
        real = Path(model).resolve()
        return any(real.is_relative_to(root) for root in self.weights_roots)

    def _token_str(self, tok: int, as_ids: bool) -> str:
        return f"token_id:{tok}" if as_ids else self.engine.tokenizer.decode([tok])

    def _chat_logprobs(self, toks: list[int], lps: list[float], as_ids: bool, top: int) -> dict:
        out = []
        for t, lp in zip(toks, lps):
            s = self._token_str(t, as_ids)
            out.append({"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")), "top_logprobs": []})
        return {"content": out}

    async def chat(self, body: dict) -> Response:
        model = self._check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "'messages' must be a non-empty list of message objects", param="messages")
        if len(messages) > self.max_messages:
            raise ApiError(400, f"{len(messages)} messages; this server takes at most {self.max_messages}",
                           param="messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ApiError(400, "'tools' must be a list", param="tools")
        if tools and len(tools) > self.max_tools:
            raise ApiError(400, f"{len(tools)} tools; this server takes at most {self.max_tools}", param="tools")
        if body.get("tool_choice") == "none":
            tools_for_parse = False
        else:
            tools_for_parse = bool(tools)
        sampling, extra = self._sampling(body, self.default_max_tokens)
        n = _num(body, "n", 1, lo=1, hi=128, integer=True)
        want_lp = _flag(body, "logprobs")
        top = _num(body, "top_logprobs", 0, lo=0, hi=20, integer=True)
        ret_ids = _flag(body, "return_token_ids")
        as_ids = _flag(body, "return_tokens_as_token_ids")
        stream = _flag(body, "stream")
        prompt_ids, mm = await self.engine.encode_request(messages, tools)
        if mm is not None:  # a VL model's image inputs for every choice
            extra = {**extra, "mm": mm}
        self.engine._check_prompt(prompt_ids)
        self._admit(n)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if stream:
            opts = body.get("stream_options") or {}
            gen = self._chat_stream(rid, model, prompt_ids, sampling, extra, n, want_lp, as_ids, ret_ids,
                                    bool(opts.get("include_usage")) if isinstance(opts, dict) else False,
                                    tools_for_parse)
            return Response(200, gen, content_type="text/event-stream")
        try:
            seqs = await self._run_n(prompt_ids, sampling, extra, n)
        finally:
            self.in_flight -= n
        choices = []
        for i, seq in enumerate(seqs):
            message, calls = self.engine.build_message(self.engine.finish_text(seq), tools_for_parse)
            choice: dict[str, Any] = {
                "index": i, "message": message,
                "logprobs": self._chat_logprobs(seq.token_ids, seq.logprobs, as_ids, top) if want_lp else None,
                "finish_reason": "tool_calls" if calls else seq.finish_reason,
                "stop_reason": seq.stop_reason,
            }
            if ret_ids:
                choice["token_ids"] = list(seq.token_ids)
                if getattr(self.engine, "router_replay", False):
                    choice["routed_experts"] = seq.routed_experts
            choices.append(choice)
        out = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
               "choices": choices, "usage": self._usage(prompt_ids, seqs),
               "policy_version": min(s.policy_version for s in seqs)}
        if ret_ids:
            out["prompt_token_ids"] = prompt_ids
        return json_response(out)

    async def _run_n(self, prompt_ids, sampling: Sampling, extra, n: int, on_token=None):
        def nth(i):
            if i == 0 or sampling.seed is None:
                return sampling
            from dataclasses import replace

            return replace(sampling, seed=sampling.seed + i)

        tasks = [self.engine.generate_ids(prompt_ids, nth(i), on_token=on_token(i) if on_token else None, **extra)
                 for i in range(n)]
        return await asyncio.gather(*tasks)

    @staticmethod
    def _usage(prompt_ids, seqs) -> dict:
        c = sum(len(s.token_ids) for s in seqs)
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": c, "total_tokens": len(prompt_ids) + c}

    async def _chat_stream(self, rid, model, prompt_ids, sampling, extra, n, want_lp, as_ids, ret_ids,
                           include_usage, tools_for_parse) -> AsyncIterator[bytes]:
        created = int(time.time())
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(
            self._run_n(prompt_ids, sampling, extra, n, on_token=lambda i: (lambda t, lp: queue.put_nowait((i, t, lp)))))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        tok = self.engine.tokenizer
        state = [{"ids": [], "lps": [], "sent": 0, "pending_ids": [], "pending_lps": []} for _ in range(n)]

        def chunk(choices, usage=None):
            d = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": choices, "policy_version": self.engine.policy_version}
            if usage is not None:
                d["usage"] = usage
            if ret_ids and choices and choices[0].get("delta", {}).get("role"):
                d["prompt_token_ids"] = prompt_ids
            return b"data: " + json.dumps(d, ensure_ascii=False).encode() + b"\n\n"

        def visible(text: str, final: bool) -> str:
            return textstream.visible(text, sampling.stop, final, tool_calls=bool(tools_for_parse))

        try:
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None} for i in range(n)])
            while True:
                item = await queue.get()
                if item is None:
                    break
                batch = [item]
                while not queue.empty():  # coalesce what already arrived into one event per choice
                    nxt = queue.get_nowait()
                    if nxt is None:
                        queue.put_nowait(None)
                        break
                    batch.append(nxt)
                touched = []
                for i, t, lp in batch:
                    st = state[i]
                    st["ids"].append(t)
                    st["lps"].append(lp)
                    st["pending_ids"].append(t)
                    st["pending_lps"].append(lp)
                    if i not in touched:
                        touched.append(i)
                out = []
                for i in touched:
                    st = state[i]
                    text = visible(tok.decode(st["ids"], skip_special_tokens=True), final=False)
                    delta = text[st["sent"]:]
                    st["sent"] = max(st["sent"], len(text))
                    c: dict[str, Any] = {"index": i, "delta": {"content": delta} if delta else {},
                                         "logprobs": self._chat_logprobs(st["pending_ids"], st["pending_lps"], as_ids, 0)
                                         if want_lp else None, "finish_reason": None}
                    if ret_ids:
                        c["token_ids"] = st["pending_ids"]
                    st["pending_ids"], st["pending_lps"] = [], []
                    out.append(c)
                yield chunk(out)
            seqs = task.result()  # raises the engine's error, if any
            final = []
            for i, seq in enumerate(seqs):
                st = state[i]
                full = self.engine.finish_text(seq)
                _, calls = self.engine.build_message(full, tools_for_parse)
                text = visible(full, final=True)
                delta: dict[str, Any] = {}
                if text[st["sent"]:]:
                    delta["content"] = text[st["sent"]:]
                if calls:
                    delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
                final.append({"index": i, "delta": delta, "logprobs": None,
                              "finish_reason": "tool_calls" if calls else seq.finish_reason,
                              "stop_reason": seq.stop_reason})
            yield chunk(final)
            if include_usage:
                yield chunk([], usage=self._usage(prompt_ids, seqs))
            yield b"data: [DONE]\n\n"
        except (EngineError, VfError) as e:
            err = {"error": {"message": str(e), "type": getattr(e, "type", "EngineError"), "code": 500}}
            yield b"data: " + json.dumps(err).encode() + b"\n\n"
        finally:
            if not task.done():
                task.cancel()
            self.in_flight -= n

    async def completions(self, body: dict) -> Response:
        model = self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):  # off the loop: a long prompt takes seconds
            self.engine._check_text_size([{"content": prompt}])
            prompt_ids = list(await asyncio.to_thread(self.engine.tokenizer.encode, prompt, add_special_tokens=False))
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt per request)",
                           param="prompt")
        sampling, extra = self._sampling(body, min(16, self.default_max_tokens) if "max_tokens" not in body
                                         else self.default_max_tokens)
        n = _num(body, "n", 1, lo=1, hi=128, integer=True)
        lp_req = body.get("logprobs")
        want_lp = lp_req is not None and lp_req is not False
        ret_ids = _flag(body, "return_token_ids")
        as_ids = _flag(body, "return_tokens_as_token_ids")
        if _flag(body, "stream"):
            raise ApiError(400, "streaming is supported on /v1/chat/completions only", param="stream")
        self.engine._check_prompt(prompt_ids)
        self._admit(n)
        try:
            seqs = await self._run_n(prompt_ids, sampling, extra, n)
        finally:
            self.in_flight -= n
        choices = []
        for i, seq in enumerate(seqs):
            text = self.engine.finish_text(seq)
            lp = None
            if want_lp:
                toks = [self._token_str(t, as_ids) for t in seq.token_ids]
                offsets, pos = [], 0
                for t in seq.token_ids:
                    offsets.append(pos)
                    pos += len(self.engine.tokenizer.decode([t]))
                lp = {"tokens": toks, "token_logprobs": list(seq.logprobs),
                      "top_logprobs": [{} for _ in toks], "text_offset": offsets}
            choice: dict[str, Any] = {"index": i, "text": text, "logprobs": lp, "finish_reason": seq.finish_reason,
                                      "stop_reason": seq.stop_reason}
            if ret_ids:
                choice["token_ids"] = list(seq.token_ids)
                choice["prompt_token_ids"] = prompt_ids
            choices.append(choice)
        out = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
               "model": model, "choices": choices, "usage": self._usage(prompt_ids, seqs),
               "policy_version": min(s.policy_version for s in seqs)}
        if ret_ids:
            out["prompt_token_ids"] = prompt_ids
        return json_response(out)
