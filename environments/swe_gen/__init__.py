"""swe-gen: fix one bug in a small *generated* Python repository; reward = hidden tests pass.

swe-mini's procedural sibling: instead of 18 hand-written repos, every task is drawn by
`generate.generate(kind, seed)` — a module of two or three functions (plus a `helpers.py` for
`rename`), one of which carries a one-line bug of a chosen kind (operator, off-by-one,
constant, name, import, rename), a visible failing unittest and hidden tests. The same
`--taskset.seed` gives the same tasks; another seed gives other tasks (held-out evaluation), and
`--taskset.size` is any number.

Everything else is swe-mini's, imported rather than copied: the prompt, the repo writer, the
isolated test runner that writes the hidden tests (and a pristine visible test) only after the
agent stops, so editing or deleting tests and forging the verdict earn nothing, and the gold
check. Rewards and metrics are swe-mini's too (`solved`, `visible_test`; details under
`trace.info["swe_mini"]`), and the agent gets the `bash` harness unless told otherwise.

    vf-eval swe-gen -n 12 -m tiny-agent
    vf-train --taskset swe-gen --env.agent.harness.id bash -m tiny-agent ...

What it can and cannot teach: each fix is one line, named by the traceback or the symptom in
the prompt (the gold trajectory: run the visible test, apply a one-line `sed`, run it again);
it teaches the shape of the agent loop and copying from tool output, not debugging.
"""

from __future__ import annotations

import hashlib
import random

from pydantic import Field

import vf
from vf.errors import UsageError

from ..swe_mini import PROMPT, SweData, SweMiniEnv, SweTask, SweTaskConfig
from ..swe_mini.checks import gold_problems, write_repo
from .generate import KINDS, GenRepo, generate


class SweGenData(SweData):
    seed: int
    """The generator's seed: `generate(kind, seed)` rebuilds the repo (the row stays small)."""


class SweGenConfig(vf.TasksetConfig):
    task: SweTaskConfig = SweTaskConfig()
    size: int = Field(60, ge=1)
    """Number of tasks (distinct: a repeat is drawn again)."""
    seed: int = 0
    """Which tasks: the same seed, the same tasks; use another seed to evaluate held out."""
    kinds: list[str] = Field(default_factory=list)
    """Only these bug kinds (empty = all: operator, off-by-one, constant, name, import, rename);
    the tasks cycle through them, so each kind gets an equal share."""


class SweGenTask(SweTask, vf.Task[SweGenData, vf.State, SweTaskConfig]):
    """swe-mini's task with the repo generated from the row instead of read from `repos/`."""

    @staticmethod
    def generated(task: SweGenData) -> GenRepo:
        return generate(task.kind, task.seed)

    async def setup(self, task, runtime) -> None:
        await write_repo(runtime, self.generated(task).repo)

    @vf.metric
    async def visible_test(self, task, trace, runtime) -> float | None:
        repo = self.generated(task).repo
        return await self._check(trace, runtime, "visible", {repo.test: repo.files[repo.test]})

    @vf.reward(weight=1.0)
    async def solved(self, task, trace, runtime) -> float | None:
        return await self._check(trace, runtime, "hidden", self.generated(task).repo.suite)

    async def validate(self, runtime) -> bool:
        return not await gold_problems(runtime, self.generated(self.data).repo, self.config.test_timeout)


class SweGenTaskset(vf.Taskset[SweGenTask, SweGenConfig]):
    ENV = SweMiniEnv

    def load(self):
        cfg = self.config
        unknown = sorted(set(cfg.kinds) - set(KINDS))
        if unknown:
            raise UsageError(f"swe-gen has no bug kind {', '.join(unknown)}", hint=f"kinds: {', '.join(KINDS)}")
        kinds = [k for k in KINDS if not cfg.kinds or k in cfg.kinds]
        rng = random.Random(f"swe-gen-set:{cfg.seed}")
        seen: set[str] = set()
        for i in range(cfg.size):
            kind = kinds[i % len(kinds)]
            while True:  # a repeat of an earlier task (same files) is drawn again
                gen = generate(kind, rng.getrandbits(32))
                digest = hashlib.sha256(repr(sorted(gen.repo.files.items())).encode()).hexdigest()
                if digest not in seen:
                    seen.add(digest)
                    break
            repo = gen.repo
            yield SweGenData(
                id=f"swe-gen-{cfg.seed}-{i}", name=repo.name, description=f"{kind}: {repo.symptom}",
                repo=repo.name, difficulty=repo.difficulty, kind=kind, test=repo.test, seed=gen.seed,
                prompt=PROMPT.format(symptom=repo.symptom, test=repo.test, files=", ".join(repo.files)))


__all__ = ["SweGenTask", "SweGenTaskset"]
