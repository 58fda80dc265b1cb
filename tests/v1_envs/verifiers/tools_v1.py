"""Tools: a per-rollout MCP toolset (`Task.toolsets`) with bare tool names (`TOOL_PREFIX = None`),
typed per-rollout toolset state, `setup()`, and a shared taskset-wide toolset whose names carry
its prefix; rewards read the tool messages the model saw."""

import re

import verifiers.v1 as vf
from tools_v1_calc import Calc, CalcConfig
from tools_v1_notes import Notes

__all__ = ["CalcTaskset"]


class CalcData(vf.TaskData):
    answer: int


class CalcTaskConfig(vf.TaskConfig):
    offset: int = 0


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Calc(CalcConfig(offset=config.offset))]

    @vf.reward
    async def correct(self, trace) -> float:
        m = re.search(r"\\boxed\{(-?\d+)\}", trace.last_reply)
        return float(m is not None and int(m.group(1)) == self.data.answer)

    @vf.metric
    async def tool_turns(self, trace) -> float:
        return float(len(trace.tool_messages))

    @vf.reward(weight=0.25)
    async def used_tool(self, trace) -> float:
        return float(any("5" in vf.types.content_text(m.content) for m in trace.tool_messages))


class CalcTasksetConfig(vf.TasksetConfig):
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcTasksetConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Notes(vf.SharedToolsetConfig())]

    def load(self):
        return [CalcTask(CalcData(prompt="Use the tool to add 2 and 3.", answer=a), self.config.task)
                for a in (5, 5, 6)]
