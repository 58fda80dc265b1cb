"""Which tasks a run uses, in a fixed order: include → exclude → shuffle → skip → limit.

Shuffling happens over the whole (finite) set before the limit, so growing `-n` on resume
keeps the tasks already chosen and adds new ones after them.
"""

from __future__ import annotations

import random
from itertools import islice

from vf.config import SelectConfig
from vf.errors import UsageError
from vf.taskset import Task, Taskset

# An infinite taskset is read up to this many tasks when it must be materialised.
MAX_INFINITE = 100_000


def select_tasks(taskset: Taskset, select: SelectConfig) -> list[Task]:
    stream = taskset.tasks()
    if taskset.INFINITE:
        if select.limit is None:
            raise UsageError(f"{taskset.config.id} is an endless taskset", hint="bound it with -n N")
        if select.shuffle:
            raise UsageError(f"{taskset.config.id} is an endless taskset and cannot be shuffled",
                             hint="drop --select.shuffle (its tasks are already generated at random)")
    include = set(select.include) if select.include is not None else None
    exclude = set(select.exclude or ())

    def keep(t: Task) -> bool:
        return (include is None or t.data.idx in include) and t.data.idx not in exclude

    stream = (t for t in stream if keep(t))
    if taskset.INFINITE:
        return list(islice(stream, select.skip, select.skip + select.limit))
    tasks = list(stream)
    if select.shuffle:
        random.Random(select.seed).shuffle(tasks)
    tasks = tasks[select.skip:]
    return tasks[: select.limit] if select.limit is not None else tasks
