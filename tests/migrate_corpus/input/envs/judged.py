import verifiers as vf


async def judged_correct(judge, prompt, completion, answer, state) -> float:
    verdict = await judge(prompt, completion, answer, state)
    return 1.0 if "yes" in verdict.lower() else 0.0


def load_environment(judge_model: str = "gpt-4.1-mini"):
    rows = [{"question": "Write a haiku about rain.", "answer": ""}]
    rubric = vf.JudgeRubric(judge_model=judge_model)
    rubric.add_reward_func(judged_correct)
    return vf.SingleTurnEnv(eval_dataset=rows, rubric=rubric)
