"""A reward plugged by config: --env.taskset.task.rewards.bonus.fn PATH/bonus.py:bonus"""


async def bonus(task, trace) -> float:
    return float(task.a % 2 == 0)
