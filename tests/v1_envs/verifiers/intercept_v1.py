"""Intercept: `@vf.intercept` hooks on every model call of a `bash` agent, and `@vf.stop`s that
read what the hooks did. Run it with the stub model `bash:echo out` (its first reply calls
`bash`, its second repeats the newest tool result) under `--env.agent.harness.id bash`.

Request hooks (newest user or tool message; two priorities, so their order shows): `note_first`
(priority 2) appends " +first", `note_second` (priority 1) " +second". `deny` (priority 0) is the
tool-call hook: before a call runs, the request hooks see the conversation plus an empty result
for it; a row asking to deny replaces that result, so the call never runs and the model sees
"denied" (as verifiers 0.4's tool gate does). The response hook `wrap` turns a text reply into
"<<reply>>". `halt` stops before a model call once the prompt, as the hooks rewrote it, ends in
"halt +first +second"; `wrapped_twice` stops after a reply wrapped twice (never, unless a hook
ran twice). Rewards read the trace: a hook not run, run out of order or run twice changes them.
"""

import verifiers.v1 as vf
from verifiers.v1.types import content_text

__all__ = ["InterceptTaskset"]

NOTES = " +first +second"


class InterceptData(vf.TaskData):
    mode: str
    """run (the call runs), deny (the tool hook blocks it) or halt (a stop ends the rollout)."""


def _note(request: vf.Request, note: str) -> vf.Request | None:
    last = request.messages[-1]
    if last.role not in ("user", "tool") or not isinstance(last.content, str) or not last.content:
        return None  # an empty tool result is a call not run yet: `deny` decides about it
    last.content += note
    return request


class InterceptTask(vf.Task[InterceptData]):
    @vf.intercept(priority=2)
    async def note_first(self, request: vf.Request) -> vf.Request | None:
        return _note(request, " +first")

    @vf.intercept(priority=1)
    async def note_second(self, request: vf.Request) -> vf.Request | None:
        return _note(request, " +second")

    @vf.intercept
    async def deny(self, request: vf.Request) -> vf.Request | None:
        last = request.messages[-1]
        if self.data.mode != "deny" or last.role != "tool" or last.content:
            return None
        last.content = "denied"
        return request

    @vf.intercept
    async def wrap(self, response: vf.Response) -> vf.Response | None:
        if response.message.tool_calls or not response.message.content:
            return None
        response.message.content = f"<<{response.message.content}>>"
        return response

    @vf.stop
    async def halt(self, request: vf.Request) -> bool:
        return any(m.role == "user" and content_text(m.content).endswith("halt" + NOTES) for m in request.messages)

    @vf.stop
    async def wrapped_twice(self, response: vf.Response) -> bool:
        return (response.message.content or "").startswith("<<<<")

    @vf.reward
    async def prompt_noted(self, trace) -> float:
        users = [m for m in trace.messages if m.role == "user"]
        return float(len(users) == 1 and users[0].content == self.data.prompt + NOTES)

    @vf.reward
    async def reply_wrapped(self, trace) -> float:
        tools = [m for m in trace.messages if m.role == "tool"]
        if self.data.mode == "halt":
            return float(not tools and trace.last_reply == "" and trace.stop_condition == "halt")
        if len(tools) != 1:
            return 0.0
        result = content_text(tools[0].content)
        ok = result == "denied" if self.data.mode == "deny" else result.endswith(NOTES) and result.count("+") == 2
        return float(ok and trace.last_reply == f"<<{result}>>")

    @vf.metric
    async def tool_results(self, trace) -> float:
        return float(sum(m.role == "tool" for m in trace.messages))

    @vf.metric
    async def replies(self, trace) -> float:
        return float(sum(m.role == "assistant" for m in trace.messages))


class InterceptTaskset(vf.Taskset[InterceptTask]):
    def load(self):
        prompts = {"run": "say out", "deny": "deny the command", "halt": "please halt"}
        for mode, prompt in prompts.items():
            yield InterceptTask(InterceptData(prompt=prompt, mode=mode))
