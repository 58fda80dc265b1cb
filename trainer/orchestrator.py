"""The orchestrator: tasks → groups of rollouts (via the harness) → scored, filtered, advantaged
training samples, produced ahead of the trainer on a background thread. Two modes, one interface
(`start`, `publish(version, state)` after every optimizer step and once for the starting version,
`get(step)`, `close`, and the checkpoint hooks `needed_versions`/`snapshots`/`forget_before`):

Continuous (`ContinuousOrchestrator`, the default). Up to `max_inflight` rollouts (whole groups)
run at once against whatever policy the engine holds. When the trainer publishes version v it
is pushed into the engine at once (only the latest state is kept): the embedded engine swaps it
in between two decode steps, a server pauses, loads and resumes, so requests in flight survive
and a rollout may span several versions (its trace records `policy.start` and `policy.end`).
Batch s is filled with finished groups in completion order. A group's staleness at step s is
s − (the oldest `policy.start` of its rollouts); one beyond `max_off_policy_steps` K is dropped
when it reaches a batch, and a group still running is cancelled as soon as the policy it was
dispatched with is more than K versions behind the next batch (it could only be dropped later).
Both count in `dropped`. Resuming restarts dispatch from the checkpoint's weights: a continuous
run resumes, but not bit-exactly (which rollouts finish first depends on timing).

Deterministic (`ReplayOrchestrator`, `--async.deterministic`, for tests and exact repeats): the
tasks of step b are a function of (seed, b) (`TaskSource`), every rollout samples with its own
seed f(seed, b, group, rollout), and batch b is generated from exactly the policy version
`drift.rollout_version(b, ...)` = b − level — the generator thread waits until the trainer has
published that version and loads it into the engine before it starts the batch, and keeps the
weight snapshots that batches still owed need (saved in checkpoints, so `--resume` is exact).

Both modes: groups with all-equal rewards are skipped and counted (`zero_variance_groups`);
errored rollouts are left out of their group (`errored_rollouts`). Per step: `off_policy/mean`,
`off_policy/max` (staleness of the groups trained on), `dropped`, and `off_policy/hist`
({staleness: groups}, summed over the run into the summary).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from vf.trainer import advantages as adv_mod
from vf.trainer.samples import Sample, trace_samples
from vf.trainer.weights import collect

from vf.runner import EpisodeSpec, run_plan, with_shared_tools
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


def group_start(group: list[Episode], fallback: int | None = None) -> int | None:
    """The oldest policy version any rollout of `group` started from (trace `policy.start`);
    `fallback` where the engine reports none."""
    versions = [t.policy.get("start") for e in group if e.ok for t in e.traces]
    known = [v if v is not None else fallback for v in versions]
    known = [v for v in known if v is not None]
    return min(known) if known else fallback


def build_batch(step: int, groups: list[list[Episode]], std_norm: bool, max_off_policy_steps: int,
                expected_version: int | None = None) -> Batch:
    """Score → staleness filter → advantages → samples, with the counts that explain what was left out."""
    batch = Batch(step=step)
    rewards_all: list[float] = []
    staleness: list[int] = []
    dropped = errored = 0
    fresh: list[list[Episode]] = []
    for group in groups:
        ok = [e for e in group if e.ok]
        errored += len(group) - len(ok)
        start = group_start(group, expected_version)
        lag = step - start if start is not None else 0
        if lag > max_off_policy_steps:
            dropped += 1
            continue
        batch.episodes.extend(group)
        rewards_all.extend(e.reward for e in ok)
        staleness.append(lag)
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
        "off_policy/mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "off_policy/max": max(staleness, default=0),
        "off_policy/hist": dict(sorted(collections.Counter(staleness).items())),
        "dropped": dropped,
        "zero_variance_groups": adv.zero_variance,
        "errored_rollouts": errored,
        "num_samples": len(batch.samples),
        "completion_tokens": sum(e.num_output_tokens for e in batch.episodes),
    }
    return batch


class _Generator:
    """What both modes share: the generator thread (one asyncio loop) and the trainer-side wait."""

    def __init__(self, *, source: TaskSource, spec: EpisodeSpec, pusher, group_size: int, groups_per_step: int,
                 seed: int, first: int, last: int, first_rl_step: int, std_norm: bool, max_off_policy_steps: int,
                 max_concurrent: int = 256):
        self.source, self.spec, self.pusher = source, spec, pusher
        self.group_size, self.groups_per_step, self.seed = group_size, groups_per_step, seed
        self.first, self.last, self.first_rl = first, last, first_rl_step
        self.std_norm, self.max_off = std_norm, max_off_policy_steps
        self.max_concurrent = max_concurrent
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self._stop = False
        self._engine_version: int | None = None
        self._thread = threading.Thread(target=self._run, name="vf-orchestrator", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _wake(self) -> None:
        """Tell the generator thread that something changed (default: it waits on the condition)."""

    def _wait(self, ready) -> float:
        """Block the trainer until `ready()` (called under the lock) is true; re-raise a generator
        error. Returns the seconds waited."""
        t0 = time.perf_counter()
        while not ready() and self._error is None:
            if not self._thread.is_alive():
                raise RuntimeError("the orchestrator thread ended before the batch was ready")
            self._cv.wait(timeout=1.0)
        if self._error is not None:
            raise self._error
        return time.perf_counter() - t0

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # noqa: BLE001 - handed to the trainer thread
            with self._cv:
                self._error = e
                self._cv.notify_all()

    async def _main(self) -> None:
        try:
            await self._loop()
        finally:
            close = getattr(self.spec.engine, "close", None)
            if close is not None:
                await close()

    async def _loop(self) -> None:
        raise NotImplementedError


class ReplayOrchestrator(_Generator):
    """Deterministic mode: batch b from exactly version b − level (see the module docstring)."""

    def __init__(self, *, async_level: int, stale_steps: int = 0, **kw):
        super().__init__(**kw)
        self.async_level, self.stale = async_level, stale_steps
        self._snapshots: dict[int, dict] = {}
        self._published = -1
        self._ready: dict[int, Batch] = {}

    # -- trainer side ---------------------------------------------------------------------------
    def needed_versions(self, next_step: int) -> range:
        """Versions that batches from `next_step` on may still need (kept in checkpoints)."""
        lo = self.version_for(max(next_step, self.first))
        return range(lo, next_step)

    def version_for(self, step: int) -> int:
        from vf.trainer.drift import rollout_version

        return rollout_version(step, self.first_rl, self.async_level, self.stale)

    def publish(self, version: int, state) -> None:
        state = collect(state)  # a whole copy: the batch owed this version is generated later
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

    def get(self, step: int) -> tuple[Batch, float]:
        """Batch `step` and the seconds the trainer waited for it."""
        with self._cv:
            waited = self._wait(lambda: step in self._ready)
            return self._ready.pop(step), waited

    # -- generator thread -----------------------------------------------------------------------
    def _wait_for(self, version_needed: int, gate: int) -> dict | None:
        with self._cv:
            while not self._stop and (self._published < gate or version_needed not in self._snapshots):
                self._cv.wait()
            if self._stop:
                return None
            return self._snapshots[version_needed]

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


@dataclass
class _Group:
    index: int
    dispatched: int  # the version the engine held when the group was dispatched
    episodes: list[Episode]
    start: int | None  # the oldest policy.start its rollouts recorded


class ContinuousOrchestrator(_Generator):
    """Continuous dispatch (see the module docstring). `max_inflight` counts rollouts dispatched
    and not yet handed to the trainer (running or finished-waiting), in whole groups."""

    def __init__(self, *, max_inflight: int, **kw):
        super().__init__(**kw)
        self.max_groups = max(self.groups_per_step, max_inflight // self.group_size)
        self._latest: tuple[int, dict] | None = None
        self._finished: collections.deque[_Group] = collections.deque()
        self._next_step = self.first  # the batch the trainer takes next
        self._cancelled = 0  # groups cancelled in flight since the last batch
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.pushes = 0
        self.push_time = 0.0

    # -- trainer side ---------------------------------------------------------------------------
    def publish(self, version: int, state) -> None:
        """Stage the state here (the trainer's thread, where a stream is gathered; see `weights`);
        only the newest is kept and the generator thread pushes it into the engine at once."""
        state = self.pusher.stage(state, version)
        with self._cv:
            if self._latest is None or version > self._latest[0]:
                self._latest = (version, state)
        self._wake()

    # checkpoints hold no weight snapshots in this mode: dispatch resumes from the trained weights
    def needed_versions(self, next_step: int) -> range:
        return range(0)

    def snapshots(self, versions: range) -> dict[int, dict]:
        return {}

    def forget_before(self, version: int) -> None:
        pass

    def version_for(self, step: int) -> int:
        return step

    def get(self, step: int) -> tuple[Batch, float]:
        """Batch `step` from the next finished groups, skipping those past the staleness bound."""
        groups: list[_Group] = []
        dropped = 0
        t0 = time.perf_counter()
        with self._cv:
            while len(groups) < self.groups_per_step:
                self._wait(lambda: bool(self._finished))
                g = self._finished.popleft()
                if g.start is not None and step - g.start > self.max_off:
                    dropped += 1
                    # its slot is free now: without this wake the generator, which counts
                    # finished groups as owed, could wait for a batch that waits for it
                    self._wake()
                    continue
                groups.append(g)
            dropped += self._cancelled
            self._cancelled = 0
            self._next_step = step + 1
        waited = time.perf_counter() - t0
        self._wake()  # room to dispatch more
        for g in groups:
            for ep in g.episodes:
                ep.run["step"] = step
        batch = build_batch(step, [g.episodes for g in groups], self.std_norm, self.max_off)
        batch.metrics["dropped"] += dropped
        with self._cv:  # weight pushes since the previous batch, and the seconds they took
            batch.metrics["weight_pushes"], batch.metrics["push_time"] = self.pushes, self.push_time
            self.pushes, self.push_time = 0, 0.0
        return batch, waited

    # -- generator thread -----------------------------------------------------------------------
    def _wake(self) -> None:
        loop, event = self._aloop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has ended
                pass

    async def _push_latest(self, running: dict[asyncio.Task, int]) -> None:
        with self._cv:
            latest = self._latest
            next_step = self._next_step
        if latest is None or latest[0] == self._engine_version:
            return
        version, state = latest
        t0 = time.perf_counter()
        # lands between two decode steps (embedded) or pause → load → resume (servers)
        await asyncio.to_thread(self.pusher.push, state, version)
        self._engine_version = version
        # a group dispatched more than K versions before the next batch can only be dropped later
        stale = [t for t, v in running.items() if next_step - v > self.max_off and not t.done()]
        for t in stale:
            t.cancel()
        with self._cv:
            self.pushes += 1
            self.push_time += time.perf_counter() - t0
            self._cancelled += len(stale)

    async def _group(self, spec: EpisodeSpec, index: int, task: Task, dispatched: int) -> _Group:
        def seeded(_i: int, t: Task, r: int) -> EpisodeSpec:
            sampling = dataclasses.replace(spec.sampling, seed=derive_seed(self.seed, "group", index, r))
            return dataclasses.replace(spec, sampling=sampling, run={**spec.run, "group": index})

        episodes = await run_plan([(task, r) for r in range(self.group_size)], spec, self.group_size,
                                  spec_for=seeded)
        return _Group(index, dispatched, episodes, group_start(episodes, dispatched))

    async def _loop(self) -> None:
        self._event = asyncio.Event()
        self._aloop = asyncio.get_running_loop()
        running: dict[asyncio.Task, int] = {}
        index = (self.first - self.first_rl) * self.groups_per_step  # task order continues on resume
        async with with_shared_tools(self.spec) as spec:
            try:
                while True:
                    self._event.clear()
                    await self._push_latest(running)
                    with self._cv:
                        if self._stop or self._next_step >= self.last:
                            return
                        owed = len(running) + len(self._finished)
                    # nothing is generated before the warm-up's weights (version first_rl) are in
                    if self._engine_version is not None and self._engine_version >= self.first_rl:
                        for _ in range(self.max_groups - owed):
                            task = self.source.take(index, 1)[0]
                            t = asyncio.create_task(self._group(spec, index, task, self._engine_version))
                            running[t] = self._engine_version
                            index += 1
                    woken = asyncio.create_task(self._event.wait())
                    done, _ = await asyncio.wait([woken, *running], return_when=asyncio.FIRST_COMPLETED)
                    woken.cancel()
                    finished = [t.result() for t in done  # a failed group (a bug, a dead engine) ends the run
                                if t is not woken and running.pop(t, None) is not None and not t.cancelled()]
                    if finished:
                        with self._cv:
                            self._finished.extend(sorted(finished, key=lambda g: g.index))
                            self._cv.notify_all()
            finally:
                for t in running:
                    t.cancel()
                await asyncio.gather(*running, return_exceptions=True)


def make(config, **kw) -> ReplayOrchestrator | ContinuousOrchestrator:
    """The orchestrator `config.async_` asks for (`kw`: what both modes take)."""
    a = config.async_
    if a.deterministic:
        return ReplayOrchestrator(async_level=a.level, stale_steps=config.drift.stale_steps,
                                  max_off_policy_steps=a.max_off_policy_steps, **kw)
    return ContinuousOrchestrator(max_inflight=config.max_inflight, max_off_policy_steps=a.max_off_policy_steps, **kw)


Orchestrator = ReplayOrchestrator | ContinuousOrchestrator


def off_policy_histogram(rows: list[dict]) -> dict[str, int]:
    """{staleness: groups trained on} summed over metrics rows' `off_policy/hist` (summary.json)."""
    total: dict[int, int] = {}
    for r in rows:
        for lag, n in (r.get("off_policy/hist") or {}).items():
            total[int(lag)] = total.get(int(lag), 0) + int(n)
    return {str(k): total[k] for k in sorted(total)}
