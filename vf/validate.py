"""Model-free checks: does a task's gold reply earn full reward?

`Task.validate()` returns the gold reply (a string), a bool verdict, or None for "no check"; or a
`Probe` (a reply to score that need not earn full reward: the check is that every reward and
metric runs without an error; a migrated v0 task, which had no gold reply, returns one, so a
reward function that would fail every episode is found before a run).
For a gold reply, `validate_task` plays one episode through the real harness
(`vf.harness.run_episode`) with a `ScriptedEngine` that answers with that reply, so setup and
finalize hooks, toolsets, stop conditions and scoring run exactly as in an evaluation:

    opening messages → assistant: gold reply → stop hooks → (if none fired and there is an Env)
    Env.respond once → score

The episode is capped at one model reply (`max_turns=1`). For a multi-turn taskset the gold
reply is the first reply that wins (wordle: the secret word), so a stop hook ends the episode
there; if none fires, the Env's next message is still recorded before scoring, so an Env that
keeps game state in `respond` has seen the gold move. Full reward is 1.0 (built-in tasksets
weight their rewards to sum to 1).

    ok, reward, reason = await validate_task(task, env)
    report = await validate_taskset(vf.load_taskset("wordle"), n=20)

No model is called: while a reply is scored, `OFFLINE` is set, and scoring code that would ask a
model itself (a migrated v0 judge) answers on its own instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from vf.engines.base import GenerateRequest, GenerateResult, Usage
from vf.env import Env
from vf.episode.hooks import call_validate
from vf.episode.runner import EpisodeSpec, run_episode
from vf.errors import UsageError
from vf.taskset import Task
from vf.trace import Episode

FULL_REWARD = 1.0
TOLERANCE = 1e-6

OFFLINE: ContextVar[bool] = ContextVar("vf_validate_offline", default=False)
"""True while vf-validate scores a reply (see the module docstring)."""


class Probe(str):
    """A reply `Task.validate()` returns to have it scored without a full-reward requirement."""


class ScriptedEngine:
    """An engine that replies with fixed texts in order (the last one repeats). No model."""

    name = "scripted"
    supports_tokens = False

    def __init__(self, replies: Sequence[str | dict[str, Any]]):
        if not replies:
            raise ValueError("ScriptedEngine needs at least one reply")
        self.replies = list(replies)
        self.calls = 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        reply = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        message = {"role": "assistant", "content": reply} if isinstance(reply, str) else dict(reply)
        return GenerateResult(message=message, usage=Usage())

    async def close(self) -> None:
        pass


async def score_reply(task: Task, reply: str, env: Env | None = None) -> Episode:
    """One episode in which the model's first (and only) reply is `reply`; scored."""
    spec = EpisodeSpec(engine=ScriptedEngine([reply]), model="scripted", max_turns=1, env=env,
                       env_id="validate", run={"type": "validate"})
    token = OFFLINE.set(True)
    try:
        return await run_episode(task, spec)
    finally:
        OFFLINE.reset(token)


async def validate_task(task: Task, env: Env | None = None) -> tuple[bool, float | None, str]:
    """(ok, reward, reason). reward is None when the task's check is a bool verdict or absent."""
    try:
        gold = await call_validate(task)  # validate(runtime) as in verifiers, or validate()
    except Exception as e:  # noqa: BLE001 - validate() is task code
        return False, None, f"validate() raised {type(e).__name__}: {e}"
    if gold is None:
        return True, None, "no check (validate() returned None)"
    if isinstance(gold, bool):
        return gold, None, "validate() passed" if gold else "validate() returned False"
    episode = await score_reply(task, str(gold), env)
    trace = episode.trace
    what = "probe" if isinstance(gold, Probe) else "gold"
    if not trace.ok or not episode.ok:
        first = next(iter([*trace.errors, *episode.errors]), None)
        return False, None, f"{what} episode failed: {first.type}: {first.message}" if first else f"{what} episode failed"
    reward = trace.reward
    if isinstance(gold, Probe):
        return True, reward, f"probe reply scored {reward:g} without an error (no gold reply to require 1.0 of)"
    if reward < FULL_REWARD - TOLERANCE:
        parts = ", ".join(f"{k}={v.score:g}×{v.weight:g}" for k, v in trace.rewards.items() if v is not None)
        return False, reward, f"gold reply earned {reward:g} < {FULL_REWARD:g} ({parts})"
    return True, reward, "gold reply earns full reward"


@dataclass
class TaskCheck:
    task: Task
    ok: bool
    reward: float | None
    reason: str


@dataclass
class ValidationReport:
    checks: list[TaskCheck] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[TaskCheck]:
        return [c for c in self.checks if not c.ok]


async def validate_taskset(loaded, n: int | None = None) -> ValidationReport:
    """Validate the first `n` tasks (all when None; an endless taskset needs `n`) of a
    `vf.loading.LoadedTaskset`, with its Env."""
    taskset = loaded.taskset
    if n is None and getattr(taskset, "INFINITE", False):
        raise UsageError(f"{loaded.id} is an endless taskset", hint="pass n to validate_taskset")
    tasks = list(taskset.take(n)) if n is not None else list(taskset.tasks())
    report = ValidationReport()
    for task in tasks:
        ok, reward, reason = await validate_task(task, loaded.env)
        report.checks.append(TaskCheck(task, ok, reward, reason))
    return report
