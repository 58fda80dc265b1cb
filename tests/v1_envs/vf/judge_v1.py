"""An agentic judge over a small taskset: verifiers 0.4's shared-agentic-judge protocol, on a host.

Each row asks the solver to write a number to answer.txt; `setup` writes the expected number to
expected.txt (the judge, sharing the solver's runtime, reads it) and the task's own reward checks
answer.txt. The judge (seat `judge`, bash harness) writes its verdicts JSON; the env turns them
into `judge/<criterion>` metrics and a `judge` reward on the solver's trace (`[env.score]`).

verifiers 0.4 runs agentic judges only in containers (docker/prime; none here): its
`AgenticJudgeEnv._check_agents` refuses a subprocess solver, and `JudgeTask.NEEDS_CONTAINER`
makes `Agent.run` refuse the judge's task on subprocess. `HostSharedJudgeEnv` lifts exactly
those two and nothing else: `_check_agents` keeps the harness check and skips the runtime one,
and `run` is SharedAgenticJudgeEnv's with a JudgeTask subclass whose NEEDS_CONTAINER is False.
On verifiers 0.4's subprocess runtime the judge's files are then host paths (/tmp/verdict.json,
/tmp/trace.json): run one episode at a time (-c 1). vf runs the same module in its default
`sandbox` runtime (it refuses subprocess for a judge itself; the override is never called there),
where the verdict and record are files in the working directory (vf.envs.agentic_judge)."""

import sys

import vf
from vf.envs.shared_agentic_judge import SharedAgenticJudgeEnv

# verifiers 0.4 exports JudgeTask only from the module that defines the env (`agentic_judge.env`)
JudgeTask = sys.modules[SharedAgenticJudgeEnv.__module__].JudgeTask

__all__ = ["HostSharedJudgeEnv", "NumberTaskset"]


class NumberData(vf.TaskData):
    number: int


class NumberTask(vf.Task[NumberData]):
    async def setup(self, runtime):
        await runtime.write("expected.txt", f"{self.data.number}\n".encode())

    @vf.reward
    async def passed(self, runtime) -> float:
        return float((await runtime.run(["cat", "answer.txt"], {})).stdout.strip() == str(self.data.number))


class NumberTaskset(vf.Taskset[NumberTask]):
    def load(self):
        for n in (42, 7, 42):
            yield NumberTask(NumberData(prompt=f"Write {n} to answer.txt.", number=n))


class HostJudgeTask(JudgeTask):
    NEEDS_CONTAINER = False


class HostSharedJudgeEnv(SharedAgenticJudgeEnv):
    def _check_agents(self):
        if not self._harnesses["judge"].EXECUTES_CODE:
            super()._check_agents()

    async def run(self, task, agents):
        async with agents.solver.provision(task) as box:
            solution = await agents.solver.run(task, runtime=box)
            if not solution.ok:
                raise RuntimeError("the solver's rollout failed, so the judge never ran")
            await agents.judge.run(HostJudgeTask.from_trace(solution, self.config.task), runtime=box)
