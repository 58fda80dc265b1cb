"""swe-mini: fix a bug in a small Python repository; reward = hidden tests pass afterwards.

An agentic taskset for the `bash` harness (and, later, real agent harnesses): each task is one
of the repositories shipped in `repos/` (no download), with a bug and a failing visible test.
`setup` writes the repo into the rollout's runtime work dir; the prompt names the symptom and
the visible test (`python3 test_x.py`: the sandbox has the system python3 and no pytest).

Scoring runs in the same runtime after the agent stops (vf.environments.swe_mini.checks): the
hidden tests, with a pristine copy of the visible test, are written into a fresh folder only
then, so the agent never sees them, and a visible test it edited or deleted does not count.

    reward  solved        1.0 when the pristine visible test and the hidden tests all pass
    metric  visible_test  1.0 when the pristine visible test passes

`validate(runtime)` is the model-free gold check: the shipped repo must fail, and pass once the
gold fix is applied with a bash command.

The taskset runs as `SweMiniEnv`: one seat, `agent`, whose harness defaults to `bash` (a SWE
task needs a shell; the `null` harness would give the model no tool at all). Any
`--env.agent.harness.id` replaces it, and other `--env.agent.*` flags keep it.
"""

from __future__ import annotations

import random

from pydantic import Field

import vf
from vf.errors import UsageError

from .checks import TestRun, gold_problems, run_tests, write_repo
from .repo import Repo, all_repos

PROMPT = """The Python repository in the current directory has a bug. {symptom}

Its test `{test}` fails: run it with `python3 {test}` (only the Python standard library is \
installed; there is no pytest). Find the cause and fix the code so that the test passes. Do not \
edit the tests: your fix is checked with the original test and with more tests you cannot see.

Files: {files}

When you are done, reply with a short summary and no tool call."""
OUTPUT_TAIL = 2000


def repo_named(name: str) -> Repo:
    for repo in all_repos():
        if repo.name == name:
            return repo
    raise UsageError(f"swe-mini has no repo {name!r}",
                     hint=f"repos: {', '.join(r.name for r in all_repos())}")


class SweData(vf.TaskData):
    repo: str
    """Which shipped repo (`repos/<repo>.txt`)."""
    difficulty: str
    kind: str
    test: str
    """The visible test file."""


class SweTaskConfig(vf.TaskConfig):
    test_timeout: float = Field(60.0, gt=0)
    """Seconds one test run may take when scoring (a fix that hangs fails)."""


class SweConfig(vf.TasksetConfig):
    task: SweTaskConfig = SweTaskConfig()
    size: int | None = None
    """Number of tasks; None = every selected repo once. More than that deals the repos again."""
    seed: int = 0
    """Order of the tasks (shuffled)."""
    repos: list[str] = Field(default_factory=list)
    """Only these repos, by name (empty = all)."""
    difficulty: list[str] = Field(default_factory=list)
    """Only these difficulties (easy, medium, hard; empty = all)."""


class SweTask(vf.Task[SweData, vf.State, SweTaskConfig]):
    def runtime_env(self) -> dict[str, str]:
        # no .pyc next to the code: one written before a same-size edit within the same second
        # looks current, and the agent would keep seeing the old behaviour
        return {"PYTHONDONTWRITEBYTECODE": "1"}

    async def setup(self, task, runtime) -> None:
        await write_repo(runtime, repo_named(task.repo))

    async def _check(self, trace, runtime, name: str, files: dict[str, str]) -> float | None:
        if runtime is None:  # re-scoring a saved run: the repo is gone
            return None
        try:
            run = await run_tests(runtime, files, self.config.test_timeout)
        except (OSError, UsageError) as e:  # the agent left the work dir unwritable
            run = TestRun(passed=False, ran=0, expected=0, output=f"{type(e).__name__}: {e}")
        trace.info.setdefault("swe_mini", {})[name] = {"passed": run.passed, "ran": run.ran,
                                                       "expected": run.expected,
                                                       "output": run.output[-OUTPUT_TAIL:]}
        return float(run.passed)

    @vf.metric
    async def visible_test(self, task, trace, runtime) -> float | None:
        repo = repo_named(task.repo)
        return await self._check(trace, runtime, "visible", {repo.test: repo.files[repo.test]})

    @vf.reward(weight=1.0)
    async def solved(self, task, trace, runtime) -> float | None:
        return await self._check(trace, runtime, "hidden", repo_named(task.repo).suite)

    async def validate(self, runtime) -> bool:
        return not await gold_problems(runtime, repo_named(self.data.repo), self.config.test_timeout)


class SweHarnessConfig(vf.HarnessConfig):
    id: str = "bash"


class SweAgentConfig(vf.AgentConfig):
    harness: SweHarnessConfig = Field(default_factory=SweHarnessConfig)


class SweEnvConfig(vf.EnvConfig):
    agent: SweAgentConfig = SweAgentConfig()
    """The one seat (a default instance, so `--env.agent.*` is seen as this seat's flags)."""


class SweMiniEnv(vf.Env[SweEnvConfig]):
    """A single-agent env whose agent gets the `bash` harness unless told otherwise."""


class SweMiniTaskset(vf.Taskset[SweTask, SweConfig]):
    ENV = SweMiniEnv

    def load(self):
        cfg = self.config
        unknown = sorted(set(cfg.repos) - {r.name for r in all_repos()})
        if unknown:
            raise UsageError(f"swe-mini has no repo {', '.join(unknown)}",
                             hint=f"repos: {', '.join(r.name for r in all_repos())}")
        chosen = [r for r in all_repos() if (not cfg.repos or r.name in cfg.repos)
                  and (not cfg.difficulty or r.difficulty in cfg.difficulty)]
        if not chosen:
            raise UsageError("swe-mini: no repo matches --taskset.repos / --taskset.difficulty")
        size = len(chosen) if cfg.size is None else cfg.size
        rng = random.Random(cfg.seed)
        for i in range(size):
            deal, k = divmod(i, len(chosen))
            if k == 0:
                rng.shuffle(chosen)
            repo = chosen[k]
            yield SweData(
                id=f"swe-mini-{repo.name}" + (f"-{deal}" if deal else ""), name=repo.name,
                description=f"{repo.difficulty} {repo.kind}", repo=repo.name,
                difficulty=repo.difficulty, kind=repo.kind, test=repo.test,
                prompt=PROMPT.format(symptom=repo.symptom, test=repo.test, files=", ".join(repo.files)))


__all__ = ["SweMiniEnv", "SweMiniTaskset"]
