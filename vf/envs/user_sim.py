"""user-sim: a modeled user converses with the assistant under evaluation.

The task's prompt is the USER's scenario (put into the user's system prompt, `persona`); the
assistant plays the same task with its prompt removed, so it learns the goal only by talking,
and the task's rewards score the assistant's trace (they must read fields like `answer`, not the
prompt). The user opens, and ends the conversation by replying `done_marker`; its own
`max_turns` caps a run-away exchange. The user seat is never trained on.
"""

from __future__ import annotations

from pydantic import Field

from vf.env import AgentConfig, Env, EnvConfig
from vf.taskset import Task, TaskData

PERSONA = """You are role-playing a USER talking to an AI assistant. This is your situation — what you want the ASSISTANT to do for you:

{scenario}

Rules:
- Open the conversation with your request, in your own words.
- Stay in character: short, natural user messages; never act as the assistant.
- The assistant does the work, not you: never perform the task yourself; ask for it instead.
- Reveal details only when asked, as a real user would.
- When the assistant has fully met your goal — or you are convinced it cannot — reply with exactly {done} and nothing else."""

DONE = "###DONE###"
GREETING = "Hello! How can I help you today?"


class UserSimEnvConfig(EnvConfig):
    assistant: AgentConfig = Field(default_factory=AgentConfig)
    user: AgentConfig = Field(default_factory=lambda: AgentConfig(harness={"id": "null"}, max_turns=8))
    """The modeled user; its `max_turns` caps the conversation (`--env.user.max-turns`)."""
    persona: str = PERSONA
    """The user's system prompt: `{scenario}` becomes the task's prompt text, `{done}` the marker."""
    done_marker: str = Field(DONE, min_length=1)


class UserSimEnv(Env[UserSimEnvConfig]):
    async def setup(self, agents) -> None:
        agents.user.trainable = False  # the user models the world; its tokens are not training data

    async def run(self, task, agents) -> None:
        persona = self.config.persona.replace("{done}", self.config.done_marker)
        user_task = Task(TaskData(idx=task.data.idx, prompt=None,
                                  system_prompt=persona.replace("{scenario}", task.data.prompt_text)))
        assistant_task = type(task)(task.data.model_copy(update={"prompt": None}), task.config)
        async with agents.user.interaction(user_task) as user, \
                agents.assistant.interaction(assistant_task) as assistant:
            ask = await user.turn(GREETING)  # the assistant "answers the phone"; the user states the goal
            while not ask.terminated and ask.last_reply.strip() != self.config.done_marker:
                answer = await assistant.turn(ask.last_reply)
                if answer.terminated:
                    break
                ask = await user.turn(answer.last_reply)

    async def finalize(self, task, episode) -> None:
        (user,) = (t for t in episode.traces if t.agent.name == "user")
        for trace in episode.traces:
            if trace.agent.name == "assistant":
                trace.record_metric("user_turns", float(user.num_turns))
