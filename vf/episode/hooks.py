"""Calling a task's hooks: a hook (reward, metric, stop, intercept, setup, finalize, validate)
gets the arguments it names, sync or async (`call_hook`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from vf.runtime import make_runtime
from vf.taskset import Task


async def call_hook(fn: Callable, available: dict[str, Any]) -> Any:
    """Call `fn` with the arguments it names (sync or async). A parameter with a default that is
    not available keeps its default; one without is an error naming what hooks may ask for."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kwargs = dict(available)
    else:
        missing = [n for n, p in params.items()
                   if n not in available and p.default is p.empty
                   and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if missing:
            raise TypeError(
                f"hook {fn.__qualname__} asks for {missing}; hooks may name: {sorted(available)}")
        kwargs = {n: available[n] for n in params if n in available}
    result = fn(**kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def needs_runtime(fn: Callable) -> bool:
    """Whether a hook names `runtime` (so the rollout must provide one)."""
    try:
        return "runtime" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


async def call_validate(task: Task) -> str | bool | None:
    """`task.validate` with the arguments it names (`runtime`: a fresh subprocess runtime,
    closed afterwards; `task`, `config`)."""
    available: dict[str, Any] = {"task": task.data, "config": task.config}
    runtime = None
    if needs_runtime(task.validate):
        runtime = available["runtime"] = make_runtime()
    try:
        return await call_hook(task.validate, available)
    finally:
        if runtime is not None:
            await runtime.close()
