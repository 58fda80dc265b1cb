import verifiers as vf


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


def load_environment(max_turns: int = 4):
    rows = [{"question": "What is (2 + 3) * 4? Use the tools.", "answer": "20"}]
    rubric = vf.Rubric(funcs=[exact, used_tools], weights=[1.0, 0.1])
    return vf.ToolEnv(dataset=rows, tools=[add, multiply], rubric=rubric, max_turns=max_turns)
