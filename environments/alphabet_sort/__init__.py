"""alphabet-sort: sort a list of names alphabetically; reward = fraction of positions right.

The model answers inside <sorted>...</sorted> as a comma-separated list; without the tags the
whole reply is read as the list. Names compare case-insensitively. Data is generated offline
from a seed (names drawn without replacement from a fixed list).
"""

from __future__ import annotations

import random
import re

import vf
from vf.errors import UsageError

NAMES = (
    "Aaron Abigail Adam Adrian Alice Amara Amelia Andre Anna Arthur Beatrice Benjamin Bianca Boris "
    "Caleb Camila Carlos Chloe Clara Daniel Daphne David Diego Eleanor Elias Emma Ethan Felix Fiona "
    "Gabriel Grace Hana Harper Henry Hugo Iris Isaac Ivan Jade James Jasmine Julia Kai Karim Laura "
    "Leo Lily Lucas Luna Maya Mila Nadia Nathan Nina Noah Olga Oliver Omar Oscar Paula Peter Priya "
    "Quentin Rafael Rosa Ruby Samuel Sara Sofia Theo Tomas Uma Victor Violet Wendy Xavier Yara Yusuf "
    "Zara Zoe"
).split()

SYSTEM_PROMPT = ("Sort the names alphabetically. Answer with the sorted names as a comma-separated list "
                 "inside <sorted> tags.")
TAG = re.compile(r"<sorted>\s*(.*?)\s*(?:</sorted>|$)", re.S)


def parse_list(reply: str) -> list[str]:
    """The names in the reply's <sorted> tag (or the whole reply), lower-cased, empties dropped."""
    m = TAG.search(reply)
    text = m.group(1) if m else reply
    return [x.strip().lower() for x in re.split(r"[,\n]", text) if x.strip()]


def position_score(answer: list[str], gold: list[str]) -> float:
    """Fraction of positions holding the right name, over the longer of the two lists (so extra
    or missing names cost as much as misplaced ones)."""
    if not answer and not gold:
        return 1.0
    hits = sum(a == g for a, g in zip(answer, gold))
    return hits / max(len(answer), len(gold))


class SortData(vf.TaskData):
    names: list[str]
    """The names in the order shown to the model."""
    answer: list[str]
    """The same names sorted (case-insensitively)."""


class SortConfig(vf.TasksetConfig):
    size: int = 200
    """Number of tasks."""
    seed: int = 0
    min_names: int = 4
    max_names: int = 8


class SortTask(vf.Task[SortData, vf.State, vf.TaskConfig]):
    @vf.stop
    def one_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    def positions(self, task, trace) -> float:
        return position_score(parse_list(trace.last_reply), [n.lower() for n in task.answer])

    @vf.metric
    def exact(self, task, trace) -> float:
        return float(parse_list(trace.last_reply) == [n.lower() for n in task.answer])

    def validate(self) -> str:
        return f"<sorted>{', '.join(self.data.answer)}</sorted>"


class AlphabetSortTaskset(vf.Taskset[SortTask, SortConfig]):
    def load(self):
        cfg = self.config
        if not 1 <= cfg.min_names <= cfg.max_names <= len(NAMES):
            raise UsageError(f"alphabet-sort needs 1 <= min_names <= max_names <= {len(NAMES)} "
                             f"(got {cfg.min_names}, {cfg.max_names})",
                             hint="fix --taskset.min-names / --taskset.max-names")
        rng = random.Random(cfg.seed)
        for i in range(cfg.size):
            names = rng.sample(NAMES, rng.randint(cfg.min_names, cfg.max_names))
            yield SortData(id=f"alphabet-sort-{cfg.seed}-{i}", prompt="Sort these names: " + ", ".join(names),
                           system_prompt=SYSTEM_PROMPT, names=names, answer=sorted(names, key=str.lower))


__all__ = ["AlphabetSortTaskset"]
