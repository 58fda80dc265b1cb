import verifiers as vf
from verifiers import Messages, State


class GuessEnv(vf.MultiTurnEnv):
    """The model guesses a number; the env says higher/lower."""

    def is_completed(self, messages: Messages, state: State, **kwargs) -> bool:
        return state.get("solved", False)

    def env_response(self, messages: Messages, state: State, **kwargs) -> tuple[Messages, State]:
        guess = messages[-1]["content"].strip()
        state["guesses"] = state.get("guesses", 0) + 1
        if guess == state["answer"]:
            state["solved"] = True
            return [{"role": "user", "content": "correct"}], state
        hint = "higher" if int(guess) < int(state["answer"]) else "lower"
        return [{"role": "user", "content": hint}], state


def solved(state) -> float:
    return 1.0 if state.get("solved") else 0.0


def efficiency(state) -> float:
    return 1.0 / state.get("guesses", 1)


def load_environment():
    rows = [{"question": "Guess my number between 1 and 10.", "answer": "7"}]
    rubric = vf.Rubric(funcs=[solved, efficiency], weights=[1.0, 0.5])
    return GuessEnv(dataset=rows, rubric=rubric, max_turns=5)
