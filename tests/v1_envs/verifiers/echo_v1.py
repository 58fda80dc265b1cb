"""Echo: single-file v1 taskset. One-argument generics, every TaskData field, prompts as text or
message lists with content parts, rewards/metrics returning floats or mappings with priorities,
hooks injected by name, the trace API."""

from typing import Any

import verifiers.v1 as vf
from echo_helpers import normalize

__all__ = ["EchoTaskset"]


class EchoData(vf.TaskData):
    answer: str
    info: dict[str, Any] = {}


class EchoTask(vf.Task[EchoData]):
    async def setup(self, trace, runtime):
        trace.info["setup_ran"] = runtime is not None
        trace.info["level"] = self.data.info.get("level", 0)

    async def finalize(self, trace):
        trace.info["finalized_turns"] = trace.num_turns

    @vf.reward(weight=1.0)
    async def exact(self, task, trace) -> float:
        return float(normalize(trace.last_reply) == normalize(task.answer))

    @vf.reward(weight=0.5, priority=10)
    async def parts(self, task, trace):
        words = set(normalize(task.answer).split())
        reply = normalize(trace.last_reply).split()
        return {"overlap": len(words & set(reply)) / max(len(words), 1),
                "short": float(len(reply) <= 3)}

    @vf.metric
    async def shape(self, trace):
        first = trace.messages[0]
        return {"n_messages": float(len(trace.messages)),
                "n_assistant": float(len(trace.assistant_messages)),
                "n_tool": float(len(trace.tool_messages)),
                "first_is_user": float(isinstance(first, vf.UserMessage)),
                "text_len": float(len(vf.types.content_text(first.content)))}

    @vf.metric(priority=5)
    async def hooks_ran(self, trace) -> float:
        return float(trace.info.get("setup_ran", False)) + float(trace.info.get("finalized_turns") == 1)



class EchoTaskset(vf.Taskset[EchoTask]):
    def load(self):
        yield EchoTask(EchoData(prompt="hello world", answer="hello world", id="t0", name="greeting",
                       description="say it back", timeout=vf.TaskTimeout(agent=60.0),
                       resources=vf.TaskResources(cpu=1, memory=1.0), info={"level": 1}))
        yield EchoTask(EchoData(prompt="Alpha beta gamma delta", answer="alpha beta", id="t1"))
        yield EchoTask(EchoData(prompt=[vf.UserMessage(content=[vf.TextContentPart(text="one two")])],
                       answer="one two", id="t2", system_prompt="Repeat the user."))
        yield EchoTask(EchoData(prompt=[{"role": "user", "content": "ONE"}], answer="two", id="t3"))
