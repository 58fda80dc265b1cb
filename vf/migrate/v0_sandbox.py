"""The tools of verifiers' `SandboxEnv` and `PythonEnv` (0.1.5+), and the agent program of its
`CliAgentEnv` (0.1.9+), run in the rollout's vf runtime.

v0 made a Prime sandbox container per rollout and gave the model `bash(command)` (SandboxEnv) or
`python(code)`, a persistent Python REPL (PythonEnv, which hides bash). In vf the rollout's
runtime is that place: a bubblewrap sandbox by default, a container with
`--env.agent.runtime.type docker`. The tools answer with v0's text, so a model sees what it saw:

- `bash`: stdout (stripped), then `stderr:\\n...` when there is any, `(no output)` when there is
  neither; past the env's `timeout_per_command_seconds`: `Error: Command timed out after Ns`.
- `python`: the cell's stdout, `stderr:\\n...`, the traceback when it raised, or `Out[n]: repr`
  of a trailing expression (n counts the rollout's cells); `(no output)` otherwise.

The REPL's namespace persists across calls, but vf's runtimes keep no process between commands:
each call runs the rollout's earlier cells again (their output discarded) before the new one. Code
whose effects live outside the namespace (appending to a file, unseeded random numbers, a slow
cell) can therefore differ from v0's live REPL. The packages are the runtime's `python3`'s (v0
pip-installed `pip_install_packages` at sandbox start; vf's sandbox has no network for that).

`CliAgentEnv` ran `run_command` in a Prime sandbox with `OPENAI_BASE_URL` at its interception
server, each model call the agent made a turn of the rollout. `CliAgentHarness` is that as a vf
program harness: the command runs in the rollout's runtime with `OPENAI_BASE_URL`, `OPENAI_API_KEY`
and `OPENAI_MODEL` set to the seat's interception endpoint, secret and model (and v0's 3600 s
client timeouts, the env's `environment_vars` beneath), and every call it makes is recorded.

A migrated env subclasses these with `v0_env = staticmethod(_v0_env)`, the built v0 env whose
options (`timeout_per_command_seconds`, `environment_vars`, `run_command`) they follow.

v0 code that drove its sandbox itself — a CliAgentEnv or HarborEnv subclass's `build_env_vars(state)`
and `post_sandbox_setup(state)`, calling `self.sandbox_client.execute_command(state["sandbox_id"],
...)`, `upload_file`, ... — runs on the rollout's runtime through `SandboxClient`, prime_sandboxes'
AsyncSandboxClient API with `sandbox_id` naming the runtime (`sandbox_setup` runs those two hooks
before the agent starts, as v0 did at sandbox creation). A file path is the runtime's: its
working directory or a directory it was given (`Runtime.add_directory`, a Harbor task's /app);
another absolute path (/tmp/x.tar.gz, /usr/local/...) is refused, with the reason. A background
job runs to its end before `start_background_job` returns (vf's runtimes keep no process between
commands).
"""

from __future__ import annotations

import json
import secrets
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vf.clients import ModelContext
from vf.harness import Harness
from vf.migrate.v0_api import SandboxError
from vf.runtime import ProgramResult, Runtime
from vf.runtime.base import PROGRAM_TIMEOUT
from vf.toolset import Toolset, tool

COMMAND_TIMEOUT = 30
"""v0 SandboxEnv's `timeout_per_command_seconds` default."""

REPL = r'''
import ast, contextlib, io, json, sys, traceback
request = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}


def run(code):
    result = {"status": "ok", "stdout": "", "stderr": "", "result": None}
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            body = list(ast.parse(code, mode="exec").body)
            last = body.pop() if body and isinstance(body[-1], ast.Expr) else None
            if body:
                exec(compile(ast.Module(body=body, type_ignores=[]), "<cell>", "exec"), namespace, namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace, namespace)
                if value is not None:
                    result["result"] = repr(value)
    except BaseException:
        result["status"] = "error"
        result["result"] = traceback.format_exc()
    result["stdout"], result["stderr"] = out.getvalue(), err.getvalue()
    return result


for cell in request["history"]:
    run(cell)  # the earlier cells again: their names back, their output dropped
sys.__stdout__.write("\n" + request["marker"] + json.dumps(run(request["code"])) + "\n")
'''
"""The REPL worker (v0 PythonEnv's cell semantics): replays `history`, runs `code`, and prints the
result as JSON after a per-call marker (the cell's own prints are captured, not mixed in)."""


def _options(toolset: Any) -> tuple[float, dict[str, str] | None]:
    env = type(toolset).v0_env()
    timeout = getattr(env, "timeout_per_command_seconds", None) or COMMAND_TIMEOUT
    return float(timeout), getattr(env, "environment_vars", None) or None


class SandboxTools(Toolset):
    """v0 SandboxEnv's `bash` tool, in the rollout's runtime."""

    TOOL_PREFIX = None  # v0's tool names, unprefixed
    v0_env: ClassVar[Callable[[], Any]]

    @tool
    async def bash(self, command: str, runtime: Runtime) -> str:
        """Execute `command` inside persistent sandbox container."""
        timeout, env = _options(self)
        result = await runtime.run(command, env, timeout=timeout)
        if result.timed_out:
            return f"Error: Command timed out after {timeout:g}s"
        stdout, stderr = result.stdout.strip(), (result.stderr or "").strip()
        combined = f"{stdout}\nstderr:\n{stderr}" if stdout and stderr else stdout or (f"stderr:\n{stderr}" if stderr else "")
        return combined or "(no output)"


class PythonTools(Toolset):
    """v0 PythonEnv's `python` tool: a REPL whose namespace lasts the rollout (see the module docstring)."""

    TOOL_PREFIX = None
    v0_env: ClassVar[Callable[[], Any]]

    def setup(self) -> None:
        self.cells: list[str] = []  # this rollout's cells so far (one toolset instance per rollout)

    @tool
    async def python(self, code: str, runtime: Runtime) -> str:
        """Execute `code` inside persistent Python REPL."""
        timeout, env = _options(self)
        marker = f"@@vf-repl-{secrets.token_hex(8)}@@"
        request = json.dumps({"history": self.cells, "code": code, "marker": marker})
        result = await runtime.run(["python3", "-I", "-c", REPL], env, timeout=timeout, input=request)
        if result.timed_out:
            return f"Error: Command timed out after {timeout:g}s"
        reply = next((line[len(marker):] for line in reversed(result.stdout.splitlines()) if line.startswith(marker)), None)
        if reply is None:  # the worker died (a limit, os._exit in the cell): what it printed
            return f"Error: the Python worker stopped (exit {result.exit_code})\n{(result.stdout + result.stderr).strip()}"
        self.cells.append(code)
        return _format(json.loads(reply), len(self.cells))


def _format(response: dict[str, Any], count: int) -> str:
    """v0 PythonEnv._format_response."""
    parts = []
    if stdout := (response.get("stdout") or "").rstrip():
        parts.append(stdout)
    if stderr := (response.get("stderr") or "").rstrip():
        parts.append(f"stderr:\n{stderr}")
    status, text = response.get("status"), response.get("result")
    if status == "error" and text:
        parts.append(text.rstrip())
    elif status == "ok" and text is not None:
        parts.append(f"Out[{count}]: {text}")
    return "\n".join(parts) or "(no output)"


class CliAgentHarness(Harness):
    """v0 CliAgentEnv's agent: its `run_command` as a program harness (see the module docstring)."""

    v0_env: ClassVar[Callable[[], Any]]

    def v0(self, data: Any) -> Any:
        """The built v0 env whose `run_command` this runs (a HarborEnv's depends on the row)."""
        return type(self).v0_env()

    async def launch(self, ctx: ModelContext, trace: Any, runtime: Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any) -> ProgramResult:
        env = self.v0(data)
        variables = {"OPENAI_TIMEOUT": "3600", "OPENAI_REQUEST_TIMEOUT": "3600", "HTTPX_TIMEOUT": "3600",
                     **(getattr(env, "environment_vars", None) or {}),
                     "OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret, "OPENAI_MODEL": ctx.model}
        # in the agent's workdir where the env names one (a HarborEnv's /app), else the runtime's
        return await runtime.run(["bash", "-c", env.run_command], {**self.config.resolved_env, **variables},
                                 timeout=PROGRAM_TIMEOUT, cwd=getattr(env, "agent_workdir", None))


@dataclass
class CommandResponse:
    """prime_sandboxes' CommandResponse (what `execute_command` returns)."""

    stdout: str
    stderr: str
    exit_code: int


@dataclass
class BackgroundJob:
    """prime_sandboxes' BackgroundJob, already run (see the module docstring)."""

    job_id: str
    sandbox_id: str
    result: CommandResponse


@dataclass
class BackgroundJobStatus:
    """prime_sandboxes' BackgroundJobStatus of a job that has ended."""

    job_id: str
    exit_code: int
    stdout: str
    stderr: str
    completed: bool = True


class SandboxClient:
    """v0's `self.sandbox_client` (prime_sandboxes' AsyncSandboxClient) on vf runtimes: the
    sandbox id a rollout's v0 state holds names its runtime (see the module docstring)."""

    _runtimes: weakref.WeakValueDictionary[str, Runtime] = weakref.WeakValueDictionary()

    @classmethod
    def attach(cls, runtime: Runtime) -> str:
        """A sandbox id for `runtime` (kept as long as the runtime lives)."""
        sandbox_id = f"vf-{secrets.token_hex(8)}"
        cls._runtimes[sandbox_id] = runtime
        return sandbox_id

    def runtime(self, sandbox_id: str) -> Runtime:
        runtime = self._runtimes.get(str(sandbox_id))
        if runtime is None:
            raise SandboxError(f"no vf runtime has sandbox id {sandbox_id!r} (its rollout has ended, or the id "
                               "did not come from this rollout's state['sandbox_id'])")
        return runtime

    async def execute_command(self, sandbox_id: str, command: str, working_dir: str | None = None,
                              env: dict[str, str] | None = None, timeout: int | None = None,
                              user: str | None = None) -> CommandResponse:
        runtime = self.runtime(sandbox_id).with_user(user)
        result = await runtime.run(command, env, timeout=timeout, cwd=working_dir)
        if result.timed_out:  # prime_sandboxes raises CommandTimeoutError
            raise SandboxError(f"command timed out after {timeout or runtime.config.timeout:g}s: {command[:200]}")
        return CommandResponse(result.stdout, result.stderr, result.exit_code)

    async def start_background_job(self, sandbox_id: str, command: str, working_dir: str | None = None,
                                   env: dict[str, str] | None = None, user: str | None = None) -> BackgroundJob:
        runtime = self.runtime(sandbox_id).with_user(user)
        result = await runtime.run(command, env, timeout=PROGRAM_TIMEOUT, cwd=working_dir)
        return BackgroundJob(secrets.token_hex(8), sandbox_id,
                             CommandResponse(result.stdout, result.stderr, result.exit_code))

    async def get_background_job(self, sandbox_id: str, job: BackgroundJob, timeout: int | None = None
                                 ) -> BackgroundJobStatus:
        return BackgroundJobStatus(job.job_id, job.result.exit_code, job.result.stdout, job.result.stderr)

    async def upload_file(self, sandbox_id: str, file_path: str, local_file_path: str, timeout: int | None = None) -> None:
        await self.runtime(sandbox_id).write(file_path, Path(local_file_path).read_bytes())

    async def upload_bytes(self, sandbox_id: str, file_path: str, file_bytes: bytes, filename: str,
                           timeout: int | None = None) -> None:
        await self.runtime(sandbox_id).write(file_path, file_bytes)

    async def download_file(self, sandbox_id: str, file_path: str, local_file_path: str,
                            timeout: int | None = None) -> None:
        Path(local_file_path).write_bytes(await self.runtime(sandbox_id).read(file_path))


async def sandbox_setup(env: Any, state: dict[str, Any], runtime: Runtime) -> None:
    """A v0 CliAgentEnv's (HarborEnv's) sandbox hooks, before the agent: `state["sandbox_id"]` names
    `runtime`, `build_env_vars(state)` gives every later command its variables (v0 set them on
    the sandbox; the harness's OPENAI_* go on top), then `post_sandbox_setup(state)` runs."""
    state["sandbox_id"] = SandboxClient.attach(runtime)
    runtime.env.update({str(k): str(v) for k, v in (await env.build_env_vars(state) or {}).items()})
    await env.post_sandbox_setup(state)
