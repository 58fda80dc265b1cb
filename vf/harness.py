"""The program-harness base class (verifiers 0.4's `verifiers.v1.harness.Harness`, same signatures):
a real agent program plays a seat, and every model call it makes is intercepted, answered by the
seat's policy and recorded on the trace.

A `Harness` installs its program in `setup(runtime)` and runs it in `launch(ctx, trace, runtime,
endpoint, secret, mcp_urls, data)`: the program must send every model call to `endpoint` with
`secret` as its key. `endpoint` is the run's interception server (vf.interception) as seen from
inside the runtime: on the host's loopback for `subprocess`, bridged through a Unix socket into
the `sandbox`, which keeps no network of its own (vf.runtime.bridge). `mcp_urls` are the task's
toolsets as MCP servers the program can reach (none where the runtime has no route to the host).

This module is the authoring API only. What runs a harness is the episode core: the in-process
harnesses (`null`, `bash`) and harness-id resolution are vf.episode.harnesses, driving a program
is vf.episode.program, the rollout it plays is vf.episode.rollout.

Harness ids (`--env.agent.harness.id`): a built-in (`vf.harnesses.<id>`), an installed
package's `vf.harnesses` entry point, a module exporting exactly one `Harness` subclass, or
`module:Class` / `path/file.py:Class` (vf.episode.harnesses.harness_class).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

from vf.clients import ModelContext
from vf.configs.harness import HarnessConfig
from vf.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE, HarnessError, InterceptionError, SandboxError
from vf.rows import TaskData
from vf.runtime import ProgramResult, Runtime
from vf.runtime.base import ROLLOUT_LIMITS, RuntimeLimitError
from vf.taskset import concrete_type
from vf.trace import Trace

__all__ = ["Harness", "HarnessConfig"]

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
