import vf
from vf.migrate import compat

from helpers import build_env


# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----

# TODO(vf-migrate): unknown environment class 'build_env': migrated as a multi-turn env; check it (line 7 of the v0 module)
# TODO(vf-migrate): a multi-turn env without a subclass: it has no env_response; check the Env
# TODO(vf-migrate): no dataset= in the environment constructor: load() yields nothing

class UnmigratableData(vf.TaskData):
    """One row of the v0 dataset."""

    answer: str = ""
    info: dict = {}


class UnmigratableConfig(vf.TasksetConfig):
    """The keyword arguments of the v0 load_environment()."""

    pass


@compat.cache
def _v0_env():
    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards
    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""
    env = build_env()
    env.rubric = compat.RubricGroup(rubrics=[])
    return env


class UnmigratableEnv(compat.MultiTurnAdapter):
    """Runs the v0 environment's is_completed/env_response after each model reply."""

    v0_env = staticmethod(_v0_env)


class UnmigratableTask(vf.Task[UnmigratableData, vf.State, vf.TaskConfig]):

    def validate(self):
        """v0 had no gold reply: vf-validate scores a probe reply (the row's answer in the parser's
        format, a judge answering itself) and fails when a reward function raises."""
        return compat.probe(_v0_env(), self.data)

    @vf.stop
    def max_turns(self, trace) -> bool:
        limit = _v0_env().max_turns
        return limit > 0 and trace.num_turns >= limit


class UnmigratableTaskset(vf.Taskset[UnmigratableTask, UnmigratableConfig]):
    ENV = UnmigratableEnv

    def load(self):
        yield from compat.rows(None, UnmigratableData)


__all__ = ["UnmigratableTaskset"]
