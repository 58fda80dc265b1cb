"""Slow: stage deadlines. Row 0's setup outlasts `--env.agent.timeout.setup`; row 1 carries its
own agent deadline (`TaskData.timeout`) shorter than the model's reply; row 2 finishes. A
deadline stops the trace (`<stage>_timeout`), finalize and scoring still run."""

import asyncio

import verifiers.v1 as vf

__all__ = ["SlowTaskset"]


class SlowData(vf.TaskData):
    setup_sleep: float = 0.0


class SlowTask(vf.Task[SlowData]):
    async def setup(self, trace):
        await asyncio.sleep(self.data.setup_sleep)

    async def finalize(self, trace):
        trace.info["finalized"] = True

    @vf.reward
    async def replied(self, trace) -> float:
        return float(bool(trace.last_reply))

    @vf.metric
    async def finalized(self, trace) -> float:
        return float(trace.info.get("finalized", False))


class SlowTaskset(vf.Taskset[SlowTask]):
    def load(self):
        return [SlowTask(SlowData(prompt="a b", setup_sleep=10.0)),
                SlowTask(SlowData(prompt="c d", timeout=vf.TaskTimeout(agent=0.5))),
                SlowTask(SlowData(prompt="e f"))]
