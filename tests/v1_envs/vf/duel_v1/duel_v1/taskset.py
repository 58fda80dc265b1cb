import vf


class DuelData(vf.TaskData):
    answer: str


class DuelTask(vf.Task[DuelData]):
    @vf.reward
    async def exact(self, task, trace) -> float:
        return float(trace.last_reply == task.answer)


class DuelTaskset(vf.Taskset[DuelTask]):
    def load(self):
        for word in ["apple", "banana", "cherry"]:
            yield DuelTask(DuelData(prompt=word, answer=word.upper() if word == "banana" else word))


class DuelConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    critic: vf.AgentConfig = vf.AgentConfig(max_turns=2)


class DuelEnv(vf.Env[DuelConfig]):
    async def setup(self, agents):
        agents.critic.trainable = False

    async def run(self, task, agents):
        trace = await agents.player.run(task)
        async with agents.critic.interaction(task.with_data(prompt=None)) as chat:
            first = await chat.turn(f"judge {trace.last_reply}")
            second = await chat.turn("again")
            third = await chat.turn("more")
            chat.trace.info["segments"] = [first.last_reply, second.last_reply, third.terminated]

    async def finalize(self, task, episode):
        player = next(t for t in episode.traces if t.agent.name == "player")
        critic = next(t for t in episode.traces if t.agent.name == "critic")
        player.record_reward("critic_agrees", float(critic.last_reply == "again"), 0.5)
        player.record_metric("critic_turns", critic.num_turns)
        player.record_metric("critic_trainable", float(critic.agent.trainable))
        player.record_metric("player_errored", float(player.has_error))
