"""Program harnesses: a real agent program plays the seat, and every model call it makes is
intercepted, answered by the seat's policy and recorded on the trace.

A `Harness` (verifiers 0.4's `verifiers.v1.harness.Harness`, same signatures) installs its
program in `setup(runtime)` and runs it in `launch(ctx, trace, runtime, endpoint, secret,
mcp_urls, data)`: the program must send every model call to `endpoint` with `secret` as its key.
`endpoint` is the run's interception server (vf.interception) as seen from inside the runtime:
on the host's loopback for `subprocess`, bridged through a Unix socket into the `sandbox`, which
keeps no network of its own (vf.runtime.bridge). `mcp_urls` are the task's toolsets as MCP
servers the program can reach (vf.mcp.client.program_tool_urls; none where the runtime has no
route to the host).

`ProgramDriver` is the rollout's side: it registers the rollout with the server, and answers each
call the program makes (`answer`): `@vf.intercept` request hooks, then the rollout's one model
call (`Rollout.generate`, the same path the in-process loops take: token ids, inference
log-probs, policy versions), then the response hooks. The call's messages are matched against
the trace's latest branch: what extends it is appended as nodes; a call that rewrites history
(an agent that compacts its context) starts a new branch from the last common message, and its
tokens start a new training sample (`token_reset`); so does a call that resends an earlier prompt
(a retry). Calls are answered one at a time (each is a turn of the one trace), and the rollout's
key is blanked wherever the program echoes it (a tool that ran `env`, its own logs).

Harness ids (`--env.agent.harness.id`): a built-in (`vf.harnesses.<id>`), an installed
package's `vf.harnesses` entry point, a module exporting exactly one `Harness` subclass, or
`module:Class` / `path/file.py:Class`. The last three import host code: from a config a run dir
holds (`--resume`) they need the user's word (vf.loading.guard_code).

What a program's calls can make the host hold is capped (vf.interception.budget): a call that
would pass its rollout's (or the run's) recorded budget is refused with 413 before anything of
it is kept, and the rollout stops as `limit` with an `InterceptionLimitError` on its trace.
Calls the server refuses before they reach the rollout (malformed, an image by URL) are listed
on the trace (`info["refused_calls"]`, the first 16; `info["refused_calls_total"]` counts all).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from vf.clients import ModelContext
from vf.configs.harness import HarnessConfig
from vf.dialects import Call, DialectError
from vf.errors import (
    MODEL_TRANSPORT_ERROR_EXIT_CODE,
    ConfigError,
    HarnessError,
    InterceptionError,
    RolloutError,
    SandboxError,
    TaskError,
    UsageError,
    boundary,
)
from vf.interception.budget import InterceptionLimitError, RecordBudget, RunBudget, recorded_size
from vf.interception.server import InterceptionConfig, InterceptionServer
from vf.mcp.client import program_tool_urls
from vf.runtime.base import ROLLOUT_LIMITS, RuntimeLimitError
from vf.runtimes import ProgramResult, Runtime
from vf.taskset import TaskData, concrete_type, task_toolsets
from vf.trace import nested_tool
from vf.types import (
    AssistantMessage,
    Request,
    Response,
    ToolCall,
    Usage,
    UserMessage,
    content_text,
    parse_message,
    to_wire,
)
from vf.utils.exports import exported_subclasses

if TYPE_CHECKING:
    from vf.harness import Rollout
    from vf.trace import Trace

log = logging.getLogger(__name__)

ConfigT = TypeVar("ConfigT", bound=HarnessConfig)


class Harness(ABC, Generic[ConfigT]):
    """The program a seat runs in (see the module docstring). Capability flags as verifiers'."""

    APPENDS_SYSTEM_PROMPT: ClassVar[bool] = False
    """The program takes the task's system prompt separately (else it is folded into the prompt)."""
    SUPPORTS_MCP: ClassVar[bool] = False
    SUPPORTS_TOOL_INTERCEPTION: ClassVar[bool] = False
    SUPPORTS_RESUME: ClassVar[bool] = False
    EXECUTES_CODE: ClassVar[bool] = True
    SUPPORTS_SKILLS: ClassVar[bool] = False
    NEEDS_CONTAINER: ClassVar[bool] = True
    """A third-party program: run it isolated (vf's `sandbox` or `docker` runtime), never on the
    host. A rollout whose runtime is not isolated (`subprocess`) fails at setup with a
    `HarnessError` (`check_isolation`); running such a program on the host on purpose takes a
    subclass that sets this False."""
    NEEDS_RUNTIME: ClassVar[bool] = True

    def __init__(self, config: ConfigT):
        self.config = config

    @classmethod
    def config_class(cls) -> type[HarnessConfig]:
        return concrete_type(cls, HarnessConfig, HarnessConfig)

    def resolve_prompt(self, task: TaskData) -> tuple[str | None, Any]:
        """(system prompt, prompt) as this program takes them: a program that cannot take a
        separate system prompt gets it folded in front of a text prompt."""
        prompt, system = task.prompt, task.system_prompt
        if system is None or self.APPENDS_SYSTEM_PROMPT:
            return system if self.APPENDS_SYSTEM_PROMPT else None, prompt
        if not isinstance(prompt, str):
            raise TypeError(f"harness {self.config.id!r} cannot fold a system prompt into a "
                            f"{'Messages' if prompt is not None else 'None'} prompt; set APPENDS_SYSTEM_PROMPT")
        return None, f"{system}\n\n{prompt}"

    def resolve_text_prompt(self, task: TaskData) -> tuple[str | None, str | None]:
        system, prompt = self.resolve_prompt(task)
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError(f"harness {self.config.id!r} takes a text prompt only")
        return system, prompt

    def check_isolation(self, runtime: Runtime) -> None:
        """HarnessError when this program needs isolation (`NEEDS_CONTAINER`) and `runtime` runs
        commands on the host, as verifiers refuses it."""
        if self.NEEDS_CONTAINER and not getattr(runtime, "ISOLATED", True):
            raise HarnessError(
                f"harness {self.config.id!r} runs a third-party program, which needs an isolated runtime "
                f"(NEEDS_CONTAINER), and runtime {getattr(runtime, 'type', '?')!r} runs it on this host",
                hint="use --env.agent.runtime.type sandbox (the default) or docker; to run it on the host on "
                     "purpose, name a subclass of the harness that sets NEEDS_CONTAINER = False")

    async def setup(self, runtime: Runtime) -> None:
        """Install the program in `runtime` (before the agent's time starts)."""

    async def cleanup(self, trace: Trace, runtime: Runtime) -> None:
        """Remove per-rollout state the harness left (after scoring). Idempotent."""

    @abstractmethod
    async def launch(self, ctx: ModelContext, trace: Trace, runtime: Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: TaskData) -> ProgramResult:
        """Run the program to completion; every model call goes to `endpoint` with `secret`."""

    async def check_result(self, trace: Trace, runtime: Runtime, result: ProgramResult) -> None:
        """A failed program is an error on the trace, named by where it broke."""
        if getattr(result, "limit", None) in ROLLOUT_LIMITS:  # it filled its runtime (killed, or exited
            raise RuntimeLimitError(result)  # 0 before the check saw it): the sandbox's error, as bash's
        if trace.stop_condition is not None or result.exit_code == 0:
            return  # a cap or stop ended it: its exit is expected
        detail = (result.stderr or result.stdout).strip()[-2000:] or "<no output>"
        if not await runtime.alive():
            raise SandboxError(f"runtime died under harness {self.config.id!r} (exit {result.exit_code}): {detail}")
        if result.exit_code == MODEL_TRANSPORT_ERROR_EXIT_CODE:
            raise InterceptionError(f"harness {self.config.id!r} could not reach the interception server: {detail}")
        if getattr(result, "timed_out", False):
            raise HarnessError(f"harness {self.config.id!r} program timed out: {detail}")
        raise HarnessError(f"harness {self.config.id!r} exited {result.exit_code}: {detail}")


# ---- harness ids ------------------------------------------------------------------------------

ENTRY_POINTS = "vf.harnesses"


def _exported_harness(module, where: str) -> type[Harness]:
    found = exported_subclasses(module, Harness)
    if len(found) != 1:
        raise UsageError(f"{where} exports {len(found)} Harness subclasses, not exactly one",
                         hint="list it in the module's __all__, or name it: --env.agent.harness.id module:Class")
    return found[0]


def harness_class(harness_id: str) -> type[Harness] | None:
    """The program harness an id names (None: not found). An id that imports a file or a module
    that is neither built in nor registered is refused while the config came from a run dir
    (vf.loading.guard_code: `vf-eval --resume` without the trust flag)."""
    from vf.loading import guard_code, import_path

    if ":" in harness_id:
        target, _, attr = harness_id.rpartition(":")
        guard_code("harness", harness_id)
        if target.endswith(".py"):
            module = import_path(Path(target))
        else:
            module = importlib.import_module(target)
        cls = getattr(module, attr, None)
        if not (isinstance(cls, type) and issubclass(cls, Harness)):
            raise UsageError(f"{harness_id}: not a vf.harness.Harness subclass")
        return cls
    name = harness_id.split("/")[-1].split("@")[0].lower().replace("-", "_")
    if not name.isidentifier():
        return None
    for point in entry_points(group=ENTRY_POINTS):
        if point.name in (harness_id, name):
            return point.load()
    for module_name in (f"vf.harnesses.{name}", name):
        if module_name == name:
            guard_code("harness", harness_id)  # any installed module: not a built-in, not registered
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
                continue  # that module does not exist (an import error inside it is the user's)
            raise
        return _exported_harness(module, module_name)
    return None


def build_program_harness(cls: type[Harness], config: HarnessConfig) -> Harness:
    """`cls` with its own config class validated from the seat's harness section."""
    fields = config.model_dump()
    fields.update(config.model_extra or {})
    try:
        return cls(cls.config_class().model_validate(fields))
    except ValueError as e:
        raise ConfigError([f"env.agent.harness: {e}"]) from None


# ---- the rollout's side ---------------------------------------------------------------------------

class RunInterception:
    """The run's interception server, started when the first program rollout needs it (most
    runs never do) and stopped with the run. Its socket directory is its own (vf.interception);
    `config` its limits and budgets (None: InterceptionConfig's defaults)."""

    def __init__(self, config: InterceptionConfig | None = None):
        self.config = config
        self._server: InterceptionServer | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> InterceptionServer:
        async with self._lock:
            if self._server is None:
                server = InterceptionServer(self.config)
                await server.start()
                self._server = server
        return self._server

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None


def flat_tools_to_functions(tools: list | None) -> list[dict[str, Any]] | None:
    """A call's tools (verifiers' flat `Tool`) as the OpenAI function schemas engines render
    (the trace's one converter, `vf.trace.nested_tool`)."""
    if not tools:
        return None
    return [nested_tool({**t.model_dump(exclude_none=True),
                         "parameters": t.parameters or {"type": "object", "properties": {}}}) for t in tools]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two provider messages say the same thing (dialects differ in empty fields)."""
    def key(m):
        calls = [ToolCall.model_validate(c) for c in m.get("tool_calls") or []]
        calls = [(c.name, c.arguments) for c in calls]
        return m.get("role"), content_text(m.get("content")).strip(), calls, m.get("tool_call_id")
    return key(a) == key(b)


class ProgramDriver:
    """Runs a program harness for one rollout: registration, launch, and answering its calls."""

    def __init__(self, rollout: Rollout, server):
        self.rollout, self.server = rollout, server
        self.intercept = rollout.intercept
        self.seen_as: dict[int, dict[str, Any]] = {}
        """Reply node → the message a response hook turned it into (what the program saw)."""
        self.prepared: Counter[str] = Counter()
        """User messages the request hooks rewrote before launch: not rewritten again when sent."""
        self.pinned: dict[str, dict[str, Any]] = {}
        """tool_call_id → the tool result a request hook rewrote (kept on later calls)."""
        self.error: RolloutError | None = None
        """The last call's failure (a hook's, the policy's): the program only sees an HTTP error, so
        when it then fails, this is recorded instead of its exit (verifiers' `session.error`)."""
        self.secret = ""
        """The rollout's key: blanked wherever the program echoes it (`_blank`)."""
        self.budget = RecordBudget(1 << 62, RunBudget(1 << 62))
        """Bytes the trace may still take from the program's calls: the server's, once registered
        (vf.interception.budget)."""
        self.one_call = asyncio.Lock()
        """Calls are answered one at a time: each is a turn on the one trace (its caps, nodes and
        tokens), so a program's concurrent calls queue (past the server's in-flight cap: 429)."""

    async def run(self) -> None:
        rollout = self.rollout
        harness: Harness = rollout.spec.harness
        registration = self.server.register(self._answer_stashing)
        self.secret = registration.secret
        self.budget = self.server.budget(registration.secret) or self.budget
        self.server.on_refused(registration.secret, self._refused)
        try:
            endpoint = rollout.runtime.model_endpoint(registration.url, registration.socket)
            ctx = ModelContext(model=rollout.spec.model, client=rollout.spec.engine,
                               sampling=rollout.spec.sampling.to_dict())
            async with program_tool_urls(task_toolsets(rollout.task), rollout.runtime) as mcp_urls:
                result = await harness.launch(ctx, rollout.trace, rollout.runtime, endpoint, registration.secret,
                                              mcp_urls, await self._prepare(rollout.task.data))
            if self.secret and self.secret in result.stdout + result.stderr:  # it logged its headers
                result = dataclasses.replace(result, stdout=self._blank(result.stdout),
                                             stderr=self._blank(result.stderr))
            try:
                await harness.check_result(rollout.trace, rollout.runtime, result)
            except RolloutError as e:
                if self.error is None:
                    raise
                raise self.error from e  # what broke, not the exit it caused
        finally:
            self.server.unregister(registration.secret)

    async def _answer_stashing(self, call: Call) -> Response:
        self.error = None  # a call that succeeds after a failed one: the program handled it
        try:
            return await self.answer(call)
        except RolloutError as e:
            self.error = e
            raise

    MAX_REFUSED_RECORDS = 16
    """Refused calls listed on the trace (`info["refused_calls"]`); past it they are only counted."""

    def _refused(self, status: int, message: str) -> None:
        """A call the server refused before answering it (malformed, an image by URL): on the trace."""
        info = self.rollout.trace.info
        info["refused_calls_total"] = info.get("refused_calls_total", 0) + 1
        listed = info.setdefault("refused_calls", [])
        if len(listed) < self.MAX_REFUSED_RECORDS:
            listed.append({"status": status, "message": self._blank(message)[:300]})

    def _blank(self, text: str) -> str:
        """`text` with the rollout's key blanked (the program may print it, or a tool its env)."""
        return text.replace(self.secret, "***")

    async def answer(self, call: Call) -> Response:
        """One intercepted model call → the policy's reply, recorded on the trace."""
        async with self.one_call:
            return await self._answer(call)

    async def _answer(self, call: Call) -> Response:
        rollout = self.rollout
        if rollout.done:
            raise DialectError(f"the rollout has ended ({rollout.trace.stop_condition})", status=400)
        if cap := rollout._cap_reached():
            rollout.finish(cap)
            raise DialectError(f"the rollout has ended ({cap})", status=400)
        async with boundary(TaskError, "request interception failed"):  # a hook's bug: the task's error
            request, stopped = await self._rewrite(call.request)
        messages = [to_wire(m) for m in request.messages]
        messages = [self.pinned.get(m.get("tool_call_id"), m) if m.get("role") == "tool" else m for m in messages]
        if self.secret and self.secret in (wire := json.dumps(messages)):  # a tool ran `env`: the key never
            messages = json.loads(self._blank(wire))  # reaches the policy or the trace (url-safe: no escapes)
        tools = flat_tools_to_functions(request.tools)
        if tools and self.secret and self.secret in (wire := json.dumps(tools)):  # nor from a tool's definition
            tools = json.loads(self._blank(wire))
        shared = self._shared(messages)
        new_tools = tools if tools and not rollout.trace.tools else None
        cost = sum(recorded_size(m) for m in messages[shared:]) + (recorded_size(new_tools) if new_tools else 0)
        try:  # checked before anything of the call is kept (vf.interception.budget)
            self.budget.charge(cost, f"this call ({len(messages) - shared} new messages)")
        except InterceptionLimitError as e:
            rollout.fail(e, "limit")
            raise DialectError(e.message, status=413) from None
        if new_tools:
            rollout.trace.tools = tools
        self._extend(messages, shared)
        if stopped:  # as verifiers: the prompt is kept, the program is refused
            rollout.finish(stopped)
            raise DialectError(f"the rollout has ended ({stopped})", status=400)
        max_tokens = call.sampling.get("max_tokens")
        result = await rollout.generate(messages, tools, max_tokens=max_tokens if isinstance(max_tokens, int) else None)
        self.budget.add(recorded_size(rollout.trace.nodes[rollout.trace.calls[-1].node].message))  # the reply
        policy = self._response(result, call.model)
        async with boundary(TaskError, "response interception failed"):
            response, stopped = await self.intercept.response(policy)
        if response != policy:
            # the trace keeps what the program was given (as verifiers records it), the node's
            # tokens the policy's own sample; the program resends the rewrite, which matches it
            node = rollout.trace.calls[-1].node
            self.seen_as[node] = rollout.trace.nodes[node].message = to_wire(response.message)
        if stopped is None and response.message.tool_calls and self.intercept.gates_tools:
            async with boundary(TaskError, "request interception failed"):  # the gate runs the request hooks
                stopped = await self._gate(response)
        if stopped:
            rollout.finish(stopped)
            raise DialectError(f"the rollout has ended ({stopped})", status=400)
        await rollout._check_stops()
        return response

    async def _gate(self, response: Response) -> str | None:
        """The tool gate (vf.intercept) for a program that runs its calls itself: vf's programs
        cannot be told to skip one, so a hook that rewrites a call's result ends the rollout
        before the call runs, named by that hook (as verifiers does for such a harness)."""
        rollout = self.rollout
        for call in response.message.tool_calls or []:
            probe = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": ""}
            verdict, stopped = await self.intercept.gate(rollout._request([probe]))
            if stopped or verdict is not None:
                return stopped or rollout.trace.info["intercepts"][-1]["hook"]
        return None

    async def _prepare(self, data: TaskData) -> TaskData:
        """The prompt as the request hooks rewrite it, given to the program (verifiers'
        `prepare_users`): a program keeps and resends its own copy, so it must hold the rewrite."""
        if not self.intercept.request_hooks or data.prompt is None:
            return data
        prompt = data.prompt
        messages = [UserMessage(content=prompt)] if isinstance(prompt, str) else [parse_message(m) for m in prompt]
        request, _ = await self.intercept.request(Request(messages=messages), set(range(len(messages))), stops=False)
        self.prepared.update(json.dumps(to_wire(m), sort_keys=True) for m in request.messages if m.role == "user")
        if isinstance(prompt, str) and isinstance(request.messages[0].content, str):
            return data.model_copy(update={"prompt": request.messages[0].content})
        return data.model_copy(update={"prompt": request.messages})

    async def _rewrite(self, request: Request) -> tuple[Request, str | None]:
        """Request hooks and stops (vf.intercept): only the messages new to the trace may change;
        a rewritten tool result is kept on later calls."""
        if not self.intercept.gates_tools:
            return request, None
        known = len(self.rollout.trace.branch())
        new = set()
        for i in range(known, len(request.messages)):
            key = json.dumps(to_wire(request.messages[i]), sort_keys=True)
            if request.messages[i].role == "user" and self.prepared[key]:
                self.prepared[key] -= 1  # rewritten before launch already
            else:
                new.add(i)
        changed, stopped = await self.intercept.request(request, new)
        for before, after in zip(request.messages, changed.messages):
            if before != after and after.role == "tool":
                self.pinned[after.tool_call_id] = to_wire(after)
        return changed, stopped

    def _shared(self, messages: list[dict[str, Any]]) -> int:
        """How many of the call's messages the latest branch already holds (`_extend` adds the rest)."""
        trace = self.rollout.trace
        branch = trace.branch()
        shared = 0
        while shared < min(len(branch), len(messages)):
            node = branch[shared]
            if not any(_same(m, messages[shared]) for m in (trace.nodes[node].message, self.seen_as.get(node))
                       if m is not None):
                break
            shared += 1
        if shared == len(messages) < len(branch):  # an earlier prompt again (a retry, concurrent calls): its
            shared -= 1  # last message again on a new branch, so the reply follows it, not the earlier reply
        return shared

    def _extend(self, messages: list[dict[str, Any]], shared: int) -> None:
        """Put the call's prompt on the trace: what extends the latest branch (past its first
        `shared` messages, `_shared`) is appended; a rewritten history branches off at the last
        message both share."""
        branch = self.rollout.trace.branch()
        parent = branch[shared - 1] if shared else None
        if shared < len(branch):
            self.rollout.restart_tokens()
        for message in messages[shared:]:
            parent = self.rollout.add(message, parent=parent)

    @staticmethod
    def _response(result, model: str) -> Response:
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


