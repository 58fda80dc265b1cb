"""Where each training step's batch comes from: one `BatchSource` interface, three sources.

    GoldWarmup   SFT samples from the taskset's gold replies (`Task.validate()`), steps 0 .. W−1
    SavedData    SFT samples from saved traces (`--data RUN_DIR`) or a chat dataset (`--data FILE|DIR|HUB_ID`,
                 trainer/datasets.py), every step
    Rollouts     RL batches from the orchestrator (rank 0), broadcast to every torchrun rank; which
                 orchestrator (this process's, or another's: `--role trainer`) the run's deployment
                 decides (`deployment.Deployment.rollouts`)

A source says what kind of step its batches make (`phase`, `rl`: the RL loss at the sampling
temperature over the engine's log-probs, or SFT at temperature 1) and hands out batch `step` with
the seconds the trainer waited for it. The samples of a step are a function of (seed, step), so a
resumed run trains on the very same batches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vf.trainer import distributed
from vf.trainer.config import DataSection, OrchestratorSection, TrainConfig, entry_sampling, mixture_groups
from vf.trainer.orchestrator import Batch, Orchestrator, Stream, TaskSource, derive_seed, make
from vf.trainer.samples import Sample, trace_samples

from vf.config import SelectConfig, TasksetEntry
from vf.episode.loading import load_taskset
from vf.episode.runner import EpisodeSpec, check_harnesses, taskset_toolsets
from vf.errors import UsageError
from vf.selection import select_tasks


class BatchSource(Protocol):
    phase: str
    """metrics.jsonl's `phase`: warmup | sft | rl."""
    rl: bool
    """RL loss over the engine's log-probs at the sampling temperature (else SFT at temperature 1)."""

    def get(self, step: int) -> tuple[Batch, float]:
        """Batch `step` and the seconds spent waiting for it (collective under torchrun)."""
        ...


@dataclass
class Picked:
    """A fixed list of samples, `batch_size` per step in seeded epoch permutations."""

    phase: str
    samples: list[Sample]
    batch_size: int
    seed: int
    tag: str
    rl: bool = False

    def get(self, step: int) -> tuple[Batch, float]:
        return Batch(step, pick(self.samples, step, self.batch_size, self.seed, self.tag), [], {}), 0.0


def gold_warmup(tasks, tokenizer, config: TrainConfig, model=None) -> Picked:
    size = config.warmup.batch_size or config.orchestrator.batch_size
    return Picked("warmup", gold_samples(tasks, tokenizer, model), size, config.seed, "gold")


def saved_data(data: DataSection, orchestrator: OrchestratorSection, seed: int, tokenizer=None,
               seq_len: int | None = None, say=lambda _msg: None) -> Picked:
    """`--data PATH`: a vf run dir / traces file (the traces' own token ids), or a chat or
    prompt/completion dataset rendered with `tokenizer`'s chat template (`trainer.datasets`)."""
    from vf.trainer import datasets

    if datasets.is_dataset(data.path):
        if data.min_reward is not None:
            raise UsageError(f"--data.min-reward filters traces by reward; the dataset {data.path} has none",
                             hint="drop --data.min-reward, or filter the dataset")
        loaded = datasets.load_samples(data.path, tokenizer, seq_len or 10**9, data.split, data.subset)
        say(loaded.describe(data.path))
        samples = loaded.samples
    else:
        samples = load_data(data.path, data.min_reward)
    return Picked("sft", samples, data.batch_size or orchestrator.batch_size, seed, "data")


class Rollouts:
    """RL batches: rank 0 takes them from the orchestrator, every rank gets them by broadcast
    (`orchestrator` None: a rank that only receives)."""

    phase, rl = "rl", True

    def __init__(self, orchestrator: Orchestrator | None, d: distributed.Dist):
        self.orch, self.d = orchestrator, d

    def get(self, step: int) -> tuple[Batch, float]:
        batch, wait = self.orch.get(step) if self.orch is not None else (None, 0.0)
        return distributed.broadcast(batch, self.d), wait

    def publish(self, version: int, weights) -> None:
        """Policy `version` exists (`weights`: the learner's stream): batches generated from it
        may start (rank 0)."""
        if self.orch is not None:
            self.orch.publish(version, weights)
            self.orch.forget_before(self.orch.version_for(version))

    def snapshots(self, next_step: int) -> dict[int, dict]:
        """Weights of older versions that batches from `next_step` on still need (checkpoints)."""
        return self.orch.snapshots(self.orch.needed_versions(next_step)) if self.orch is not None else {}

    def close(self) -> None:
        if self.orch is not None:
            self.orch.close()


def build_orchestrator(config: TrainConfig, run_dir: Path, engine, push, members: list[Member], tasks, first: int,
                       positions: dict[str, int] | None = None) -> Orchestrator:
    """The orchestrator of batches first .. total−1 (not started) over `engine`, pushing weights
    with `push`: one stream per taskset (`members`), each with its episode spec, group size and
    groups per step (the batch split by weight). A stream starts at its `positions` entry, else
    where a run without refill would be at batch `first` (its groups per step since the warm-up)."""
    o, W, mixed = config.orchestrator, config.warmup.steps, len(members) > 1
    streams = []
    for m, groups in zip(members, mixture_groups(config)):
        name = m.entry.label
        spec = EpisodeSpec(engine=engine, model=str(config.model.path),
                           sampling=sampling(config, entry_sampling(config, m.entry) if mixed else None),
                           max_turns=o.max_turns, env=m.loaded.env, env_id=m.loaded.id,
                           run=train_run(run_dir), require_tokens=True,
                           shared_toolsets=taskset_toolsets(m.loaded))
        # a mixture's tasksets each get their own task order (one taskset: the order of before mixtures)
        seed = derive_seed(config.seed, "taskset", name) if mixed else config.seed
        position = (positions or {}).get(name, (first - W) * groups)
        streams.append(Stream(name, TaskSource(m.tasks, seed), spec, m.entry.group_size or o.group_size, groups,
                              position, tag=name if mixed else ""))
    return make(config, streams=streams, pusher=push, seed=config.seed, first=first, last=config.total_steps,
                first_rl_step=W, std_norm=o.std_norm, max_concurrent=o.max_concurrent, refill=o.refill,
                max_oversample=o.max_oversample)


def train_run(run_dir: Path) -> dict[str, Any]:
    """The `run` of a training episode, as verifiers 0.4.0's `TrainRunInfo` reads it (type, id,
    name); the orchestrator adds the step and `work` when the episode joins a batch
    (`orchestrator.record_work`)."""
    name = Path(run_dir).name
    return {"type": "train", "id": name, "name": name}


def sampling(config: TrainConfig, s=None):
    """The rollouts' sampling (`s`, default `config.sampling`): the full distribution, with the
    engine's log-probs."""
    from vf.engines.base import Sampling

    s = s or config.sampling
    return Sampling(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                    max_tokens=s.max_tokens, seed=s.seed, stop=list(s.stop), logprobs=True)


@dataclass
class Member:
    """One taskset of the run (`config.mixture`): its entry, the loaded taskset, its tasks."""

    entry: TasksetEntry
    loaded: Any
    tasks: list


def load_tasks(config: TrainConfig) -> tuple[list[Member], list]:
    """The training tasksets (loaded, each with its tasks: at most 10 000 of an endless one) and
    all their tasks together (the gold warm-up's)."""
    members = []
    for entry in config.mixture:
        loaded = load_taskset(entry.id, entry.fields, config.env)
        check_harnesses(loaded)  # an unknown or unbuildable harness stops the run here (exit 2)
        limit = 10_000 if loaded.taskset.INFINITE else None
        members.append(Member(entry, loaded, select_tasks(loaded.taskset, SelectConfig(limit=limit))))
    return members, [t for m in members for t in m.tasks]


def gold_samples(tasks, tokenizer, model=None) -> list[Sample]:
    """SFT samples from the tasks' gold replies (`Task.validate()` returning a string); with a VL
    `model`, image prompts keep their images (references on the sample, image tokens in the prompt)."""
    from vf.engines.chat import image_refs, render_multimodal, render_prompt
    from vf.episode.hooks import needs_runtime

    out = []
    for task in tasks:
        if needs_runtime(task.validate):  # a check run in a runtime (swe-mini's gold patch) is no reply
            raise UsageError(f"task {task.data.key} has no gold reply (its validate() checks in a runtime)",
                             hint="set --warmup.steps 0 for tasksets without gold replies")
        gold = task.validate()
        if not isinstance(gold, str):
            raise UsageError(f"task {task.data.key} has no gold reply (validate() returned {type(gold).__name__})",
                             hint="set --warmup.steps 0 for tasksets without gold replies")
        multimodal = getattr(model, "is_multimodal", False)
        prompt = render_multimodal(tokenizer, model, task.messages())[0] if multimodal \
            else render_prompt(tokenizer, task.messages())
        reply = list(tokenizer.encode(gold, add_special_tokens=False)) + [tokenizer.eos_token_id]
        out.append(Sample(prompt + reply, [0] * len(prompt) + [1] * len(reply), [0.0] * (len(prompt) + len(reply)),
                          images=image_refs(task.messages()) if multimodal else []))
    return out


def load_data(path: str, min_reward: float | None) -> list[Sample]:
    from vf.trace import load_traces, read_episodes

    file = load_traces(path)
    if not file.exists():
        raise UsageError(f"--data {path}: no traces at {file}", hint="pass a run dir written by vf-rollout/vf-eval -o")
    samples = []
    # in task order, not the order the rollouts finished in: the same traces give the same run
    for ep in sorted(read_episodes(file), key=lambda e: (str(e.task.key), e.rollout, e.id)):
        if not ep.ok or (min_reward is not None and ep.reward < min_reward):
            continue
        for trace in ep.traces:
            samples.extend(trace_samples(trace, 0.0, {"reward": ep.reward}))
    if not samples:
        raise UsageError(f"--data {path}: no usable samples (token ids on assistant nodes"
                         + (f", reward ≥ {min_reward}" if min_reward is not None else "") + ")",
                         hint="traces need token ids: write them with vf-rollout")
    return samples


def pick(items: list, step: int, n: int, seed: int, tag: str) -> list:
    """Items for `step`: epoch permutations seeded by (seed, tag, epoch) — a function of (seed, step)."""
    out = []
    for pos in range(step * n, step * n + n):
        epoch, i = divmod(pos, len(items))
        order = list(range(len(items)))
        random.Random(derive_seed(seed, tag, epoch)).shuffle(order)
        out.append(items[order[i]])
    return out
