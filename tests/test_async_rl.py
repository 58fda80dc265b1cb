"""Continuous asynchronous RL: in-flight weight updates in the embedded engine, the continuous
orchestrator's staleness bound, and a continuous `vf-train` run that resumes."""

import asyncio
import json
import time

import pytest
from test_trainer_cli import SMALL, train


@pytest.fixture
def engine():  # one per test: an orchestrator closes its engine when it stops
    from vf.engines.local import LocalEngine

    e = LocalEngine.from_model("tiny-random", max_batch=16)
    yield e
    asyncio.run(e.close())


def perturbed(state, scale=0.5):
    import torch

    g = torch.Generator().manual_seed(0)
    return {k: v + scale * v.std() * torch.randn(v.shape, generator=g) if v.dim() >= 2 else v.clone()
            for k, v in state.items()}


def test_weight_update_lands_between_decode_steps(engine):
    """A request in flight keeps running across an update: it records both versions, and its
    tokens after the update are scored by the new weights."""
    from vf.engines.base import Sampling

    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    # long enough that the update surely lands mid-request: the tiny model decodes ~1 ms a token
    sampling = Sampling(temperature=1.0, max_tokens=1000, seed=3)

    async def run(update: bool):
        seen = []
        task = asyncio.ensure_future(engine.generate_ids([1, 2, 3, 4], sampling, ignore_eos=True,
                                                         on_token=lambda t, lp: seen.append(t)))
        if update:
            deadline = time.time() + 30
            while len(seen) < 8 and time.time() < deadline:
                await asyncio.sleep(0.001)
            await asyncio.to_thread(engine.update_weights, perturbed(original), 7)
        return await task

    engine.update_weights(original, 0)
    plain = asyncio.run(run(False))
    assert plain.policy_version == plain.policy_version_end == 0
    engine.update_weights(original, 0)
    mixed = asyncio.run(run(True))
    engine.update_weights(original, 0)
    assert mixed.policy_version == 0 and mixed.policy_version_end == 7
    assert len(mixed.token_ids) == 1000  # not aborted by the update
    # same seed: identical until the update, then the new weights give other log-probs
    assert mixed.logprobs[:8] == plain.logprobs[:8]
    assert mixed.logprobs[-8:] != plain.logprobs[-8:]


def setup(engine, max_tokens=6):
    from vf.config import SelectConfig
    from vf.engines.base import Sampling
    from vf.loading import load_taskset
    from vf.runner import EpisodeSpec
    from vf.selection import select_tasks

    tasks = select_tasks(load_taskset("reverse-text", {"size": 20}).taskset, SelectConfig())
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    spec = EpisodeSpec(engine=engine, model="tiny-random", sampling=Sampling(temperature=1.0, max_tokens=max_tokens),
                       run={"type": "train"}, require_tokens=True)
    return tasks, state, spec


def test_continuous_orchestrator_drops_what_is_too_stale(engine):
    from vf.trainer.orchestrator import ContinuousOrchestrator, TaskSource
    from vf.trainer.weights import EmbeddedPush

    tasks, state, spec = setup(engine)

    class Counting(EmbeddedPush):
        versions: list[int] = []  # noqa: RUF012 (one pusher per test)

        def push(self, state, version):
            self.versions.append(version)
            super().push(state, version)

    pusher = Counting(engine)
    orch = ContinuousOrchestrator(max_inflight=8, source=TaskSource(tasks, 0), spec=spec, pusher=pusher,
                                  group_size=4, groups_per_step=1, seed=0, first=0, last=10, first_rl_step=0,
                                  std_norm=False, max_off_policy_steps=1)
    orch.start()
    try:
        orch.publish(0, state)
        b0, _ = orch.get(0)
        assert len(b0.episodes) == 4 and b0.metrics["off_policy/max"] == 0 and b0.metrics["dropped"] == 0
        # the trainer publishes three versions before it asks for a batch again: only the newest
        # state is kept, and the engine gets it at once (the embedded engine takes it as it is
        # published: the stream is read in the trainer's thread; the push then counts it)
        for v in (1, 2, 3):
            orch.publish(v, state)
        deadline = time.time() + 30
        while pusher.versions[-1:] != [3] and time.time() < deadline:
            time.sleep(0.01)
        assert engine.policy_version == 3 and pusher.versions[-1] == 3
        b3, _ = orch.get(3)
        # groups started at version 0 are 3 > K=1 steps old at step 3: dropped and counted
        assert b3.metrics["dropped"] >= 1, b3.metrics
        assert b3.metrics["off_policy/max"] <= 1
        assert all(t.policy["start"] >= 2 for e in b3.episodes for t in e.traces)
        assert all(e.run["step"] == 3 for e in b3.episodes)
    finally:
        orch.close()


def test_push_cancels_groups_that_can_only_go_stale(engine):
    """At a push, a running group dispatched more than K versions before the next batch is
    cancelled (its rollouts leave the engine) and counted; a younger one keeps running."""
    from vf.trainer.orchestrator import ContinuousOrchestrator, TaskSource
    from vf.trainer.weights import EmbeddedPush

    tasks, state, spec = setup(engine, max_tokens=4000)  # replies long enough to be in flight
    orch = ContinuousOrchestrator(max_inflight=8, source=TaskSource(tasks, 0), spec=spec, pusher=EmbeddedPush(engine),
                                  group_size=4, groups_per_step=1, seed=0, first=0, last=10, first_rl_step=0,
                                  std_norm=False, max_off_policy_steps=2)

    async def main():
        old = asyncio.create_task(orch._group(spec, 0, tasks[0], 0))
        young = asyncio.create_task(orch._group(spec, 1, tasks[1], 4))
        await asyncio.sleep(0.05)
        orch._next_step = 5  # the next batch is step 5: version 0 is 5 > K behind, version 4 is 1
        orch.publish(5, state)
        await orch._push_latest({old: 0, young: 4})
        await asyncio.gather(old, return_exceptions=True)
        assert old.cancelled() and not young.done()
        assert orch._cancelled == 1 and engine.policy_version == 5
        young.cancel()
        await asyncio.gather(young, return_exceptions=True)

    asyncio.run(main())
    deadline = time.time() + 10
    while engine.scheduler.load and time.time() < deadline:
        time.sleep(0.01)
    assert engine.scheduler.load == 0  # cancelled requests left the engine


@pytest.mark.slow
def test_continuous_run_reports_staleness_and_resumes(tmp_path):
    run = tmp_path / "c"
    train("-o", str(run), *SMALL, "--steps", "2", "--ckpt-every", "2", "--max-off-policy-steps", "64")
    proc = train("--resume", str(run), "--steps", "4", "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"] == 4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    rl = [r for r in rows if r["phase"] == "rl"]
    for r in rl:
        assert 0 <= r["off_policy/mean"] <= r["off_policy/max"] <= 64 and r["dropped"] == 0
        assert sum(r["off_policy/hist"].values()) == 2  # two groups of 4 per step
        assert r["staleness"] == r["off_policy/mean"]
    # each RL step after the first trains on rollouts from an older policy (one step overlap)
    assert rl[0]["off_policy/max"] == 0 and rl[1]["off_policy/max"] >= 1
    assert sum(summary["off_policy_hist"].values()) == 2 * 4
    # no weight snapshots in continuous checkpoints (the trained weights are enough)
    from vf.trainer import checkpoint

    assert checkpoint.load(run / "checkpoints" / "step_6")["snapshots"] == {}
