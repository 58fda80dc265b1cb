"""Judged: the built-in judges plugged by config (`--env.taskset.task.judges`), after the task's
own reward. The policy echoes the prompt, so each row's reply is its prompt; rows cover a match, a
miss and a list of acceptable answers."""

import verifiers.v1 as vf

__all__ = ["JudgedTaskset"]


class JudgedData(vf.TaskData):
    answer: str | list[str]
    question: str = ""


class JudgedTask(vf.Task[JudgedData]):
    @vf.reward(weight=0.5)
    async def exact(self, task, trace) -> float:
        answers = task.answer if isinstance(task.answer, list) else [task.answer]
        return float(trace.last_reply in answers)


class JudgedTaskset(vf.Taskset[JudgedTask]):
    def load(self):
        rows = [
            JudgedData(prompt="Paris", answer="Paris", question="Capital of France?"),
            JudgedData(prompt="I think it is Lyon, please.", answer="Paris", question="Capital of France?"),
            JudgedData(prompt=[{"role": "user", "content": "four apples"}], answer=["4", "Four"],
                       system_prompt="Count the apples."),
        ]
        for row in rows:
            yield JudgedTask(row, self.config.task)
