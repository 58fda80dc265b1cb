"""Scoring a finished trace: the task's metrics, then its rewards, then the judges its config
plugs in (`TaskConfig.judges`), as verifiers scores.
"""

from __future__ import annotations

import asyncio
import traceback as tb
from collections.abc import Mapping
from typing import Any

from vf.episode.hooks import call_hook
from vf.judge import Judge, load_judge
from vf.taskset import Task
from vf.trace import ErrorInfo, RewardValue


async def score(task: Task, trace, runtime=None) -> None:
    """Metrics, then rewards, then judges, as verifiers scores. Every expected name is seeded
    with None first, so a trace shows which signals should have run; a hook that raises is
    recorded as an error (type, message) and leaves its value None."""
    args = {"task": task.data, "trace": trace, "state": trace.state, "config": task.config, "runtime": runtime}
    for kind in ("metric", "reward"):
        hooks = task.hooks(kind)
        target = trace.rewards if kind == "reward" else trace.metrics
        for name, _, _ in hooks:
            target.setdefault(name, None)
        for name, fn, meta in hooks:
            try:
                value = await call_hook(fn, args)
            except Exception as e:  # noqa: BLE001 - hook code is user code
                trace.errors.append(ErrorInfo(type=type(e).__name__, message=f"{kind} {name!r}: {e}",
                                              traceback=tb.format_exc(limit=5)))
                trace.ok = False
                continue
            values = value if isinstance(value, Mapping) else {name: value}
            if name not in values:  # a hook that reports several signals replaces its own name
                target.pop(name, None)
            for k, v in values.items():
                if kind == "reward":
                    target[k] = None if v is None else RewardValue(score=float(v), weight=meta.get("weight", 1.0))
                else:
                    target[k] = None if v is None else float(v)
    if task.config.judges:
        await run_judges(task, trace, args)


async def run_judges(task, trace, args: dict[str, Any]) -> None:
    """The task config's plugged judges, concurrently, after the task's rewards. Each reward name
    is seeded with None first; a judge that raises is an error on the trace and leaves it None."""
    judges = [load_judge(c) for c in task.config.judges]
    for judge in judges:
        trace.rewards[judge.reward_name] = None

    async def one(judge: Judge) -> None:
        try:
            value = await call_hook(judge.score, args)
        except Exception as e:  # noqa: BLE001 - a judge that errors fails this trace, not the run
            trace.errors.append(ErrorInfo(type=getattr(e, "type", None) or type(e).__name__,
                                          message=f"judge {judge.reward_name!r}: {e}",
                                          status_code=getattr(e, "status_code", None),
                                          traceback=tb.format_exc(limit=5)))
            trace.ok = False
            return
        values = value if isinstance(value, Mapping) else {judge.reward_name: value}
        if judge.reward_name not in values and trace.rewards.get(judge.reward_name) is None:
            trace.rewards.pop(judge.reward_name, None)
        for k, v in values.items():
            trace.rewards[k] = None if v is None else RewardValue(score=float(v), weight=judge.config.weight)

    await asyncio.gather(*(one(j) for j in judges))
