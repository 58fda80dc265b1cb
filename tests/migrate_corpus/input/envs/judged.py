import verifiers as vf


def load_environment(judge_model: str = "gpt-4.1-mini"):
    rows = [{"question": "Write a haiku about rain.", "answer": ""}]
    rubric = vf.JudgeRubric(judge_model=judge_model)
    return vf.SingleTurnEnv(eval_dataset=rows, rubric=rubric)
