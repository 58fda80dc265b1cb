"""`subprocess`: commands run as plain host processes. No isolation: for debugging and trusted code.

Each command starts in its own process session so that a timeout or `close()` kills the whole
tree it spawned, not just the shell. Output is read as it arrives and the command is stopped
once it writes more than `max_output_bytes` (a `yes` must not fill the host's memory).
The sandbox and docker runtimes reuse all of this and only change what is started (`_argv`),
with which environment (`_env`) and as whom (`_spawn_kwargs`).
`vf.reaper` kills a command's process group if vf itself is killed first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from vf import reaper
from vf.runtime.base import CommandResult, Runtime, register_runtime

_warned = False


@register_runtime
class SubprocessRuntime(Runtime):
    type = "subprocess"

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

    def _argv(self, command: str | list[str], cwd: str) -> list[str]:
        """The argv to start; other runtimes wrap it (sandbox, container)."""
        return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        return {**os.environ, **(env or {})}

    def _spawn_kwargs(self) -> dict:
        return {}

    async def run(self, command, env=None, *, timeout=None, cwd=None, input=None) -> CommandResult:
        cwd_path = str(self._resolve(cwd) if cwd else self.workdir)
        proc = await asyncio.create_subprocess_exec(
            *self._argv(command, cwd_path), env=self._env(env),
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
            **{"cwd": cwd_path, **self._spawn_kwargs()})
        self._groups.add(proc.pid)
        reaper.watch(proc.pid)
        cap = self.config.max_output_bytes
        out, err = bytearray(), bytearray()
        limit: list[str] = []

        async def drain(stream, buf: bytearray) -> None:
            while chunk := await stream.read(1 << 16):
                buf += chunk[: cap + 1 - len(buf)]
                if len(buf) > cap and not limit:
                    limit.append("output")
                    self._kill(proc.pid)

        async def feed() -> None:
            if input is not None:
                try:
                    proc.stdin.write(input.encode())
                    await proc.stdin.drain()
                    proc.stdin.close()
                except (BrokenPipeError, ConnectionResetError):
                    pass

        readers = asyncio.gather(drain(proc.stdout, out), drain(proc.stderr, err), feed())
        try:
            await asyncio.wait_for(asyncio.shield(readers), timeout or self.config.timeout)
            await proc.wait()
        except TimeoutError:
            limit.append("wall_time")
            self._kill(proc.pid)
            await proc.wait()
        try:  # a detached grandchild can hold the pipes open; never wait on it for long
            await asyncio.wait_for(readers, 2)
        except (TimeoutError, asyncio.CancelledError):
            readers.cancel()
        code = proc.returncode
        found = limit[0] if limit else self._limit_hit(code, bytes(err))
        return CommandResult(code, self._cut(bytes(out)), self._cut(bytes(err)),
                             timed_out=found == "wall_time", limit=found)

    def _limit_hit(self, exit_code: int, stderr: bytes) -> str | None:
        """Which limit (if any) ended a command that exited by itself; only the limited runtimes know."""
        return None

    def _kill(self, group: int) -> None:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def close(self) -> None:
        for group in self._groups:
            self._kill(group)
            reaper.forget(group)
        self._groups.clear()
        await super().close()
