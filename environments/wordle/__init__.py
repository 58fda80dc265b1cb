"""wordle: guess a secret 5-letter word in `max_guesses` tries with per-letter feedback.

Multi-turn: the model replies `<guess>word</guess>`; `WordleEnv.respond` answers with feedback
such as `CRANE -> X Y G X X (5 guesses left)` (G right letter and place, Y in the word elsewhere,
X not in the word — repeated letters are marked as in Wordle: greens first, then yellows up to
the letter's count). A reply without a valid guess gets a message restating the format and still
uses up a guess. The episode ends on the right guess (stop `solved`) or after `max_guesses`
replies (stop `out_of_guesses`).

Secret words come from `words.txt` beside this module (shipped, offline); any 5-letter
alphabetic guess is accepted. Rewards are computed from the trace alone, so saved runs re-score.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import vf
from vf.errors import UsageError
from vf.trace import content_text

SYSTEM_PROMPT = (
    "You are playing Wordle. Guess the secret 5-letter English word. Reply with one guess inside "
    "<guess></guess> tags, e.g. <guess>crane</guess>. After each guess you get one mark per letter: "
    "G = right letter in the right place, Y = in the word but elsewhere, X = not in the word."
)
GUESS = re.compile(r"<guess>\s*(.*?)\s*(?:</guess>|$)", re.S | re.I)


@lru_cache(maxsize=1)
def words() -> tuple[str, ...]:
    """The shipped secret-word list (lower case, 5 letters each)."""
    text = (Path(__file__).parent / "words.txt").read_text()
    return tuple(w.strip().lower() for w in text.split() if w.strip())


def parse_guess(reply: str) -> str | None:
    """The last <guess> in the reply, lower-cased, if it is 5 letters; else None."""
    found = GUESS.findall(reply)
    if not found:
        return None
    guess = found[-1].strip().lower()
    return guess if len(guess) == 5 and guess.isascii() and guess.isalpha() else None


def feedback(guess: str, secret: str) -> str:
    """Per-letter marks, e.g. 'XYGXX'. Greens first; then yellows while the secret still has
    unmatched copies of the letter (so a doubled guess letter is not marked Y twice)."""
    marks = ["X"] * 5
    left = Counter(s for g, s in zip(guess, secret) if g != s)
    for i, (g, s) in enumerate(zip(guess, secret)):
        if g == s:
            marks[i] = "G"
        elif left[g] > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


def guesses(trace) -> list[str | None]:
    """The parsed guess of every model reply so far (None for an invalid reply)."""
    return [parse_guess(content_text(m.get("content"))) for m in trace.assistant_messages]


def solved_at(trace, secret: str) -> int | None:
    """1-based number of the reply that guessed the secret, or None."""
    for i, g in enumerate(guesses(trace), 1):
        if g == secret:
            return i
    return None


class WordleData(vf.TaskData):
    answer: str
    """The secret word."""
    max_guesses: int = 6


class WordleConfig(vf.TasksetConfig):
    size: int = 100
    """Number of games."""
    seed: int = 0
    max_guesses: int = 6
    """Model replies allowed per game (raise --max-turns too when setting this above 8)."""


class WordleTask(vf.Task[WordleData, vf.State, vf.TaskConfig]):
    @vf.stop(priority=1)
    def solved(self, task, trace) -> bool:
        return parse_guess(trace.last_reply) == task.answer

    @vf.stop
    def out_of_guesses(self, task, trace) -> bool:
        return trace.num_turns >= task.max_guesses

    @vf.reward(name="solved", weight=0.8)
    def solved_reward(self, task, trace) -> float:
        return float(solved_at(trace, task.answer) is not None)

    @vf.reward(weight=0.2)
    def efficiency(self, task, trace) -> float:
        """1 for a first-try solve, falling by 1/max_guesses per extra guess; 0 when unsolved."""
        k = solved_at(trace, task.answer)
        return 0.0 if k is None else max(0.0, (task.max_guesses - k + 1) / task.max_guesses)

    @vf.metric
    def num_guesses(self, trace) -> float:
        return float(len(trace.assistant_messages))

    def validate(self) -> str:
        return f"<guess>{self.data.answer}</guess>"


class WordleEnv(vf.Env):
    """Scripted game master: feedback on the last guess, or the format rules for a bad reply."""

    async def respond(self, task, trace, state) -> str | None:
        guess = parse_guess(trace.last_reply)
        if guess == task.answer:
            return None
        left = task.max_guesses - len(trace.assistant_messages)
        tail = f"({left} guess{'' if left == 1 else 'es'} left)"
        if guess is None:
            return ("Invalid guess: reply with one 5-letter word inside <guess></guess> tags, "
                    f"e.g. <guess>crane</guess>. {tail}")
        return f"{guess.upper()} -> {' '.join(feedback(guess, task.answer))} {tail}"


class WordleTaskset(vf.Taskset[WordleTask, WordleConfig]):
    ENV = WordleEnv

    def load(self):
        cfg = self.config
        if cfg.max_guesses < 1:
            raise UsageError(f"wordle needs max_guesses >= 1 (got {cfg.max_guesses})",
                             hint="e.g. --taskset.max-guesses 6")
        rng = random.Random(cfg.seed)
        pool: list[str] = []
        for i in range(cfg.size):
            if not pool:  # deal the whole list in a shuffled order, then reshuffle
                pool = list(words())
                rng.shuffle(pool)
            secret = pool.pop()
            yield WordleData(
                id=f"wordle-{cfg.seed}-{i}", system_prompt=SYSTEM_PROMPT, answer=secret,
                max_guesses=cfg.max_guesses,
                prompt=f"Guess the secret word. You have {cfg.max_guesses} guesses.")


__all__ = ["WordleEnv", "WordleTaskset"]
