"""Envs: how one task becomes one episode, with one or more agents (seats).

Every plain taskset runs as `SingleAgentEnv` (one seat named `agent`). A multi-agent env
declares each seat as an `AgentConfig` field of its `EnvConfig` (field name = seat name) and
writes `run(task, agents)`; `setup(agents)` and `finalize(task, episode)` are optional:

    class GameConfig(vf.EnvConfig):
        player: vf.AgentConfig = vf.AgentConfig()
        critic: vf.AgentConfig = vf.AgentConfig(max_turns=1)

    class GameEnv(vf.Env[GameConfig]):
        async def setup(self, agents):
            agents.critic.trainable = False          # never trained on

        async def run(self, task, agents):
            trace = await agents.player.run(task)    # one segment on the task's prompt
            async with agents.critic.interaction(task.with_data(prompt=None)) as chat:
                segment = await chat.turn(f"Rate this: {trace.last_reply}")

        async def finalize(self, task, episode):    # cross-seat rewards
            ...

One episode line holds every seat's trace in completion order, each stamped with its seat
name and `trainable`. Seat config comes from `--env.<seat>.*` (`--env.agent.*` for the single
agent, and as defaults for every seat of a multi-agent env).

A scripted user for the single agent can also be written as `respond(task, trace, state)`:
the default `run` then alternates model turns and `respond` until it returns None.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Generic

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

from vf.harness import HarnessConfig, Rollout, reply_text, runtime_for_task, segment_since
from vf.retries import RetryBudget, RetryConfig, backoff
from vf.runtime import Runtime, RuntimeConfig, make_runtime
from vf.taskset import Task, concrete_type


class SubprocessConfig(RuntimeConfig):
    """verifiers' name for a host-process runtime: `RuntimeConfig(type="subprocess")`."""

    type: str = "subprocess"


class EnvTimeout(BaseModel):
    model_config = ConfigDict(extra="forbid")
    episode: float | None = Field(None, gt=0)
    """Seconds one episode may take (all seats); None = the run's `episode_timeout`."""


class AgentTimeout(BaseModel):
    """Seconds each stage of one rollout may take (`--env.<seat>.timeout.*`); an unset stage takes
    the task's own (`TaskData.timeout`), else has no limit. A stage past its deadline stops the
    trace as `<stage>_timeout` (`is_timeout`), which is a stop, not an error: finalize and
    scoring still run after a setup or agent timeout."""

    model_config = ConfigDict(extra="forbid")
    setup: float | None = Field(None, gt=0)
    """Runtime, toolsets and the task's setup hook."""
    rollout: float | None = Field(None, gt=0)
    """The agent's solve attempt: one budget over all of its turns (the task's `timeout.agent`)."""
    finalize: float | None = Field(None, gt=0)
    scoring: float | None = Field(None, gt=0)


class AgentConfig(BaseModel):
    """One seat: harness × model × runtime policy, and its caps (`--env.<seat>.*`)."""

    model_config = ConfigDict(extra="forbid")

    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    model: str | None = None
    """None = the run's model."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Merged onto the run's sampling for this seat."""
    max_turns: int | None = Field(None, gt=0)
    """Model replies per rollout; None = the run's `max_turns`."""
    max_input_tokens: int | None = Field(None, gt=0)
    """Prompt tokens summed over the rollout's model calls before it stops (`max_input_tokens`)."""
    max_output_tokens: int | None = Field(None, gt=0)
    max_total_tokens: int | None = Field(None, gt=0)
    timeout: AgentTimeout = Field(default_factory=AgentTimeout)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    """Run this seat's rollout again when its trace ends with an error the rules allow."""


class EnvConfig(BaseModel):
    """The `[env]` block: env-level knobs plus one `AgentConfig` field per seat."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    timeout: EnvTimeout = Field(default_factory=EnvTimeout)
    max_concurrent_agents: int = Field(1, gt=0)
    """Seats of one episode running at once (an env's `asyncio.gather` is bounded by it)."""
    retries: RetryConfig = Field(default_factory=RetryConfig)
    """Rerun the whole episode when it failed with an error the rules allow."""


class SingleAgentEnvConfig(EnvConfig):
    agent: AgentConfig = Field(default_factory=AgentConfig)


def seat_fields(config: BaseModel) -> dict[str, AgentConfig]:
    """The seats a config declares: its top-level AgentConfig fields, in declaration order."""
    return {name: getattr(config, name) for name in type(config).model_fields
            if isinstance(getattr(config, name), AgentConfig)}


# ---- agents and interactions -------------------------------------------------------------------


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


# ---- envs --------------------------------------------------------------------------------------

EC = TypeVar("EC", bound=EnvConfig, default=EnvConfig)


class Env(Generic[EC]):
    """One episode's control flow. Stateless across episodes (one instance serves them all)."""

    def __init__(self, config: EC | None = None):
        self.config = config if config is not None else self.config_class()()

    @classmethod
    def config_class(cls) -> type[EnvConfig]:
        found = concrete_type(cls, EnvConfig, None)
        if found is not None:
            return found
        return SingleAgentEnvConfig

    def seats(self) -> dict[str, AgentConfig]:
        return seat_fields(self.config)

    async def setup(self, agents: Agents) -> None:
        """Before `run`, once per episode (e.g. `agents.judge.trainable = False`)."""

    async def run(self, task: Task, agents: Agents) -> None:
        """The episode. Default: the single agent runs the task; with `respond` defined, a
        scripted user answers every reply until it returns None."""
        agent = agents.agent
        if type(self).respond is Env.respond:
            await agent.run(task)
            return
        async with agent.interaction(task) as chat:
            segment = await chat.turn() if task.data.prompt is not None else None
            while segment is None or not segment.terminated:
                message = await self.respond(task=task.data, trace=chat.trace, state=chat.state)
                if message is None:
                    chat.finish("env_done")
                    return
                segment = await chat.turn(message)

    async def finalize(self, task: Task, episode) -> None:
        """After every seat finished: cross-seat rewards via `trace.record_reward`."""

    async def respond(self, task, trace, state) -> str | dict[str, Any] | None:
        """The next user message after a model reply, or None to end the episode."""
        return None


class SingleAgentEnv(Env[SingleAgentEnvConfig]):
    """What every plain taskset runs as: one seat named `agent`."""


def runs_legacy(env: Env) -> bool:
    """An env whose `run(task, agent)` drives the single seat's rollout directly (older vf)."""
    params = list(inspect.signature(env.run).parameters)
    return "agent" in params and "agents" not in params
