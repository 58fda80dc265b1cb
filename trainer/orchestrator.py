"""The orchestrator: tasks → groups of rollouts (via the harness) → scored, filtered, advantaged
training samples, produced ahead of the trainer on a background thread.

Determinism (what makes `--seed` runs repeatable and `--resume` exact): the tasks of step b are a
function of (seed, b) (`TaskSource`), every rollout samples with its own seed
f(seed, b, group, rollout), and batch b is generated from exactly the policy version
`drift.rollout_version(b, ...)` — the generator thread waits until the trainer has published that
version and loads it into the engine before it starts the batch. Generation of batch b+1 thus
overlaps training on batch b (`async_level` = 1), and can run at most `async_level` batches ahead.

Staleness: every trace records the policy version its rollout started from (`policy.start`, from
the engine). A group whose oldest rollout is more than `max_off_policy_steps` versions behind the
step that trains on it is dropped and counted (`dropped_stale_groups`). Groups with all-equal
rewards are skipped and counted (`zero_variance_groups`); errored rollouts are left out of their
group (`errored_rollouts`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from vf.trainer import advantages as adv_mod
from vf.trainer.samples import Sample, trace_samples

from vf.runner import EpisodeSpec, run_plan
from vf.taskset import Task
from vf.trace import Episode


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (not Python's salted hash)."""
    h = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


class TaskSource:
    """Endless, deterministic task order: epoch e is a permutation seeded by (seed, e); step b
    takes the next `n` tasks from the concatenation of epochs."""

    def __init__(self, tasks: list[Task], seed: int):
        if not tasks:
            from vf.errors import UsageError

            raise UsageError("the training taskset has no tasks")
        self.tasks, self.seed = tasks, seed
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            order = list(range(len(self.tasks)))
            random.Random(derive_seed(self.seed, "epoch", epoch)).shuffle(order)
            self._perms[epoch] = order
        return self._perms[epoch]

    def take(self, step: int, n: int) -> list[Task]:
        out = []
        for pos in range(step * n, step * n + n):
            epoch, i = divmod(pos, len(self.tasks))
            out.append(self.tasks[self._perm(epoch)[i]])
        return out


@dataclass
class Batch:
    step: int
    samples: list[Sample] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


async def generate_groups(step: int, tasks: list[Task], spec: EpisodeSpec, group_size: int, seed: int,
                          max_concurrent: int = 256) -> list[list[Episode]]:
    """Run group_size rollouts of each task through the episode runner; one seed per rollout."""
    owed = [(t, r) for t in tasks for r in range(group_size)]

    def seeded(i: int, task: Task, r: int) -> EpisodeSpec:
        g = i // group_size
        sampling = dataclasses.replace(spec.sampling, seed=derive_seed(seed, "rollout", step, g, r))
        return dataclasses.replace(spec, sampling=sampling, run={**spec.run, "step": step, "group": g})

    flat = await run_plan(owed, spec, max_concurrent, spec_for=seeded)
    return [list(flat[g * group_size:(g + 1) * group_size]) for g in range(len(tasks))]


def build_batch(step: int, groups: list[list[Episode]], std_norm: bool, max_off_policy_steps: int,
                expected_version: int | None = None) -> Batch:
    """Score → staleness filter → advantages → samples, with the counts that explain what was left out."""
    batch = Batch(step=step)
    rewards_all: list[float] = []
    staleness: list[int] = []
    dropped_stale = errored = 0
    fresh: list[list[Episode]] = []
    for group in groups:
        batch.episodes.extend(group)
        ok = [e for e in group if e.ok]
        errored += len(group) - len(ok)
        rewards_all.extend(e.reward for e in ok)
        versions = [t.policy.get("start") for e in ok for t in e.traces]
        versions = [v if v is not None else expected_version for v in versions]
        known = [v for v in versions if v is not None]
        lag = step - min(known) if known else 0
        staleness.append(lag)
        if lag > max_off_policy_steps:
            dropped_stale += 1
            continue
        if len(ok) >= 2:
            fresh.append(ok)
    adv = adv_mod.compute([[e.reward for e in g] for g in fresh], std_norm)
    for gi, advs in zip(adv.kept, adv.advantages):
        for ep, a in zip(fresh[gi], advs):
            for trace in ep.traces:
                if trace.trainable:  # seats an env marked non-trainable are never trained on
                    batch.samples.extend(trace_samples(trace, a, {"step": step, "reward": ep.reward}))
    n = len(rewards_all)
    mean = sum(rewards_all) / n if n else float("nan")
    batch.metrics = {
        "reward": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards_all) / n) ** 0.5 if n else float("nan"),
        "staleness": sum(staleness) / len(staleness) if staleness else 0.0,
        "staleness_max": max(staleness, default=0),
        "dropped_stale_groups": dropped_stale,
        "zero_variance_groups": adv.zero_variance,
        "errored_rollouts": errored,
        "num_samples": len(batch.samples),
        "completion_tokens": sum(e.num_output_tokens for e in batch.episodes),
    }
    return batch


class Orchestrator:
    """Background generator of RL batches `first .. last-1` (see module docstring).

    The trainer calls `publish(version, state)` after every optimizer step (and once for the
    starting version) and `get(step)` to receive batch `step`; `close()` stops the thread.
    """

    def __init__(self, *, source: TaskSource, spec: EpisodeSpec, pusher, group_size: int, groups_per_step: int,
                 seed: int, first: int, last: int, first_rl_step: int, async_level: int, stale_steps: int,
                 std_norm: bool, max_off_policy_steps: int, max_concurrent: int = 256):
        self.source, self.spec, self.pusher = source, spec, pusher
        self.group_size, self.groups_per_step, self.seed = group_size, groups_per_step, seed
        self.first, self.last, self.first_rl = first, last, first_rl_step
        self.async_level, self.stale = async_level, stale_steps
        self.std_norm, self.max_off = std_norm, max_off_policy_steps
        self.max_concurrent = max_concurrent
        self._cv = threading.Condition()
        self._snapshots: dict[int, dict] = {}
        self._published = -1
        self._ready: dict[int, Batch] = {}
        self._error: BaseException | None = None
        self._stop = False
        self._engine_version: int | None = None
        self._thread = threading.Thread(target=self._run, name="vf-orchestrator", daemon=True)

    # -- trainer side ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def needed_versions(self, next_step: int) -> range:
        """Versions that batches from `next_step` on may still need (kept in checkpoints)."""
        lo = self.version_for(max(next_step, self.first))
        return range(lo, next_step)

    def version_for(self, step: int) -> int:
        from vf.trainer.drift import rollout_version

        return rollout_version(step, self.first_rl, self.async_level, self.stale)

    def publish(self, version: int, state: dict) -> None:
        with self._cv:
            self._snapshots[version] = state
            self._published = max(self._published, version)
            self._cv.notify_all()

    def forget_before(self, version: int) -> None:
        """Drop weight snapshots older than `version` (no batch still to generate needs them)."""
        with self._cv:
            for v in [v for v in self._snapshots if v < version]:
                del self._snapshots[v]

    def snapshots(self, versions: range) -> dict[int, dict]:
        with self._cv:
            return {v: self._snapshots[v] for v in versions if v in self._snapshots}

    def get(self, step: int, timeout: float | None = None) -> tuple[Batch, float]:
        """Batch `step` and the seconds the trainer waited for it."""
        t0 = time.perf_counter()
        with self._cv:
            while step not in self._ready and self._error is None:
                if not self._thread.is_alive():
                    raise RuntimeError(f"the orchestrator thread ended without producing batch {step}")
                self._cv.wait(timeout=1.0)
            if self._error is not None:
                raise self._error
            batch = self._ready.pop(step)
        return batch, time.perf_counter() - t0

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    # -- generator thread -----------------------------------------------------------------------
    def _wait_for(self, version_needed: int, gate: int) -> dict | None:
        with self._cv:
            while not self._stop and (self._published < gate or version_needed not in self._snapshots):
                self._cv.wait()
            if self._stop:
                return None
            return self._snapshots[version_needed]

    def _run(self) -> None:
        try:
            asyncio.run(self._loop())
        except BaseException as e:  # noqa: BLE001 - handed to the trainer thread
            with self._cv:
                self._error = e
                self._cv.notify_all()

    async def _loop(self) -> None:
        for step in range(self.first, self.last):
            version = self.version_for(step)
            # async_level bounds the run-ahead even when drift asks for an older version
            gate = max(self.first_rl, step - self.async_level)
            state = self._wait_for(version, gate)
            if state is None:
                return
            if self._engine_version != version:
                self.pusher.push(state, version)
                self._engine_version = version
            t0 = time.perf_counter()
            tasks = self.source.take(step - self.first_rl, self.groups_per_step)
            groups = await generate_groups(step, tasks, self.spec, self.group_size, self.seed, self.max_concurrent)
            batch = build_batch(step, groups, self.std_norm, self.max_off, expected_version=version)
            batch.metrics["gen_time"] = time.perf_counter() - t0
            batch.metrics["policy_version"] = version
            with self._cv:
                self._ready[step] = batch
                self._cv.notify_all()
        close = getattr(self.spec.engine, "close", None)
        if close is not None:
            await close()
