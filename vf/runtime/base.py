"""The runtime interface, its config, and the registry of runtime types."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field

from vf import reaper
from vf.errors import SandboxError, UsageError
from vf.runtime import uv_script
from vf.runtime.files import DIR_FLAGS, parts_beneath, read_beneath, write_beneath


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
    """Largest file a command may write, in MiB (sandbox; never more than `disk_mb`)."""
    disk_mb: int = Field(4096, gt=0)
    """Disk the working directory may use in all, in MiB (every type): checked while a command
    runs (`du`, a few times a second) and when it ends; past it the command is killed and its
    result carries `limit="disk"`. A fast writer may get a fraction of a second past it."""
    tmp_mb: int = Field(512, gt=0)
    """Size of the sandbox's private /tmp in MiB (sandbox: a size-capped tmpfs, so it is host
    memory, freed when the command ends). A command that fills it gets `limit="disk"`."""
    max_read_mb: int = Field(64, gt=0)
    """Largest file `read()` returns when its caller names no `max_bytes`, in MiB (every type): a
    command can make a file of any size, even a sparse one that costs it nothing, and a hook
    that reads it must not take the host's memory."""
    total_memory_mb: int = Field(4096, gt=0)
    """Memory all of a command's processes may hold together in MiB (sandbox: the sum of their
    resident memory, checked a few times a second), on top of `memory_mb` per process. Past it
    the command is killed and its result carries `limit="total_memory"`."""
    network_allow: list[str] = Field(default_factory=list)
    """Hosts the command may reach. Empty = no network at all; any entry gives the host's network
    (bubblewrap cannot filter by host, so a non-empty list is all-or-nothing: the task's
    `network_allow` decides)."""
    read_only_paths: list[str] = Field(default_factory=list)
    """Extra host paths visible read-only inside the sandbox (e.g. a virtualenv a hook needs)."""
    image: str = "python:3.11-slim"
    """Container image (docker)."""


LIMITS = ("wall_time", "cpu_time", "memory", "processes", "output", "disk", "total_memory")
ROLLOUT_LIMITS = ("disk", "total_memory")
"""Limits on what a rollout holds in all (not one command's own): a harness ends the rollout."""
PROGRAM_TIMEOUT = 86400.0
"""A harness's main program has no wall-time limit of its own: the rollout's agent budget ends it."""
SYSTEM_DIRECTORIES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/proc", "/dev", "/sys", "/tmp",
                      "/run")
"""What `add_directory` may not cover: the system every command runs on, and the runtime's own mounts."""


class RuntimeLimitError(SandboxError):
    """A command hit one of its runtime's limits (see `CommandResult.limit`). A `SandboxError`
    (verifiers' taxonomy); a rollout it ends stops as `limit`, vf's own condition."""

    STOP_CONDITION = "limit"

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


ProgramResult = CommandResult
"""verifiers 0.4's name for one program run (`ProgramResult(exit_code, stdout, stderr)`)."""


class Runtime(ABC):
    """One rollout's place to run commands: a working directory plus the processes in it."""

    type: ClassVar[str]
    ISOLATED: ClassVar[bool] = False
    """Whether a command runs isolated from the host (its files, network, processes): what a
    harness with `NEEDS_CONTAINER` (a third-party program) must have."""
    RESOURCES: ClassVar[dict[str, str]] = {}
    """`TaskData.resources` field → the `RuntimeConfig` limit (MiB) by which this type enforces it
    (vf.runtime.resources); the others are ignored, with a warning."""
    RESERVED: ClassVar[tuple[str, ...]] = ()
    """Paths this type mounts for itself, which `add_directory` may not cover (docker: /workspace)."""

    def __init__(self, config: RuntimeConfig, workdir: Path | None = None):
        self.config = config
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"vf-{self.type}-"))
        if self._owns_workdir:  # removed by vf's reaper if vf is killed before close()
            reaper.watch_dir(str(self.workdir))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._root_fd: int | None = os.open(self.workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        """Every host-side file access starts here (vf.runtime.files), never at a path."""
        self.env: dict[str, str] = {}
        """Variables every command gets beneath its own (verifiers' `runtime.env`: the task's)."""
        self.user: str | None = None
        """verifiers' `runtime.user`: vf runs every command as the runtime's one user (None)."""
        self.directories: dict[str, str] = {}
        """`add_directory`'s directories: the absolute path commands see → its folder's name."""
        self._folders: Path | None = None
        self._folders_fd: int | None = None

    @abstractmethod
    async def run(self, command: str | list[str], env: dict[str, str] | None = None, *,
                  timeout: float | None = None, cwd: str | None = None,
                  input: str | None = None) -> CommandResult:
        """Run a shell command (a string) or an argv list in the working directory. `env` is
        second and positional, as verifiers' `runtime.run(argv, env)` calls it."""

    async def run_program(self, argv: list[str], env: dict[str, str] | None = None, *,
                          input: str | None = None) -> CommandResult:
        """Run a harness's main program (verifiers' `runtime.run_program(argv, env)`, which harness
        packages call from `launch`): `run` without the per-command time limit."""
        return await self.run(argv, env, timeout=PROGRAM_TIMEOUT, input=input)

    # ---- verifiers 0.4's runtime API for harness packages ------------------------------------
    def process_env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """`runtime.env` with one command's own values on top (verifiers' `process_env`)."""
        return {**self.env, **(env or {})}

    def with_user(self, user: str | None, home: str | None = None) -> Runtime:
        """verifiers' `with_user`: None is this runtime; vf cannot run commands as another user."""
        if user is not None:
            raise UsageError(f"runtime {self.type!r} cannot run commands as another user ({user!r})")
        return self

    @property
    def supports_live_processes(self) -> bool:
        """verifiers' flag for `open_process` (ACP harnesses): vf's runtimes have none."""
        return False

    async def prepare_uv_script(self, script: str | bytes, env: dict[str, str] | None = None, *,
                                activate: bool = True) -> list[str]:
        """verifiers' `prepare_uv_script`: an argv that runs the PEP 723 `script`, its
        dependencies resolved and installed on the host once (cached) and mounted read-only,
        so the runtime needs no network (vf.runtime.uv_script). `activate=False` runs the bare
        interpreter (its environment's variables stay out of the script's children)."""
        prepared = await asyncio.to_thread(uv_script.prepare, script, env)
        for path in prepared.mounts:
            self.add_read_only(path)
        return prepared.argv(activate)

    async def run_uv_script(self, script: str | bytes, args: list[str] | None = None,
                            env: dict[str, str] | None = None) -> CommandResult:
        """verifiers' `run_uv_script`: prepare `script`, then run it with `args` (a command's
        time limit applies)."""
        argv = await self.prepare_uv_script(script, env)
        return await self.run([*argv, *(args or [])], env or {})

    async def write(self, path: str, data: str | bytes) -> None:
        """Put `data` at `path` (parents made as needed). A symlink or hard link at that name is
        replaced, never written through (vf.runtime.files)."""
        write_beneath(*self._locate(path), path, data.encode() if isinstance(data, str) else data,
                      owner=self._file_owner())

    async def read(self, path: str, max_bytes: int | None = None) -> bytes:
        """The file's bytes, as verifiers' `runtime.read` returns them. A file larger than
        `max_bytes` (default: `max_read_mb`), a symlink anywhere in the path, a hard link or
        anything but a regular file raises UsageError (the command may have put anything there;
        vf.runtime.files)."""
        cap = max_bytes if max_bytes is not None else self.config.max_read_mb << 20
        return read_beneath(*self._locate(path), path, cap)

    def add_directory(self, path: str) -> None:
        """Give later commands an empty, writable directory at the absolute `path` (a Harbor task's
        /app, /tests, /logs/verifier), replacing what an earlier call put there: a verifier's
        folder added after the agent stopped holds nothing the agent left. `write`, `read` and
        `run(cwd=...)` reach it by `path`.

        Its folder lives on the host outside the working directory, in a directory of vf's that
        no command sees, so a command can neither swap it for a link to a host path nor read the
        next one; its disk use counts against `disk_mb`, and `close()` removes it. Only runtimes
        that isolate their commands can show them a directory at a path of its own (a host
        process would get the host's /app): the others raise SandboxUnavailable. The system
        directories and the working directory's own path are refused (UsageError)."""
        inside = self._directory_path(path)
        if not self.ISOLATED:
            raise SandboxUnavailable(f"runtime {self.type!r} cannot give commands a directory at {inside}: its "
                                     "commands see the host's own files",
                                     hint="use --env.agent.runtime.type sandbox (the default) or docker")
        if self._folders_fd is None:
            self._folders = Path(tempfile.mkdtemp(prefix=f"vf-{self.type}-dirs-"))
            reaper.watch_dir(str(self._folders))
            self._folders.chmod(0o711)  # the command's user (nobody, under root) binds its folders by name
            self._folders_fd = os.open(self._folders, DIR_FLAGS)
        name = secrets.token_hex(8)
        os.mkdir(name, dir_fd=self._folders_fd)
        if (owner := self._file_owner()) is not None:
            os.chown(name, owner, owner, dir_fd=self._folders_fd, follow_symlinks=False)
        old = self.directories.pop(inside, None)
        if old is not None:  # rmtree follows no link a command left in the old folder
            shutil.rmtree(self._folders / old, ignore_errors=True)
        self.directories[inside] = name

    def _directory_path(self, path: str) -> str:
        """`path` as `add_directory` takes it: absolute, without `..`, clear of the system's
        directories and of the working directory (UsageError otherwise)."""
        p = PurePosixPath(path)
        if "\0" in path or not p.is_absolute() or ".." in p.parts or p == PurePosixPath("/"):
            raise UsageError(f"add_directory needs an absolute path below / without '..', not {path!r}")
        inside, work = str(p), str(self.workdir)
        if any(inside == d or inside.startswith(d + "/") or d.startswith(inside + "/") for d in
               (*SYSTEM_DIRECTORIES, *self.RESERVED, work)):
            raise UsageError(f"add_directory({inside!r}) would cover a system directory or the runtime's "
                             "working directory")
        return inside

    def binds(self) -> list[tuple[str, str]]:
        """(host folder, path commands see) of each `add_directory`, parents first."""
        return [(str(self._folders / name), inside) for inside, name in sorted(self.directories.items())]

    def _inside(self, host: str) -> str:
        """The path commands see for the host path `host` (itself unless in an added directory)."""
        for folder, inside in self.binds():
            if host == folder or host.startswith(folder + "/"):
                return inside + host[len(folder):]
        return host

    def _directory_of(self, path: str) -> tuple[str, str] | None:
        """(path commands see, folder name) of the added directory holding the absolute `path`."""
        p = PurePosixPath(path)
        return max(((inside, name) for inside, name in self.directories.items()
                    if p.is_absolute() and p.is_relative_to(inside)), key=lambda d: len(d[0]), default=None)

    def wire_info(self, borrowed: bool = False) -> dict:
        """What a trace records as `agent.runtime`: verifiers' `RuntimeInfo` (a closed union keyed
        by `type`, no extra keys), whose `subprocess` kind is a host process in a host working
        directory, its `id` that directory. The sandbox is that kind too (bubblewrap is host
        processes in the working directory, isolated): verifiers has no `sandbox` kind, and the
        run dir's config.yaml names the runtime vf used."""
        return {"type": "subprocess", "id": str(self.workdir), "borrowed": borrowed}

    def host_url(self, url: str) -> str | None:
        """The URL by which a program inside this runtime reaches `url`, a server on the host's
        loopback (verifiers' `Runtime.host_url`); None where it cannot (no route to the host)."""
        return url

    def model_endpoint(self, url: str, socket: str) -> str:
        """The base URL by which a program inside this runtime reaches the interception server
        that listens at `url` (TCP on the host's loopback) and on the Unix socket `socket`.
        Host processes use `url`; runtimes without the host's network bridge the socket."""
        return url

    def add_read_only(self, path: str) -> None:
        """Let later commands read (never write) the host directory `path` at the same path:
        an agent program installed outside the runtime. Host processes see it already."""

    async def alive(self) -> bool:
        """Whether the runtime can still run commands (a container can die under a program)."""
        return self._root_fd is not None

    async def close(self) -> None:
        """Stop what still runs and remove the working directory (if this runtime made it)."""
        self.release()

    def release(self) -> None:
        """Close the working directory and remove it (if this runtime made it); `close` without
        stopping anything, for a runtime whose commands all ran to their end."""
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None
        if self._folders_fd is not None:
            os.close(self._folders_fd)
            self._folders_fd = None
            shutil.rmtree(self._folders, ignore_errors=True)
            reaper.forget_dir(str(self._folders))
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            reaper.forget_dir(str(self.workdir))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _parts(self, path: str) -> list[str]:
        """`path`'s components below the working directory (relative paths are relative to it)."""
        return parts_beneath(str(self.workdir), str(path))

    def _locate(self, path: str) -> tuple[int, list[str]]:
        """(directory descriptor, components below it) of `path`: in an added directory's folder,
        else in the working directory."""
        held = self._directory_of(str(path))
        if held is None:
            return self._fd(), self._parts(path)
        inside, name = held
        return self._folders_fd, [name, *parts_beneath(inside, str(path))]

    def _resolve(self, path: str) -> Path:
        """A path inside the working directory or an added directory's folder, by name (nothing
        on disk is looked at)."""
        fd, parts = self._locate(path)
        return (self.workdir if fd == self._root_fd else self._folders).joinpath(*parts)

    def _fd(self) -> int:
        if self._root_fd is None:
            raise SandboxError("the runtime is closed")
        return self._root_fd

    def _file_owner(self) -> int | None:
        """Who gets the files `write` makes (None: whoever vf runs as)."""
        return None

    def _cut(self, data: bytes) -> str:
        limit = self.config.max_output_bytes
        text = data[:limit].decode(errors="replace")
        return text + f"\n[output cut at {limit} bytes]" if len(data) > limit else text


_TYPES: dict[str, type[Runtime]] = {}


class SandboxUnavailable(SandboxError, UsageError):
    """The runtime cannot be provisioned on this machine (a tool it needs is missing, a directory
    it needs cannot be reached): a `SandboxError` on the trace, a usage error (exit 2, with a
    hint saying what to install or change) where it reaches a command."""


def register_runtime(cls: type[Runtime]) -> type[Runtime]:
    _TYPES[cls.type] = cls
    return cls
