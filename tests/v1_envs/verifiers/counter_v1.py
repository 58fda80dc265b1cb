"""Counter: an endless procedural taskset (needs -n) with typed State, TaskConfig and
TasksetConfig generics, a stop condition, and a reward plugged from config (see bonus.py)."""

import random
import re

import verifiers.v1 as vf

__all__ = ["CountTaskset"]


class CountData(vf.TaskData):
    a: int
    b: int


class CountState(vf.State):
    target: int = 0
    checks: int = 0


class CountTaskConfig(vf.TaskConfig):
    tolerance: int = 0


class CountTask(vf.Task[CountData, CountState, CountTaskConfig]):
    async def setup(self, trace):
        trace.state.target = self.data.a + self.data.b

    @vf.stop
    async def answered(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward
    async def correct(self, trace) -> float:
        trace.state.checks += 1
        m = re.search(r"\\boxed\{(-?\d+)\}", trace.last_reply)
        return float(m is not None and abs(int(m.group(1)) - trace.state.target) <= self.config.tolerance)

    @vf.reward(weight=0.0)
    async def formatted(self, trace) -> float:
        return float("\\boxed" in trace.last_reply)

    @vf.metric
    async def checks_before_rewards(self, trace) -> float:
        return float(trace.state.checks)


class CountConfig(vf.TasksetConfig):
    task: CountTaskConfig = CountTaskConfig()
    seed: int = 0
    wrong_every: int = 3


class CountTaskset(vf.Taskset[CountTask, CountConfig]):
    INFINITE = True

    def load(self):
        rng = random.Random(self.config.seed)
        i = 0
        while True:
            a, b = rng.randint(1, 50), rng.randint(1, 50)
            shown = b + 1 if self.config.wrong_every and i % self.config.wrong_every == 2 else b
            yield CountTask(CountData(prompt=f"What is {a} + {shown}?", a=a, b=b), self.config.task)
            i += 1
