"""LLM judges: a model call through any OpenAI-compatible client that scores a trace.

    class YesNoJudge(vf.Judge):
        prompt = "Question: {question}\\nAnswer: {answer}\\nIs the answer correct? Say yes or no."

        async def score(self, task, trace) -> float:
            response = await self.complete(self.build_messages(question=task.prompt_text,
                                                               answer=trace.last_reply), trace=trace)
            return float("yes" in response.text.lower())

A task's rewards may call a judge directly, or a run plugs judges into every task:
`--env.taskset.task.judges '[{id: "my_pkg.judges:YesNoJudge", weight: 0.5, model: m,
base_url: http://...}]'` (built-in ids: `reference`). A plugged judge runs after the task's
rewards and adds the reward `name` (default: the class name in snake case, less `Judge`).
Every call is recorded in `trace.info["judge_calls"]` (request, reply, usage) and its usage in
`trace.extra_usage`, as verifiers records them. A judge that errors is an error on the trace (the
episode is redone by `--resume`).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vf.errors import ConfigError


class JudgeConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = ""
    """Which judge: a built-in (`reference`) or `pkg.module:Class` / `path/file.py:Class`."""
    name: str = ""
    """Reward key (default: derived from the class name)."""
    weight: float = 1.0
    model: str = "judge"
    sampling: dict[str, Any] = Field(default_factory=dict)
    prompt: str | None = None
    """Path to a file whose text replaces the judge's prompt template."""
    base_url: str | None = None
    """OpenAI-compatible endpoint (None = the OPENAI_BASE_URL environment variable)."""
    api_key_var: str = "OPENAI_API_KEY"
    timeout: float = Field(60.0, gt=0)


@dataclass
class JudgeResponse:
    text: str
    usage: dict[str, int] = field(default_factory=dict)


class Judge:
    prompt: str | None = None
    config_class: type[JudgeConfig] = JudgeConfig

    def __init__(self, config: JudgeConfig | dict | None = None):
        if not isinstance(config, JudgeConfig):
            config = self.config_class(**(config or {}))
        self.config = config
        if config.prompt is not None:
            self.prompt = Path(config.prompt).read_text()
        self._client = None

    @property
    def reward_name(self) -> str:
        fallback = re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__.removesuffix("Judge")).lower()
        return self.config.name or fallback or "judge"

    def build_messages(self, **fields: Any) -> str:
        """The prompt template with `{field}` placeholders filled (others left as written)."""
        if self.prompt is None:
            raise ValueError(f"{type(self).__name__} has no `prompt`; set it or override build_messages")
        if not fields:
            return self.prompt
        pattern = re.compile(r"\{(" + "|".join(map(re.escape, fields)) + r")\}")
        return pattern.sub(lambda m: str(fields[m.group(1)]), self.prompt)

    def engine(self):
        """The judge's client: vf's OpenAI-compatible engine (retries, timeouts) on its endpoint."""
        if self._client is None:
            from vf.engines.openai_client import OpenAIEngine

            base_url = self.config.base_url or os.environ.get("OPENAI_BASE_URL")
            if not base_url:
                raise ConfigError([f"judge {self.reward_name!r}: no base_url"],
                                  hint="set base_url in its JudgeConfig, or OPENAI_BASE_URL")
            self._client = OpenAIEngine(base_url, self.config.model, api_key_var=self.config.api_key_var,
                                        timeout=self.config.timeout, max_retries=1, max_connections=8)
        return self._client

    async def complete(self, messages: str | list, *, trace=None, **sampling: Any) -> JudgeResponse:
        """One judge call; recorded on `trace` (with its usage) even when the reply is unusable."""
        from vf.engines.base import GenerateRequest, Sampling
        from vf.types import to_wire

        wire = [{"role": "user", "content": messages}] if isinstance(messages, str) else [to_wire(m) for m in messages]
        kwargs = {**self.config.sampling, **sampling}
        start = time.time()
        result = await self.engine().generate(GenerateRequest(
            messages=wire, sampling=Sampling(**{"logprobs": False, **kwargs}), model=self.config.model))
        text = result.message.get("content") or ""
        usage = {"prompt_tokens": result.usage.prompt_tokens, "completion_tokens": result.usage.completion_tokens}
        if trace is not None:  # the record verifiers writes: request, response message, usage
            trace.info.setdefault("judge_calls", []).append({
                "name": self.reward_name, "request": {"model": self.config.model, "messages": wire, **kwargs},
                "response": {"message": {"role": "assistant", "content": text}, "usage": usage},
                "time": {"start": start, "end": time.time()}})
            trace.extra_usage.append(usage)
        return JudgeResponse(text=text, usage=usage)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def score(self, task, trace) -> float | dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} implements no `score`, so it cannot be plugged "
                                  "via taskset.task.judges")


class ReferenceJudge(Judge):
    """Is the reply equivalent to the task's reference `answer`? 1.0 for yes, else 0.0."""

    prompt = ("Question:\n{question}\n\nReference answer:\n{answer}\n\nResponse:\n{response}\n\n"
              "Is the response equivalent to the reference answer? Reply with exactly yes or no.")

    async def score(self, task, trace) -> float:
        answer = getattr(task, "answer", None)
        messages = self.build_messages(question=task.prompt_text, answer=answer, response=trace.last_reply)
        reply = await self.complete(messages, trace=trace)
        return 1.0 if reply.text.strip().lower().startswith("yes") else 0.0


BUILTIN = {"reference": ReferenceJudge}


def load_judge(entry: dict[str, Any] | JudgeConfig) -> Judge:
    raw = entry.model_dump() if isinstance(entry, BaseModel) else dict(entry)
    judge_id = raw.get("id") or ""
    if not judge_id:
        raise ConfigError(["taskset.task.judges: each entry needs an `id` (a built-in: "
                           f"{', '.join(BUILTIN)}, or pkg.module:Class)"])
    if judge_id in BUILTIN:
        cls = BUILTIN[judge_id]
    else:
        from vf.taskset import import_function

        cls = import_function(judge_id)
    if not (isinstance(cls, type) and issubclass(cls, Judge)):
        raise ConfigError([f"taskset.task.judges: {judge_id} is not a vf.Judge subclass"])
    return cls(cls.config_class(**raw))


async def run_judges(task, trace, args: dict[str, Any]) -> None:
    """The task config's plugged judges, after the task's rewards (see module docstring)."""
    import traceback as tb

    from vf.taskset import call_hook
    from vf.trace import ErrorInfo, RewardValue

    judges = [load_judge(e) for e in task.config.judges]
    for judge in judges:
        trace.rewards.setdefault(judge.reward_name, None)
    for judge in judges:
        try:
            value = await call_hook(judge.score, args)
        except Exception as e:  # noqa: BLE001 - a judge that errors fails this trace, not the run
            trace.errors.append(ErrorInfo(type=type(e).__name__, message=f"judge {judge.reward_name!r}: {e}",
                                          status_code=getattr(e, "status_code", None),
                                          traceback=tb.format_exc(limit=5)))
            trace.ok = False
            continue
        finally:
            await judge.close()
        values = value if isinstance(value, dict) else {judge.reward_name: value}
        if judge.reward_name not in values:
            trace.rewards.pop(judge.reward_name, None)
        for k, v in values.items():
            trace.rewards[k] = None if v is None else RewardValue(score=float(v), weight=judge.config.weight)
