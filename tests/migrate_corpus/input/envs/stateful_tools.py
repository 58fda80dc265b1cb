import verifiers as vf


def lookup(key: str, table: dict) -> str:
    """Look a key up in the session's table."""
    return str(table.get(key, "missing"))


class VaultEnv(vf.StatefulToolEnv):
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


def load_environment():
    rows = [{"question": "What is stored under gold?", "answer": "42"}]
    return VaultEnv(eval_dataset=rows, rubric=vf.Rubric(funcs=[found]), max_turns=4)
