import vf
from vf.migrate import compat


def exact(completion, answer) -> float:
    return float(completion[-1]["content"].strip() == answer)


def shortest_wins(completions, **kwargs) -> list[float]:
    lengths = [len(c[-1]["content"]) for c in completions]
    return [float(n == min(lengths)) for n in lengths]


# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----

class GroupRewardData(vf.TaskData):
    """One row of the v0 dataset."""

    answer: str = ""
    info: dict = {}


class GroupRewardConfig(vf.TasksetConfig):
    """The keyword arguments of the v0 load_environment()."""

    pass


@compat.cache
def _v0_env():
    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards
    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""
    rubric = compat.Rubric(funcs=[exact, shortest_wins], weights=[1.0, 0.5])
    return compat.SingleTurnEnv(rubric=rubric)


class GroupRewardEnv(vf.Env):
    """Scores the v0 group rewards over the episode's traces."""

    async def finalize(self, task, episode):
        # TODO(vf-migrate): v0 scored these over the rollouts of one prompt; here they score the traces
        # of one episode (one trace unless the env runs several, e.g. --env.id best-of-n)
        await compat.group_score(_v0_env(), 1, 'shortest_wins', 0.5, task, episode)


class GroupRewardTask(vf.Task[GroupRewardData, vf.State, vf.TaskConfig]):

    def validate(self):
        """v0 had no gold reply: vf-validate scores a probe reply (the row's answer in the parser's
        format, a judge answering itself) and fails when a reward function raises."""
        return compat.probe(_v0_env(), self.data)

    @vf.stop
    def single_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    def exact(self, task, trace, state):
        return _v0_env().score(0, task, trace, state)


class GroupRewardTaskset(vf.Taskset[GroupRewardTask, GroupRewardConfig]):
    ENV = GroupRewardEnv

    def load(self):
        rows = [{"question": "Say yes.", "answer": "yes"}]
        rubric = compat.Rubric(funcs=[exact, shortest_wins], weights=[1.0, 0.5])
        yield from compat.rows(rows, GroupRewardData)


__all__ = ["GroupRewardTaskset"]
