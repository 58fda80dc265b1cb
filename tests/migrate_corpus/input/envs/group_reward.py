import verifiers as vf


def exact(completion, answer) -> float:
    return float(completion[-1]["content"].strip() == answer)


def shortest_wins(completions, **kwargs) -> list[float]:
    lengths = [len(c[-1]["content"]) for c in completions]
    return [float(n == min(lengths)) for n in lengths]


def load_environment():
    rows = [{"question": "Say yes.", "answer": "yes"}]
    rubric = vf.Rubric(funcs=[exact, shortest_wins], weights=[1.0, 0.5])
    return vf.SingleTurnEnv(dataset=rows, rubric=rubric)
