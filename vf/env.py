"""Control flow of one episode beyond a single agent reply: scripted users, games.

The default `Env.run` opens the conversation with the task's prompt, lets the agent reply
(running any tool calls it makes), then asks `respond()` for the next user message until it
returns None, a stop condition fires, or `max_turns` is reached:

    class WordleEnv(vf.Env):
        async def respond(self, task, trace, state):
            if state.solved:
                return None
            return feedback(trace.last_reply, task.answer)

Override `run(task, agent)` itself for anything else (several agents, games with moves).
"""

from __future__ import annotations

from typing import Any


class Env:
    """One episode's control flow. Stateless across episodes: keep per-episode data in `state`."""

    async def run(self, task, agent) -> None:
        await agent.turn()
        while not agent.done:
            message = await self.respond(task=task.data, trace=agent.trace, state=agent.state)
            if message is None:
                agent.finish("env_done")
                break
            await agent.turn(message)

    async def respond(self, task, trace, state) -> str | dict[str, Any] | None:
        """The next user message after a model reply, or None to end the episode."""
        return None
