"""Retry: whole-rollout retries (`--env.agent.retries.*`). A row's setup fails its first
`failures` attempts; a retried rollout starts from scratch, and the trace that stands is the
last attempt's, with the earlier attempts' errors in front."""

import verifiers.v1 as vf

__all__ = ["RetryTaskset"]

ATTEMPTS: dict[str, int] = {}


class RetryData(vf.TaskData):
    failures: int = 0


class RetryTask(vf.Task[RetryData]):
    async def setup(self, trace):
        n = ATTEMPTS[self.data.prompt] = ATTEMPTS.get(self.data.prompt, 0) + 1
        if n <= self.data.failures:
            raise RuntimeError(f"setup failed on attempt {n}")

    @vf.reward
    async def replied(self, trace) -> float:
        return float(bool(trace.last_reply))

    @vf.metric
    async def attempts(self, trace) -> float:
        return float(ATTEMPTS[self.data.prompt])


class RetryTaskset(vf.Taskset[RetryTask]):
    def load(self):
        return [RetryTask(RetryData(prompt=p, failures=f)) for p, f in (("a b", 0), ("c d", 1), ("e f", 3))]
