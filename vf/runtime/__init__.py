"""Runtimes: where commands that tasks, rewards and harnesses run actually execute.

One interface (`Runtime`: `run`, `write`, `read`, `close`) with one implementation per type.
A runtime owns one per-rollout working directory and every process it starts; `close()` removes
both, always (use `async with`). Pick one with `make_runtime(RuntimeConfig(type=...))`.

Types: `subprocess` (host processes; no isolation, debug only) and the ones other modules
register through `register_runtime` (`sandbox`, `docker`).
"""

from vf.runtime.base import CommandResult, Runtime, RuntimeConfig, make_runtime, register_runtime

__all__ = ["CommandResult", "Runtime", "RuntimeConfig", "make_runtime", "register_runtime"]
