"""verifiers' `HarborEnv` (0.1.9+): Harbor task folders, each solved by a `CliAgentEnv` agent and
scored by the task's own tests, run in the rollout's vf runtime instead of a Prime sandbox.

A Harbor task is a folder: `instruction.md` (the prompt), `task.toml` (its config, with
`[environment].docker_image`), `tests/test.sh` (the verifier, which writes the score to
/logs/verifier/reward.txt, or reward.json) and `solution/` (the oracle). What v0 did, and vf
does, per task (read from the 0.1.9-0.3.1 wheels; compat.HarborEnv / HarborTask / HarborAgent):

- rows: one per folder of `dataset_path`, sorted by name, `tasks` keeping only those named; a
  folder without task.toml or instruction.md is skipped. The prompt is the instruction; `info`
  holds task_name, task_dir, docker_image and the parsed config (0.1.14's layout), and the image
  (the task's, else `docker_image`) is the row's `TaskData.image`, which the docker runtime runs.
  v0 never built a task's `environment/Dockerfile` either: such a task ran on `docker_image`.
- before the agent: /task (instruction.md, task.toml), /logs/verifier and the agent's workdir
  (/app) exist. In vf they are directories of the runtime (`Runtime.add_directory`), so the
  runtime must isolate its commands: the bubblewrap sandbox (the default, on this machine's
  system where v0 had the image) or docker. Every command sees HARBOR_TASK_NAME,
  HARBOR_TASK_DIR, HARBOR_INSTRUCTION_PATH, AGENT_WORKDIR and the env's `environment_vars`.
- the agent: `run_command`, in the agent workdir, with CliAgentEnv's OPENAI_* variables.
- after it: /tests and /oracle get the task's tests/ and solution/, `bash test.sh` runs in /tests
  (300 s), and the reward is reward.txt's number, else reward.json's "reward"; neither, or one
  that does not parse, is 0 as in v0. vf's additions: /tests, /oracle and /logs/verifier are
  fresh directories made after the agent stopped, so nothing it left there (a forged
  reward.txt, a planted conftest.py) counts; files of the task folder are copied only when they
  are regular files (a link in a task folder could name any host file); and tests that cannot
  run (a timeout, the runtime gone) are an error on the trace, not a silent 0.

Not here: task.toml's `[[environment.mcp_servers]]` (0.1.11+ started them in the sandbox): such
a task is an error at setup that says so. v0's sandboxes reached the internet; vf's sandbox
has no network unless `--env.agent.runtime.network_allow` gives it.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from vf.errors import TaskError, UsageError
from vf.runtime import Runtime

TEST_TIMEOUT = 300.0
"""v0's limit on `bash test.sh`, in seconds."""
TASK_FILES = ("instruction.md", "task.toml")
"""What /task holds while the agent works."""
VERIFIER_FILES = (("solution", "/oracle"), ("tests", "/tests"))
"""Task subfolders given to the verifier once the agent has stopped, and where."""


def load_tasks(dataset_path: str | Path, tasks: list[str] | None = None) -> list[dict[str, Any]]:
    """v0 `HarborEnv.load_harbor_dataset`: one row per task folder."""
    root = Path(dataset_path)
    if not root.exists():
        raise FileNotFoundError(f"Dataset path not found: {root}")
    rows = []
    for task_dir in sorted(root.iterdir()):
        if not task_dir.is_dir() or (tasks and task_dir.name not in tasks):
            continue
        if not all((task_dir / name).is_file() for name in TASK_FILES):
            continue  # v0 logged "missing task.toml or instruction.md" and skipped it
        config = tomllib.loads(_regular(task_dir / "task.toml").decode())
        rows.append({"example_id": len(rows),
                     "prompt": [{"role": "user", "content": _regular(task_dir / "instruction.md").decode().strip()}],
                     "info": {"task_name": task_dir.name, "task_dir": str(task_dir),
                              "docker_image": (config.get("environment") or {}).get("docker_image"),
                              "config": config}})
    if not rows:
        raise ValueError(f"No valid Harbor tasks found in {root}")
    return rows


def _regular(path: Path) -> bytes:
    """A task file's bytes; a link is refused, never followed (a crafted task folder could point
    one at a host secret, which would then be copied where the agent reads it)."""
    if path.is_symlink() or not path.is_file():
        raise TaskError(f"Harbor task file {path} is a link or not a regular file: refused (links are not "
                        "followed; copy the file into the task folder)")
    return path.read_bytes()


def variables(env: Any, info: dict[str, Any]) -> dict[str, str]:
    """What every command of the task sees (v0's `build_env_vars`): the env's `environment_vars`,
    then Harbor's, whose `setdefault` lets `environment_vars` win."""
    out = dict(getattr(env, "environment_vars", None) or {})
    out.setdefault("HARBOR_TASK_NAME", str(info.get("task_name", "")))
    out.setdefault("HARBOR_TASK_DIR", "/task")
    out.setdefault("HARBOR_INSTRUCTION_PATH", "/task/instruction.md")
    if env.agent_workdir:
        out.setdefault("AGENT_WORKDIR", env.agent_workdir)
    return out


async def prepare(env: Any, info: dict[str, Any], runtime: Runtime) -> None:
    """Before the agent (v0's `post_sandbox_setup`): /task with the instruction and config,
    /logs/verifier and the agent's workdir."""
    servers = ((info.get("config") or {}).get("environment") or {}).get("mcp_servers")
    if servers:
        raise TaskError(f"Harbor task {info.get('task_name')!r} declares MCP servers ([[environment.mcp_servers]]), "
                        "which vf's HarborEnv does not start: port the task to a vf.Toolset")
    task_dir = _task_dir(info)
    for path in ("/task", "/logs/verifier", *([env.agent_workdir] if env.agent_workdir else [])):
        runtime.add_directory(path)
    for name in TASK_FILES:
        if (task_dir / name).exists():
            await runtime.write(f"/task/{name}", _regular(task_dir / name))


async def run_tests(info: dict[str, Any], runtime: Runtime) -> tuple[float, dict[str, Any]]:
    """After the agent: the task's tests in fresh directories, its score (see the module doc), and
    what the run did (for `trace.info["harbor"]`)."""
    task_dir = _task_dir(info)
    for sub, inside in VERIFIER_FILES:
        runtime.add_directory(inside)
        await _copy(task_dir / sub, inside, runtime)
    runtime.add_directory("/logs/verifier")
    result = await runtime.run("bash test.sh", timeout=TEST_TIMEOUT, cwd="/tests")
    if result.timed_out or result.limit is not None:
        raise TaskError(f"Harbor tests of {info.get('task_name')!r} stopped: "
                        f"{'timed out after %gs' % TEST_TIMEOUT if result.timed_out else result.limit + ' limit'}")
    report: dict[str, Any] = {"tests_exit_code": result.exit_code, "reward_file": None,
                              "output_tail": (result.stdout + result.stderr)[-2000:]}
    for name in ("reward.txt", "reward.json"):
        try:
            text = (await runtime.read(f"/logs/verifier/{name}", max_bytes=1 << 20)).decode(errors="replace").strip()
        except (OSError, UsageError):  # missing, or a link / not a regular file: no score from it
            continue
        if text:
            report["reward_file"] = name
            return parse_reward(text), report
    return 0.0, report


def parse_reward(text: str) -> float:
    """v0's reading of the reward file: a number, else JSON whose "reward" is one; 0 otherwise."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        data = json.loads(text)
        return float(data.get("reward", 0.0)) if isinstance(data, dict) else 0.0
    except (ValueError, TypeError):
        return 0.0


def _task_dir(info: dict[str, Any]) -> Path:
    task_dir = Path(str(info.get("task_dir") or ""))
    if not info.get("task_dir") or not task_dir.is_dir():
        raise TaskError(f"Harbor task directory not found: {task_dir}")
    return task_dir


async def _copy(source: Path, inside: str, runtime: Runtime) -> None:
    """The regular files below `source` into `inside` (executable bits kept); a link is refused."""
    if not source.is_dir() or source.is_symlink():
        return
    executable = []
    for folder, dirs, files in os.walk(source):
        for name in [*files, *(d for d in dirs if Path(folder, d).is_symlink())]:
            path = Path(folder, name)
            target = f"{inside}/{path.relative_to(source).as_posix()}"
            await runtime.write(target, _regular(path))
            if path.stat().st_mode & stat.S_IXUSR:
                executable.append(target)
    if executable:
        await runtime.run(["chmod", "+x", "--", *executable])
