"""isolated-verifier: the task's own scoring, run in a fresh runtime the solver never touched.

One solver seat (`agent`, so `--env.agent.*` applies unchanged) runs the task with its scoring
deferred; `finalize` and the collection of its declared artifacts (`TaskData.artifacts`) still
run, then its runtime is closed. The env's `finalize` then makes a FRESH runtime, runs the task's
`setup` there, restores the collected artifacts (vf.artifacts: validated on the host first),
runs `task.stage_verifier(trace, runtime)` if the task defines one (trusted verifier-only inputs,
written after the agent's files so they win), and runs the task's ordinary metrics and rewards
in that runtime onto the solver's trace. Anything else the agent changed — a rewritten checker,
a planted file — is not there: only declared artifacts travel.

A failed verifier attempt (setup, restore, staging, a hook escaping) is retried in another fresh
runtime `--env.verifier.retries` times; only a successful attempt's scores reach the trace.
Model-backed judges (`--env.taskset.task.judges`) are refused (the verifier is deterministic),
and so is the host-process `subprocess` runtime (nothing isolated to restore into); vf's default
`sandbox` and `docker` are isolated.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time

from pydantic import BaseModel, ConfigDict, Field

from vf.artifacts import restore
from vf.env import AgentConfig, Env, EnvConfig
from vf.episode.hooks import call_hook
from vf.episode.rollout import runtime_for_task, stage_deadlines
from vf.episode.scoring import score
from vf.retries import backoff
from vf.runtime import RuntimeConfig, make_runtime
from vf.taskset import Task

logger = logging.getLogger(__name__)

HOST_RUNTIMES = ("subprocess",)
"""Runtime types that run on the host: no fresh box to restore untrusted files into."""


class VerifierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runtime: RuntimeConfig | None = None
    """The verifier's runtime; None = a fresh one with the solver's runtime policy."""
    env: dict[str, str] | None = None
    """Extra process environment for every command the task's setup, staging and scoring hooks
    run in the verifier's runtime (e.g. a token only the grader may hold); the solver never has it."""
    retries: int = Field(2, ge=0)
    """Extra fresh-runtime attempts after a setup, restore, staging or scoring failure."""


class IsolatedVerifierEnvConfig(EnvConfig):
    agent: AgentConfig = Field(default_factory=AgentConfig)
    """The one solver seat."""
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)


class IsolatedVerifierEnv(Env[IsolatedVerifierEnvConfig]):
    async def run(self, task: Task, agents) -> None:
        if task.config.judges:
            raise ValueError("isolated-verifier runs the task's deterministic metrics and rewards; "
                             "model-backed task judges are not supported")
        self.verifier_runtime(task)  # refuse an impossible verifier before spending a solve
        await agents.agent.run(task, scored=False)

    def verifier_runtime(self, task: Task) -> RuntimeConfig:
        config = runtime_for_task(self.config.verifier.runtime or self.config.agent.runtime, task.data)
        for name, seat in (("verifier", config), ("agent", runtime_for_task(self.config.agent.runtime, task.data))):
            if seat.type in HOST_RUNTIMES:
                raise TypeError(f"isolated-verifier needs an isolated runtime to restore artifacts into, but "
                                f"the {name} runtime is {seat.type!r}; use --env.{name}.runtime.type sandbox "
                                "(the default) or docker")
        return config

    async def finalize(self, task: Task, episode) -> None:
        solution = episode.traces[0]
        if solution.ok:
            episode.traces[0] = await self.grade(self.verifier_runtime(task), task, solution)

    async def stage(self, task: Task, solution, runtime) -> None:
        """The task's setup, the solver's artifacts, then the task's verifier-only inputs."""
        args = hook_args(task, solution, runtime)
        await call_hook(task.setup, args)
        await restore(runtime, dict(solution.state.artifacts or {}))
        stage_verifier = getattr(task, "stage_verifier", None)
        if stage_verifier is not None:
            await call_hook(stage_verifier, args)

    async def grade(self, config: RuntimeConfig, task: Task, solution):
        """The solver's trace scored in a fresh runtime (a copy: a failed attempt leaves nothing)."""
        deadlines = stage_deadlines(self.config.agent.timeout, task.data.timeout)
        last: Exception | None = None
        for attempt in range(self.config.verifier.retries + 1):
            if attempt:
                delay = backoff(attempt - 1)
                logger.warning("isolated verifier attempt %d/%d failed (%s); retrying in %.1fs",
                               attempt, self.config.verifier.retries + 1, last, delay)
                await asyncio.sleep(delay)
            graded, fresh, started = copy.deepcopy(solution), copy.deepcopy(task), time.time()
            try:
                async with make_runtime(config) as box:
                    runtime = WithEnv(box, self.config.verifier.env) if self.config.verifier.env else box
                    async with asyncio.timeout(deadlines["setup"]):
                        await self.stage(fresh, graded, runtime)
                    async with asyncio.timeout(deadlines["scoring"]):
                        await score(fresh, graded, runtime)
                graded.info["verifier"] = {"runtime": config.type, "attempts": attempt + 1}
                graded.timing["verifier"] = {"start": started, "end": time.time()}
                return graded
            except Exception as e:  # noqa: BLE001 - retry the whole fresh box
                last = e
        assert last is not None
        raise last


def hook_args(task: Task, trace, runtime) -> dict:
    return {"task": task.data, "trace": trace, "state": trace.state, "config": task.config, "runtime": runtime}


class WithEnv:
    """A runtime whose every `run` also gets `env` (a caller's own variables win)."""

    def __init__(self, runtime, env: dict[str, str]):
        self._runtime, self._env = runtime, env

    def __getattr__(self, name: str):
        return getattr(self._runtime, name)

    async def run(self, command, env: dict[str, str] | None = None, **kwargs):
        return await self._runtime.run(command, {**self._env, **(env or {})}, **kwargs)
