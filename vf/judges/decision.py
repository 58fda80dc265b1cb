"""`decision`: a grade from a decision-model evaluations API (Prime's by default).

One POST of `{model, state: {question, response[, answer]}, questions: {grade: {type: score,
instructions, criteria: levels}}}` to `base_url` (the full URL); the reply's
`answers.grade.score` (a level index, possibly fractional: probability-weighted) over
`len(levels) - 1` is the reward. A `result` wrapper (Workers AI) is unwrapped.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from vf.judge import Judge, JudgeConfig, JudgeResponse, JudgeView, judge_question, judge_response
from vf.types import Usage


class DecisionJudgeConfig(JudgeConfig):
    id: str = "decision"
    model: str = "typesafe-ai/jev"
    base_url: str | None = "https://api.pinference.ai/api/v1/evaluations"
    """Full URL evaluation requests are POSTed to."""
    api_key_var: str = "PRIME_API_KEY"
    levels: list[str] = Field(default_factory=lambda: ["Incorrect", "Correct"], min_length=2, max_length=10)
    """Grades, worst to best; the weighted level normalised to [0, 1]."""
    question_field: str = ""
    answer_field: str = ""
    """Task field with a reference answer to include in the state (empty: none)."""
    view: JudgeView = "last_reply"


class DecisionJudge(Judge[float, DecisionJudgeConfig]):
    prompt = ("Grade how well the response satisfies the task in question. "
              "Use the reference answer when provided; equivalent answers are acceptable.")

    async def evaluate(self, *, trace=None, **fields: Any) -> JudgeResponse[float]:
        request = {"model": self.config.model, "state": fields,
                   "questions": {"grade": {"type": "score", "instructions": self.build_messages(**fields),
                                           "criteria": self.config.levels}}}
        client = self.client(self.config.base_url)
        try:
            raw = await client.post_json(client.base_url, request)
        finally:
            await client.close()
        response = JudgeResponse[float](text=json.dumps(raw))
        try:
            result = raw.get("result", raw)
            usage = result.get("usage") if isinstance(result, dict) else None
            if isinstance(usage, dict) and usage:
                response.usage = Usage(
                    prompt_tokens=_first(usage, "inputTokens", "input_tokens"),
                    completion_tokens=_first(usage, "outputTokens", "output_tokens"), cost=usage.get("cost"))
            score = result["answers"]["grade"]["score"] / (len(self.config.levels) - 1)
            if not 0 <= score <= 1:
                raise ValueError(f"decision judge score {score!r} is outside [0, 1]")
            response.parsed = score
            return response
        finally:  # billed even when the score is unreadable
            if trace is not None:
                trace.record_judge_call(name=self.reward_name, request=request, response=response)

    async def score(self, task, trace) -> float:
        response = judge_response(trace, self.config.view)
        if not response.strip():
            return 0.0
        fields: dict[str, Any] = {"question": judge_question(task, self.config.question_field), "response": response}
        if self.config.answer_field:
            answer = getattr(task, self.config.answer_field, None)
            if answer is None:
                raise ValueError(f"decision judge found no {self.config.answer_field!r} field on the task")
            fields["answer"] = answer
        return (await self.evaluate(trace=trace, **fields)).parsed


def _first(usage: dict, *keys: str) -> int:
    for key in keys:
        if usage.get(key) is not None:
            return int(usage[key])
    raise ValueError(f"decision judge usage has none of {keys}: {usage!r}")


__all__ = ["DecisionJudge", "DecisionJudgeConfig"]
