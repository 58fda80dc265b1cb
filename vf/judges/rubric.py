"""`rubric`: weighted criteria from a TOML/JSON file, each answered with one of its ordered choices.

    [[criteria]]
    name = "cites_sources"          # metric `<judge name>/cites_sources`
    text = "The response cites at least one source."
    weight = 2.0                    # share of the reward (default 1; config `weights` overrides)
    choices = ["no", "partly", "yes"]   # worst → best: scores 0, 0.5, 1 (default ["no", "yes"])

The reward is the weight-averaged criterion score. The judge sees verifiers' prompt (and, unless
`structured_output`, its JSON instructions); the first `{"verdicts": [...]}` object in the reply is
read (an echoed format example is skipped). A missing, repeated or unknown criterion, or a verdict
outside its choices, is a judge error, never a score.
"""

from __future__ import annotations

import asyncio
import json
import re
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, TypeAdapter, field_validator

from vf.judge import Judge, JudgeConfig, JudgeView, judge_question, judge_response

RUBRIC_PROMPT = (Path(__file__).parent / "rubric.txt").read_text(encoding="utf-8")

# Appended when not using structured output, so the reply is JSON (a reason before each verdict).
JSON_SUFFIX = (
    "\n\nRespond with ONLY a JSON object and nothing else, in exactly this shape:\n"
    '{"verdicts": [{"name": "<criterion name>", "reason": "<one sentence citing specific '
    'evidence from the response>", "verdict": "<answer>"}, ...]}\n'
    "with one entry per criterion, using each criterion's exact name. For each, first write the "
    "one-sentence reason grounded in the response, then set verdict to exactly one of the options "
    "listed in parentheses after that criterion."
)

CriterionWeight = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Criterion(BaseModel):
    name: str
    text: str
    weight: CriterionWeight = 1.0
    choices: list[str] = Field(default_factory=lambda: ["no", "yes"], min_length=2)
    """Allowed answers, worst → best (first 0.0, last 1.0, the rest evenly spaced)."""

    @field_validator("choices")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"`choices` has duplicate options: {v}")
        return v

    def render(self) -> str:
        return f"- {self.name}: {self.text} (answer one of, worst to best: {', '.join(self.choices)})"


class CriterionVerdict(BaseModel):
    name: str
    reason: str
    verdict: str


class RubricVerdicts(BaseModel):
    verdicts: list[CriterionVerdict]


def load_criteria(path: Path, weights: dict[str, float] | None = None) -> list[Criterion]:
    """The criteria in a `.toml` (a `criteria` array of tables) or `.json` file (a `criteria` list,
    or the list itself), with `weights` overriding by name."""
    text = Path(path).read_text(encoding="utf-8")
    data = tomllib.loads(text) if Path(path).suffix.lower() == ".toml" else json.loads(text)
    items = data.get("criteria", []) if isinstance(data, dict) else data
    criteria = TypeAdapter(list[Criterion]).validate_python(items)
    if not criteria:
        raise ValueError(f"rubric file '{path}' lists no criteria")
    names = [c.name for c in criteria]
    if len(set(names)) != len(names):
        raise ValueError(f"rubric file '{path}' has duplicate criterion names")
    overrides = weights or {}
    if unknown := set(overrides) - set(names):
        raise ValueError(f"`weights` overrides name no criterion in '{path}': {sorted(unknown)}")
    criteria = [c.model_copy(update={"weight": overrides.get(c.name, c.weight)}) for c in criteria]
    total = sum(c.weight for c in criteria)
    if total == float("inf"):
        raise ValueError(f"rubric '{path}' has a non-finite total criterion weight")
    if total <= 0:
        raise ValueError(f"rubric '{path}' has no positive criterion weight")
    return criteria


def first_verdicts_object(text: str) -> dict | None:
    """The first balanced JSON object in `text` with a `verdicts` key, wherever it starts (prose,
    code fences and an echoed, unparsable format example before it are passed over)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            obj = None
        if isinstance(obj, dict) and "verdicts" in obj:
            return obj
        start = text.find("{", start + 1)
    return None


def score_verdicts(verdicts: list[CriterionVerdict], criteria: list[Criterion]) -> dict[str, float]:
    """Criterion name → score in [0, 1], for a verdict set that answers each criterion exactly once."""
    by_name = {c.name: c for c in criteria}
    answers: dict[str, str] = {}
    for v in verdicts:
        if v.name in answers:
            raise ValueError(f"judge answered criterion {v.name!r} more than once")
        answers[v.name] = v.verdict
    if sorted(answers) != sorted(by_name):
        raise ValueError(f"judge verdicts name {sorted(answers)}, expected the batch's {sorted(by_name)}")
    scores = {}
    for name, answer in answers.items():
        choices = by_name[name].choices
        if answer not in choices:
            raise ValueError(f"judge answered {answer!r} for '{name}', expected one of {choices}")
        scores[name] = choices.index(answer) / (len(choices) - 1)
    return scores


class RubricJudgeConfig(JudgeConfig):
    id: str = "rubric"
    path: Path
    """The `.toml`/`.json` rubric (relative paths: from the working directory)."""
    weights: dict[str, CriterionWeight] = Field(default_factory=dict)
    """Per-criterion weight overrides by name (config wins over the file)."""
    question_field: str = ""
    answer_field: str = ""
    """Task field with a reference solution to show the judge (`{reference}`); empty shows none."""
    view: JudgeView = "full_trace"
    max_criteria: int | None = Field(default=None, ge=1)
    """Criteria per judge call (None: all in one); batches are graded concurrently."""
    structured_output: bool = False
    """Ask for JSON-schema structured output instead of parsing JSON out of plain text."""

    @field_validator("path")
    @classmethod
    def _exists(cls, v: Path) -> Path:
        if not v.is_file():
            raise ValueError(f"rubric file '{v}' does not exist")
        return v


class RubricJudge(Judge[RubricVerdicts, RubricJudgeConfig]):
    prompt = RUBRIC_PROMPT
    schema = RubricVerdicts

    @cached_property
    def criteria(self) -> list[Criterion]:
        return load_criteria(self.config.path, self.config.weights)

    def reference_block(self, task) -> str:
        """The reference solution section (empty without `answer_field`), fenced by one more
        backtick than the longest run in it, so it cannot close its own fence."""
        if not self.config.answer_field:
            return ""
        answer = getattr(task, self.config.answer_field, None)
        if answer is None:
            raise ValueError(f"rubric judge found no {self.config.answer_field!r} field on the task; point "
                             "`answer_field` at the task's reference-answer field or leave it empty")
        if isinstance(answer, (list, tuple)):
            answer = "\n".join(map(str, answer))
        fence = "`" * (max((len(run) for run in re.findall(r"`+", answer)), default=2) + 1)
        return f"\nReference solution (a correct implementation of this task, for comparison):\n{fence}\n{answer}\n{fence}\n"

    async def grade_batch(self, task, trace, batch: list[Criterion]) -> dict[str, float]:
        fields = {"question": judge_question(task, self.config.question_field),
                  "response": judge_response(trace, self.config.view),
                  "criteria": "\n".join(c.render() for c in batch),
                  "reference": self.reference_block(task)}
        if self.config.structured_output:
            verdicts = (await self.evaluate(trace=trace, **fields)).parsed.verdicts
        else:
            result = await self.complete(self.build_messages(**fields) + JSON_SUFFIX, trace=trace)
            obj = first_verdicts_object(result.text)
            if obj is None:
                raise ValueError(f"judge returned no verdicts JSON object: {result.text!r}")
            verdicts = RubricVerdicts.model_validate(obj).verdicts
        return score_verdicts(verdicts, batch)

    async def score(self, task, trace) -> float:
        criteria, k = self.criteria, self.config.max_criteria
        batches = [criteria] if k is None else [criteria[i:i + k] for i in range(0, len(criteria), k)]
        # one call per batch; the first failure cancels the rest (they would only bill more)
        calls = [asyncio.ensure_future(self.grade_batch(task, trace, b)) for b in batches]
        try:
            results = await asyncio.gather(*calls)
        except BaseException:
            for c in calls:
                c.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            raise
        scores = {name: value for r in results for name, value in r.items()}
        for c in criteria:
            trace.record_metric(f"{self.reward_name}/{c.name}", scores[c.name])
        return sum(c.weight * scores[c.name] for c in criteria) / sum(c.weight for c in criteria)


__all__ = ["Criterion", "CriterionVerdict", "RubricJudge", "RubricJudgeConfig", "RubricVerdicts"]
