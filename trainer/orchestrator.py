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

Refill (`orchestrator.refill`, prime-rl's online difficulty filtering; off by default as there):
a group with no signal (all-equal rewards, or under two scored rollouts) trains nothing, so the
step samples more groups until each taskset has its quota of groups with signal — the batch is
`batch_size` rollouts — or until it has sampled `max_oversample` times its quota (`Fill`). Per
step: `groups_sampled`, `groups_refilled` (beyond the quota), `refill_capped` (1: the cap ended
the step short of a full batch; the loop says so). Deterministic mode stays deterministic: the
extra groups take the next tasks of the stream and seeds that follow the step's first groups.

Mixtures (`tasksets`): one `Stream` per taskset, each with its task order, episode spec, group
size and quota of groups per step (`vf.mixture.split`: the batch split by weight, in whole
groups). Batch s holds exactly each stream's quota (continuous mode takes each stream's groups
in completion order and leaves a stream's extra finished groups for the next batch); per-taskset
metrics are `reward/NAME`, `rollouts/NAME`, `groups/NAME`, `num_samples/NAME` (trained on),
`zero_variance_groups/NAME`.
`task_position` ({name: tasks taken}) goes into each batch's metrics and the run state's
progress, so a resumed run continues every stream where the trained batches left it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
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

from vf.episode.runner import EpisodeSpec, run_plan, with_shared_tools
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
        return self.at(step * n, n)

    def at(self, position: int, n: int) -> list[Task]:
        """Tasks position .. position + n − 1 of the endless order."""
        out = []
        for pos in range(position, position + n):
            epoch, i = divmod(pos, len(self.tasks))
            out.append(self.tasks[self._perm(epoch)[i]])
        return out


@dataclass
class Stream:
    """One taskset's part of every batch: its endless task order, the episode spec its rollouts
    run with, its group size, and its quota of groups per step. `position` counts the tasks taken
    (a resumed run sets it from the run state). `tag` enters the rollout seeds of a mixture's
    streams; a single taskset has none, so its seeds are those of runs before mixtures."""

    name: str
    source: TaskSource
    spec: EpisodeSpec
    group_size: int
    groups: int
    position: int = 0
    tag: str = ""

    def take(self, n: int) -> list[Task]:
        tasks = self.source.at(self.position, n)
        self.position += n
        return tasks


def informative(group: list[Episode]) -> bool:
    """Whether a group can train: two or more scored rollouts whose rewards differ."""
    ok = [e.reward for e in group if e.ok]
    return len(ok) >= 2 and adv_mod.group_advantages(ok) is not None


class Fill:
    """Filling one step's batch, per stream: groups wanted (the quota), sampled, and with signal.

    Without refill a stream samples its quota once (groups with no signal are skipped by
    `build_batch`, and the batch is smaller). With refill it samples until `quota` groups have
    signal or it has sampled `cap` = ⌊max_oversample × quota⌋ (at least the quota): the cap keeps a
    taskset the policy always solves (or always fails) from sampling forever."""

    def __init__(self, quotas: list[int], refill: bool = False, max_oversample: float = 1.0):
        self.quotas, self.refill = list(quotas), refill
        self.caps = [max(q, int(q * max_oversample + 1e-9)) if refill else q for q in quotas]
        self.sampled = [0] * len(quotas)
        self.kept = [0] * len(quotas)

    def want(self, i: int) -> int:
        """Groups stream i should sample now (0: done, full or at the cap)."""
        if self.refill:
            return max(0, min(self.quotas[i] - self.kept[i], self.caps[i] - self.sampled[i]))
        return self.quotas[i] - self.sampled[i]

    def offer(self, i: int, group: list[Episode]) -> None:
        self.sampled[i] += 1
        self.kept[i] += 1 if not self.refill or informative(group) else 0

    @property
    def done(self) -> bool:
        return all(self.want(i) == 0 for i in range(len(self.quotas)))

    @property
    def capped(self) -> list[int]:
        """Streams whose refill stopped at the cap short of their quota."""
        return [i for i in range(len(self.quotas)) if self.refill and self.kept[i] < self.quotas[i]]

    def metrics(self) -> dict[str, int]:
        return {"groups_sampled": sum(self.sampled),
                "groups_refilled": sum(max(0, s - q) for s, q in zip(self.sampled, self.quotas)),
                "refill_capped": int(bool(self.capped))}


@dataclass
class Batch:
    step: int
    samples: list[Sample] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


async def generate_groups(step: int, tasks: list[Task], spec: EpisodeSpec, group_size: int, seed: int,
                          max_concurrent: int = 256, first_group: int = 0) -> list[list[Episode]]:
    """Run group_size rollouts of each task through the episode runner; one seed per rollout
    (group g of the step: `first_group` + its place in `tasks`)."""
    owed = [(t, r) for t in tasks for r in range(group_size)]

    def seeded(i: int, task: Task, r: int) -> EpisodeSpec:
        g = first_group + i // group_size
        sampling = dataclasses.replace(spec.sampling, seed=derive_seed(seed, "rollout", step, g, r))
        return dataclasses.replace(spec, sampling=sampling, run={**spec.run, "step": step, "group": g})

    flat = await run_plan(owed, spec, max_concurrent, spec_for=seeded)
    for ep in flat:
        record_work(ep, step)
    return [list(flat[g * group_size:(g + 1) * group_size]) for g in range(len(tasks))]


def record_work(ep: Episode, step: int) -> None:
    """Stamp the training step an episode's batch is `step` onto its `run`: `run.step` (what vf's
    tools read) and `run.work`, verifiers 0.4.0's `TrainRunInfo.work` (a train run's episode must
    say what work it did: {type: train, step, policy: the policy versions its traces spanned})."""
    ep.run["step"] = step
    spans = [t.policy for t in ep.traces if isinstance(t.policy, dict)
             and isinstance(t.policy.get("start"), int) and isinstance(t.policy.get("end"), int)]
    work: dict[str, Any] = {"type": "train", "step": step}
    if spans:
        work["policy"] = {"start": min(p["start"] for p in spans), "end": max(p["end"] for p in spans)}
    ep.run["work"] = work


def group_start(group: list[Episode], fallback: int | None = None) -> int | None:
    """The oldest policy version any rollout of `group` started from (trace `policy.start`);
    `fallback` where the engine reports none."""
    versions = [t.policy.get("start") for e in group if e.ok for t in e.traces]
    known = [v if v is not None else fallback for v in versions]
    known = [v for v in known if v is not None]
    return min(known) if known else fallback


def build_batch(step: int, groups: list[list[Episode]], std_norm: bool, max_off_policy_steps: int,
                expected_version: int | None = None, names: list[str] | None = None) -> Batch:
    """Score → staleness filter → advantages → samples, with the counts that explain what was left out.
    `names`: each group's taskset (a mixture's); with two or more, the per-taskset metrics too."""
    batch = Batch(step=step)
    names = list(names) if names is not None else [""] * len(groups)
    rewards_all: list[float] = []
    staleness: list[int] = []
    dropped = errored = 0
    fresh: list[list[Episode]] = []
    fresh_names: list[str] = []
    per: dict[str, dict[str, Any]] = {n: {"rewards": [], "samples": 0, "groups": 0, "rollouts": 0, "zero": 0}
                                      for n in names}
    for group, name in zip(groups, names):
        ok = [e for e in group if e.ok]
        errored += len(group) - len(ok)
        start = group_start(group, expected_version)
        lag = step - start if start is not None else 0
        if lag > max_off_policy_steps:
            dropped += 1
            continue
        batch.episodes.extend(group)
        rewards_all.extend(e.reward for e in ok)
        per[name]["rewards"].extend(e.reward for e in ok)
        per[name]["groups"] += 1
        per[name]["rollouts"] += len(group)
        staleness.append(lag)
        if len(ok) >= 2:
            fresh.append(ok)
            fresh_names.append(name)
    adv = adv_mod.compute([[e.reward for e in g] for g in fresh], std_norm)
    kept = set(adv.kept)
    for gi, name in enumerate(fresh_names):
        per[name]["zero"] += gi not in kept
    for gi, advs in zip(adv.kept, adv.advantages):
        name = fresh_names[gi]
        info = {"step": step, **({"taskset": name} if name else {})}
        for ep, a in zip(fresh[gi], advs):
            for trace in ep.traces:
                if trace.trainable:  # seats an env marked non-trainable are never trained on
                    samples = trace_samples(trace, a, {**info, "reward": ep.reward})
                    batch.samples.extend(samples)
                    per[name]["samples"] += len(samples)
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
    if len(per) > 1:  # a mixture: the same numbers per taskset
        for name, p in per.items():
            rs = p["rewards"]
            batch.metrics[f"reward/{name}"] = sum(rs) / len(rs) if rs else float("nan")
            batch.metrics[f"num_samples/{name}"] = p["samples"]
            batch.metrics[f"groups/{name}"] = p["groups"]
            batch.metrics[f"rollouts/{name}"] = p["rollouts"]
            batch.metrics[f"zero_variance_groups/{name}"] = p["zero"]
    return batch


class _Generator:
    """What both modes share: the generator thread (one asyncio loop) and the trainer-side wait."""

    def __init__(self, *, pusher, seed: int, first: int, last: int, first_rl_step: int, std_norm: bool,
                 max_off_policy_steps: int, max_concurrent: int = 256, streams: list[Stream] | None = None,
                 source: TaskSource | None = None, spec: EpisodeSpec | None = None, group_size: int = 0,
                 groups_per_step: int = 0, refill: bool = False, max_oversample: float = 1.0):
        """`streams`: one per taskset; or one taskset as `source`, `spec`, `group_size`,
        `groups_per_step`. A stream without a position starts where batch `first` begins (the
        order of a run without refill: its quota per step since the warm-up)."""
        if streams is None:
            assert source is not None and spec is not None
            streams = [Stream("", source, spec, group_size, groups_per_step)]
            streams[0].position = (first - first_rl_step) * groups_per_step
        self.streams, self.mixture = streams, len(streams) > 1
        self.spec, self.pusher = streams[0].spec, pusher
        self.group_size, self.groups_per_step = streams[0].group_size, sum(s.groups for s in streams)
        self.seed = seed
        self.first, self.last, self.first_rl = first, last, first_rl_step
        self.std_norm, self.max_off = std_norm, max_off_policy_steps
        self.max_concurrent = max_concurrent
        self.refill, self.max_oversample = refill, max_oversample
        self._cv = threading.Condition()
        self._error: BaseException | None = None
        self._stop = False
        self._engine_version: int | None = None
        # in the creator's context: what it set (vf.imports.untrusted_config: a resumed run's
        # config.yaml is data) holds for the code the rollouts import, too
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,), name="vf-orchestrator", daemon=True)

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

    def _names(self, streams: list[int]) -> list[str] | None:
        """Each group's taskset, for the per-taskset metrics of a mixture (None: one taskset)."""
        return [self.streams[i].name for i in streams] if self.mixture else None

    def _fill_metrics(self, batch: Batch, fill: Fill, positions: list[int]) -> None:
        """The refill counts, and where each stream's task order stands after this batch."""
        batch.metrics.update(fill.metrics())
        batch.metrics["task_position"] = {s.name: p for s, p in zip(self.streams, positions)}
        if fill.capped:
            batch.metrics["refill_capped_tasksets"] = [self.streams[i].name for i in fill.capped]

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

    async def _generate(self, step: int) -> tuple[Fill, list[list[Episode]], list[int]]:
        """Batch `step`'s groups: each stream's quota, then (refill) rounds of more groups from
        the streams still short of groups with signal, until full or capped. The groups of a
        step are numbered in this order, which fixes their seeds: deterministic."""
        fill = Fill([s.groups for s in self.streams], self.refill, self.max_oversample)
        groups: list[list[Episode]] = []
        streams: list[int] = []
        first = 0
        while not fill.done:
            owed = []
            for i, s in enumerate(self.streams):
                n = fill.want(i)
                if n:
                    owed.append((i, s, s.take(n), first))
                    first += n
            made = await asyncio.gather(*(generate_groups(step, tasks, s.spec, s.group_size, self.seed,
                                                          self.max_concurrent, g0) for _, s, tasks, g0 in owed))
            for (i, _, _, _), gs in zip(owed, made):
                for g in gs:
                    fill.offer(i, g)
                    groups.append(g)
                    streams.append(i)
        return fill, groups, streams

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
            fill, groups, streams = await self._generate(step)
            batch = build_batch(step, groups, self.std_norm, self.max_off, expected_version=version,
                                names=self._names(streams))
            self._fill_metrics(batch, fill, [s.position for s in self.streams])
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
    stream: int = 0  # which taskset (`streams[stream]`); `index` is its place in that stream


class ContinuousOrchestrator(_Generator):
    """Continuous dispatch (see the module docstring). `max_inflight` counts rollouts dispatched
    and not yet handed to the trainer (running or finished-waiting), in whole groups."""

    def __init__(self, *, max_inflight: int, **kw):
        super().__init__(**kw)
        # each stream's share of the rollouts in flight is its share of the batch, in whole groups
        rollouts = sum(s.groups * s.group_size for s in self.streams)
        self.max_groups = [max(s.groups, max_inflight * s.groups * s.group_size // rollouts // s.group_size)
                           for s in self.streams]
        self._consumed = [s.position for s in self.streams]  # each stream's next task after the trained batches
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

    def _wanted(self, fill: Fill) -> int | None:
        """Place in the finished queue of the first group the batch still wants (its stream short)."""
        return next((k for k, g in enumerate(self._finished) if fill.want(g.stream)), None)

    def get(self, step: int) -> tuple[Batch, float]:
        """Batch `step` from the next finished groups of each stream short of its quota (`Fill`),
        skipping those past the staleness bound."""
        groups: list[_Group] = []
        dropped = 0
        fill = Fill([s.groups for s in self.streams], self.refill, self.max_oversample)
        t0 = time.perf_counter()
        with self._cv:
            while not fill.done:
                self._wait(lambda: self._wanted(fill) is not None)
                k = self._wanted(fill)
                g = self._finished[k]
                del self._finished[k]
                # its slot is free now: without this wake the generator, which counts finished
                # groups as owed, could wait for a batch that waits for it (or for a refill)
                self._wake()
                if g.start is not None and step - g.start > self.max_off:
                    dropped += 1
                    continue
                fill.offer(g.stream, g.episodes)
                groups.append(g)
                self._consumed[g.stream] = max(self._consumed[g.stream], g.index + 1)
            positions = list(self._consumed)
            dropped += self._cancelled
            self._cancelled = 0
            self._next_step = step + 1
        waited = time.perf_counter() - t0
        self._wake()  # room to dispatch more
        for g in groups:
            for ep in g.episodes:
                record_work(ep, step)
        batch = build_batch(step, [g.episodes for g in groups], self.std_norm, self.max_off,
                            names=self._names([g.stream for g in groups]))
        self._fill_metrics(batch, fill, positions)
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

    async def _group(self, spec: EpisodeSpec, index: int, task: Task, dispatched: int, stream: int = 0) -> _Group:
        tag, size = self.streams[stream].tag, self.streams[stream].group_size
        parts = ("group", tag, index) if tag else ("group", index)  # one taskset: the seeds of before mixtures

        def seeded(_i: int, t: Task, r: int) -> EpisodeSpec:
            sampling = dataclasses.replace(spec.sampling, seed=derive_seed(self.seed, *parts, r))
            return dataclasses.replace(spec, sampling=sampling, run={**spec.run, "group": index})

        episodes = await run_plan([(task, r) for r in range(size)], spec, size, spec_for=seeded)
        return _Group(index, dispatched, episodes, group_start(episodes, dispatched), stream)

    async def _loop(self) -> None:
        self._event = asyncio.Event()
        self._aloop = asyncio.get_running_loop()
        running: dict[asyncio.Task, int] = {}
        stream_of: dict[asyncio.Task, int] = {}
        async with contextlib.AsyncExitStack() as stack:
            specs = [await stack.enter_async_context(with_shared_tools(s.spec)) for s in self.streams]
            try:
                while True:
                    self._event.clear()
                    await self._push_latest(running)
                    with self._cv:
                        if self._stop or self._next_step >= self.last:
                            return
                        owed = collections.Counter(g.stream for g in self._finished)
                    owed.update(stream_of[t] for t in running)
                    # nothing is generated before the warm-up's weights (version first_rl) are in
                    if self._engine_version is not None and self._engine_version >= self.first_rl:
                        for i, stream in enumerate(self.streams):  # task order continues on resume
                            for _ in range(self.max_groups[i] - owed[i]):
                                index, task = stream.position, stream.take(1)[0]
                                t = asyncio.create_task(self._group(specs[i], index, task, self._engine_version, i))
                                running[t], stream_of[t] = self._engine_version, i
                    woken = asyncio.create_task(self._event.wait())
                    done, _ = await asyncio.wait([woken, *running], return_when=asyncio.FIRST_COMPLETED)
                    woken.cancel()
                    finished = [t.result() for t in done  # a failed group (a bug, a dead engine) ends the run
                                if t is not woken and running.pop(t, None) is not None
                                and stream_of.pop(t) is not None and not t.cancelled()]
                    for t in [t for t in stream_of if t not in running]:  # cancelled by a push
                        del stream_of[t]
                    if finished:
                        with self._cv:
                            self._finished.extend(sorted(finished, key=lambda g: (g.index, g.stream)))
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
