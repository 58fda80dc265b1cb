"""Process groups and directories that must not outlive vf, even when vf is killed with `kill -9`.

Runtimes start each command, and `vf.mcp` each tool server, in its own process group (session)
so that closing a rollout can kill the whole tree, and make a working directory per rollout
that closing it removes. A `kill -9` of vf skips that cleanup, and PR_SET_PDEATHSIG cannot
help: it reaches only the direct child, not what a shell started in the background. So the
first `watch()` (or `watch_dir()`) starts one small reaper process per vf process. vf tells it
about every group it starts (`+PGID`) and finishes (`-PGID`), and every directory it makes
(`+/path`) and removes (`-/path`), over a pipe; when that pipe ends (vf exited, however) the
reaper kills every group still listed and every process working in a listed directory, then
removes those directories, then exits.
It detaches (double fork), so it is nobody's child process and never waits to be reaped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

_REAPER = """
import os, shutil, signal, sys, time
if os.fork():
    os._exit(0)
groups, dirs = set(), set()
for line in sys.stdin:  # EOF: the vf process that started us is gone
    item = line[1:].rstrip("\\n")
    if item.startswith("/"):
        (dirs.add if line[0] == "+" else dirs.discard)(item)
    else:
        (groups.add if line[0] == "+" else groups.discard)(int(item))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
# a command vf started just before it died may not be listed yet: what works in a listed
# directory (its cwd, or the directory in its argv: a sandbox's bwrap) is a rollout's too
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = set(f.read().split(b"\\0"))
    except OSError:
        continue
    if any(cwd == d or cwd.startswith(d + "/") or d.encode() in argv for d in dirs):
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
for _ in range(20):  # a killed process may still be writing for a moment
    for path in list(dirs):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            dirs.discard(path)
    if not dirs:
        break
    time.sleep(0.1)
"""

_lock = threading.Lock()
_pipe: int | None = None  # write end of the pipe to this process's reaper
_owner = 0  # the pid that started it (a forked child needs its own)


def _start() -> int:
    read, write = os.pipe()  # not inherited by other children: only the reaper holds `read`
    try:
        subprocess.run([sys.executable, "-I", "-S", "-c", _REAPER], stdin=read, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, start_new_session=True, check=False)
    finally:
        os.close(read)
    return write


def _send(line: str) -> None:
    global _pipe, _owner
    with _lock:
        for _ in range(2):  # a reaper that went away is started again once
            if _pipe is None or _owner != os.getpid():
                _pipe, _owner = _start(), os.getpid()
            try:
                os.write(_pipe, line.encode())  # one short write: atomic on a pipe
                return
            except OSError:
                os.close(_pipe)
                _pipe = None


def watch(group: int) -> None:
    """Kill process group `group` if this process dies before `forget(group)`."""
    _send(f"+{group}\n")


def forget(group: int) -> None:
    """`group` has been stopped (or is no longer ours to stop)."""
    if _pipe is not None and _owner == os.getpid():
        _send(f"-{group}\n")


def watch_dir(path: str) -> None:
    """Remove directory `path` (absolute) if this process dies before `forget_dir(path)`."""
    if path.startswith("/") and "\n" not in path:
        _send(f"+{path}\n")


def forget_dir(path: str) -> None:
    """`path` has been removed (or is no longer ours to remove)."""
    if _pipe is not None and _owner == os.getpid() and "\n" not in path:
        _send(f"-{path}\n")
