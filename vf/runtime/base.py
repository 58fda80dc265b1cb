"""The runtime interface, its config, and the registry of runtime types."""

from __future__ import annotations

import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from vf.errors import UsageError, VfError


class RuntimeConfig(BaseModel):
    """`--env.agent.runtime.*`: which runtime, and the limits every type honours where it can.

    The default type is `sandbox` (bubblewrap): code a model wrote never runs on the host unasked.
    `subprocess` (no isolation) must be named explicitly.
    """

    model_config = ConfigDict(extra="allow")
    type: str = "sandbox"
    timeout: float = Field(60.0, gt=0)
    """Default wall-time limit in seconds for one `run()`."""
    max_output_bytes: int = Field(1_000_000, gt=0)
    """stdout and stderr are each kept up to this many bytes; a command that writes more is stopped."""
    cpu_time: float | None = Field(None, gt=0)
    """CPU seconds one command may use (sandbox, docker); None = the wall-time limit."""
    memory_mb: int = Field(2048, gt=0)
    """Address-space limit per process in MiB (sandbox), container memory (docker)."""
    max_processes: int = Field(256, gt=0)
    """Processes and threads a command may have at once (sandbox, docker)."""
    max_file_mb: int = Field(1024, gt=0)
    """Largest file a command may write, in MiB (sandbox)."""
    network_allow: list[str] = Field(default_factory=list)
    """Hosts the command may reach. Empty = no network at all; any entry gives the host's network
    (bubblewrap cannot filter by host, so a non-empty list is all-or-nothing: the task's
    `network_allow` decides)."""
    read_only_paths: list[str] = Field(default_factory=list)
    """Extra host paths visible read-only inside the sandbox (e.g. a virtualenv a hook needs)."""
    image: str = "python:3.11-slim"
    """Container image (docker)."""


LIMITS = ("wall_time", "cpu_time", "memory", "processes", "output")


class RuntimeLimitError(VfError):
    """A command hit one of its runtime's limits (see `CommandResult.limit`)."""

    def __init__(self, result: CommandResult):
        super().__init__(f"command stopped: {result.limit} limit reached (exit code {result.exit_code})")
        self.result = result
        self.limit = result.limit


@dataclass
class CommandResult:
    """What one `run()` produced. A command killed at its time limit has `timed_out` set; any limit
    it hit is named in `limit` (one of `LIMITS`)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    limit: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.limit is None

    def raise_for_limit(self) -> CommandResult:
        """Raise `RuntimeLimitError` if a limit stopped the command (for hooks that want an error)."""
        if self.limit is not None:
            raise RuntimeLimitError(self)
        return self


class Runtime(ABC):
    """One rollout's place to run commands: a working directory plus the processes in it."""

    type: ClassVar[str]

    def __init__(self, config: RuntimeConfig, workdir: Path | None = None):
        self.config = config
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"vf-{self.type}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)

    @abstractmethod
    async def run(self, command: str | list[str], env: dict[str, str] | None = None, *,
                  timeout: float | None = None, cwd: str | None = None,
                  input: str | None = None) -> CommandResult:
        """Run a shell command (a string) or an argv list in the working directory. `env` is
        second and positional, as verifiers' `runtime.run(argv, env)` calls it."""

    async def write(self, path: str, data: str | bytes) -> None:
        target = self._resolve(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes, as verifiers' `runtime.read` returns them; more than `max_bytes`
        raises (a file written by something we do not control)."""
        target = self._resolve(path)
        if max_bytes is not None and target.stat().st_size > max_bytes:
            raise UsageError(f"{path} is larger than max_bytes={max_bytes}")
        return target.read_bytes()

    async def close(self) -> None:
        """Stop what still runs and remove the working directory (if this runtime made it)."""
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _resolve(self, path: str) -> Path:
        """A path inside the working directory; relative paths are relative to it."""
        p = Path(path)
        p = p if p.is_absolute() else self.workdir / p
        resolved = p.resolve()
        if not resolved.is_relative_to(self.workdir.resolve()):
            raise UsageError(f"path {path!r} lies outside the runtime's working directory")
        return resolved

    def _cut(self, data: bytes) -> str:
        limit = self.config.max_output_bytes
        text = data[:limit].decode(errors="replace")
        return text + f"\n[output cut at {limit} bytes]" if len(data) > limit else text


_TYPES: dict[str, type[Runtime]] = {}


def register_runtime(cls: type[Runtime]) -> type[Runtime]:
    _TYPES[cls.type] = cls
    return cls


def make_runtime(config: RuntimeConfig | dict | None = None, workdir: Path | None = None) -> Runtime:
    config = config if isinstance(config, RuntimeConfig) else RuntimeConfig(**(config or {}))
    from vf.runtime import docker, sandbox, subprocess  # noqa: F401  (register their types)

    if config.type not in _TYPES:
        raise UsageError(f"unknown runtime type {config.type!r}",
                         hint=f"choose one of: {', '.join(sorted(_TYPES))}")
    return _TYPES[config.type](config, workdir)
