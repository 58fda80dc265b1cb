"""reverse-text: reverse a short text; reward = LCS ratio against the exact reversal.

The model answers inside <reversed_text>...</reversed_text>; without the tags the whole reply
is compared. Data is generated offline from a seed (words from a fixed list).
"""

from __future__ import annotations

import random
import re
from difflib import SequenceMatcher

import vf

WORDS = (
    "the cat dog sun moon star tree leaf rain snow wind fire stone river sea sky red blue green gold "
    "fast slow big small old new hot cold light dark day night bird fish road hill book lamp door "
    "apple bread milk salt time song ring"
).split()

SYSTEM_PROMPT = "Reverse the text character by character. Put your answer in <reversed_text> tags."
TAG = re.compile(r"<reversed_text>\s*(.*?)\s*(?:</reversed_text>|$)", re.S)


def lcs_ratio(a: str, b: str) -> float:
    """Similarity in [0, 1] from the longest matching blocks (difflib's ratio)."""
    return SequenceMatcher(None, a, b).ratio()


def parse_answer(reply: str) -> str:
    m = TAG.search(reply)
    return (m.group(1) if m else reply).strip()


class ReverseData(vf.TaskData):
    answer: str
    """The text reversed character by character."""


class ReverseConfig(vf.TasksetConfig):
    size: int = 200
    """Number of tasks."""
    seed: int = 0
    min_words: int = 1
    max_words: int = 3


class ReverseTask(vf.Task[ReverseData, vf.State, vf.TaskConfig]):
    @vf.stop
    def one_turn(self, trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    def lcs(self, task, trace) -> float:
        return lcs_ratio(parse_answer(trace.last_reply), task.answer)

    @vf.metric
    def exact(self, task, trace) -> float:
        return float(parse_answer(trace.last_reply) == task.answer)

    def validate(self) -> str:
        return f"<reversed_text>{self.data.answer}</reversed_text>"


class ReverseTextTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for i in range(self.config.size):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(self.config.min_words, self.config.max_words)))
            yield ReverseData(id=f"reverse-{self.config.seed}-{i}", prompt=text, system_prompt=SYSTEM_PROMPT,
                              answer=text[::-1])


__all__ = ["ReverseTextTaskset"]
