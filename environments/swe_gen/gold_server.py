"""A scripted gold policy behind an OpenAI-compatible Chat Completions endpoint.

It stands in for a remote provider whose model always solves swe-gen: given the conversation so
far it answers, as `bash` tool calls, with the gold trajectory

    1. `python3 test_<module>.py`        (see the failure)
    2. `cat <module>.py`                  (only where the traceback does not show the bad line:
                                          operator, off-by-one, constant)
    3. the task's one-line `sed` fix      (`GenRepo.fix_command`)
    4. `python3 test_<module>.py`        (see it pass)
    5. a short summary, no tool call     (the episode ends)

Which task a conversation is about is read from its first user message (the task's prompt),
looked up among the tasks of the taskset it was started for (`--seed/--size/--kinds`, the same
flags as `--taskset.*`). Running `vf-rollout swe-gen --base-url` against it records gold
trajectories exactly as the bash harness sends and receives them — the SFT warm-up data of the
built-in agent model (models/build_agent.py).

    python -m vf.environments.swe_gen.gold_server --seed 0 --size 60 --port 8123

With `--tokenizer HF_DIR` it also answers like vLLM serving that model: `prompt_token_ids`,
`choices[0].token_ids` and per-token log-probs (0.0: the policy is certain), the ids rendered by
the model's own chat template, so `vf-train --loss sft --data RUN_DIR` can train on the run.

Routes: GET /v1/models, POST /v1/chat/completions (non-streaming; `stream: true` is refused 400).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from vf.models.tiny import builtin_model_path

from vf.episode.loading import load_taskset
from vf.serve.http import Request, Response, json_response, serve

from .generate import GenRepo, generate

MODEL = "swe-gen-gold"
VALUE_KINDS = ("operator", "off-by-one", "constant")
"""Kinds whose failure is a wrong value: the traceback shows the test's line, not the bug's."""


def gold_by_prompt(fields: dict[str, Any]) -> dict[str, GenRepo]:
    """Prompt text -> the generated task, for the swe-gen taskset with these `--taskset.*` fields."""
    loaded = load_taskset("swe-gen", fields)
    return {t.data.prompt: generate(t.data.kind, t.data.seed) for t in loaded.taskset.tasks()}


def gold_reply(gen: GenRepo, turn: int) -> dict[str, Any]:
    """The gold policy's assistant message on its `turn`-th reply (0-based)."""
    look = [f"cat {gen.module}"] if gen.kind in VALUE_KINDS else []
    commands = [f"python3 {gen.repo.test}", *look, gen.fix_command, f"python3 {gen.repo.test}"]
    if turn >= len(commands):
        return {"role": "assistant", "content": f"Fixed the bug in {gen.module}; the test passes."}
    arguments = json.dumps({"command": commands[turn]})
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
         "function": {"name": "bash", "arguments": arguments}}]}


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def token_ids(tokenizer, messages: list[dict], tools: list[dict] | None, reply: dict) -> tuple[list[int], list[int]] | None:
    """(prompt ids, completion ids) as the model's chat template renders the call and its reply:
    the completion runs to and including the end-of-turn token. None when the template does not
    render the prompt as a prefix of the whole (no consistent tokens to give)."""
    def ids(msgs: list[dict], gen: bool) -> list[int]:  # rendered, then encoded: as vf's engines do
        text = tokenizer.apply_chat_template(msgs, tools=tools or None, tokenize=False, add_generation_prompt=gen)
        return list(tokenizer.encode(text, add_special_tokens=False))

    prompt, full = ids(messages, True), ids([*messages, reply], False)
    if full[:len(prompt)] != prompt or tokenizer.eos_token_id not in full[len(prompt):]:
        return None
    completion = full[len(prompt):]
    return prompt, completion[:completion.index(tokenizer.eos_token_id) + 1]


class GoldPolicy:
    """The request handler (see the module doc)."""

    def __init__(self, tasks: dict[str, GenRepo], tokenizer=None):
        self.tasks = tasks
        self.tokenizer = tokenizer
        self.calls = 0

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET" and request.path == "/v1/models":
            return json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if request.method != "POST" or request.path != "/v1/chat/completions":
            return json_response({"error": {"message": f"no route {request.path}"}}, 404)
        body = json.loads(request.body)
        if body.get("stream"):
            return json_response({"error": {"message": "streaming is not supported"}}, 400)
        messages = body.get("messages") or []
        prompt = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
        gen = self.tasks.get(prompt)
        if gen is None:
            return json_response({"error": {"message": "not a prompt of this swe-gen taskset"}}, 400)
        self.calls += 1
        message = gold_reply(gen, sum(m.get("role") == "assistant" for m in messages))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        reply: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                                 "created": int(time.time()), "model": body.get("model") or MODEL,
                                 "choices": [choice]}
        ids = token_ids(self.tokenizer, messages, body.get("tools"), message) if self.tokenizer else None
        prompt, completion = ids or ([], [])
        if ids and body.get("return_token_ids"):
            reply["prompt_token_ids"], choice["token_ids"] = prompt, completion
            choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": 0.0} for t in completion]}
        reply["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                          "total_tokens": len(prompt) + len(completion)}
        return json_response(reply)


async def start(fields: dict[str, Any], host: str = "127.0.0.1", port: int = 0,
                tokenizer: str | None = None) -> tuple[asyncio.Server, GoldPolicy]:
    """Serve the gold policy for the swe-gen tasks `fields` selects; port 0 picks a free one;
    `tokenizer` (an HF dir or built-in model name) adds token ids (see the module doc)."""
    tok = None
    if tokenizer:
        from transformers import AutoTokenizer  # heavy: only when token ids are asked for

        tok = AutoTokenizer.from_pretrained(str(builtin_model_path(tokenizer) or tokenizer))
    policy = GoldPolicy(gold_by_prompt(fields), tok)
    return await serve(policy, host, port), policy


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m vf.environments.swe_gen.gold_server",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=60)
    p.add_argument("--kinds", nargs="*", default=[])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokenizer", default=None, help="HF dir or built-in model: also return token ids")
    args = p.parse_args()

    async def run() -> None:
        fields = {"seed": args.seed, "size": args.size, "kinds": args.kinds}
        server, _ = await start(fields, args.host, args.port, args.tokenizer)
        port = server.sockets[0].getsockname()[1]
        print(f"http://{args.host}:{port}/v1", flush=True)  # stdout is data: the base URL
        await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
