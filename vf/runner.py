"""Run many episodes with bounded concurrency, saving each one the moment it finishes.

`run_plan` is what `vf-eval`, `vf-rollout` and the trainer's evaluation share: given the
(task, rollout index) pairs still owed, it runs them on one engine with at most
`max_concurrent` in flight and hands every finished episode to `on_episode` (which appends it
to the run dir or stdout) before starting the bookkeeping for the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vf.config import EvalConfig
from vf.errors import UsageError
from vf.harness import EpisodeSpec, run_episode
from vf.loading import LoadedTaskset
from vf.selection import select_tasks
from vf.taskset import Task
from vf.trace import Episode


@dataclass
class Plan:
    tasks: list[Task]
    owed: list[tuple[Task, int]]
    kept: list[Episode] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.owed) + len(self.kept)


def make_plan(loaded: LoadedTaskset, config: EvalConfig, kept: list[Episode] | None = None) -> Plan:
    """Pairs (task, rollout) for the selected tasks, minus those already kept on disk.
    Saved episodes of tasks no longer selected are left out of the plan (and the file)."""
    tasks = select_tasks(loaded.taskset, config.select)
    have = {(e.task.hash, e.rollout): e for e in (kept or [])}
    owed, keep = [], []
    for t in tasks:
        h = t.data.hash
        for r in range(config.num_rollouts):
            if (h, r) in have:
                keep.append(have[(h, r)])
            else:
                owed.append((t, r))
    return Plan(tasks=tasks, owed=owed, kept=keep)


def make_engine(config: EvalConfig):
    from vf.engines import create_engine

    e = config.engine
    kind = e.resolved_type
    if kind == "openai":
        return create_engine("openai", base_url=e.base_url, model=config.model, api_key_var=e.api_key_var,
                             timeout=e.timeout, max_retries=e.max_retries,
                             max_connections=max(config.max_concurrent, 8))
    if kind == "local":
        return create_engine("local", model=config.model, dtype=e.dtype, device=e.device, max_batch=e.max_batch)
    return create_engine("vllm", model=config.model, dtype=e.dtype)


def make_spec(engine, loaded: LoadedTaskset, config: EvalConfig, run: dict[str, Any]) -> EpisodeSpec:
    return EpisodeSpec(
        engine=engine, model=config.model,
        sampling=config.sampling.to_sampling(logprobs=True),
        max_turns=config.max_turns, episode_timeout=config.episode_timeout,
        env=loaded.env, env_id=loaded.id, run=run,
        require_tokens=config.command == "rollout",
    )


async def run_plan(owed: list[tuple[Task, int]], spec: EpisodeSpec, max_concurrent: int,
                   on_episode: Callable[[Episode], None]) -> None:
    """Run every owed pair; stop early (UsageError) if the engine cannot give required tokens."""
    queue: asyncio.Queue = asyncio.Queue()
    for pair in owed:
        queue.put_nowait(pair)
    fatal: list[BaseException] = []

    async def worker():
        while not fatal:
            try:
                task, rollout = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            episode = await run_episode(task, spec, rollout)
            errors = [err for t in episode.traces for err in t.errors]
            if spec.require_tokens and any(err.type == "MissingTokens" for err in errors):
                fatal.append(UsageError(
                    f"the engine ({spec.engine.name}) does not return token ids and log-probs, which "
                    "vf-rollout needs for training",
                    hint="use the embedded engine, vf-serve, or a vLLM server (which return them)"))
                return
            on_episode(episode)

    workers = [asyncio.create_task(worker()) for _ in range(max(1, min(max_concurrent, len(owed))))]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
    if fatal:
        raise fatal[0]
