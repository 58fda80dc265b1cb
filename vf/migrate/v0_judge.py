"""v0's judge calls on top of a v1 `vf.Judge`, in every shape verifiers 0.1.x offered them.

A migrated JudgeRubric's reward functions reach the judge two ways, as v0's did: as their
`judge` argument (`await judge(prompt, completion, answer, state)`), or through the rubric they
close over (`rubric.judge(...)`). Both land in the `JudgeCall` of the trace being scored: the
scoring code (`compat.Environment.score`) makes it current (`CURRENT`) while the reward runs, so a
rubric object that `_v0_env()` built once per process still reaches the judge of this trace, with
the run's judge settings (`--taskset.task.judge.*`).

Releases differ in how the call looks, and each shape works:

- 0.1.2: `judge(...)` is a plain call that returns the reply text (the reward is sync);
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
        if kwargs:
            raise TypeError(f"judge() got unexpected keyword arguments {sorted(kwargs)}: verifiers 0.1.8 and later "
                            "take judge(prompt, completion, answer, state) only (0.1.3-0.1.7 ignored extra ones); "
                            "drop them from the call")
        coro = self._reply(prompt, completion, answer, state)
        if asynchronous:
            return coro
        return _wait(coro)

    async def _reply(self, prompt: Any, completion: Any, answer: Any, state: Any) -> str:
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
