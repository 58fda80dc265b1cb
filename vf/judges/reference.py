"""`reference`: the reply against the task's reference answer(s), verdict `yes`/`no` (configurable).

An empty reply scores 0 without a call; an endpoint failure or a reply without a verdict label
raises (an error on the trace, never a 0 for the model).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import model_validator

from vf.judge import (
    Judge,
    JudgeConfig,
    JudgeResponse,
    JudgeView,
    judge_question,
    judge_response,
    judge_verdict,
)

REFERENCE_PROMPT = (Path(__file__).parent / "reference.txt").read_text(encoding="utf-8")


class ReferenceJudgeConfig(JudgeConfig):
    id: str = "reference"
    answer_field: str = "answer"
    """Task field holding the reference answer; a list is shown one acceptable answer per line."""
    question_field: str = ""
    """Task field for `{question}`; empty = the task's prompt as text."""
    view: JudgeView = "last_reply"
    choices: tuple[str, str] = ("yes", "no")
    """(positive, negative) verdict labels, put in the prompt as `{positive}`/`{negative}`."""

    @model_validator(mode="after")
    def _distinct_choices(self) -> ReferenceJudgeConfig:
        # labels match case-insensitively, so they must differ that way too
        if not all(self.choices) or self.choices[0].upper() == self.choices[1].upper():
            raise ValueError(f"`choices` needs two distinct, non-empty verdict labels, got {self.choices!r}")
        return self


class ReferenceJudge(Judge[float, ReferenceJudgeConfig]):
    prompt = REFERENCE_PROMPT

    def parse(self, response: JudgeResponse) -> float:
        return float(judge_verdict(response.text, self.config.choices) == self.config.choices[0])

    async def score(self, task, trace) -> float:
        answer = getattr(task, self.config.answer_field, None)
        if answer is None:
            raise ValueError(f"reference judge found no {self.config.answer_field!r} field on the task; "
                             "point `answer_field` at the task's reference-answer field")
        if isinstance(answer, (list, tuple)):
            answer = "\n".join(map(str, answer))
        response = judge_response(trace, self.config.view)
        if not response.strip():
            return 0.0
        positive, negative = self.config.choices
        result = await self.evaluate(trace=trace, question=judge_question(task, self.config.question_field),
                                     answer=answer, response=response, positive=positive, negative=negative)
        return result.parsed


__all__ = ["ReferenceJudge", "ReferenceJudgeConfig"]
