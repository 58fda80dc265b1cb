import vf
from vf.migrate import compat


# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----

# TODO(vf-migrate): JudgeRubric has no compat equivalent; port it to @vf.reward methods (a judge call inside a reward, or vf's math helpers) (line 6 of the v0 module)

class JudgedData(vf.TaskData):
    """One row of the v0 dataset."""

    answer: str = ""
    info: dict = {}


class JudgedConfig(vf.TasksetConfig):
    """The keyword arguments of the v0 load_environment()."""

    judge_model: str = "gpt-4.1-mini"


@compat.cache
def _v0_env():
    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards
    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""
    judge_model = "gpt-4.1-mini"  # default of load_environment(judge_model=...)
    # TODO(vf-migrate): verifiers JudgeRubric has no vf equivalent; port it
    rubric = compat.JudgeRubric(judge_model=judge_model)
    return compat.SingleTurnEnv(rubric=rubric)


class JudgedTask(vf.Task[JudgedData, vf.State, vf.TaskConfig]):

    @vf.stop
    def single_turn(self, trace) -> bool:
        return trace.num_turns >= 1


class JudgedTaskset(vf.Taskset[JudgedTask, JudgedConfig]):
    def load(self):
        judge_model = self.config.judge_model
        rows = [{"question": "Write a haiku about rain.", "answer": ""}]
        # TODO(vf-migrate): verifiers JudgeRubric has no vf equivalent; port it
        rubric = compat.JudgeRubric(judge_model=judge_model)
        yield from compat.rows(rows, JudgedData)


__all__ = ["JudgedTaskset"]
