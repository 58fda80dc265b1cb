"""`@vf.intercept` hooks and the call-boundary `@vf.stop`s, applied at every model call of a
rollout, as verifiers 0.4 applies them to every call its interception server sees (its
`RolloutSession.rewrite_request` / `rewrite_response` / `gate_tool_calls`).

One copy for both kinds of seat: the in-process loops (`null`, `bash`: vf.episode.harnesses) and
program harnesses (vf.episode.program), applied in the rollout's one model-call path (`Rollout.call`), so a hook behaves the same whichever runs the agent.

A hook's boundary is its parameter annotated `vf.Request` or `vf.Response` (or named `request` /
`response`); it may also name `trace`, `task`, `state` and `config`. Request hooks run, highest
priority first (ties by name), over the call's request and may rewrite only the messages new since
the previous call that are user or tool messages; with several new tool results each is shown
with the conversation up to it, as verifiers shows parallel calls. Returning None leaves it.
Response hooks see the policy's reply before the agent does. A `@vf.stop` annotated the same way
runs after that boundary's hooks, on what they made: it ends the rollout there.

The tool gate (`gate`): before a tool call runs, the request hooks see the conversation plus an
empty result for it; a hook that fills that result in denies the call, and the model sees the
hook's result instead (verifiers' harnesses that support tool interception do the same).
"""

from __future__ import annotations

import inspect
import typing
from functools import cached_property
from typing import Any

from vf.episode.hooks import call_hook
from vf.taskset import Task
from vf.trace import InterceptRecord
from vf.types import Request, Response, ToolMessage


def params(fn) -> dict[str, Any]:
    """Parameter name → its resolved annotation (None where there is none)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable annotations: parameter names still work
        hints = {}
    return {name: hints.get(name) for name in inspect.signature(fn).parameters}


def boundary(fn) -> type | None:
    """Which call boundary a hook watches: its parameter annotated `vf.Request` or `vf.Response`
    (or named `request` / `response`); None for a stop that reads only the trace."""
    for name, hint in params(fn).items():
        if hint is Request or name == "request":
            return Request
        if hint is Response or name == "response":
            return Response
    return None



class Interceptors:
    """One rollout's intercept hooks and boundary stops. `args()` gives what else hooks may name
    (its `trace` gets each change noted in `info["intercepts"]`, in execution order)."""

    def __init__(self, task: Task, args):
        self.task, self.args = task, args

    @cached_property
    def _hooks(self) -> tuple[list, list, list, list]:
        # resolved at the first call, not when the rollout is made: a bad plugged stop is then
        # an error on that rollout's trace, as the other hooks' are
        hooks = [fn for _, fn, _ in self.task.hooks("intercept")]
        stops = [(name, fn) for name, fn, _ in self.task.hooks("stop")]
        return ([fn for fn in hooks if boundary(fn) is Request],
                [fn for fn in hooks if boundary(fn) is Response],
                [(n, fn) for n, fn in stops if boundary(fn) is Request],
                [(n, fn) for n, fn in stops if boundary(fn) is Response])

    request_hooks = property(lambda self: self._hooks[0])
    response_hooks = property(lambda self: self._hooks[1])
    request_stops = property(lambda self: self._hooks[2])
    response_stops = property(lambda self: self._hooks[3])

    def __bool__(self) -> bool:
        return bool(self.request_hooks or self.response_hooks or self.request_stops or self.response_stops)

    @property
    def gates_tools(self) -> bool:
        return bool(self.request_hooks or self.request_stops)

    def record(self, kind: str, hook: str) -> None:
        """A hook changed the call: noted on the trace, in execution order, as verifiers records it
        (`request_rewrites` / `response_rewrites`: the hook's name) and in `info["intercepts"]`."""
        trace = self.args()["trace"]
        rewrites = trace.request_rewrites if kind == "request" else trace.response_rewrites
        rewrites.append(InterceptRecord(handler=hook))
        trace.info.setdefault("intercepts", []).append({"boundary": kind, "hook": hook})

    async def _call(self, fn, value: Request | Response):
        kind = "request" if isinstance(value, Request) else "response"
        available = {**self.args(), kind: value}
        available.update({name: value for name, hint in params(fn).items() if hint is type(value)})
        return await call_hook(fn, available)

    async def request(self, request: Request, new: set[int], stops: bool = True) -> tuple[Request, str | None]:
        """Run the request hooks over `request`, of which the positions `new` may change, then the
        request stops (unless `stops` is false). Returns the request and the name of the stop that fired (None if none)."""
        messages = list(request.messages)
        ends = [i + 1 for i in sorted(new) if messages[i].role == "tool"]
        if not ends or ends[-1] != len(messages):
            ends.append(len(messages))
        previous = 0
        for end in ends:
            active = {i for i in new if previous <= i < end and messages[i].role in ("user", "tool")}
            current = request.model_copy(update={"messages": messages[:end]})
            for hook in self.request_hooks if active else []:
                changed = await self._call(hook, current.model_copy(deep=True))
                if changed is None:
                    continue
                if not isinstance(changed, Request) or len(changed.messages) != len(current.messages):
                    raise TypeError(f"@vf.intercept {hook.__name__}: a request hook returns a vf.Request "
                                    "with the same number of messages")
                if changed.tools != current.tools:
                    raise ValueError(f"@vf.intercept {hook.__name__}: request hooks cannot rewrite tools")
                for i, (before, after) in enumerate(zip(current.messages, changed.messages)):
                    if before != after and (i not in active or after.role != before.role):
                        raise ValueError(f"@vf.intercept {hook.__name__}: only new user or tool messages may change")
                    if before != after and before.role == "tool" and (
                            after.tool_call_id, after.name) != (before.tool_call_id, before.name):
                        raise ValueError(f"@vf.intercept {hook.__name__}: a tool result keeps its call's id and name")
                if changed != current:
                    current = changed
                    self.record("request", hook.__name__)
            messages[:end] = current.messages
            for name, stop in self.request_stops if stops else []:
                if await self._call(stop, current.model_copy(deep=True)):
                    return request.model_copy(update={"messages": messages}), name
            previous = end
        return request.model_copy(update={"messages": messages}), None

    async def response(self, response: Response) -> tuple[Response, str | None]:
        """Run the response hooks over the policy's reply, then the response stops."""
        for hook in self.response_hooks:
            changed = await self._call(hook, response.model_copy(deep=True))
            if changed is None:
                continue
            if not isinstance(changed, Response):
                raise TypeError(f"@vf.intercept {hook.__name__} returned {type(changed).__name__}, not vf.Response")
            if changed != response:
                response = changed
                self.record("response", hook.__name__)
        for name, stop in self.response_stops:
            if await self._call(stop, response.model_copy(deep=True)):
                return response, name
        return response, None

    async def gate(self, request: Request) -> tuple[ToolMessage | None, str | None]:
        """The tool gate: `request` ends with the empty result of a call about to run. Returns
        the result a hook put in its place (the call must not run; None: it runs) and the stop
        that fired, if any."""
        probe = request.messages[-1]
        request, stopped = await self.request(request, {len(request.messages) - 1})
        verdict = request.messages[-1]
        return (None if verdict == probe else verdict), stopped
