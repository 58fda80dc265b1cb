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

`agents` is a `vf.Agents` (the episode core's, vf.episode.agents: this module is the authoring
API and never imports the machinery that runs it).

A scripted user for the single agent can also be written as `respond(task, trace, state)`:
the default `run` then alternates model turns and `respond` until it returns None.
"""

from __future__ import annotations

import inspect
from typing import Any, Generic

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypeVar

from vf.configs.harness import HarnessConfig
from vf.retries import RetryConfig
from vf.runtime import RuntimeConfig
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

    async def setup(self, agents: Any) -> None:
        """Before `run`, once per episode (e.g. `agents.judge.trainable = False`)."""

    async def run(self, task: Task, agents: Any) -> None:
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
