"""best-of-n: `n` independent attempts at the task in one episode, then compared.

Each attempt is scored by the task's own rewards; `finalize` marks the best attempt(s) (metric
`best`, ties share it) and records on every attempt whether any reached `threshold`
(`pass_at_n`). The seat keeps the single-agent name, so `--env.agent.*` flags apply unchanged.
"""

from __future__ import annotations

import asyncio

from pydantic import Field

from vf.env import AgentConfig, Env, EnvConfig


class BestOfNEnvConfig(EnvConfig):
    agent: AgentConfig = Field(default_factory=AgentConfig)
    n: int = Field(4, ge=1)
    """Independent attempts per episode."""
    threshold: float = 1.0
    """An attempt counts as solved when its reward reaches this (`pass_at_n`)."""


class BestOfNEnv(Env[BestOfNEnvConfig]):
    async def run(self, task, agents) -> None:
        # a TaskGroup: an attempt that raises cancels its siblings instead of leaving them running
        async with asyncio.TaskGroup() as group:
            for _ in range(self.config.n):
                group.create_task(agents.agent.run(task))

    async def finalize(self, task, episode) -> None:
        top = max(t.reward for t in episode.traces)
        solved = float(top >= self.config.threshold)
        for trace in episode.traces:
            trace.record_metric("best", float(trace.reward == top))
            trace.record_metric("pass_at_n", solved)
