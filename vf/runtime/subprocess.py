"""`subprocess`: commands run as plain host processes. No isolation: for debugging and trusted code.

Each command starts in its own process session so that a limit, a cancelled call (the caller's
own timeout) or `close()` kills the whole tree it spawned, not just the shell, before `run()`
returns. Output is read as it arrives and the command is stopped once it writes more than
`max_output_bytes` (a `yes` must not fill the host's memory); the working directory's disk use
is checked (`du`) while it runs and when it ends, and it is stopped past `disk_mb`.
The sandbox and docker runtimes reuse all of this and only change what is started (`_argv`),
with which environment (`_env`) and as whom (`_spawn_kwargs`).
`vf.reaper` kills a command's process group if vf itself is killed first.

What a command detaches from its group (`setsid`, a double fork) outlives `close()` here, as a
host process does, but not vf: `close()` finds the processes its commands left (working in its
directory, or carrying its `VF_RUNTIME_DIR` mark in their environment) and vf kills them when it
exits (by pidfd, so a recycled pid is never hit). A daemon that changed both is beyond reach:
this runtime is no isolation.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import sys
import time
from typing import ClassVar

from vf import reaper
from vf.errors import SandboxError
from vf.runtime.base import CommandResult, Runtime, register_runtime

_warned = False
POLL = 0.1
"""Seconds between checks of a running command's disk (and, in the sandbox, memory) use."""
MARK = "VF_RUNTIME_DIR"
"""In every command's environment: the runtime's working directory (`leftovers` finds it)."""
_left: list[int] = []
"""pidfds of processes closed runtimes left running: killed when vf exits (`_kill_left`)."""


def _kill_left() -> None:
    while _left:
        fd = _left.pop()
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


atexit.register(_kill_left)


def leftovers(workdir: str) -> list[int]:
    """Live processes (not vf) working in `workdir` or below, or whose environment carries its
    mark: what a runtime's commands left behind."""
    mark, me, found = f"{MARK}={workdir}".encode(), os.getpid(), []
    for name in filter(str.isdigit, os.listdir("/proc")):
        pid = int(name)
        if pid == me:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if cwd == workdir or cwd.startswith(workdir + "/") or mark in environ:
            found.append(pid)
    return found


@register_runtime
class SubprocessRuntime(Runtime):
    type = "subprocess"
    BACKGROUND_OUTLIVES: ClassVar[bool] = True
    RESOURCES: ClassVar[dict[str, str]] = {"disk": "disk_mb"}  # `du`; nothing else is enforced on the host
    """Whether what a command left in the background lives on after it exits (on the host: until
    `close()` kills its group); a runtime whose commands take it all with them says False."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._groups: set[int] = set()
        """Process groups started here; background children can outlive their shell."""
        self._warn()

    def _warn(self) -> None:
        """One line per process (a run), so nobody mistakes this for isolation."""
        global _warned
        if not _warned:
            _warned = True
            print("vf: warning: runtime 'subprocess' runs model-written commands on this host with your "
                  "files, network and environment (no sandbox); use it only for trusted code", file=sys.stderr)

    def _argv(self, command: str | list[str], cwd: str, timeout: float) -> list[str]:
        """The argv to start (`timeout`: this call's wall-time limit); other runtimes wrap it
        (sandbox, container)."""
        return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        return {**os.environ, **(env or {}), MARK: str(self.workdir)}

    def _spawn_kwargs(self) -> dict:
        return {}

    async def run(self, command, env=None, *, timeout=None, cwd=None, input=None) -> CommandResult:
        cwd_path = str(self._resolve(cwd) if cwd else self.workdir)
        timeout = timeout or self.config.timeout
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(command, cwd_path, timeout), env=self._env(self.process_env(env)),
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
                **{"cwd": cwd_path, **self._spawn_kwargs()})
        except OSError as e:  # no such cwd, out of processes or fds: the runtime failed, not the command
            raise SandboxError(f"{self.type} runtime could not start the command: {e}") from e
        self._groups.add(proc.pid)
        reaper.watch(proc.pid)
        cap = self.config.max_output_bytes
        out, err = bytearray(), bytearray()
        limit: list[str] = []

        def stop(reason: str) -> None:
            if not limit:
                limit.append(reason)
            self._kill(proc.pid)

        async def drain(stream, buf: bytearray) -> None:
            while chunk := await stream.read(1 << 16):
                buf += chunk[: cap + 1 - len(buf)]
                if len(buf) > cap:
                    stop("output")

        async def feed() -> None:
            if input is not None:
                try:
                    proc.stdin.write(input.encode())
                    await proc.stdin.drain()
                    proc.stdin.close()
                except (BrokenPipeError, ConnectionResetError):
                    pass

        async def watch() -> None:
            spent = 0.0
            while True:
                # a few checks a second, but never more than a fifth of the time (a big tree)
                await asyncio.sleep(max(POLL, 4 * spent))
                started = time.monotonic()
                if over := await self._over_limit(proc):
                    stop(over)
                    return
                spent = time.monotonic() - started

        readers = asyncio.gather(drain(proc.stdout, out), drain(proc.stderr, err), feed())
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait_for(asyncio.shield(readers), timeout)
            await proc.wait()
        except TimeoutError:
            stop("wall_time")
        finally:
            # on every path, a cancelled call (the harness's own timeout) included: the command's
            # whole tree is dead before run() returns or raises
            watcher.cancel()
            if proc.returncode is None or limit:
                self._kill(proc.pid)
                await self._reap(proc)
                self._groups.discard(proc.pid)
                reaper.forget(proc.pid)
            else:
                await self._reap(proc)
                if not self.BACKGROUND_OUTLIVES:
                    self._groups.discard(proc.pid)
                    reaper.forget(proc.pid)
            try:  # a detached grandchild can hold the pipes open; never wait on it for long
                await asyncio.wait_for(asyncio.shield(readers), 2)
            except (TimeoutError, asyncio.CancelledError):
                readers.cancel()
                await asyncio.gather(readers, return_exceptions=True)
            finally:  # our ends of the pipes, now: left to the garbage collector, they are closed after
                transport = getattr(proc, "_transport", None)  # the event loop is ("Event loop is closed")
                if transport is not None:
                    transport.close()
        if not limit and (over := await self._over_limit(None)):
            limit.append(over)  # filled the disk faster than the checks above
        code = proc.returncode
        found = limit[0] if limit else self._limit_hit(code, bytes(err))
        return CommandResult(code, self._cut(bytes(out)), self._cut(bytes(err)),
                             timed_out=found == "wall_time", limit=found)

    async def _reap(self, proc: asyncio.subprocess.Process) -> None:
        """Wait until the command (killed, or exited by itself) is gone. Not `proc.wait()`: it
        also waits for the pipes to close, which a detached grandchild can hold open forever."""
        while proc.returncode is None:
            await asyncio.sleep(0.02)
        await self._gone(proc.pid)

    async def _gone(self, group: int) -> None:
        """Wait until what a killed group left behind is gone (the sandbox: its namespace)."""

    async def _over_limit(self, proc: asyncio.subprocess.Process | None) -> str | None:
        """Which rollout-wide limit the command (still running, or `None`: just ended) is past."""
        du = shutil.which("du", path="/usr/bin:/bin")
        if du is None:  # no way to measure: the per-file limit is all there is
            return None
        # `du` runs to its end even when this is cancelled (the command ended meanwhile): a `du`
        # cancelled while starting or running is reaped by its transport's poll(), racing asyncio's
        # child watcher, which then logs "Unknown child process pid N, will report returncode 255"
        measure = asyncio.ensure_future(self._disk_used_kib(du))
        try:
            used_kib = await asyncio.shield(measure)
        except asyncio.CancelledError:
            await asyncio.gather(measure, return_exceptions=True)
            raise
        return "disk" if used_kib is not None and used_kib > self.config.disk_mb << 10 else None

    async def _disk_used_kib(self, du: str) -> int | None:
        """KiB the work dir and the added directories' folders hold (`du -skxc`, its total line);
        None when it cannot be measured this time."""
        folders = [folder for folder, _ in self.binds()]
        try:
            child = await asyncio.create_subprocess_exec(du, "-skxc", "--", str(self.workdir), *folders,
                                                         stdout=asyncio.subprocess.PIPE,
                                                         stderr=asyncio.subprocess.DEVNULL)
            out, _ = await child.communicate()
            return int(out.splitlines()[-1].split()[0])
        except (OSError, IndexError, ValueError):  # e.g. out of fds
            return None

    def _limit_hit(self, exit_code: int, stderr: bytes) -> str | None:
        """Which limit (if any) ended a command that exited by itself; only the limited runtimes know."""
        return None

    def _kill(self, group: int) -> None:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def close(self) -> None:
        groups, self._groups = self._groups, set()
        for group in groups:
            self._kill(group)
            reaper.forget(group)
        for group in groups:
            await self._gone(group)
        if self.BACKGROUND_OUTLIVES and self._owns_workdir:
            self._hand_over_leftovers()
        await super().close()

    def _hand_over_leftovers(self) -> None:
        """What the commands detached from their groups lives on (host processes), until vf exits."""
        for pid in leftovers(str(self.workdir)):
            try:
                _left.append(os.pidfd_open(pid))
            except OSError:
                pass
