"""Flaky: an Env whose run() raises on one task; the episode records the error, the run goes on."""

import verifiers.v1 as vf

__all__ = ["FlakyEnv", "FlakyTaskset"]


class FlakyData(vf.TaskData):
    answer: str


class FlakyTask(vf.Task[FlakyData]):
    @vf.reward
    async def exact(self, task, trace) -> float:
        return float(trace.last_reply == task.answer)


class FlakyTaskset(vf.Taskset[FlakyTask]):
    def load(self):
        yield FlakyTask(FlakyData(prompt="fine", answer="fine", id="ok"))
        yield FlakyTask(FlakyData(prompt="boom", answer="boom", id="boom"))
        yield FlakyTask(FlakyData(prompt="also fine", answer="nope", id="ok2"))


class FlakyEnv(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task, agents):
        if task.data.id == "boom":
            raise RuntimeError("the env broke on purpose")
        await agents.agent.run(task)
