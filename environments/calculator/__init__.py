"""calculator: arithmetic word problems solved with calculator tools; answer in \\boxed{...}.

The task offers a `Calculator` toolset (`add`, `subtract`, `multiply`, `divide`) through
function calling. The episode is one agent turn: the model may call tools any number of times
(bounded by `--max-turns`) and ends with a reply that makes no tool call. Reward `correct` is 1
when the last \\boxed{} value equals the answer; metric `tool_calls` counts the calls made.
Data is generated offline from a seed.
"""

from __future__ import annotations

import random
from typing import ClassVar, Literal

from pydantic import Field

import vf
from vf.environments.arithmetic import last_boxed, parse_number
from vf.errors import UsageError

SYSTEM_PROMPT = ("Solve the problem with the calculator tools (add, subtract, multiply, divide). "
                 "Put the final number in \\boxed{}.")

Operation = Literal["add", "subtract", "multiply", "divide"]

# Operands appear in the text in the order (a, b) and nothing numeric comes before them, so the
# first two numbers of a prompt are always the operands of its operation.
TEMPLATES: dict[str, list[str]] = {
    "add": [
        "A library has {a} books and buys {b} more. How many books does it have now?",
        "A train carries {a} passengers and {b} more get on. How many passengers are on the train?",
        "A farmer picks {a} apples on Monday and {b} on Tuesday. How many apples did he pick in total?",
    ],
    "subtract": [
        "A tank holds {a} liters of water and {b} liters are drained. How many liters are left?",
        "A store had {a} shirts and sold {b} of them. How many shirts remain?",
    ],
    "multiply": [
        "A theater has {a} rows with {b} seats in each row. How many seats are there?",
        "A crate holds {a} pencils. How many pencils are in {b} crates?",
    ],
    "divide": [
        "{a} candies are shared equally among {b} children. How many candies does each child get?",
        "A rope {a} meters long is cut into {b} equal pieces. How many meters long is each piece?",
    ],
}


def _num(x: float) -> int | float:
    """Integral results as ints (so the model sees `42`, not `42.0`)."""
    return int(x) if float(x).is_integer() else round(x, 6)


class Calculator(vf.Toolset):
    TOOL_PREFIX = None  # bare names (add, subtract, ...), as the system prompt calls them
    @vf.tool
    def add(self, a: float, b: float) -> int | float:
        """Add two numbers: a + b."""
        return _num(a + b)

    @vf.tool
    def subtract(self, a: float, b: float) -> int | float:
        """Subtract b from a: a - b."""
        return _num(a - b)

    @vf.tool
    def multiply(self, a: float, b: float) -> int | float:
        """Multiply two numbers: a * b."""
        return _num(a * b)

    @vf.tool
    def divide(self, a: float, b: float) -> int | float | str:
        """Divide a by b: a / b."""
        if b == 0:
            return "error: division by zero"
        return _num(a / b)


class CalculatorData(vf.TaskData):
    operation: str
    answer: int


class CalculatorConfig(vf.TasksetConfig):
    size: int = 200
    """Number of problems."""
    seed: int = 0
    max_value: int = 999
    """Largest operand (for division: largest quotient; divisors are 2..12); operands start at 2."""
    operations: list[Operation] = Field(default_factory=lambda: ["add", "subtract", "multiply", "divide"])


class CalculatorTask(vf.Task[CalculatorData, vf.State, vf.TaskConfig]):
    toolsets: ClassVar[list[type]] = [Calculator]

    @vf.reward(weight=1.0)
    def correct(self, task, trace) -> float:
        value = parse_number(last_boxed(trace.last_reply))
        return float(value is not None and abs(value - task.answer) < 1e-6)

    @vf.metric
    def tool_calls(self, trace) -> float:
        return float(sum(len(m.get("tool_calls") or []) for m in trace.assistant_messages))

    def validate(self) -> str:
        return f"\\boxed{{{self.data.answer}}}"


class CalculatorTaskset(vf.Taskset[CalculatorTask, CalculatorConfig]):
    def load(self):
        cfg = self.config
        if cfg.max_value < 3 or not cfg.operations:
            raise UsageError(f"calculator needs max_value >= 3 and at least one operation "
                             f"(got {cfg.max_value}, {cfg.operations})",
                             hint="e.g. --taskset.max-value 999 --taskset.operations '[add, multiply]'")
        rng = random.Random(cfg.seed)
        ops = list(dict.fromkeys(cfg.operations))
        for i in range(cfg.size):
            op = rng.choice(ops)
            a, b = rng.randint(2, cfg.max_value), rng.randint(2, cfg.max_value)
            if op == "subtract":
                a, b = max(a, b), min(a, b)
                answer = a - b
            elif op == "add":
                answer = a + b
            elif op == "multiply":
                answer = a * b
            else:  # exact division by a small divisor: a = b * quotient
                b = rng.randint(2, 12)
                answer, a = a, a * b
            text = rng.choice(TEMPLATES[op]).format(a=a, b=b)
            yield CalculatorData(id=f"calculator-{cfg.seed}-{i}", prompt=f"{text} Use the tools.",
                                 system_prompt=SYSTEM_PROMPT, operation=op, answer=answer)


__all__ = ["CalculatorTaskset"]
