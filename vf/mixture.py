"""Mixtures: several tasksets in one `vf-train` run or one `vf-eval` run.

Both commands take the same shape (`vf.config.TasksetEntry`): a `tasksets:` list of entries,
each a taskset id with its own fields plus `name`, `weight`, `group_size`, `sampling` and
`eval` overrides; a single `taskset:` is a mixture of one (`entries`).

    split          vf-train: each taskset's groups per step, the batch split by weight in whole
                   groups, the same every step (so a 3:1 mixture is exactly 3:1 in every batch)
    eval_config    one entry's vf-eval config (its taskset, sampling, select, rollouts)
    combine        the overall summary of a mixture evaluation: over every episode, with each
                   taskset's own summary under `tasksets`
    run_eval       vf-eval with several tasksets: each one a run dir of its own under
                   RUN/tasksets/NAME (so `--score` works on it alone; `--resume RUN` resumes
                   each), the overall summary in RUN/summary.json
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from vf.config import EvalConfig, SamplingConfig, TasksetEntry, deep_merge
from vf.rundir import RunDir

TASKSETS_DIR = "tasksets"
"""Where a mixture evaluation writes each taskset's run dir (RUN/tasksets/NAME)."""


def entries(taskset: dict[str, Any], tasksets: list[TasksetEntry]) -> list[TasksetEntry]:
    """The mixture a config describes: `tasksets`, else the one `taskset` as a mixture of one (all
    its keys are the taskset's fields: a single taskset reserves no key names)."""
    if tasksets:
        return list(tasksets)
    fields = dict(taskset)
    entry = TasksetEntry.model_construct(id=str(fields.pop("id", "")))  # as given: load_taskset judges the id
    entry.__pydantic_extra__ = fields
    return [entry]


def split(batch_size: int, weights: list[float], group_sizes: list[int], labels: list[str]) -> list[int]:
    """Groups per step of each taskset: batch_size rollouts shared by weight, in whole groups.

    Each taskset's ideal share is batch_size × weight / Σ weights rollouts. Every taskset first gets
    the whole groups that fit in its share; the rollouts left go one group at a time to the taskset
    furthest below its share (ties: the earlier one) among those whose group still fits. The
    result must add up to batch_size exactly and give every taskset a group, else ValueError says
    what to change. 3:1 of batch 8 with groups of 2 → 3 and 1 groups (6 and 2 rollouts)."""
    total = sum(weights)
    ideal = [batch_size * w / total for w in weights]
    groups = [int(i // g) for i, g in zip(ideal, group_sizes)]
    left = batch_size - sum(n * g for n, g in zip(groups, group_sizes))
    while left > 0:
        fits = [k for k, g in enumerate(group_sizes) if g <= left]
        if not fits:
            break
        k = max(fits, key=lambda k: (ideal[k] - groups[k] * group_sizes[k], -k))
        groups[k] += 1
        left -= group_sizes[k]
    shares = ", ".join(f"{lab} {n}×{g}" for lab, n, g in zip(labels, groups, group_sizes))
    if left:
        raise ValueError(f"the batch of {batch_size} rollouts cannot be split into whole groups ({shares}, "
                         f"{left} left over); make orchestrator.batch_size a sum of the group sizes, "
                         "e.g. a multiple of each")
    empty = [lab for lab, n in zip(labels, groups) if n == 0]
    if empty:
        enough = max(math.ceil(g * total / w - 1e-9) for w, g in zip(weights, group_sizes))
        raise ValueError(f"{', '.join(empty)} get(s) no group of a batch of {batch_size} ({shares}); raise "
                         f"their weight or the batch size (a batch of {enough} or more gives every taskset a group)")
    return groups


def sampling_for(base: dict[str, Any], *overrides: dict[str, Any]) -> dict[str, Any]:
    """The command's sampling (a dump) with an entry's overrides on top, later ones winning."""
    out = dict(base)
    for over in overrides:
        out.update(over)
    return out


def eval_config(config: EvalConfig, entry: TasksetEntry) -> EvalConfig:
    """The vf-eval config of one entry of `config.tasksets`: the shared keys, and the entry's
    taskset, sampling (entry's, then its eval's), select and rollouts."""
    data = config.model_dump(mode="json", exclude={"tasksets"})
    data["taskset"] = entry.fields
    data["sampling"] = sampling_for(data["sampling"], entry.sampling, entry.eval.sampling)
    data["select"] = deep_merge(data["select"], entry.eval.select)
    if entry.eval.num_rollouts is not None:
        data["num_rollouts"] = entry.eval.num_rollouts
    return EvalConfig.model_validate(data)


def combine(parts: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The overall summary of several tasksets' summaries (`vf.summary.summarize`'s keys), with
    each one under `tasksets`. Counts and tokens add up; the mean reward (and each named reward
    and metric) is the mean over every scored episode, so a taskset weighs by its episodes;
    pass@k is the mean over every task that has k rollouts."""
    ps = list(parts.values())

    def weighted(get, weight) -> float | None:
        pairs = [(get(p), weight(p)) for p in ps]
        pairs = [(v, w) for v, w in pairs if v is not None and w]
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else None

    def per_key(section: str, weight) -> dict[str, float | None]:
        keys = sorted({k for p in ps for k in p.get(section, {})})
        return {k: weighted(lambda p, k=k: p.get(section, {}).get(k), weight) for k in keys}

    scored, tasks = (lambda p: p.get("num_scored", 0)), (lambda p: p.get("num_tasks", 0))
    summary: dict[str, Any] = {
        "mean_reward": weighted(lambda p: p.get("mean_reward"), scored),
        **{k: sum(p.get(k, 0) for p in ps) for k in ("num_episodes", "num_scored", "num_errors", "num_tasks")},
        "rewards": per_key("rewards", scored),
        "metrics": per_key("metrics", scored),
        "pass_at_k": {k: v for k, v in per_key("pass_at_k", tasks).items() if v is not None},
        "pass_threshold": ps[0].get("pass_threshold") if ps else None,
        "input_tokens": sum(p.get("input_tokens", 0) for p in ps),
        "output_tokens": sum(p.get("output_tokens", 0) for p in ps),
    }
    errors = [{**e, "taskset": name} for name, p in parts.items() for e in p.get("first_errors", [])]
    if errors:
        summary["first_errors"] = errors[:5]
    first = next((p["first_error"] for p in ps if p.get("first_error")), None)
    if first:
        summary["first_error"] = first
    summary.update(extra)
    wall = summary.get("wall_time")
    summary.setdefault("tokens_per_second", summary["output_tokens"] / wall if wall else None)
    summary["tasksets"] = parts
    return summary


def label(entries_: list[TasksetEntry]) -> str:
    """A mixture's name in summaries and default run dirs: the labels joined by '+'."""
    return "+".join(e.label for e in entries_)


def run_label(config: Any) -> str:
    """What a run is named after: its mixture's label, else its one taskset's id."""
    return label(config.tasksets) if config.tasksets else str(config.taskset.get("id", "taskset"))


def check_sampling(entry: TasksetEntry, base: dict[str, Any]) -> list[str]:
    """Problems with an entry's sampling overrides (values checked against SamplingConfig)."""
    from pydantic import ValidationError

    problems = []
    for what, over in (("sampling", entry.sampling), ("eval.sampling", entry.eval.sampling)):
        try:
            SamplingConfig.model_validate({k: v for k, v in sampling_for(base, over).items() if k != "replay_mask"})
        except ValidationError as e:
            problems += [f"tasksets[{entry.label}].{what}.{'.'.join(map(str, err['loc']))}: {err['msg']}"
                         for err in e.errors()]
    return problems


# ---- vf-eval with several tasksets --------------------------------------------------------------


def run_eval(config: EvalConfig, run, execute, stream=None, label_: str = "eval") -> dict[str, Any]:
    """vf-eval over `config.tasksets`: `execute(part_config, part_run, kept)` (vf.evaluate's) for
    each taskset in turn, into RUN/tasksets/NAME (a run dir that resumes on its own: what it
    already holds is kept), then the overall summary in RUN/summary.json. `run` None: every
    episode goes to the stream (`-o -`)."""
    t0 = time.time()
    parts: dict[str, dict[str, Any]] = {}
    part_configs = {e.label: eval_config(config, e) for e in config.tasksets}  # every entry refused up front
    if run is not None:
        run.save_config(config.model_dump(mode="json"))
        (Path(run.path) / TASKSETS_DIR).mkdir(exist_ok=True)  # made here, so a failed part removes only its own dir
    for name, part in part_configs.items():
        sub, kept = None, []
        if run is not None:
            sub = RunDir(Path(run.path) / TASKSETS_DIR / name)
            if sub.config_path.exists():
                kept = sub.read().kept
            else:
                sub.create()
        parts[name] = execute(part, sub, kept, stream=stream, label=f"{label_} {name}")
    wall = time.time() - t0
    summary = combine(parts, wall_time=wall, taskset=label(config.tasksets), model=config.model,
                      command=config.command, num_owed=sum(p.get("num_owed", 0) for p in parts.values()),
                      num_resumed=sum(p.get("num_resumed", 0) for p in parts.values()),
                      run_dir=str(run.path) if run is not None else None)
    # throughput of this attempt only, as vf-eval's: tokens of the episodes generated now
    fresh = [p for p in parts.values() if p.get("tokens_per_second") is not None and p.get("wall_time")]
    summary["tokens_per_second"] = (sum(p["tokens_per_second"] * p["wall_time"] for p in fresh) / wall
                                    if fresh and wall > 0 else None)
    if run is not None:
        run.write_summary(summary)
    return summary


def taskset_arguments(values: list[str] | None, score: str | None = None) -> tuple[str | None, list[dict] | None]:
    """vf-eval's TASKSET arguments: one → that id; several → a mixture, one entry each (`ID` or
    `ID:WEIGHT`; vf-eval reports the weight, it does not use it)."""
    from vf.config import parse_taskset_spec
    from vf.errors import UsageError

    if not values:
        return None, None
    if len(values) == 1:
        return values[0], None
    if score is not None:
        raise UsageError("--score re-scores one taskset's traces",
                         hint="--score RUN/tasksets/NAME scores one taskset of a mixture")
    return None, [parse_taskset_spec(v) for v in values]
