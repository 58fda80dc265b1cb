"""`docker`: each command runs in a fresh container of `image` (a daemon must answer).

The rollout's working directory is mounted at /workspace; no network unless `network_allow` is
non-empty; memory, process and CPU-time limits go to `docker run`. A timeout, an output overflow
or `close()` kills this runtime's containers by name (all of them: one rollout's commands share
its fate), not just the docker client process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from typing import ClassVar

from vf.errors import HarnessError
from vf.runtime import bridge
from vf.runtime.base import SandboxUnavailable, register_runtime
from vf.runtime.subprocess import SubprocessRuntime

MOUNT = "/workspace"


def docker_available() -> bool:
    """A docker CLI whose daemon answers (checked once per call; tests use it to skip)."""
    exe = shutil.which("docker")
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "info"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@register_runtime
class DockerRuntime(SubprocessRuntime):
    type = "docker"
    ISOLATED = True
    RESOURCES: ClassVar[dict[str, str]] = {"disk": "disk_mb", "memory": "memory_mb"}  # the container's memory
    RESERVED = (MOUNT,)

    def __init__(self, *args, **kwargs):
        if not docker_available():
            raise SandboxUnavailable("runtime 'docker' needs a running docker daemon ('docker info' fails)",
                             hint="start docker, or use --env.agent.runtime.type sandbox")
        super().__init__(*args, **kwargs)
        self._containers: set[str] = set()
        self._model_socket: str | None = None

    def model_endpoint(self, url: str, socket: str) -> str:
        """Containers get the interception server's socket mounted and bridged to their own
        loopback by vf.runtime.bridge, which needs `python3` in the image (untested here: no
        docker daemon on the CI machines)."""
        self._model_socket = socket
        return f"http://127.0.0.1:{bridge.PORT}/v1"

    def host_url(self, url: str) -> str | None:
        return None  # a container's loopback is its own; only the model endpoint is bridged in

    def wire_info(self, borrowed: bool = False) -> dict:
        """verifiers' `docker` RuntimeInfo: the image and the working directory inside it."""
        return {"type": "docker", "image": self.config.image, "workdir": MOUNT, "id": str(self.workdir),
                "borrowed": borrowed}

    def _warn(self) -> None:
        pass

    def _argv(self, command: str | list[str], cwd: str, timeout: float) -> list[str]:
        c = self.config
        name = f"vf-{uuid.uuid4().hex[:12]}"
        self._containers.add(name)
        inner = self._inside(cwd)
        inner = MOUNT + cwd.removeprefix(str(self.workdir)) if inner == cwd else inner
        cpu = int(c.cpu_time or timeout) + 1
        argv = ["docker", "run", "--rm", "-i", "--name", name, "-v", f"{self.workdir}:{MOUNT}", "-w", inner,
                "--memory", f"{c.memory_mb}m", "--pids-limit", str(c.max_processes),
                "--ulimit", f"cpu={cpu}:{cpu + 1}", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        for folder, inside in self.binds():
            argv += ["-v", f"{folder}:{inside}"]
        if not c.network_allow:
            argv += ["--network", "none"]
        inner_argv = super()._argv(command, cwd, timeout)
        if self._model_socket is not None:
            argv += ["-v", f"{os.path.dirname(self._model_socket)}:{bridge.SOCKET_DIR}:ro"]
            inside = f"{bridge.SOCKET_DIR}/{os.path.basename(self._model_socket)}"
            inner_argv = ["python3", "-I", "-c", bridge.SCRIPT, inside, str(bridge.PORT), *inner_argv]
        return argv + [c.image] + inner_argv

    def _env(self, env):
        return super()._env(None)  # the docker client's own env; the command's goes through -e below

    async def run(self, command, env=None, *, timeout=None, cwd=None, input=None):
        env = self.process_env(env)
        if env:
            command = ["env", *(f"{k}={v}" for k, v in env.items()),
                       *(["/bin/sh", "-c", command] if isinstance(command, str) else command)]
        return await super().run(command, timeout=timeout, cwd=cwd, input=input)

    async def prepare_uv_script(self, script, env=None, *, activate=True) -> list[str]:
        """Refused: the environment is resolved on the host against the host's Python, which
        the container's image does not have at the same path (and the container sees no host
        directory but the working one)."""
        raise HarnessError("runtime 'docker' cannot run verifiers uv-script programs (prepare_uv_script): "
                           "vf resolves them on the host for the host's Python",
                           hint="use --env.agent.runtime.type sandbox (the default)")

    def _kill(self, group: int) -> None:
        super()._kill(group)
        for name in list(self._containers):
            subprocess.run(["docker", "kill", name], capture_output=True, timeout=30, check=False)

    async def close(self) -> None:
        await super().close()
        self._containers.clear()
