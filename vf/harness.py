"""Run one episode of a task against an engine, and score it.

A bad rollout is data, not a crash: a provider error, a timeout, a tool or hook that raises
is recorded on the trace (`errors`, `stop_condition`, `ok: false`) and the run goes on.
Errored episodes are not scored (their `rewards` stay empty) and are redone on `--resume`.

Token bookkeeping: each node stores its delta of the token sequence. When the engine's prompt
for the next call extends the previous call's prompt + completion, the new message node gets
only the new tokens; when it does not (the chat template re-rendered history differently),
that node stores the whole prompt and is flagged `token_reset: true`, which starts a new
training sample (see `vf.trainer` sample building).
"""

from __future__ import annotations

import asyncio
import time
import traceback as tb
from dataclasses import dataclass, field
from typing import Any

from vf.engines.base import Engine, GenerateRequest, GenerateResult, Sampling
from vf.env import Env
from vf.errors import EngineError
from vf.taskset import Task, call_hook
from vf.toolset import ToolError, ToolRunner
from vf.trace import Episode, ErrorInfo, MessageNode, ModelCall, RewardValue, Trace, TraceTask


@dataclass
class EpisodeSpec:
    """How to run episodes: everything that is the same for every episode of a run."""

    engine: Engine
    model: str
    sampling: Sampling = field(default_factory=Sampling)
    max_turns: int = 8
    episode_timeout: float | None = None
    env: Env | None = None
    env_id: str = ""
    run: dict[str, Any] = field(default_factory=lambda: {"type": "eval"})
    require_tokens: bool = False


class Agent:
    """One seat: sends the conversation to the engine, runs tool calls, checks stop hooks."""

    def __init__(self, task: Task, trace: Trace, state: Any, spec: EpisodeSpec, tools: ToolRunner | None):
        self.task, self.trace, self.state, self.spec, self.tools = task, trace, state, spec, tools
        self.done = False
        self._seq: list[int] | None = None  # tokens of the current branch (prompt + completions)

    def finish(self, condition: str) -> None:
        if not self.done:
            self.done = True
            self.trace.stop_condition = condition

    def add(self, message: dict[str, Any], sampled: bool = False, **fields) -> int:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled,
                                            timestamp=time.time(), **fields))
        return len(self.trace.nodes) - 1

    async def turn(self, message: str | dict[str, Any] | None = None) -> None:
        """Add `message` (a user turn) if given, then get replies until one is not a tool call."""
        if self.done:
            return
        if message is not None:
            self.add({"role": "user", "content": message} if isinstance(message, str) else dict(message))
        while not self.done:
            if self.trace.num_turns >= self.spec.max_turns:
                self.finish("max_turns")
                return
            result = await self._call()
            tool_calls = result.message.get("tool_calls") or []
            if tool_calls and self.tools is not None:
                await self._run_tools(tool_calls)
                await self._check_stops()
                continue
            await self._check_stops()
            return

    async def _check_stops(self) -> None:
        for name, fn, _ in self.task.hooks("stop"):
            if await call_hook(fn.__get__(self.task), self._hook_args()):
                self.finish(name)
                return

    def _hook_args(self) -> dict[str, Any]:
        return {"task": self.task.data, "trace": self.trace, "state": self.state, "config": self.task.config}

    async def _run_tools(self, tool_calls: list[dict[str, Any]]) -> None:
        for call in tool_calls:
            fn = call.get("function") or {}
            try:
                content = await self.tools.call(fn.get("name", ""), fn.get("arguments", "{}"), self._hook_args())
            except ToolError as e:
                content = f"error: {e}"
            self.add({"role": "tool", "tool_call_id": call.get("id"), "name": fn.get("name"), "content": content})

    async def _call(self) -> GenerateResult:
        trace = self.trace
        request = GenerateRequest(messages=trace.messages, sampling=self.spec.sampling,
                                  tools=self.tools.schemas if self.tools else None, model=self.spec.model)
        record = ModelCall(model=self.spec.model, engine=self.spec.engine.name,
                           sampling=self.spec.sampling.to_dict(), time={"start": time.time()})
        trace.calls.append(record)
        try:
            result = await self.spec.engine.generate(request)
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
        record.attempts = getattr(result, "attempts", 1)
        if self.spec.require_tokens and (result.token_ids is None or result.logprobs is None):
            raise EngineError(f"engine {self.spec.engine.name!r} returned no token ids/log-probs",
                              type="MissingTokens")
        self._attach_prompt_tokens(result.prompt_token_ids)
        fields: dict[str, Any] = {}
        if result.token_ids is not None:
            fields = {"token_ids": list(result.token_ids), "mask": [1] * len(result.token_ids),
                      "logprobs": [round(x, 6) for x in result.logprobs] if result.logprobs is not None else None}
        message = {"role": "assistant", **{k: v for k, v in result.message.items() if k != "role"}}
        record.node = self.add(message, sampled=True, **fields)
        if result.token_ids is not None and self._seq is not None:
            self._seq = self._seq + list(result.token_ids)
        if result.policy_version is not None:
            if trace.policy.get("start") is None:
                trace.policy["start"] = result.policy_version
            trace.policy["end"] = result.policy_version
        if result.finish_reason == "length":
            trace.info["truncated_replies"] = trace.info.get("truncated_replies", 0) + 1
        return result

    def _attach_prompt_tokens(self, prompt_ids: list[int] | None) -> None:
        """Give the newest prompt-side node the prompt tokens not seen before."""
        if prompt_ids is None or not self.trace.nodes:
            return
        node = self.trace.nodes[-1]
        seq = self._seq or []
        if self._seq is not None and prompt_ids[: len(seq)] == seq:
            delta = prompt_ids[len(seq):]
        else:
            delta = list(prompt_ids)
            if self._seq is not None:  # history re-rendered differently: a new sample starts here
                node.token_reset = True  # type: ignore[attr-defined]
        node.token_ids, node.mask = list(delta), [0] * len(delta)
        self._seq = list(prompt_ids)


async def score(task: Task, trace: Trace, state: Any) -> None:
    """Run rewards then metrics; seed every expected name with None first so a trace shows which
    signals should have run. A hook that raises records the error and leaves its value None."""
    args = {"task": task.data, "trace": trace, "state": state, "config": task.config}
    for kind in ("reward", "metric"):
        hooks = task.hooks(kind)
        target = trace.rewards if kind == "reward" else trace.metrics
        for name, _, _ in hooks:
            target.setdefault(name, None)
        for name, fn, meta in hooks:
            try:
                value = await call_hook(fn.__get__(task), args)
            except Exception as e:  # noqa: BLE001 - hook code is user code
                trace.errors.append(ErrorInfo(type=type(e).__name__, message=f"{kind} {name!r}: {e}",
                                              traceback=tb.format_exc(limit=5)))
                trace.ok = False
                continue
            values = value if isinstance(value, dict) else {name: value}
            if name not in values:  # a hook that reports several signals replaces its own name
                target.pop(name, None)
            for k, v in values.items():
                if kind == "reward":
                    target[k] = RewardValue(score=float(v), weight=meta.get("weight", 1.0))
                else:
                    target[k] = None if v is None else float(v)


def new_episode(task: Task, spec: EpisodeSpec, rollout: int = 0) -> tuple[Episode, Trace]:
    data = task.data.model_dump(mode="json")
    ttask = TraceTask(type=type(task).__name__, data=data, key=task.data.key, hash=task.data.hash)
    trace = Trace(task=ttask, agent={"name": "agent", "trainable": True, "engine": spec.engine.name,
                                     "config": {"model": spec.model, "sampling": spec.sampling.to_dict(),
                                                "max_turns": spec.max_turns}})
    episode = Episode(env={"id": spec.env_id, "name": spec.env_id}, task=ttask, run=dict(spec.run),
                      rollout=rollout, group={"id": f"{ttask.hash[:16]}"}, traces=[trace])
    return episode, trace


async def run_episode(task: Task, spec: EpisodeSpec, rollout: int = 0) -> Episode:
    episode, trace = new_episode(task, spec, rollout)
    state = task.state_class()()
    trace._state = state
    t0 = time.time()
    trace.timing["start"] = t0
    span = lambda start: {"start": start, "end": time.time()}  # noqa: E731 - verifiers' TimeSpan shape
    try:
        toolsets = [cls(state) for cls in task.toolsets]
        for ts in toolsets:
            ts.setup()
        tools = ToolRunner(toolsets) if toolsets else None
        if tools:
            trace.tools = tools.schemas
        agent = Agent(task, trace, state, spec, tools)

        for message in task.messages():
            agent.add(message)

        async def body():
            await call_hook(task.setup, agent._hook_args())
            trace.timing["setup"] = span(t0)
            t_agent = time.time()
            if spec.env is not None:
                await spec.env.run(task, agent)
            else:
                await agent.turn()
            agent.finish("agent_completed")
            model_time = sum(c.time.get("end", 0) - c.time.get("start", 0) for c in trace.calls)
            trace.timing["agent"] = {**span(t_agent), "model": {"duration": model_time}}
            t_final = time.time()
            await call_hook(task.finalize, agent._hook_args())
            trace.timing["finalize"] = span(t_final)

        if spec.episode_timeout:
            await asyncio.wait_for(body(), timeout=spec.episode_timeout)
        else:
            await body()
    except asyncio.TimeoutError:
        trace.is_timeout = episode.is_timeout = True
        trace.stop_condition = "episode_timeout"
        trace.errors.append(ErrorInfo(type="Timeout", message=f"episode exceeded {spec.episode_timeout}s"))
    except EngineError as e:
        trace.stop_condition = "provider_error"
        trace.errors.append(ErrorInfo.from_exception(e))
    except Exception as e:  # noqa: BLE001 - task/env code is user code
        trace.stop_condition = "error"
        trace.errors.append(ErrorInfo(type=type(e).__name__, message=str(e), traceback=tb.format_exc(limit=8)))
    if not trace.errors:
        t1 = time.time()
        await score(task, trace, state)
        trace.timing["scoring"] = span(t1)
    trace.ok = not trace.errors
    trace.is_completed = trace.ok
    return episode.finish()
