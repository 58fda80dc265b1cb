"""`subprocess`: commands run as plain host processes. No isolation: for debugging and trusted code.

Each command starts in its own process session so that a timeout or `close()` kills the whole
tree it spawned, not just the shell; `vf.reaper` kills it if vf itself is killed first.
"""

from __future__ import annotations

import asyncio
import os
import signal

from vf import reaper
from vf.runtime.base import CommandResult, Runtime, register_runtime


@register_runtime
class SubprocessRuntime(Runtime):
    type = "subprocess"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._groups: set[int] = set()
        """Process groups started here; background children can outlive their shell."""

    def _argv(self, command: str | list[str]) -> list[str]:
        """The argv to start; other runtimes wrap it (sandbox, container)."""
        return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)

    async def run(self, command, *, timeout=None, env=None, cwd=None, input=None) -> CommandResult:
        cwd_path = self._resolve(cwd) if cwd else self.workdir
        proc = await asyncio.create_subprocess_exec(
            *self._argv(command), cwd=cwd_path, env={**os.environ, **(env or {})},
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        self._groups.add(proc.pid)
        reaper.watch(proc.pid)
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None),
                timeout or self.config.timeout)
            return CommandResult(proc.returncode, self._cut(out), self._cut(err))
        except asyncio.TimeoutError:
            self._kill(proc.pid)
            out, err = await proc.communicate()
            return CommandResult(-signal.SIGKILL, self._cut(out), self._cut(err), timed_out=True)

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
