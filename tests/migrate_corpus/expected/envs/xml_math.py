"""Add two numbers; answer in <answer> tags (a v0 SingleTurnEnv)."""

import vf
from vf.migrate import compat

SYSTEM_PROMPT = "Think inside <think> tags, then give the number inside <answer> tags."


def correct_answer(completion, answer, parser) -> float:
    guess = parser.parse_answer(completion) or ""
    return 1.0 if guess.strip() == answer else 0.0


# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----

class XmlMathData(vf.TaskData):
    """One row of the v0 dataset."""

    answer: str = ""
    info: dict = {}


class XmlMathConfig(vf.TasksetConfig):
    """The keyword arguments of the v0 load_environment()."""

    num_examples: int = 3


@compat.cache
def _v0_env():
    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards
    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""
    parser = compat.XMLParser(["think", "answer"], answer_field="answer")
    rubric = compat.Rubric(funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    return compat.SingleTurnEnv(parser=parser, rubric=rubric)


class XmlMathTask(vf.Task[XmlMathData, vf.State, vf.TaskConfig]):

    def validate(self):
        """v0 had no gold reply: vf-validate scores a probe reply (the row's answer in the parser's
        format, a judge answering itself) and fails when a reward function raises."""
        return compat.probe(_v0_env(), self.data)

    @vf.stop
    def single_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    def correct_answer(self, task, trace, state):
        return _v0_env().score(0, task, trace, state)

    @vf.reward(weight=0.2)
    def format_reward_func(self, task, trace, state):
        return _v0_env().score(1, task, trace, state)


class XmlMathTaskset(vf.Taskset[XmlMathTask, XmlMathConfig]):
    """Sums of small integers."""

    def load(self):
        num_examples = self.config.num_examples
        rows = [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(num_examples)]
        parser = compat.XMLParser(["think", "answer"], answer_field="answer")
        rubric = compat.Rubric(funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
        yield from compat.rows(rows, XmlMathData, system_prompt=SYSTEM_PROMPT)


__all__ = ["XmlMathTaskset"]
