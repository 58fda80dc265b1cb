"""arithmetic: evaluate a generated integer expression (`+ - *`); answer in \\boxed{...}.

Reward `correct` is 1 when the last \\boxed{} value equals the exact result (numbers are parsed
leniently: `1,234`, `12.0`, `$-7$` all count). Data is generated offline from a seed; prompts
stay short ("What is 12 + 7 * 3?") so small-context models can train on it.
"""

from __future__ import annotations

import random
import re

import vf
from vf.errors import UsageError

SYSTEM_PROMPT = "Compute the result. Put the final number in \\boxed{}."
OPERATORS = "+-*"


def last_boxed(reply: str) -> str | None:
    """Content of the last \\boxed{...} in `reply` (nested braces allowed), or None."""
    start = reply.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(reply)):
        if reply[j] == "{":
            depth += 1
        elif reply[j] == "}":
            depth -= 1
            if depth == 0:
                return reply[i:j]
    return None  # unclosed: no answer


def parse_number(text: str | None) -> float | None:
    """A number from a boxed answer: drops `$`, spaces, thousands commas, `\\text{}`/`\\mathrm{}`
    wrappers and a trailing period; None when what is left is not a number."""
    if text is None:
        return None
    t = re.sub(r"\\(?:text|mathrm|mathbf)\{([^{}]*)\}", r"\1", text)
    t = t.replace("$", "").replace(" ", "").replace("\\,", "").replace("\\!", "").replace("−", "-")
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t).rstrip(".")
    try:
        return float(t)
    except ValueError:
        return None


def evaluate(operands: list[int], ops: list[str]) -> int:
    """Value of operands[0] ops[0] operands[1] ... with `*` binding tighter than `+`/`-`."""
    terms = [operands[0]]
    signs = [1]
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


class ArithmeticData(vf.TaskData):
    expression: str
    answer: int


class ArithmeticConfig(vf.TasksetConfig):
    size: int = 200
    """Number of tasks."""
    seed: int = 0
    digits: int = 2
    """Operands have 1..digits digits (non-negative)."""
    min_operands: int = 2
    max_operands: int = 3
    operators: str = OPERATORS
    """Operators to draw from, a subset of `+-*`."""


class ArithmeticTask(vf.Task[ArithmeticData, vf.State, vf.TaskConfig]):
    @vf.stop
    def one_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    def correct(self, task, trace) -> float:
        value = parse_number(last_boxed(trace.last_reply))
        return float(value is not None and abs(value - task.answer) < 1e-9)

    @vf.metric
    def has_boxed(self, trace) -> float:
        return float(last_boxed(trace.last_reply) is not None)

    def validate(self) -> str:
        return f"\\boxed{{{self.data.answer}}}"


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def load(self):
        cfg = self.config
        problems = []
        if cfg.digits < 1:
            problems.append(f"digits must be >= 1 (got {cfg.digits})")
        if not 2 <= cfg.min_operands <= cfg.max_operands:
            problems.append(f"need 2 <= min_operands <= max_operands (got {cfg.min_operands}, {cfg.max_operands})")
        if not cfg.operators or set(cfg.operators) - set(OPERATORS):
            problems.append(f"operators must be a non-empty subset of {OPERATORS!r} (got {cfg.operators!r})")
        if problems:
            raise UsageError("arithmetic: " + "; ".join(problems),
                             hint="e.g. --taskset.digits 3 --taskset.max-operands 4 --taskset.operators '+-'")
        rng = random.Random(cfg.seed)
        ops_pool = sorted(set(cfg.operators))
        top = 10 ** cfg.digits - 1
        for i in range(cfg.size):
            n = rng.randint(cfg.min_operands, cfg.max_operands)
            operands = [rng.randint(0, top) for _ in range(n)]
            ops = [rng.choice(ops_pool) for _ in range(n - 1)]
            expr = str(operands[0]) + "".join(f" {op} {x}" for op, x in zip(ops, operands[1:]))
            yield ArithmeticData(id=f"arithmetic-{cfg.seed}-{i}", prompt=f"What is {expr}?",
                                 system_prompt=SYSTEM_PROMPT, expression=expr,
                                 answer=evaluate(operands, ops))


__all__ = ["ArithmeticTaskset"]
