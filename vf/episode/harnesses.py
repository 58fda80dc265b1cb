"""The harness a seat runs in (`--env.agent.harness.id`), and the seat that drives it.

    null   the plain chat loop: the task's prompt, the model's replies, and the task's
           toolsets offered as function calls (verifiers' `null` harness)
    bash   the same loop plus a `bash` tool whose commands run in the rollout's runtime
           (`--env.agent.runtime.type`, a `vf.runtime` type; one runtime per rollout)
    other  a program harness (`vf.harness.Harness`): a built-in (`vf.harnesses.<id>`), an
           installed package's `vf.harnesses` entry point, a module exporting exactly one
           `Harness` subclass, or `module:Class` / `path/file.py:Class`. The last three import
           host code: from a config a run dir holds (`--resume`) they need the user's word
           (vf.imports.guard_code).

`seat_for` pairs a harness with what drives it: the in-process loop (vf.episode.loop) for `null`
and `bash`, a program driver (vf.episode.program) for a program harness. The rollout only knows
the seat's three steps (open, drive, cleanup), never which kind it has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from vf.configs.harness import HarnessConfig
from vf.episode.loop import InProcessLoop
from vf.episode.program import ProgramSeat
from vf.errors import ConfigError, UsageError
from vf.harness import Harness
from vf.imports import import_plugin
from vf.runtime.base import ROLLOUT_LIMITS, RuntimeLimitError
from vf.toolset import ToolError
from vf.utils.exports import exported_subclasses

if TYPE_CHECKING:
    from vf.episode.rollout import Rollout, Seat, SeatSpec

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


def seat_for(spec: SeatSpec) -> Seat:
    """What drives a rollout of `spec`: a program driver for a program harness, else the
    in-process loop around the seat's harness."""
    if isinstance(spec.harness, Harness):
        return ProgramSeat(spec.harness, spec.interception)
    return InProcessLoop(spec.harness)


# ---- program harness ids ------------------------------------------------------------------------

ENTRY_POINTS = "vf.harnesses"


def _exported_harness(module, where: str) -> type[Harness]:
    found = exported_subclasses(module, Harness)
    if len(found) != 1:
        raise UsageError(f"{where} exports {len(found)} Harness subclasses, not exactly one",
                         hint="list it in the module's __all__, or name it: --env.agent.harness.id module:Class")
    return found[0]


def harness_class(harness_id: str) -> type[Harness] | None:
    """The program harness an id names (None: not found), in the plugin grammar every resolver
    shares (vf.imports.import_plugin): a built-in `vf.harnesses.<id>`, an installed package's
    `vf.harnesses` entry point, `module:Class` / `path/file.py:Class`, a file, or an installed
    module exporting exactly one `Harness` subclass. The last ones import host code: from a config
    a run dir holds they need the user's word (vf.imports.guard_code)."""
    found = import_plugin("harness", harness_id, builtin="vf.harnesses", group=ENTRY_POINTS)
    if found is None:
        return None
    module, attr = found
    if attr is None:
        return _exported_harness(module, module.__name__)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Harness)):
        raise UsageError(f"{harness_id}: not a vf.harness.Harness subclass")
    return cls


def build_program_harness(cls: type[Harness], config: HarnessConfig) -> Harness:
    """`cls` with its own config class validated from the seat's harness section."""
    fields = config.model_dump()
    fields.update(config.model_extra or {})
    try:
        config = cls.config_class().model_validate(fields)
    except ValueError as e:
        raise ConfigError([f"env.agent.harness: {e}"]) from None
    try:
        return cls(config)
    except TypeError as e:  # an abstract method left out, or a constructor that takes other arguments
        raise UsageError(f"harness {config.id!r} ({cls.__module__}.{cls.__qualname__}) cannot be built: {e}",
                         hint="a vf.harness.Harness subclass implements launch() and takes its config "
                              "(docs/agents.md)") from None
