import vf
from vf.migrate import compat


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def exact(completion, answer) -> float:
    return 1.0 if completion[-1]["content"].strip() == answer else 0.0


def used_tools(completion) -> float:
    return float(sum(1 for m in completion if m["role"] == "tool"))


# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----

class CalcToolsData(vf.TaskData):
    """One row of the v0 dataset."""

    answer: str = ""
    info: dict = {}


class CalcToolsConfig(vf.TasksetConfig):
    """The keyword arguments of the v0 load_environment()."""

    max_turns: int = 4


@compat.cache
def _v0_env():
    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards
    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""
    max_turns = 4  # default of load_environment(max_turns=...)
    rubric = compat.Rubric(funcs=[exact, used_tools], weights=[1.0, 0.1])
    return compat.ToolEnv(tools=[add, multiply], rubric=rubric, max_turns=max_turns)


class CalcToolsTools(vf.Toolset):
    """The v0 ToolEnv tools, called unchanged."""

    TOOL_PREFIX = None  # v0 tool names, unprefixed
    
    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return add(a=a, b=b)
    
    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return multiply(a=a, b=b)


class CalcToolsTask(vf.Task[CalcToolsData, vf.State, vf.TaskConfig]):

    toolsets = [CalcToolsTools]

    def validate(self):
        """v0 had no gold reply: vf-validate scores a probe reply (the row's answer in the parser's
        format, a judge answering itself) and fails when a reward function raises."""
        return compat.probe(_v0_env(), self.data)

    @vf.stop
    def max_turns(self, trace) -> bool:
        limit = _v0_env().max_turns
        return limit > 0 and trace.num_turns >= limit

    @vf.reward(weight=1.0)
    def exact(self, task, trace, state):
        return _v0_env().score(0, task, trace, state)

    @vf.reward(weight=0.1)
    def used_tools(self, task, trace, state):
        return _v0_env().score(1, task, trace, state)


class CalcToolsTaskset(vf.Taskset[CalcToolsTask, CalcToolsConfig]):
    def load(self):
        max_turns = self.config.max_turns
        rows = [{"question": "What is (2 + 3) * 4? Use the tools.", "answer": "20"}]
        rubric = compat.Rubric(funcs=[exact, used_tools], weights=[1.0, 0.1])
        yield from compat.rows(rows, CalcToolsData)


__all__ = ["CalcToolsTaskset"]
