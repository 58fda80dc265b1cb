"""Which tasks a run uses: the taskset's views in a fixed order, include → exclude → shuffle →
skip → limit (`Taskset.select`, as verifiers orders `--select.*`).

Shuffling happens over the whole (finite) set before the limit, so growing `-n` on resume
keeps the tasks already chosen and adds new ones after them.
"""

from __future__ import annotations

from vf.config import SelectConfig
from vf.errors import UsageError
from vf.taskset import Task, Taskset


def select_tasks(taskset: Taskset, select: SelectConfig) -> list[Task]:
    if not taskset.bounded and select.limit is None and select.include.stop is None:
        raise UsageError(f"{taskset.config.id or type(taskset).__name__} is an endless taskset",
                         hint="bound it with -n N (or closed --select.include.idx ranges)")
    return list(taskset.select(select))
