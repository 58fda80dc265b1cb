"""vf: reinforcement learning on language models.

The taskset API lives at the top level (`import vf`; `class T(vf.Task[...])`). Importing vf
never imports torch: models, engines and the trainer load it only when used.
"""

from vf.env import Env
from vf.taskset import (
    State,
    Task,
    TaskConfig,
    TaskData,
    Taskset,
    TasksetConfig,
    metric,
    reward,
    stop,
)
from vf.toolset import SharedToolsetConfig, Toolset, ToolsetConfig, tool
from vf.trace import Episode, MessageNode, ModelCall, Trace
from vf.version import TRACE_VERSION, __version__

__all__ = [
    "Env", "Episode", "MessageNode", "ModelCall", "State", "Task", "TaskConfig", "TaskData", "Taskset",
    "TasksetConfig", "Toolset", "ToolsetConfig", "SharedToolsetConfig", "Trace", "TRACE_VERSION", "__version__", "metric", "reward", "stop", "tool",
    "load_taskset",
]


def load_taskset(taskset_id: str, fields: dict | None = None):
    """Build a taskset by id (see vf.loading)."""
    from vf.loading import load_taskset as _load

    return _load(taskset_id, fields)
