import vf
from vf.migrate import compat


async def judged_correct(judge, prompt, completion, answer, state) -> float:
    verdict = await judge(prompt, completion, answer, state)
    return 1.0 if "yes" in verdict.lower() else 0.0


# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----

class JudgedData(vf.TaskData):
    """One row of the v0 dataset."""

    answer: str = ""
    info: dict = {}


class JudgedJudge(vf.Judge):
    """The v0 JudgeRubric's judge: its reply text is what v0's `judge(...)` returned."""

    prompt = compat.JUDGE_PROMPT


class JudgedJudgeConfig(vf.JudgeConfig):
    """The v0 judge client's settings (`--taskset.task.judge.*` sets one, keeping the others)."""

    model: str = "gpt-4.1-mini"


class JudgedTaskConfig(vf.TaskConfig):
    judge: JudgedJudgeConfig = JudgedJudgeConfig()


class JudgedConfig(vf.TasksetConfig):
    """The keyword arguments of the v0 load_environment()."""

    judge_model: str = "gpt-4.1-mini"
    task: JudgedTaskConfig = JudgedTaskConfig()

    # load_environment's judge arguments given for a run reach the judge (task.judge.* wins)
    _v0_judge_arguments = compat.judge_arguments(model='judge_model')


@compat.cache
def _v0_env():
    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards
    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""
    judge_model = "gpt-4.1-mini"  # default of load_environment(judge_model=...)
    rubric = compat.JudgeRubric(judge_model=judge_model)
    rubric.add_reward_func(judged_correct)
    return compat.SingleTurnEnv(rubric=rubric)


class JudgedTask(vf.Task[JudgedData, vf.State, JudgedTaskConfig]):

    def validate(self):
        """v0 had no gold reply: vf-validate scores a probe reply (the row's answer in the parser's
        format, a judge answering itself) and fails when a reward function raises."""
        return compat.probe(_v0_env(), self.data)

    @vf.stop
    def single_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    def judged_correct(self, task, trace, state):
        return _v0_env().score(0, task, trace, state, judge=compat.JudgeCall(JudgedJudge(self.config.judge), trace, _v0_env().rubric.parser))


class JudgedTaskset(vf.Taskset[JudgedTask, JudgedConfig]):
    def load(self):
        judge_model = self.config.judge_model
        rows = [{"question": "Write a haiku about rain.", "answer": ""}]
        rubric = compat.JudgeRubric(judge_model=judge_model)
        rubric.add_reward_func(judged_correct)
        yield from compat.rows(rows, JudgedData)


__all__ = ["JudgedTaskset"]
