"""verifiers 0.4's `verifiers.v1.task` import path: the task row, its behaviour and its config
(defined in `vf.taskset`)."""

from vf.taskset import State, Task, TaskConfig, TaskData, TaskResources, TaskTimeout

__all__ = ["State", "Task", "TaskConfig", "TaskData", "TaskResources", "TaskTimeout"]
