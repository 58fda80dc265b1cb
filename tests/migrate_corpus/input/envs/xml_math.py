"""Add two numbers; answer in <answer> tags (a v0 SingleTurnEnv)."""

import verifiers as vf

SYSTEM_PROMPT = "Think inside <think> tags, then give the number inside <answer> tags."


def correct_answer(completion, answer, parser) -> float:
    guess = parser.parse_answer(completion) or ""
    return 1.0 if guess.strip() == answer else 0.0


def load_environment(num_examples: int = 3, **kwargs) -> vf.Environment:
    """Sums of small integers."""
    rows = [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(num_examples)]
    parser = vf.XMLParser(["think", "answer"], answer_field="answer")
    rubric = vf.Rubric(funcs=[correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    return vf.SingleTurnEnv(dataset=rows, system_prompt=SYSTEM_PROMPT, parser=parser, rubric=rubric, **kwargs)
