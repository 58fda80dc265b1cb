"""The built-in judges, plugged by id (`--env.taskset.task.judges '[{"id": "rubric", ...}]'`):

- `reference` (ReferenceJudge): is the reply the task's reference answer? 1.0 / 0.0;
- `rubric` (RubricJudge): weighted criteria from a TOML/JSON file, one verdict per criterion;
- `decision` (DecisionJudge): a probability-weighted grade from a decision-model evaluations API.

Prompts, fields and parsing are verifiers 0.4's (`verifiers.v1.judges`), so a judge model sees the
same text and a reply scores the same.
"""

from vf.judges.decision import DecisionJudge, DecisionJudgeConfig
from vf.judges.reference import ReferenceJudge, ReferenceJudgeConfig
from vf.judges.rubric import Criterion, RubricJudge, RubricJudgeConfig

__all__ = ["Criterion", "DecisionJudge", "DecisionJudgeConfig", "ReferenceJudge", "ReferenceJudgeConfig",
           "RubricJudge", "RubricJudgeConfig"]
