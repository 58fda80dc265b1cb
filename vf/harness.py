"""One seat's rollout of one task: the chat loop against an engine, tools, hooks, scoring.

A harness is the program the model runs in (`--env.agent.harness.id`):

    null   the plain chat loop: the task's prompt, the model's replies, and the task's
           toolsets offered as function calls (verifiers' `null` harness)
    bash   the same loop plus a `bash` tool whose commands run in the rollout's runtime
           (`--env.agent.runtime.type`, a `vf.runtime` type; one runtime per rollout)

A `Rollout` is opened (runtime, toolsets, opening messages, `Task.setup`), driven by turns
(`turn(message)` adds a user message, then gets model replies until one is not a tool call),
and closed (`Task.finalize`, scoring, cleanup). Its runtime is closed on every path.

A bad rollout is data, not a crash: a provider error, a timeout, a tool or hook that raises is
recorded on the trace (`errors`, `stop_condition`, `ok: false`) and the run goes on. Errored
traces are not scored (their `rewards` stay empty) and their episodes are redone on `--resume`.

Token bookkeeping: each node stores its delta of the token sequence. When the engine's prompt
for the next call extends the previous call's prompt + completion, the new message node gets
only the new tokens; when it does not (the chat template re-rendered history differently),
that node stores the whole prompt and is flagged `token_reset: true`, which starts a new
training sample (see `vf.trainer` sample building).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import traceback as tb
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vf.artifacts import collect
from vf.bounded import BoundsError, load_json
from vf.configs.harness import HarnessConfig
from vf.engines.base import Engine, GenerateRequest, GenerateResult, Sampling
from vf.errors import EngineError, UsageError
from vf.intercept import Interceptors, boundary
from vf.program import Harness, ProgramDriver, RunInterception, build_program_harness, harness_class
from vf.runtime.base import ROLLOUT_LIMITS, RuntimeLimitError
from vf.runtime.resources import with_resources
from vf.taskset import Task, call_hook, needs_runtime, score, task_toolsets
from vf.toolset import SharedTools, ToolError, ToolRunner, open_tools
from vf.trace import ErrorInfo, MessageNode, ModelCall, Trace
from vf.types import Request, Tool, content_text, parse_message, to_wire


class NullHarness:
    """The plain chat loop; tools are the task's toolsets."""

    NEEDS_RUNTIME: ClassVar[bool] = False

    def __init__(self, config: HarnessConfig):
        self.config = config

    def extra_tools(self, rollout: Rollout) -> dict[str, tuple[dict[str, Any], Any]]:
        """name → (OpenAI function schema, async fn(arguments dict) → str) beyond the toolsets'."""
        return {}

    def system_prompt(self) -> str | None:
        """Put before the task's own system prompt (None: the task's prompt alone)."""
        return None


def _function(name: str, description: str, properties: dict[str, str], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": required,
                       "properties": {k: {"type": "string", "description": d} for k, d in properties.items()}}}}


class BashHarness(NullHarness):
    """The chat loop plus verifiers' `bash` harness tools, run in the rollout's runtime: `bash`
    (its combined stdout and stderr come back) and `edit` (replace a string that occurs exactly
    once in a file of at most `EDIT_MAX_BYTES`; `--env.agent.harness.edit false` leaves it out).
    The tools, their replies and the system prompt are verifiers 0.4's, so a model sees the same
    conversation on both. A command that fills the runtime (`ROLLOUT_LIMITS`: disk, total
    memory) ends the rollout with a `RuntimeLimitError` on the trace (stop condition `limit`)."""

    NEEDS_RUNTIME = True
    BASH = _function("bash", "Run a bash command and return its combined stdout and stderr.",
                     {"command": "The bash command to run."}, ["command"])
    EDIT = _function("edit", "Replace a unique string in a file. old_str must appear exactly once in the file.",
                     {"path": "File path (relative to cwd or absolute).",
                      "old_str": "Exact string to find (must appear exactly once).",
                      "new_str": "Replacement string."}, ["path", "old_str", "new_str"])
    EDIT_MAX_BYTES = 4 << 20
    """Largest file `edit` takes (a larger one is a tool error telling the model so): a command
    can make a huge, even sparse, file, and the host must not load it."""
    PROMPT = "You are a coding agent. You have access to a bash tool for running shell commands."
    EDIT_PROMPT = "You also have an edit tool for single-occurrence string replacement in a file."

    @property
    def edit(self) -> bool:
        return bool(getattr(self.config, "edit", True))

    def system_prompt(self) -> str:
        return f"{self.PROMPT} {self.EDIT_PROMPT}" if self.edit else self.PROMPT

    def extra_tools(self, rollout: Rollout):
        async def bash(arguments: dict[str, Any]) -> str:
            command = arguments.get("command")
            if not isinstance(command, str):
                raise ToolError("bash needs a string argument 'command'")
            # the runtime stops the command at the tool's timeout; when the harness's own timeout
            # cancels the call first, the runtime still kills all of it before the call ends
            result = await rollout.runtime.run(command, rollout.task.runtime_env() or None,
                                               timeout=self.config.tool_timeout)
            output = result.stdout + result.stderr
            if result.limit in ROLLOUT_LIMITS:  # the sandbox is full: the rollout ends, recorded
                try:
                    result.raise_for_limit()
                except RuntimeLimitError as e:
                    rollout.fail(e, "limit")
                    return f"error: {e}\n{output}"
            if result.timed_out:  # shown to the model and recorded; the rollout goes on
                rollout.trace.info.setdefault("tool_errors", []).append({"tool": "bash", "type": "Timeout"})
                return f"error: command timed out after {self.config.tool_timeout:g}s\n{output}"
            return output

        async def edit(arguments: dict[str, Any]) -> str:
            path, old, new = (arguments.get(k) for k in ("path", "old_str", "new_str"))
            if not isinstance(path, str) or not path:
                return "error: 'path' is required"
            if not isinstance(old, str) or not isinstance(new, str):
                return "error: 'old_str' and 'new_str' must be strings"
            if not old:  # '' occurs everywhere: it would insert, not replace
                return "error: 'old_str' must be a non-empty string"
            try:  # the runtime refuses links and non-files: a command may have put anything there
                content = (await rollout.runtime.read(path, max_bytes=self.EDIT_MAX_BYTES)).decode()
            except FileNotFoundError:
                return f"error: {path} not found"
            except Exception as e:  # noqa: BLE001 - shown to the model, as verifiers does
                return f"error: could not read {path}: {e}"
            if (count := content.count(old)) != 1:
                return f"error: old_str must appear exactly once in {path} (found {count})"
            try:
                await rollout.runtime.write(path, content.replace(old, new, 1))
            except Exception as e:  # noqa: BLE001 - e.g. the name became a directory meanwhile
                return f"error: could not write {path}: {e}"
            return f"Edited {path}"

        tools = {"bash": (self.BASH, bash)}
        if self.edit:
            tools["edit"] = (self.EDIT, edit)
        return tools


HARNESSES: dict[str, type[NullHarness]] = {"null": NullHarness, "bash": BashHarness}


STAGES = ("setup", "agent", "finalize", "scoring")


def stage_deadlines(agent_timeout, task_timeout) -> dict[str, float | None]:
    """Seconds per rollout stage: the seat's `--env.<seat>.timeout.*` (its `rollout` is the agent
    stage), else the task's `TaskData.timeout`, else None (no limit)."""
    out = {}
    for stage in STAGES:
        mine = getattr(agent_timeout, "rollout" if stage == "agent" else stage, None) if agent_timeout else None
        out[stage] = mine if mine is not None else getattr(task_timeout, stage, None)
    return out


def with_system_prompt(messages: list[dict[str, Any]], prompt: str | None) -> list[dict[str, Any]]:
    """The harness's system prompt first, then the task's own (one system message, as verifiers)."""
    if not prompt:
        return messages
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{prompt}\n\n{content_text(messages[0]['content'])}"}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def make_harness(config: HarnessConfig | dict | None) -> NullHarness | Harness:
    """The seat's harness: an in-process loop (`null`, `bash`) or a program (vf.program)."""
    config = config if isinstance(config, HarnessConfig) else HarnessConfig(**(config or {}))
    if config.id in HARNESSES:
        return HARNESSES[config.id](config)
    program = harness_class(config.id)
    if program is None:
        raise UsageError(f"unknown harness {config.id!r}",
                         hint=f"built in: {', '.join(sorted(HARNESSES))}, the vf.harnesses modules; or an "
                              "installed package exporting one vf.harness.Harness, or module:Class")
    return build_program_harness(program, config)


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
    harness: NullHarness = field(default_factory=lambda: NullHarness(HarnessConfig()))
    runtime: Any = None
    """A `vf.runtime.RuntimeConfig` (None = subprocess)."""
    require_tokens: bool = False
    name: str = "agent"
    trainable: bool = True
    shared_tools: SharedTools | None = None
    """The run's shared toolsets (the taskset's, from `open_shared_tools`), offered in every
    rollout; each call sees the calling rollout's state."""
    interception: RunInterception | None = None
    """The run's interception server (started by the first program-harness rollout)."""


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
        self.tools: ToolRunner | None = None
        self._stack = contextlib.AsyncExitStack()  # the rollout's toolsets (and their servers)
        self._extra: dict[str, Any] = {}
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
        return any(needs_runtime(h) for h in hooks)

    async def open(self) -> bool:
        """Runtime, toolsets, opening messages, `Task.setup`. False (recorded) if any failed or
        the setup deadline passed."""
        t0 = self.trace.timing.setdefault("start", time.time())
        if not await self._stage("setup", self._open(), self.deadlines["setup"]):
            return False
        self.trace.timing["setup"] = {"start": t0, "end": time.time()}
        self.trace.timing["agent"] = {"start": time.time()}
        return True

    async def _open(self) -> None:
        """Runtime, toolsets, opening messages, `Task.setup` (under the setup deadline)."""
        if self._borrowed is not None:
            self.runtime = self._borrowed
        elif self._wants_runtime():
            from vf.runtime import make_runtime

            self.runtime = make_runtime(runtime_for_task(self.spec.runtime, self.task.data))
        if isinstance(self.spec.harness, Harness):  # a program: it sends its own prompts and tools
            self.spec.harness.check_isolation(self.runtime)
            await self.spec.harness.setup(self.runtime)
            await call_hook(self.task.setup, self.hook_args())
            return
        harness = self.spec.harness.config
        tools = await self._stack.enter_async_context(open_tools(
            task_toolsets(self.task), self.state, shared=self.spec.shared_tools, timeout=harness.tool_timeout))
        self.tools = tools if tools.functions else None
        self._extra = {n: t for n, t in self.spec.harness.extra_tools(self).items()
                       if n not in harness.disabled_tools}
        self.trace.tools = [s for s in tools.schemas if s["function"]["name"] not in harness.disabled_tools]
        self.trace.tools += [schema for schema, _ in self._extra.values()]
        for message in with_system_prompt(self.task.messages(), self.spec.harness.system_prompt()):
            self.add(message)
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
        """Stop toolsets (and their servers) and close the runtime (idempotent; runs on every path)."""
        self.tools = None
        with contextlib.suppress(Exception):  # cleanup must not mask the rollout's outcome
            await self._stack.aclose()
            if isinstance(self.spec.harness, Harness) and self.runtime is not None:
                await self.spec.harness.cleanup(self.trace, self.runtime)
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
            **fields) -> int:
        """Append a node under `parent` (default: the newest node) and return its index."""
        if parent == "last":
            parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled,
                                            timestamp=time.time(), **fields))
        return len(self.trace.nodes) - 1

    # ---- the chat loop -----------------------------------------------------------------------------
    def _cap_reached(self) -> str | None:
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
        """Add `message` (a user turn: text, a message, or a list of messages) if given, then get
        replies until one is not a tool call. Errors end the rollout and are recorded."""
        if self.done:
            return
        cap = self._cap_reached()
        if cap:  # checked before the message is taken: a capped rollout leaves it unconsumed
            self.finish(cap)
            return
        if message is not None:
            items = message if isinstance(message, list) else [message]
            for m in items:
                self.add({"role": "user", "content": m} if isinstance(m, str) else to_wire(m))
        started = time.monotonic()
        try:
            work = self._program() if isinstance(self.spec.harness, Harness) else self._replies()
            await self._stage("agent", work, self.agent_budget)
        finally:
            if self.agent_budget is not None:  # time between turns (another seat's) is not spent
                self.agent_budget = max(self.agent_budget - (time.monotonic() - started), 1e-3)

    async def _replies(self) -> None:
        """Model replies (and the tool calls they make) until one is not a tool call."""
        while not self.done:
            cap = self._cap_reached()
            if cap:
                self.finish(cap)
                return
            result = await self._call()
            if self.done:  # a boundary @vf.stop fired at this call
                return
            tool_calls = result.message.get("tool_calls") or []
            if tool_calls and (self.tools is not None or self._extra):
                cap = self._cap_reached()
                if cap:  # as verifiers: a capped rollout leaves its last tool calls unexecuted
                    self.finish(cap)
                    return
                await self._run_tools(tool_calls)
                await self._check_stops()
                continue
            await self._check_stops()
            return

    async def _program(self) -> None:
        """A program harness's run: its calls are answered (and recorded) as they come."""
        if self.spec.interception is None:
            raise UsageError(f"harness {self.spec.harness.config.id!r} needs the run's interception server")
        await ProgramDriver(self, await self.spec.interception.get()).run()

    async def _check_stops(self) -> None:
        for name, fn, _ in self.task.hooks("stop"):
            if boundary(fn) is not None:  # a request/response stop runs at the call (vf.intercept)
                continue
            if await call_hook(fn, self.hook_args()):
                self.finish(name)
                return

    async def _run_tools(self, tool_calls: list[dict[str, Any]]) -> None:
        timeout = self.spec.harness.config.tool_timeout
        verdicts = await self._gate(tool_calls)
        for call, verdict in zip(tool_calls, verdicts):
            fn = call.get("function") or {}
            name = fn.get("name", "")
            if self.done:  # a stop at the gate: no call of this reply runs
                return
            if verdict is not None:  # a hook denied the call: the model sees the hook's result
                self._hooked.add(self.add(to_wire(verdict)))
                continue
            try:
                if name in self._extra:
                    args = load_json(fn.get("arguments") or "{}")
                    content = await asyncio.wait_for(self._extra[name][1](args), timeout)
                elif self.tools is not None and name not in self.spec.harness.config.disabled_tools:
                    content = await asyncio.wait_for(
                        self.tools.call(name, fn.get("arguments", "{}"), self.hook_args()), timeout)
                else:
                    raise ToolError(f"unknown tool {name!r}")
            except (ToolError, BoundsError) as e:
                content = f"error: {e}"
            except TimeoutError:
                self.trace.info.setdefault("tool_errors", []).append({"tool": name, "type": "Timeout"})
                content = f"error: tool {name} timed out after {timeout:g}s"
            except Exception as e:  # noqa: BLE001 - a tool that raises is shown to the model
                self.trace.info.setdefault("tool_errors", []).append(
                    {"tool": name, "type": type(e).__name__, "message": str(e)})
                content = f"error: {type(e).__name__}: {e}"
            if not isinstance(content, (str, list)):
                content = json.dumps(content)
            self.add({"role": "tool", "tool_call_id": call.get("id"), "name": name, "content": content})

    def _request(self, extra: list[dict[str, Any]] = ()) -> Request:
        """The latest branch (plus `extra`) and the tools, typed for the hooks."""
        tools = [Tool(name=t["function"]["name"], description=t["function"].get("description") or "",
                      parameters=t["function"].get("parameters") or {}) for t in self.trace.tools or []]
        return Request(messages=[parse_message(m) for m in [*self.trace.wire_messages(), *extra]], tools=tools or None)

    async def _gate(self, tool_calls: list[dict[str, Any]]) -> list[Any]:
        """The request hooks' verdict on each call before any runs (vf.intercept: the tool gate)."""
        if not self.intercept.gates_tools:
            return [None] * len(tool_calls)
        verdicts = []
        for call in tool_calls:
            probe = {"role": "tool", "tool_call_id": call.get("id"), "content": "",
                     "name": (call.get("function") or {}).get("name", "")}
            verdict, stopped = await self.intercept.gate(self._request([probe]))
            if stopped:
                self.finish(stopped)
            verdicts.append(verdict)
        return verdicts

    async def _call(self) -> GenerateResult | None:
        """One model call with the task's intercept hooks around it (vf.intercept): what they
        rewrite is what the model sees and what the trace keeps. None when a stop fired first."""
        if self.intercept.gates_tools:
            branch = self.trace.branch()
            new = {i for i, n in enumerate(branch) if n not in self._hooked}
            before = self._request()
            request, stopped = await self.intercept.request(before, new)
            for i in new:  # only these may change; the rest keep their wire form as it was
                if request.messages[i] != before.messages[i]:
                    self.trace.nodes[branch[i]].message = to_wire(request.messages[i])
            self._hooked.update(branch)
            if stopped:
                self.finish(stopped)
                return None
        result = await self.generate(self.trace.wire_messages(), self.trace.tools or None)
        if self.intercept.response_hooks or self.intercept.response_stops:
            node = self.trace.nodes[self.trace.calls[-1].node]
            policy = ProgramDriver._response(result, self.spec.model)
            response, stopped = await self.intercept.response(policy)
            if response != policy:
                # the trace keeps what the agent was given; the node's tokens stay the policy's sample
                node.message = to_wire(response.message)
                result = dataclasses.replace(result, message=node.message)
            if stopped:
                self.finish(stopped)
        return result

    async def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       max_tokens: int | None = None) -> GenerateResult:
        """The rollout's one model call (in-process loops and intercepted programs alike):
        `messages` are the prompt, whose last node gets the prompt tokens not seen before; the
        reply becomes a sampled node with its token ids and inference log-probs. `max_tokens`
        (a program's own cap) only ever lowers the seat's."""
        trace, spec = self.trace, self.spec
        sampling = spec.sampling
        if max_tokens is not None and 0 < max_tokens < (sampling.max_tokens or max_tokens + 1):
            sampling = dataclasses.replace(sampling, max_tokens=max_tokens)
        request = GenerateRequest(messages=messages, sampling=sampling, tools=tools, model=spec.model)
        record = ModelCall(model=spec.model, engine=spec.engine.name,
                           sampling=sampling.to_dict(), time={"start": time.time()})
        trace.calls.append(record)
        try:
            result = await spec.engine.generate(request)
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

    def restart_tokens(self) -> None:
        """The next prompt does not extend the last one (a program rewrote its history): its
        tokens start a new training sample."""
        self._seq, self._restarted = None, True

    def _attach_prompt_tokens(self, prompt_ids: list[int] | None) -> None:
        """Give the newest prompt-side node the prompt tokens not seen before."""
        if prompt_ids is None or not self.trace.nodes:
            return
        node = self.trace.nodes[-1]
        seq = self._seq or []
        if self._restarted:  # a new branch: a new sample, even if its tokens happen to extend
            node.token_reset = True  # type: ignore[attr-defined]
            self._restarted = False
        if self._seq is not None and prompt_ids[: len(seq)] == seq:
            delta = prompt_ids[len(seq):]
        else:
            delta = list(prompt_ids)
            if self._seq is not None:  # history re-rendered differently: a new sample starts here
                node.token_reset = True  # type: ignore[attr-defined]
        node.token_ids, node.mask = list(delta), [0] * len(delta)
        self._seq = list(prompt_ids)


def runtime_for_task(config: Any, data: Any) -> Any:
    """The seat's runtime config, with network only when the task asks for it and the task's
    `resources` applied (vf.runtime.resources). TaskData's
    `network_allow` defaults to ["*"] (as in verifiers, whose task hashes we match), so only a
    value the task author set explicitly opens the sandbox's network."""
    from vf.runtime import RuntimeConfig

    config = config if isinstance(config, RuntimeConfig) else RuntimeConfig(**(config or {}))
    if "network_allow" in getattr(data, "model_fields_set", ()) and data.network_allow:
        config = config.model_copy(update={"network_allow": list(data.network_allow)})
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


def __getattr__(name: str):
    # Older imports (`from vf.harness import EpisodeSpec, run_episode`) keep working.
    if name in ("EpisodeSpec", "run_episode"):
        import vf.runner

        return getattr(vf.runner, name)
    raise AttributeError(name)
