"""Runtimes: where commands that tasks, rewards and harnesses run actually execute.

One interface (`Runtime`: `run`, `write`, `read`, `close`) with one implementation per type.
A runtime owns one per-rollout working directory and every process it starts; `close()` removes
both, always (use `async with`). Pick one with `make_runtime(RuntimeConfig(type=...))`.

Types: `sandbox` (the default: bubblewrap, see vf.runtime.sandbox), `docker` (where a daemon
answers), `subprocess` (host processes; no isolation, debug only, warns once per run), and any a
module registers through `register_runtime`. A command stopped by a limit has
`CommandResult.limit` set (`RuntimeLimitError` via `raise_for_limit()`).
"""

from vf.runtime.base import (
    CommandResult,
    ProgramResult,
    Runtime,
    RuntimeConfig,
    RuntimeLimitError,
    SandboxUnavailable,
    register_runtime,
)
from vf.runtime.registry import make_runtime

__all__ = ["CommandResult", "ProgramResult", "Runtime", "RuntimeConfig", "RuntimeLimitError", "SandboxUnavailable", "make_runtime", "register_runtime"]
