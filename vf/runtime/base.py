"""The runtime interface, its config, and the registry of runtime types."""

from __future__ import annotations

import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from vf.errors import UsageError


class RuntimeConfig(BaseModel):
    """`--env.agent.runtime.*`: which runtime, and the limits every type honours where it can."""

    model_config = ConfigDict(extra="allow")
    type: str = "subprocess"
    timeout: float = Field(60.0, gt=0)
    """Default wall-time limit in seconds for one `run()`."""
    max_output_bytes: int = Field(1_000_000, gt=0)
    """stdout and stderr are each cut to this many bytes (the rest is dropped, marked)."""


@dataclass
class CommandResult:
    """What one `run()` produced. A command killed at its time limit has `timed_out` set."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Runtime(ABC):
    """One rollout's place to run commands: a working directory plus the processes in it."""

    type: ClassVar[str]

    def __init__(self, config: RuntimeConfig, workdir: Path | None = None):
        self.config = config
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"vf-{self.type}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)

    @abstractmethod
    async def run(self, command: str | list[str], *, timeout: float | None = None,
                  env: dict[str, str] | None = None, cwd: str | None = None,
                  input: str | None = None) -> CommandResult:
        """Run a shell command (a string) or an argv list in the working directory."""

    async def write(self, path: str, data: str | bytes) -> None:
        target = self._resolve(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    async def read(self, path: str) -> str:
        return self._resolve(path).read_text(errors="replace")

    async def close(self) -> None:
        """Stop what still runs and remove the working directory (if this runtime made it)."""
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def __aenter__(self) -> "Runtime":
        return self

    async def __aexit__(self, *exc: Any) -> None:
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
    from vf.runtime import subprocess as _  # noqa: F401  (registers `subprocess`)

    if config.type not in _TYPES:
        raise UsageError(f"unknown runtime type {config.type!r}",
                         hint=f"choose one of: {', '.join(sorted(_TYPES))}")
    return _TYPES[config.type](config, workdir)
