"""reasoning-gym: the procedural generators of the `reasoning-gym` package as tasksets.

Pick a generator with the id's variant: `reasoning-gym:countdown`, `reasoning-gym:basic_arithmetic`
(the `dataset` field). The model answers inside <answer>...</answer>; reward `score` is the
generator's own `score_answer(answer, entry)` (0 when there is no tag, or when the scorer
raises on the reply). Everything runs offline; `reasoning_gym` is imported only when tasks are
loaded or scored (the import takes about a second).

Rows keep the generator's name, seed, size and kwargs plus the entry's index, so scoring
rebuilds the exact entry (`dataset[index]` is deterministic) — also when re-scoring saved runs.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from typing import Any, ClassVar

from pydantic import Field

import vf
from vf.errors import UsageError

SYSTEM_PROMPT = ("Solve the problem. You may reason first, then give only the final answer inside "
                 "<answer></answer> tags.")
TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
INSTALL_HINT = "pip install reasoning-gym   (or the vf extras: pip install 'vf[gym]')"


def parse_answer(reply: str) -> str | None:
    """The last <answer>...</answer> content, stripped; None without a closed tag."""
    found = TAG.findall(reply)
    return found[-1].strip() if found else None


def _rg():
    try:
        import reasoning_gym
    except ImportError:
        raise UsageError("the reasoning-gym tasksets need the `reasoning-gym` package, which is not installed",
                         hint=INSTALL_HINT) from None
    return reasoning_gym


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


@lru_cache(maxsize=32)
def _dataset(name: str, size: int, seed: int, kwargs_json: str):
    rg = _rg()
    names = dataset_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        shown = close or ["basic_arithmetic", "countdown", "chain_sum", "gsm_symbolic", "leg_counting"]
        raise UsageError(
            f"reasoning-gym has no dataset {name!r}" if name else "reasoning-gym needs a dataset",
            hint=f"use reasoning-gym:NAME, e.g. {', '.join('reasoning-gym:' + n for n in shown)} "
                 f"({len(names)} datasets; list them with python -c \"import reasoning_gym.factory as f; "
                 f"print(sorted(f.DATASETS))\")")
    try:
        return rg.create_dataset(name, size=size, seed=seed, **json.loads(kwargs_json))
    except (TypeError, ValueError, AssertionError) as e:
        raise UsageError(f"reasoning-gym dataset {name!r} rejected its config: {e}",
                         hint="check --taskset.kwargs.KEY values against the generator's config class") from None


def dataset(name: str, size: int, seed: int, kwargs: dict[str, Any]):
    """The generator object (cached per config)."""
    return _dataset(name, size, seed, json.dumps(kwargs, sort_keys=True))


class GymData(vf.TaskData):
    dataset: str
    index: int
    """Position of the entry in the generator (`dataset[index]`)."""
    answer: str | None = None
    """The entry's gold answer (some generators have none: any valid answer scores)."""
    seed: int
    size: int
    kwargs: dict[str, Any] = Field(default_factory=dict)


class GymConfig(vf.TasksetConfig):
    dataset: str = "basic_arithmetic"
    """Generator name (`reasoning-gym:NAME` sets it)."""
    size: int = 200
    """Number of tasks."""
    seed: int = 0
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra generator config, e.g. --taskset.kwargs.min-terms 2 (keys as the generator names them)."""


class GymTask(vf.Task[GymData, vf.State, vf.TaskConfig]):
    @vf.stop
    def one_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    def entry(self) -> dict[str, Any]:
        d = self.data
        return dataset(d.dataset, d.size, d.seed, d.kwargs)[d.index]

    @vf.reward(weight=1.0)
    def score(self, task, trace) -> float:
        answer = parse_answer(trace.last_reply)
        if answer is None:
            return 0.0
        ds = dataset(task.dataset, task.size, task.seed, task.kwargs)
        try:
            return float(ds.score_answer(answer, ds[task.index]))
        except Exception:  # noqa: BLE001 - some scorers raise on malformed replies: that's a wrong answer
            return 0.0

    @vf.metric
    def has_answer_tag(self, trace) -> float:
        return float(parse_answer(trace.last_reply) is not None)

    def validate(self) -> str | None:
        return None if self.data.answer is None else f"<answer>{self.data.answer}</answer>"


class ReasoningGymTaskset(vf.Taskset[GymTask, GymConfig]):
    VARIANT_FIELD: ClassVar[str] = "dataset"

    def load(self):
        cfg = self.config
        ds = dataset(cfg.dataset, cfg.size, cfg.seed, cfg.kwargs)
        for i in range(cfg.size):
            entry = ds[i]
            answer = entry.get("answer")
            yield GymData(id=f"reasoning-gym-{cfg.dataset}-{cfg.seed}-{i}", prompt=entry["question"],
                          system_prompt=SYSTEM_PROMPT, dataset=cfg.dataset, index=i,
                          answer=None if answer is None else str(answer).strip(),
                          seed=cfg.seed, size=cfg.size, kwargs=dict(cfg.kwargs))


__all__ = ["ReasoningGymTaskset"]
