"""Relay: two seats, and the second seat's task is built from the first seat's finished trace.

The writer plays the taskset's row; the env then mints a NEW task for the reader from the
writer's trace: its reply and its typed row (`trace.task.data` is the taskset's RelayData, so
`.idx` and the author's own field `.answer` read as attributes). Each seat's trace is scored
against its own task; the env's finalize copies the reader's outcome onto the writer's trace.
Command line: `--env.writer.*` / `--env.reader.*` for the seats."""

import vf

__all__ = ["RelayEnv", "RelayTaskset"]


class RelayData(vf.TaskData):
    answer: str
    source_idx: int = -1


class RelayTask(vf.Task[RelayData]):
    @vf.reward
    async def exact(self, trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.metric
    async def source(self, trace) -> float:
        return float(self.data.source_idx)


class RelayTaskset(vf.Taskset[RelayTask]):
    def load(self):
        for word in ["apple", "banana", "cherry"]:
            yield RelayTask(RelayData(prompt=word, answer=word.upper() if word == "banana" else word))


class RelayConfig(vf.EnvConfig):
    writer: vf.AgentConfig = vf.AgentConfig()
    reader: vf.AgentConfig = vf.AgentConfig()


class RelayEnv(vf.Env[RelayConfig]):
    async def run(self, task, agents):
        first = await agents.writer.run(task)
        row = first.task.data  # the writer's row, typed
        relayed = RelayTask(RelayData(idx=row.idx, prompt=f"#{row.idx} {first.last_reply}",
                                      answer=f"#{row.idx} {row.answer}", source_idx=row.idx + 10))
        await agents.reader.run(relayed)

    async def finalize(self, task, episode):
        writer = next(t for t in episode.traces if t.agent.name == "writer")
        reader = next(t for t in episode.traces if t.agent.name == "reader")
        writer.record_reward("relayed", reader.rewards["exact"].score, 0.5)
        writer.record_metric("reader_row", float(reader.task.data.source_idx))
        writer.record_metric("reader_is_relay", float(type(reader.task.data).__name__ == "RelayData"))
