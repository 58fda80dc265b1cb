"""What an env's `run(task, agents)` drives: `Agents` (the episode's seats by name), each an
`Agent` (`run(task)` → its finished trace, `interaction(task)` for turn-by-turn control, an
`Interaction` whose `turn` gives a `Segment`). verifiers 0.4's names (`vf.Agent`, `vf.Agents`,
`vf.Interaction`, `vf.Segment`).

The runner (vf.episode.runner) implements `EpisodeContext`: how a seat's rollout is opened,
where its finished trace goes, and the permits a seat holds while it works.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from vf.env import AgentConfig
from vf.episode.rollout import Rollout, reply_text, runtime_for_task, segment_since
from vf.retries import RetryBudget, backoff
from vf.runtime import Runtime, make_runtime
from vf.taskset import Task


@dataclass
class Segment:
    """What one `Interaction.turn` produced: the model's replies and tool results, in order.
    `terminated` = the rollout ended (a cap, a stop condition, an error) instead of replying."""

    messages: list[Any] = field(default_factory=list)
    terminated: bool = False

    @property
    def last_reply(self) -> str:
        return reply_text(self.messages)


class Interaction:
    """A seat's rollout held open turn by turn; the caller is its user. A prompted task speaks
    first (take its opening reply with a bare `turn()`); a prompt-less task is opened by the
    first `turn(message)`. Leaving the `interaction()` block finishes the rollout (scored)."""

    def __init__(self, rollout: Rollout, gate: asyncio.Semaphore | None = None):
        self._rollout = rollout
        self._gate = gate
        self._started = False

    @property
    def trace(self):
        return self._rollout.trace

    @property
    def state(self):
        return self._rollout.state

    async def turn(self, message: str | dict | list | None = None) -> Segment:
        r = self._rollout
        prompted = not self._started and r.task.data.prompt is not None
        if message is None and not self._started and not prompted:
            raise ValueError("this task has no prompt: open the exchange with turn(message)")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take the first reply with a bare turn()")
        self._started = True
        if r.done:
            return Segment(terminated=True)
        start = len(r.trace.nodes)
        turns = r.trace.num_turns
        async with self._gate or contextlib.nullcontext():  # between turns the seat holds no permit
            await r.turn(message)
        if r.trace.num_turns > turns:
            return Segment(messages=segment_since(r.trace, start))
        return Segment(terminated=True)

    def finish(self, condition: str = "user_closed") -> None:
        self._rollout.finish(condition)


class Agent:
    """One seat of one episode: `run(task)` → its finished trace; `interaction(task)` for
    turn-by-turn control. `trainable` (default True) says whether trainers learn from its traces."""

    def __init__(self, name: str, config: AgentConfig, episode: EpisodeContext):
        self.name, self.config, self._episode = name, config, episode
        self.trainable = True

    async def run(self, task: Task, *, scored: bool = True, runtime: Runtime | None = None):
        """One segment on the task's prompt (tool calls included), then finalize and score; run
        again from scratch while the trace ends with an error `retries` allows.

        `scored=False` defers the task's metrics, rewards and judges (finalize and artifact
        collection still run): an env scores the trace elsewhere (isolated-verifier).
        `runtime` is a box the caller owns (`provision`): the rollout runs in it and leaves it
        open, so a later seat can work in the same files (shared-agentic-judge)."""
        budget, history = RetryBudget(self.config.retries), []
        for attempt in range(budget.total + 1):
            trace = await self._run_once(task, scored, runtime)
            if trace.ok or attempt == budget.total or not budget.take(trace.errors):
                break
            history.extend(trace.errors)
            self._episode.discard(trace)  # one trace per seat: the retry replaces it
            await asyncio.sleep(backoff(attempt))
        if history:
            trace.errors = history + trace.errors
        return trace

    async def _run_once(self, task: Task, scored: bool = True, runtime: Runtime | None = None):
        async with self._episode.gate:
            rollout = await self._episode.open(self, task, runtime=runtime)
            try:
                if not rollout.done:
                    await rollout.turn()
                    rollout.finish("agent_completed")
            except BaseException:  # cancelled (episode timeout): the runner records it, unscored
                await rollout.cleanup()
                raise
            return await self._episode.close(rollout, scored=scored)

    @contextlib.asynccontextmanager
    async def provision(self, task: Task):
        """A runtime made from this seat's runtime policy for `task`, closed on leaving the block;
        rollouts given it (`run(task, runtime=box)`) borrow it and never close it."""
        runtime = make_runtime(runtime_for_task(self.config.runtime, task.data))
        try:
            yield runtime
        finally:
            await runtime.close()

    @contextlib.asynccontextmanager
    async def interaction(self, task: Task):
        async with self._episode.gate:
            rollout = await self._episode.open(self, task)
        try:
            yield Interaction(rollout, self._episode.gate)
        except BaseException:
            await rollout.cleanup()
            raise
        rollout.finish("user_closed")
        async with self._episode.gate:
            await self._episode.close(rollout)


class Agents:
    """An episode's agents by seat name (`agents.player`)."""

    def __init__(self, agents: dict[str, Agent]):
        self._agents = agents

    def __getattr__(self, name: str) -> Agent:
        agents = self.__dict__.get("_agents") or {}
        if name not in agents:
            raise AttributeError(f"no agent {name!r}; this env declares {sorted(agents)}")
        return agents[name]

    def __iter__(self):
        return iter(self._agents.values())

    def names(self) -> list[str]:
        return list(self._agents)


class EpisodeContext:
    """What the runner gives an episode's agents: how to open a seat's rollout, where its
    finished trace goes, and `gate`, the permits (`max_concurrent_agents`) a seat holds while it
    sets up, runs a segment, or closes. Implemented by `vf.runner`."""

    gate: asyncio.Semaphore

    async def open(self, agent: Agent, task: Task,
                   runtime: Runtime | None = None) -> Rollout:  # pragma: no cover - interface
        """`runtime`: a borrowed box the rollout uses instead of making (and closing) its own."""
        raise NotImplementedError

    async def close(self, rollout: Rollout, scored: bool = True):  # pragma: no cover - interface
        raise NotImplementedError

    def discard(self, trace) -> None:  # pragma: no cover - interface
        """Forget a closed rollout's trace (a retry replaces it)."""
        raise NotImplementedError
