"""v0's judge calls on top of a v1 `vf.Judge`, in every shape verifiers 0.1.x offered them.

A migrated JudgeRubric's reward functions reach the judge two ways, as v0's did: as their
`judge` argument (`await judge(prompt, completion, answer, state)`), or through the rubric they
close over (`rubric.judge(...)`). Both land in the `JudgeCall` of the trace being scored: the
scoring code (`compat.Environment.score`) makes it current (`CURRENT`) while the reward runs, so a
rubric object that `_v0_env()` built once per process still reaches the judge of this trace, with
the run's judge settings (`--taskset.task.judge.*`).

Releases differ in how the call looks, and each shape works:

- 0.1.2: `judge(...)` is a plain call that returns the reply text (the reward is sync); it ignored
  extra keyword arguments and kept its first reply in `state["judge_response"]` for the rollout;
- 0.1.3 and later: `await judge(...)`;
- 0.1.3–0.1.7 took `**kwargs` and ignored them; 0.1.8 and later refuse them: extra keyword
  arguments are an error that says so (v0 0.1.8+ failed there too, and scored the reward 0);
- `judge_sampling_args` go with every call; replies are cached per filled prompt in the v0
  state's `judge_response` (0.1.3+), so a reward that asks twice is billed once.

A sync or async caller is told apart by the calling function itself (`caller_is_async`), so a
sync helper inside an async reward gets the text, and an async reward gets an awaitable.
While `vf-validate` probes a migrated task (`vf.validate.OFFLINE`), the judge answers "yes"
itself: the probe checks that the rewards run, without a model.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import sys
import threading
from contextvars import ContextVar
from typing import Any

from vf.trace import content_text

CURRENT: ContextVar[JudgeCall | None] = ContextVar("vf_migrate_judge", default=None)
"""The judge of the trace whose v0 reward function is running (None outside scoring)."""

OFFLINE_REPLY = "yes"
"""What the judge answers while vf-validate probes a task (no model is called)."""

_WRAPPERS = {"<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>"}


def caller_is_async(depth: int = 1) -> bool:
    """Whether the function `depth` frames above the caller is `async def` (comprehensions and
    lambdas are looked through to the function that holds them)."""
    frame = sys._getframe(depth + 1)
    while frame is not None and frame.f_code.co_name in _WRAPPERS:
        frame = frame.f_back
    return bool(frame is not None and frame.f_code.co_flags & inspect.CO_COROUTINE)


def current(what: str = "rubric.judge()") -> JudgeCall:
    """The judge of the trace being scored; a clear error outside scoring."""
    call = CURRENT.get()
    if call is None:
        raise RuntimeError(f"{what} was called outside a reward function: the migrated task's judge "
                           "(vf.Judge, --taskset.task.judge.*) is only reachable while a trace is scored")
    return call


class JudgeCall:
    """v0's `judge(prompt, completion, answer, state)` for one trace: fills the v0 judge prompt
    with the last prompt message, the answer and the judge rubric's parser's answer, asks the
    `vf.Judge`, records the exchange on the trace and returns the reply text."""

    def __init__(self, judge: Any, trace: Any, parser: Any = None, sampling: dict[str, Any] | None = None):
        self.judge, self.trace, self.parser = judge, trace, parser
        self.sampling = dict(sampling or {})

    def __call__(self, prompt: Any, completion: Any, answer: Any, state: Any = None, **kwargs: Any) -> Any:
        return self.ask(prompt, completion, answer, state, kwargs, asynchronous=caller_is_async())

    def ask(self, prompt: Any, completion: Any, answer: Any, state: Any, kwargs: dict[str, Any],
            asynchronous: bool) -> Any:
        """The reply text: an awaitable for an async caller, the text itself for a sync one."""
        if not asynchronous:
            # a plain call from sync code is 0.1.2's judge (the only release whose judge was sync): it
            # took **kwargs and ignored them, and kept one reply per rollout in state["judge_response"]
            if isinstance(state, dict) and isinstance(state.get("judge_response"), str):
                return state["judge_response"]
            text = _wait(self._reply(prompt, completion, answer, state, cache=False))
            if isinstance(state, dict):
                state["judge_response"] = text
            return text
        # extra keyword arguments: 0.1.3-0.1.7 ignored them, 0.1.8+ refused them (TypeError). Only code
        # written for the releases that ran it passes them, so they are ignored, as its author saw.
        return self._reply(prompt, completion, answer, state)

    async def _reply(self, prompt: Any, completion: Any, answer: Any, state: Any, cache: bool = True) -> str:
        from vf.validate import OFFLINE

        question = prompt if isinstance(prompt, str) else (content_text(prompt[-1].get("content")) if prompt else "")
        if self.parser is not None:
            response = self.parser.parse_answer(completion)
        else:
            response = completion if isinstance(completion, str) else next(
                (content_text(m.get("content")) for m in reversed(completion or []) if m.get("role") == "assistant"), "")
        messages = self.judge.build_messages(question=question, answer=answer, response=response)
        if OFFLINE.get():
            return OFFLINE_REPLY
        if not cache:
            return (await self.judge.complete(messages, trace=self.trace, **self.sampling)).text
        cache = state.get("judge_response") if isinstance(state, dict) else None
        key = messages if isinstance(messages, str) else None
        if isinstance(cache, dict) and key in cache:
            return cache[key]
        text = (await self.judge.complete(messages, trace=self.trace, **self.sampling)).text
        if isinstance(state, dict) and key is not None:
            if not isinstance(cache, dict):
                cache = state["judge_response"] = {}
            cache[key] = text
        return text


def _wait(coro) -> Any:
    """Run `coro` to its end from sync code: here when no event loop runs in this thread, else in
    a thread of its own (the caller is a sync reward called from the running loop; v0 0.1.2's
    judge blocked the same way)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}
    context = contextvars.copy_context()  # the caller's (vf-validate's OFFLINE) holds in the thread

    def run() -> None:
        try:
            box["value"] = context.run(asyncio.run, coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    worker = threading.Thread(target=run, name="vf-v0-judge")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Completions:
    def __init__(self, client: JudgeClient):
        self.client = client

    def create(self, *, messages: Any, model: Any = None, **sampling: Any) -> Any:
        call = CURRENT.get()
        if call is None:  # outside a reward: the real client, as the env built it
            return self.client.real().chat.completions.create(messages=messages, model=model, **sampling)
        coro = _judge_reply(call, messages, sampling)
        if self.client.asynchronous:
            return coro
        return _wait(coro)


async def _judge_reply(call: JudgeCall, messages: Any, sampling: dict[str, Any]) -> Any:
    """The trace's vf.Judge answers a v0 `client.chat.completions.create(...)`, in the shape the
    openai client returned (`.choices[0].message.content`)."""
    from types import SimpleNamespace

    from vf.validate import OFFLINE

    sampling = {k: v for k, v in sampling.items() if k not in ("n", "stream", "stream_options")}
    text = OFFLINE_REPLY if OFFLINE.get() else (await call.judge.complete(list(messages), trace=call.trace,
                                                                          **sampling)).text
    message = SimpleNamespace(role="assistant", content=text, tool_calls=None, refusal=None)
    return SimpleNamespace(choices=[SimpleNamespace(index=0, message=message, finish_reason="stop")],
                           model=call.judge.config.model, usage=None, object="chat.completion")


class JudgeClient:
    """An `openai.OpenAI(...)` / `AsyncOpenAI(...)` a v0 judge environment built for its judge.

    Code that calls it directly (`self.judge_client.chat.completions.create(...)` in the env's own
    rubric class, or inside a reward function) reaches the task's `vf.Judge` while a reward runs:
    the run's judge settings (`--taskset.task.judge.*`: base URL, model, key) apply, and the
    exchange is recorded on the trace. Outside scoring it is the real client, built with the
    arguments the env gave it."""

    asynchronous = False

    def __init__(self, *args: Any, **kwargs: Any):
        self._args, self._kwargs, self._real = args, kwargs, None
        self.chat = type("Chat", (), {})()
        self.chat.completions = _Completions(self)

    def real(self) -> Any:
        if self._real is None:
            import openai

            self._real = (openai.AsyncOpenAI if self.asynchronous else openai.OpenAI)(*self._args, **self._kwargs)
        return self._real

    def __getattr__(self, name: str) -> Any:  # base_url, api_key, models, ...: the real client's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.real(), name)


class AsyncJudgeClient(JudgeClient):
    asynchronous = True
