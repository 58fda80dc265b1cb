import vf
from vf.migrate import compat


def lookup(key: str, table: dict) -> str:
    """Look a key up in the session's table."""
    return str(table.get(key, "missing"))


class VaultEnv(compat.StatefulToolEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_tool(lookup, args_to_skip=["table"])

    async def setup_state(self, state, **kwargs):
        state["table"] = {"gold": "42"}
        return state

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs):
        if tool_name == "lookup":
            tool_args["table"] = state["table"]
        return tool_args


def found(completion, state) -> float:
    return float("42" in str(completion[-1]["content"]))


# ---- migrated from load_environment() by vf-migrate (see MIGRATION.md) ----

class StatefulToolsData(vf.TaskData):
    """One row of the v0 dataset."""

    answer: str = ""
    info: dict = {}


class StatefulToolsConfig(vf.TasksetConfig):
    """The keyword arguments of the v0 load_environment()."""

    pass


@compat.cache
def _v0_env():
    """The v0 environment without its dataset: the parser, rubric, tools and max_turns the rewards
    and stop conditions use, rebuilt from load_environment() with its arguments at their defaults."""
    return VaultEnv(rubric=compat.Rubric(funcs=[found]), max_turns=4)


class StatefulToolsState(vf.State):
    """Per-rollout state: the v0 state dict, kept whole."""

    v0_state: dict = {}


class StatefulToolsTools(vf.Toolset[vf.ToolsetConfig, StatefulToolsState]):
    """The v0 ToolEnv tools, called unchanged."""

    TOOL_PREFIX = None  # v0 tool names, unprefixed
    
    @vf.tool
    def lookup(self, key: str) -> str:
        """Look a key up in the session's table."""
        args = compat.tool_args(_v0_env(), 'lookup', {'key': key}, self.state)
        return lookup(**args)


class StatefulToolsTask(vf.Task[StatefulToolsData, StatefulToolsState, vf.TaskConfig]):

    toolsets = [StatefulToolsTools]

    async def setup(self, trace, state):
        """The v0 VaultEnv.setup_state."""
        await compat.setup_state(_v0_env(), self.data, trace, state)

    def validate(self):
        """v0 had no gold reply: vf-validate scores a probe reply (the row's answer in the parser's
        format, a judge answering itself) and fails when a reward function raises."""
        return compat.probe(_v0_env(), self.data)

    @vf.stop
    def max_turns(self, trace) -> bool:
        limit = _v0_env().max_turns
        return limit > 0 and trace.num_turns >= limit

    @vf.reward(weight=1.0)
    def found(self, task, trace, state):
        return _v0_env().score(0, task, trace, state)


class StatefulToolsTaskset(vf.Taskset[StatefulToolsTask, StatefulToolsConfig]):
    def load(self):
        rows = [{"question": "What is stored under gold?", "answer": "42"}]
        yield from compat.rows(rows, StatefulToolsData)


__all__ = ["StatefulToolsTaskset"]
