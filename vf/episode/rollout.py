"""One seat's rollout of one task: its stages, its trace, and its one model-call path.

A `Rollout` is opened (runtime, the seat's own setup, `Task.setup`), driven by turns
(`turn(message)` adds a user message, then lets its seat drive until the seat's turn ends), and
closed (`Task.finalize`, scoring, cleanup). Its runtime is closed on every path.

A seat (vf.episode.harnesses.seat_for) is what plays it: the in-process loop for `null` and
`bash` (vf.episode.loop), a program driver for a program harness (vf.episode.program). The
rollout knows only a seat's three steps (`open`, `drive`, `cleanup`), and every seat reaches the
model through one public method, `Rollout.call`: messages and tools in, the agent's reply out;
caps, request hooks, trace nodes, generation, response hooks and call-boundary stops happen
there and only there, so an `@vf.intercept` hook, a cap or a token reset behaves the same
whichever seat runs the agent.

A bad rollout is data, not a crash: a provider error, a timeout, a tool or hook that raises is
recorded on the trace (`errors`, `stop_condition`, `ok: false`) and the run goes on. Errored
traces are not scored (their `rewards` stay empty) and their episodes are redone on `--resume`.

Token bookkeeping: each node stores its delta of the token sequence. When the engine's prompt
for the next call extends the previous call's prompt + completion, the new message node gets
only the new tokens; when it does not (the chat template re-rendered history differently, or a
program rewrote its history), that node stores the whole prompt and is flagged `token_reset`
(`vf.trace.MessageNode.token_reset`), which starts a new training sample (vf.trainer.samples).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import traceback as tb
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vf.artifacts import collect
from vf.configs.harness import HarnessConfig
from vf.dialects.tool_args import same_message
from vf.engines.base import Engine, GenerateRequest, GenerateResult, Sampling, streams
from vf.episode.harnesses import NullHarness, seat_for
from vf.episode.hooks import call_hook, needs_runtime
from vf.episode.intercept import Interceptors, boundary
from vf.episode.scoring import score
from vf.episode.tools import SharedTools
from vf.errors import EngineError, RolloutError
from vf.errors import boundary as attributed
from vf.interception.budget import InterceptionLimitError, RecordBudget, recorded_size
from vf.runtime import RuntimeConfig, make_runtime
from vf.runtime.resources import with_resources
from vf.taskset import Task, task_toolsets
from vf.trace import ErrorInfo, MessageNode, ModelCall, Trace, flat_tool
from vf.types import (
    AssistantMessage,
    Request,
    Response,
    Tool,
    ToolCall,
    Usage,
    content_text,
    parse_message,
    to_wire,
)

STAGES = ("setup", "agent", "finalize", "scoring")


def stage_deadlines(agent_timeout, task_timeout) -> dict[str, float | None]:
    """Seconds per rollout stage: the seat's `--env.<seat>.timeout.*` (its `rollout` is the agent
    stage), else the task's `TaskData.timeout`, else None (no limit)."""
    out = {}
    for stage in STAGES:
        mine = getattr(agent_timeout, "rollout" if stage == "agent" else stage, None) if agent_timeout else None
        out[stage] = mine if mine is not None else getattr(task_timeout, stage, None)
    return out


class Seat(Protocol):
    """What plays a rollout (vf.episode.harnesses.seat_for). It reaches the model only through
    `Rollout.call`."""

    async def open(self, rollout: Rollout) -> None:
        """After the runtime is made, before `Task.setup`: the seat's own setup."""

    async def drive(self, rollout: Rollout) -> None:
        """One turn of the seat (under the agent deadline)."""

    async def cleanup(self, rollout: Rollout) -> None:
        """Release what `open` took (idempotent; runs on every path, before the runtime closes)."""


@dataclass
class SeatSpec:
    """How one seat runs: engine, model, sampling, caps, harness and runtime."""

    engine: Engine
    model: str
    sampling: Sampling = field(default_factory=Sampling)
    max_turns: int | None = 8
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_total_tokens: int | None = None
    timeout: Any = None
    """The seat's `AgentTimeout` (stage deadlines; None = the task's own only)."""
    harness: Any = field(default_factory=lambda: NullHarness(HarnessConfig()))
    """An in-process harness (vf.episode.harnesses) or a program harness (`vf.harness.Harness`)."""
    runtime: Any = None
    """A `vf.runtime.RuntimeConfig` (None = subprocess)."""
    require_tokens: bool = False
    name: str = "agent"
    trainable: bool = True
    shared_tools: SharedTools | None = None
    """The run's shared toolsets (the taskset's, from `open_shared_tools`), offered in every
    rollout; each call sees the calling rollout's state."""
    interception: Any = None
    """The run's interception server (`vf.episode.program.RunInterception`, started by the first
    program-harness rollout)."""


@dataclass
class Reply:
    """What one `Rollout.call` produced: `response` is what the agent is given (after the
    response hooks), `message` the reply node's provider message on the trace, `node` its index."""

    response: Response
    message: dict[str, Any]
    node: int


def _same(a: dict[str, Any], b: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> bool:
    """Whether two provider messages say the same thing: dialects differ in empty fields, and an
    agent may re-send its tool calls' arguments reserialised or with its defaults spelled out
    (vf.dialects.tool_args)."""
    return same_message(a, b, tools)


def policy_response(result: GenerateResult, model: str) -> Response:
    """The engine's reply as the typed `vf.Response` hooks and programs see."""
    message = result.message
    calls = [ToolCall(id=c.get("id") or f"call_{uuid.uuid4().hex[:12]}",
                      name=(c.get("function") or {}).get("name", ""),
                      arguments=(c.get("function") or {}).get("arguments") or "{}")
             for c in message.get("tool_calls") or []]
    finish = "tool_calls" if calls else (result.finish_reason if result.finish_reason in ("stop", "length") else "stop")
    return Response(id=f"vf-{uuid.uuid4().hex[:16]}", created=int(time.time()), model=model,
                    message=AssistantMessage(content=content_text(message.get("content")) or None,
                                             tool_calls=calls or None),
                    finish_reason=finish,
                    usage=Usage(prompt_tokens=result.usage.prompt_tokens,
                                completion_tokens=result.usage.completion_tokens))


class Rollout:
    """One seat's conversation on one task (see module docstring)."""

    def __init__(self, task: Task, trace: Trace, spec: SeatSpec, runtime: Any = None):
        self.task, self.trace, self.spec = task, trace, spec
        self._borrowed = runtime
        """A runtime the caller owns (`Agent.provision`): used instead of a new one, never closed."""
        self.deadlines = stage_deadlines(spec.timeout, task.data.timeout)
        self.agent_budget = self.deadlines["agent"]
        """Seconds the agent has left: spent only while its own turns run."""
        self.state = task.state_class()()
        trace.state = self.state
        self.done = False
        self.closed = False
        self.runtime = None
        self.seat: Seat = seat_for(spec)
        self._seq: list[int] | None = None  # tokens of the current branch (prompt + completions)
        self._restarted = False
        self.intercept = Interceptors(task, self.hook_args)
        self._hooked: set[int] = set()
        """Nodes the request hooks have already seen (or that a tool gate put there)."""

    # ---- lifecycle -----------------------------------------------------------------------------
    def hook_args(self) -> dict[str, Any]:
        return {"task": self.task.data, "trace": self.trace, "state": self.state, "config": self.task.config,
                "runtime": self.runtime}

    def _wants_runtime(self) -> bool:
        if self.spec.harness.NEEDS_RUNTIME or self.task.data.artifacts:
            return True
        cls = type(self.task)
        hooks = [h for h in (cls.setup, cls.finalize) if h not in (Task.setup, Task.finalize)]
        hooks += [fn for kind in ("reward", "metric", "stop") for _, fn, _ in self.task.hooks(kind)]
        return any(needs_runtime(h) for h in hooks) or any(ts.needs_runtime() for ts in task_toolsets(self.task))

    async def open(self) -> bool:
        """Runtime, the seat's setup, `Task.setup`. False (recorded) if any failed or the setup
        deadline passed."""
        t0 = self.trace.timing.setdefault("start", time.time())
        if not await self._stage("setup", self._open(), self.deadlines["setup"]):
            return False
        self.trace.timing["setup"] = {"start": t0, "end": time.time()}
        self.trace.timing["agent"] = {"start": time.time()}
        return True

    async def _open(self) -> None:
        """Runtime, the seat's setup, `Task.setup` (under the setup deadline)."""
        if self._borrowed is not None:
            self.runtime = self._borrowed
        elif self._wants_runtime():
            self.runtime = make_runtime(runtime_for_task(self.spec.runtime, self.task.data))
        await self.seat.open(self)
        await call_hook(self.task.setup, self.hook_args())

    async def close(self, scored: bool = True) -> Trace:
        """`Task.finalize`, scoring (error-free traces only), cleanup. Idempotent."""
        if self.closed:
            return self.trace
        self.closed = True
        trace = self.trace
        if self.runtime is not None:
            trace.agent["runtime"] = self.runtime.wire_info(borrowed=self.runtime is self._borrowed)
        try:
            agent = trace.timing.setdefault("agent", {"start": time.time()})
            agent["end"] = time.time()
            agent["model"] = {"duration": sum(c.time.get("end", 0) - c.time.get("start", 0) for c in trace.calls)}
            if not trace.errors:
                t = time.time()
                await self._stage("finalize", self._finalize(), self.deadlines["finalize"])
                trace.timing["finalize"] = {"start": t, "end": time.time()}
            if scored and not trace.errors:
                t = time.time()
                await self._stage("scoring", score(self.task, trace, self.runtime), self.deadlines["scoring"])
                trace.timing["scoring"] = {"start": t, "end": time.time()}
        finally:
            await self.cleanup()
        trace.ok = not trace.errors
        trace.is_completed = trace.ok
        return trace

    async def _finalize(self) -> None:
        """`Task.finalize`, then the task's declared artifacts out of the runtime (vf.artifacts)."""
        await call_hook(self.task.finalize, self.hook_args())
        data = self.task.data
        if data.artifacts and self.runtime is not None and not self.state.artifacts:
            self.state.artifacts = await collect(self.runtime, data.artifacts, max_bytes=data.artifact_max_bytes)

    async def cleanup(self) -> None:
        """The seat's cleanup (its toolsets and their servers, a program's leftovers), then the
        runtime closed (idempotent; runs on every path)."""
        with contextlib.suppress(Exception):  # cleanup must not mask the rollout's outcome
            await self.seat.cleanup(self)
        runtime, self.runtime = self.runtime, None
        if runtime is not None and runtime is not self._borrowed:
            await runtime.close()

    async def _stage(self, stage: str, work, seconds: float | None) -> bool:
        """Run one stage's coroutine under its deadline (None: no limit). A passed deadline stops
        the trace as `<stage>_timeout`; an error is recorded on it. True when the stage completed."""
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                await work
            return True
        except TimeoutError as e:  # a timeout inside the stage (a tool's own) is an error, not the stage's
            if deadline.expired():
                self.timeout(stage)
            else:
                self.fail(e, "error")
        except EngineError as e:
            self.fail(e, "provider_error")
        except Exception as e:  # noqa: BLE001 - task, tool and hook code is user code
            self.fail(e, "error")
        return False

    def timeout(self, stage: str) -> None:
        """A stage passed its deadline: the trace stops as `<stage>_timeout` (replacing an earlier
        stop), which is a stop, not an error, as verifiers records it."""
        self.trace.is_timeout = True
        self.trace.stop_condition = f"{stage}_timeout"
        self.done = True

    def fail(self, exc: BaseException, condition: str) -> None:
        """Record an error on the trace and end the rollout."""
        if isinstance(exc, asyncio.TimeoutError):
            self.trace.is_timeout = True
            self.trace.errors.append(ErrorInfo(type="Timeout", message=str(exc) or "timed out"))
        elif isinstance(exc, EngineError):
            self.trace.errors.append(ErrorInfo.from_exception(exc))
        else:
            self.trace.errors.append(ErrorInfo(type=type(exc).__name__, message=str(exc),
                                               traceback=tb.format_exc(limit=8)))
        self.trace.ok = False
        self.done = True
        self.trace.stop_condition = getattr(exc, "stop_condition", None) or condition  # vf.errors: TaskError → task_error

    def finish(self, condition: str) -> None:
        if not self.done:
            self.done = True
            self.trace.stop_condition = condition

    def add(self, message: dict[str, Any], sampled: bool = False, parent: int | None | str = "last",
            hooked: bool = False, **fields) -> int:
        """Append a node under `parent` (default: the newest node) and return its index.
        `hooked`: the request hooks have had their say on it already (a tool gate's verdict)."""
        if parent == "last":
            parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled,
                                            timestamp=time.time(), **fields))
        if hooked:
            self._hooked.add(len(self.trace.nodes) - 1)
        return len(self.trace.nodes) - 1

    # ---- turns -----------------------------------------------------------------------------------
    def cap_reached(self) -> str | None:
        """The first of the seat's caps (turns, input/output/total tokens) the rollout has reached."""
        s, t = self.spec, self.trace
        if s.max_turns is not None and t.num_turns >= s.max_turns:
            return "max_turns"
        inp = sum(int(c.usage.get("prompt_tokens", 0)) for c in t.calls)
        out = sum(int(c.usage.get("completion_tokens", 0)) for c in t.calls)
        for cap, used in (("max_input_tokens", inp), ("max_output_tokens", out), ("max_total_tokens", inp + out)):
            limit = getattr(s, cap)
            if limit is not None and used >= limit:
                return cap
        return None

    async def turn(self, message: str | dict[str, Any] | list | None = None) -> None:
        """Add `message` (a user turn: text, a message, or a list of messages) if given, then let
        the seat drive until its turn ends. Errors end the rollout and are recorded."""
        if self.done:
            return
        cap = self.cap_reached()
        if cap:  # checked before the message is taken: a capped rollout leaves it unconsumed
            self.finish(cap)
            return
        if message is not None:
            items = message if isinstance(message, list) else [message]
            for m in items:
                self.add({"role": "user", "content": m} if isinstance(m, str) else to_wire(m))
        started = time.monotonic()
        try:
            await self._stage("agent", self.seat.drive(self), self.agent_budget)
        finally:
            if self.agent_budget is not None:  # time between turns (another seat's) is not spent
                self.agent_budget = max(self.agent_budget - (time.monotonic() - started), 1e-3)

    async def check_stops(self) -> None:
        """The task's trace-level `@vf.stop`s (those at a call boundary run in `call`)."""
        for name, fn, _ in self.task.hooks("stop"):
            if boundary(fn) is not None:  # a request/response stop runs at the call (vf.intercept)
                continue
            if await call_hook(fn, self.hook_args()):
                self.finish(name)
                return

    def request(self, extra: list[dict[str, Any]] = ()) -> Request:
        """The latest branch (plus `extra`) and the tools, typed for the hooks."""
        return self._typed([*self.trace.wire_messages(), *extra], self.trace.tools)

    @staticmethod
    def _typed(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Request:
        """Provider messages and tool schemas (a program's non-function tools included) typed."""
        flat = [flat_tool(t) for t in tools or []]
        typed = [Tool.model_validate({**t, "description": t.get("description") or "",
                                      "parameters": t.get("parameters") or {}}) for t in flat]
        return Request(messages=[parse_message(m) for m in messages], tools=typed or None)

    # ---- the one model-call path -------------------------------------------------------------------
    async def call(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                   new: set[int] | None = None, max_tokens: int | None = None, model: str | None = None,
                   budget: RecordBudget | None = None, hook_errors: type[RolloutError] | None = None,
                   on_delta: Callable[[str], None] | None = None) -> Reply | None:
        """One model call of the seat, every seat's only way to the model. `messages` (provider
        dicts) are the call's whole prompt, `tools` its OpenAI function schemas. In order:

        1. caps: a rollout that has ended or reached a cap answers None (finished);
        2. request hooks (vf.intercept) over the positions `new` (default: what the hooks have
           not seen: branch nodes added since the last call, and whatever extends the branch);
        3. trace nodes: what extends the latest branch is appended; a prompt that rewrites
           history branches off at the last message both share and starts a new training sample
           (`token_reset`); `budget` (a program's, vf.interception.budget) is charged first, and a
           call past it fails the rollout as `limit` (InterceptionLimitError raised);
        4. a request stop ends the rollout here (the prompt kept): None;
        5. generation (`_generate`): the reply node with its tokens and log-probs;
        6. response hooks, whose rewrite is what the trace keeps and the agent is given (the
           node's tokens stay the policy's sample), then the response stops (finished, the reply
           still returned: the seat sees `done`).

        A hook that raises ends the rollout with its error; with `hook_errors` (a program's seat:
        `TaskError`, since the program itself only sees an HTTP error) it is attributed to that
        class, named by its boundary ("request interception failed: RuntimeError: ...").

        `on_delta(text)` (a streaming caller's) is told the reply's text as it is generated, but
        only when nothing may change or refuse the reply after the agent has seen it: no response
        hook or stop, no tool gate. Otherwise it is never called (the caller frames the whole reply).
        """
        if self.intercept.response_hooks or self.intercept.response_stops or self.intercept.gates_tools:
            on_delta = None
        if self.done:
            return None
        if cap := self.cap_reached():
            self.finish(cap)
            return None
        branch = self.trace.branch()
        if new is None:
            new = {i for i, n in enumerate(branch) if n not in self._hooked} | set(range(len(branch), len(messages)))
        stopped = None
        if self.intercept.gates_tools:
            before = self._typed(messages, tools)
            async with self._attributed(hook_errors, "request interception failed"):
                after, stopped = await self.intercept.request(before, new)
            changed = {i for i, (a, b) in enumerate(zip(after.messages, before.messages)) if a != b}
            # only the rewritten messages change; the rest keep their wire form as it was
            messages = [to_wire(after.messages[i]) if i in changed else m for i, m in enumerate(messages)]
            for i in sorted(changed):
                if i < len(branch):  # already on the trace (a loop's new user or tool node): rewritten there
                    self.trace.nodes[branch[i]].message = messages[i]
        self._place(messages, tools, budget)
        self._hooked.update(self.trace.branch())
        if stopped:  # as verifiers: the prompt is kept, no reply
            self.finish(stopped)
            return None
        result = await self._generate(messages, tools or None, max_tokens, on_delta)
        node = self.trace.calls[-1].node
        if budget is not None:
            budget.add(recorded_size(self.trace.nodes[node].message))  # the reply
        policy = policy_response(result, model or self.spec.model)
        response, stopped = policy, None
        if self.intercept.response_hooks or self.intercept.response_stops:
            async with self._attributed(hook_errors, "response interception failed"):
                response, stopped = await self.intercept.response(policy)
            if response != policy:
                # the trace keeps what the agent was given; the node's tokens stay the policy's sample
                self.trace.nodes[node].message = to_wire(response.message)
        if stopped:
            self.finish(stopped)
        return Reply(response=response, message=self.trace.nodes[node].message, node=node)

    @staticmethod
    def _attributed(error_cls: type[RolloutError] | None, what: str):
        return attributed(error_cls, what) if error_cls is not None else contextlib.nullcontext()

    def _place(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               budget: RecordBudget | None) -> None:
        """Put the call's prompt on the trace (step 3 of `call`): what extends the latest branch
        is appended; a rewritten history branches off at the last message both share."""
        branch = self.trace.branch()
        shared = 0
        while shared < min(len(branch), len(messages)):
            held = self.trace.nodes[branch[shared]].message
            if held is not messages[shared] and not _same(held, messages[shared], self.trace.tools or tools):
                break
            shared += 1
        if shared == len(messages) < len(branch):  # an earlier prompt again (a retry, concurrent calls): its
            shared -= 1  # last message again on a new branch, so the reply follows it, not the earlier reply
        new_tools = tools if tools and not self.trace.tools else None
        if budget is not None:  # checked before anything of the call is kept (vf.interception.budget)
            cost = sum(recorded_size(m) for m in messages[shared:]) + (recorded_size(new_tools) if new_tools else 0)
            try:
                budget.charge(cost, f"this call ({len(messages) - shared} new messages)")
            except InterceptionLimitError as e:
                self.fail(e, "limit")
                raise
        if new_tools:
            self.trace.tools = tools
        parent = branch[shared - 1] if shared else None
        if shared < len(branch):  # a new branch: its tokens start a new training sample
            self._seq, self._restarted = None, True
        for message in messages[shared:]:
            parent = self.add(message, parent=parent)

    async def _generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        max_tokens: int | None = None, on_delta: Callable[[str], None] | None = None
                        ) -> GenerateResult:
        """The engine call of `call` (step 5): `messages` are the prompt, whose last node gets the
        prompt tokens not seen before; the reply becomes a sampled node with its token ids and
        inference log-probs. `max_tokens` (a program's own cap) only ever lowers the seat's."""
        trace, spec = self.trace, self.spec
        sampling = spec.sampling
        if max_tokens is not None and 0 < max_tokens < (sampling.max_tokens or max_tokens + 1):
            sampling = dataclasses.replace(sampling, max_tokens=max_tokens)
        request = GenerateRequest(messages=messages, sampling=sampling, tools=tools, model=spec.model)
        record = ModelCall(model=spec.model, engine=spec.engine.name,
                           sampling=sampling.to_dict(), time={"start": time.time()})
        trace.calls.append(record)
        try:
            # on_delta only to an engine that takes it (vf.engines.base.streams); else the reply is framed whole
            result = await (spec.engine.generate(request, on_delta=on_delta)
                            if on_delta is not None and streams(spec.engine) else spec.engine.generate(request))
        except asyncio.CancelledError:  # the caller hung up (vf.interception): the call is abandoned
            record.time["end"] = time.time()
            record.error = ErrorInfo(type="Abandoned", message="caller hung up; generation cancelled")
            raise
        except EngineError as e:
            record.time["end"] = time.time()
            record.error = ErrorInfo.from_exception(e)
            record.attempts = getattr(e, "attempts", 1)
            raise
        record.time["end"] = time.time()
        record.finish_reason = result.finish_reason
        record.usage = {"prompt_tokens": result.usage.prompt_tokens,
                        "completion_tokens": result.usage.completion_tokens}
        record.policy_version = result.policy_version
        record.endpoint = getattr(result, "endpoint", None)
        record.attempts = getattr(result, "attempts", 1)
        if spec.require_tokens and (result.token_ids is None or result.logprobs is None):
            raise EngineError(f"engine {spec.engine.name!r} returned no token ids/log-probs",
                              type="MissingTokens")
        self._attach_prompt_tokens(result.prompt_token_ids)
        fields: dict[str, Any] = {}
        if result.token_ids is not None:
            fields = {"token_ids": list(result.token_ids), "mask": [1] * len(result.token_ids),
                      "logprobs": [round(x, 6) for x in result.logprobs] if result.logprobs is not None else None}
            if getattr(result, "routed_experts", None) is not None:
                fields["expert_ids"] = result.routed_experts
        message = {"role": "assistant", **{k: v for k, v in result.message.items() if k != "role"}}
        record.node = self.add(message, sampled=True, **fields)
        if result.token_ids is not None and self._seq is not None:
            self._seq = self._seq + list(result.token_ids)
        if result.policy_version is not None:
            if trace.policy.get("start") is None:
                trace.policy["start"] = result.policy_version
            end = result.policy_version_end
            trace.policy["end"] = end if end is not None else result.policy_version
        if result.finish_reason == "length":
            trace.info["truncated_replies"] = trace.info.get("truncated_replies", 0) + 1
        return result

    def _attach_prompt_tokens(self, prompt_ids: list[int] | None) -> None:
        """Give the newest prompt-side node the prompt tokens not seen before."""
        if prompt_ids is None or not self.trace.nodes:
            return
        node = self.trace.nodes[-1]
        seq = self._seq or []
        if self._restarted:  # a new branch: a new sample, even if its tokens happen to extend
            node.token_reset = True
            self._restarted = False
        if self._seq is not None and prompt_ids[: len(seq)] == seq:
            delta = prompt_ids[len(seq):]
        else:
            delta = list(prompt_ids)
            if self._seq is not None:  # history re-rendered differently: a new sample starts here
                node.token_reset = True
        node.token_ids, node.mask = list(delta), [0] * len(delta)
        self._seq = list(prompt_ids)


def runtime_for_task(config: Any, data: Any) -> Any:
    """The seat's runtime config, with network only when the task asks for it, the task's `image`
    and its `resources` applied (vf.runtime.resources). TaskData's
    `network_allow` defaults to ["*"] (as in verifiers, whose task hashes we match), so only a
    value the task author set explicitly opens the sandbox's network."""
    config = config if isinstance(config, RuntimeConfig) else RuntimeConfig(**(config or {}))
    if "network_allow" in getattr(data, "model_fields_set", ()) and data.network_allow:
        config = config.model_copy(update={"network_allow": list(data.network_allow)})
    if getattr(data, "image", None):  # the task's container image (runtimes that use one: docker)
        config = config.model_copy(update={"image": data.image})
    return with_resources(config, getattr(data, "resources", None))


def segment_since(trace: Trace, start: int) -> list[Any]:
    """Typed model replies and tool results added to `trace` from node `start` on."""
    out, seen_reply = [], False
    for node in trace.nodes[start:]:
        if node.sampled:
            out.append(parse_message(node.message))
            seen_reply = True
        elif seen_reply and node.message.get("role") == "tool":
            out.append(parse_message(node.message))
    return out


def reply_text(messages: list[Any]) -> str:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return content_text(m.get("content")).strip()
    return ""
