"""Judge prompts and verdict parsing, computed the same way by verifiers 0.4.0 and by vf.

Run `python judge_parity_cases.py verifiers` with verifiers 0.4.0 installed, or `... vf` with vf:
it prints one JSON object with
- `prompts`: per case, the exact messages each built-in judge sends and the score it gives a
  scripted reply (the model call is replaced by a capture, so no endpoint is needed; the
  trace is a stand-in with `last_reply` and `transcript`, all a judge reads of it);
- `choices`: `parse_judge_choice` on hostile and messy judge replies.
tests/golden/judges_v04_cases.json holds verifiers' output; tests/test_judges_v04.py checks
vf's against it (and, with VF_VERIFIERS_PYTHON set, re-runs verifiers' side).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

CHOICE_REPLIES: list[tuple[str | None, list[str]]] = [
    (None, ["A", "B", "C"]),
    ("", ["A", "B", "C"]),
    ("   ", ["A", "B", "C"]),
    ("<think>It is A", ["A", "B", "C"]),
    ("<think>A</think>", ["A", "B", "C"]),
    ("<think>maybe A</think>\nB", ["A", "B", "C"]),
    ("</think>A</think>  c ", ["A", "B", "C"]),
    ("a", ["A", "B", "C"]),
    ("A.", ["A", "B", "C"]),
    ("The answer is (b).", ["A", "B", "C"]),
    ("Final Verdict: c\nsome text\nFinal verdict: A", ["A", "B", "C"]),
    ("FINAL ANSWER IS B", ["A", "B", "C"]),
    ("final answer - c", ["A", "B", "C"]),
    ("   final judgment:A because B", ["A", "B", "C"]),
    ("Final\nverdict: A", ["A", "B", "C"]),
    ("Final verdict:\nB", ["A", "B", "C"]),
    ("Answer: \n\nB", ["A", "B", "C"]),
    ("Answers: C", ["A", "B", "C"]),
    ("I pick B.\nVERDICT", ["A", "B", "C"]),
    ("\\boxed{B}", ["A", "B", "C"]),
    ("A is wrong. \\boxed{Verdict: C} then A", ["A", "B", "C"]),
    ("\\boxed{ unclosed B", ["A", "B", "C"]),
    ("\\boxed{}C", ["A", "B", "C"]),
    ("BA AB", ["A", "B", "C"]),
    ("A B C", ["A", "B", "C"]),
    ("Ａ fullwidth, then b", ["A", "B", "C"]),
    ("A\u00a0B", ["A", "B", "C"]),
    ("Final verdict: D", ["A", "B", "C"]),
    ("Final verdict: D\nA", ["A", "B", "C"]),
    ("Yes, definitely not no.", ["yes", "no"]),
    ("no... wait, YES", ["yes", "no"]),
    ("yesno", ["yes", "no"]),
    ("The response is incorrect.", ["Correct", "Incorrect"]),
    ("CORRECT: the answer is incorrect", ["Correct", "Incorrect"]),
    ("verdict: Correct!", ["Correct", "Incorrect"]),
    ("A+ or B?", ["A+", "B?"]),
    ("a", ["a", "A"]),
    ("x" * 5000 + " B " + "y" * 5000, ["A", "B"]),
    ("{" * 200 + "A", ["A", "B"]),
    ("answer is: B\nFINAL VERDICT IS  a", ["A", "B"]),
    ("<think></think><think>A", ["A", "B"]),
    ("\n\nJudgment - B\n\nFinal answer A", ["A", "B"]),
    ("judgmentally A", ["A", "B"]),
]

RUBRIC = """
[[criteria]]
name = "correct"
text = "The final number is right."

[[criteria]]
name = "shows_work"
text = "It shows {response} work ```like this```."
weight = 2.5
choices = ["none", "some", "all"]

[[criteria]]
name = "polite"
text = "It is polite."
weight = 0
"""

TRANSCRIPT = "[system]\nBe brief.\n\n[user]\nWhat is 6*7?\n\n[assistant]\nIt is {answer}: 42\n[tool_call calc({\"a\": 6})]"


class StandInTrace(SimpleNamespace):
    """What a judge reads of a trace (`last_reply`, `transcript`) and writes (`record_metric`)."""

    def record_metric(self, name: str, value: float) -> None:
        self.metrics[name] = value


def verdicts(*pairs: tuple[str, str]) -> str:
    body = json.dumps({"verdicts": [{"name": n, "reason": "r", "verdict": v} for n, v in pairs]})
    return 'Shape: {"verdicts": [...]}\nnoise {"a": 1} ```json\n' + body + "\n```"


def run(vf) -> dict:
    captured: list[dict] = []

    async def fake_complete(self, messages, *, trace=None, schema=None, parse=None, **sampling):
        reply = self._scripted.pop(0)
        captured.append({"messages": messages, "schema": schema.__name__ if schema else None})
        response = vf.JudgeResponse(text=reply)
        if schema is not None:
            response.parsed = schema.model_validate_json(reply[reply.rindex("{\"verdicts"):reply.rindex("}") + 1])
        if parse is not None:
            response.parsed = parse(response)
        return response

    vf.Judge.complete = fake_complete

    class Data(vf.TaskData):
        answer: str | list[str] = ""
        question: str = ""
        gold: str = ""

    tmp = Path(tempfile.mkdtemp())
    (tmp / "rubric.toml").write_text(RUBRIC)
    (tmp / "rubric.json").write_text(json.dumps([{"name": "only", "text": "Only {question}?"}]))
    (tmp / "custom.txt").write_text("Q={question} R={response} A={answer} {unknown} {positive}/{negative}\n{\"json\": 1}")
    tricky_answer = "def f():\n    ```python\n    `````\n    return 1"
    cases = [
        ("ref_default", vf.ReferenceJudge, {}, {"prompt": "What is 6*7? {response}", "answer": "42"},
         ["Final verdict: yes"]),
        ("ref_list_ab", vf.ReferenceJudge, {"choices": ["A", "B"], "question_field": "question", "view": "full_trace"},
         {"prompt": [{"role": "user", "content": "6*7"}], "answer": ["42", "forty-two"], "question": "Q {answer}"},
         ["<think>A</think>B"]),
        ("ref_custom_prompt", vf.ReferenceJudge, {"prompt": str(tmp / "custom.txt"), "answer_field": "gold"},
         {"prompt": "p", "gold": "{question}"}, ["verdict: no"]),
        ("rubric_all", vf.RubricJudge, {"path": str(tmp / "rubric.toml")},
         {"prompt": "Solve 6*7 with ``` fences", "answer": "42"},
         [verdicts(("shows_work", "some"), ("correct", "yes"), ("polite", "no"))]),
        ("rubric_reference_batched", vf.RubricJudge,
         {"path": str(tmp / "rubric.toml"), "answer_field": "gold", "max_criteria": 2, "weights": {"correct": 3},
          "view": "last_reply"},
         {"prompt": "Solve", "gold": tricky_answer},
         [verdicts(("correct", "no"), ("shows_work", "all")), verdicts(("polite", "yes"))]),
        ("rubric_list_reference_structured", vf.RubricJudge,
         {"path": str(tmp / "rubric.json"), "answer_field": "answer", "structured_output": True},
         {"prompt": "Solve", "answer": ["a", "b``c"]}, [verdicts(("only", "yes"))]),
    ]
    prompts = {}
    for name, cls, config, data, replies in cases:
        judge = cls(judge_config(vf, cls)(**config))
        judge._scripted = list(replies)
        before = len(captured)
        trace = StandInTrace(last_reply="It is {answer}: 42", transcript=TRANSCRIPT, metrics={})
        score = asyncio.run(judge.score(Data(**data), trace))
        prompts[name] = {"calls": captured[before:], "score": score, "metrics": trace.metrics}
    choices = [vf.parse_judge_choice(text, tuple(ch)) for text, ch in CHOICE_REPLIES]
    return {"prompts": prompts, "choices": choices}


def judge_config(vf, cls):
    return {vf.ReferenceJudge: vf.ReferenceJudgeConfig, vf.RubricJudge: vf.RubricJudgeConfig}[cls]


if __name__ == "__main__":
    if sys.argv[1:] == ["verifiers"]:
        import verifiers.v1 as peer
    else:
        import vf as peer
    print(json.dumps(run(peer), indent=1, sort_keys=True))
