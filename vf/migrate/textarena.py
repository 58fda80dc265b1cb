"""v0 `TextArenaEnv(game="Wordle-v0")` without the textarena package.

v0 wrapped textarena's Wordle-v0: the model answers `[word]` inside the parser's answer tag, the
game master replies with textarena's observation (`feedback_fn` trims it before the model sees
it), and the game ends on the secret word or after six guesses. vf plays the same game with the
rules of its built-in `wordle` taskset (its word list and its G/Y/X marks), and writes the reply
in textarena's layout, so the v0 reward functions that read it (`partial_credit_reward_func`
splits the last reply into the guess line and the marks line) score it as they did. The secret
words are vf's list, drawn with the env's `seed` (textarena's list needs nltk data from the
network); a game other than Wordle-v0 is an error that says what to do.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from vf.errors import UsageError
from vf.migrate.compat import MultiTurnEnv, Parser, XMLParser

MAX_GUESSES = 6  # textarena Wordle-v0
PROMPT = ("[GAME] You are playing Wordle. Guess the secret 5-letter word within 6 turns. After each guess you "
          "receive feedback: G means the letter is in the right place, Y means it is in the word but elsewhere, "
          "X means it is not in the word. Enter your guess in square brackets, e.g. [crane].")
BRACKETED = re.compile(r"\[([a-zA-Z]+)\]")


def make(game: str, **kwargs: Any) -> TextArenaWordle:
    if game != "Wordle-v0":
        raise UsageError(f"TextArenaEnv(game={game!r}): vf plays only Wordle-v0 without the textarena package",
                         hint="port the game to a vf.Env whose respond() steps it (see vf's built-in wordle)")
    return TextArenaWordle(**kwargs)


class TextArenaWordle(MultiTurnEnv):
    """v0 TextArenaEnv on Wordle-v0: rows `{question, answer}`, env_response = the game's reply."""

    def __init__(self, num_train_examples: int = 1000, num_eval_examples: int = 0, system_prompt: str | None = None,
                 parser: Parser | None = None, feedback_fn: Callable[[str], str] = lambda x: x, seed: int = 0,
                 **kwargs: Any):
        parser = parser if parser is not None else XMLParser(fields=["think", "guess"], answer_field="guess")
        super().__init__(parser=parser, system_prompt=system_prompt, **kwargs)
        self.feedback_fn, self.seed = feedback_fn, seed
        from vf.environments.wordle import words

        rng = random.Random(seed)
        rows = [{"question": PROMPT, "answer": rng.choice(words())} for _ in range(num_train_examples + num_eval_examples)]
        self.dataset, self.eval_dataset = rows[:num_train_examples], rows[num_train_examples:] or None

    def env_response(self, messages: list[dict[str, Any]], state: dict, **kwargs: Any) -> list[dict[str, Any]]:
        from vf.environments.wordle import feedback

        guess = str(self.parser.parse_answer(messages))
        found = BRACKETED.search(guess)
        word = found.group(1).lower() if found else ""
        history = state.setdefault("wordle_guesses", [])
        history.append(word)
        secret = state["answer"]
        if word == secret:
            state["wordle_done"] = True
            return [{"role": "user", "content": f"Congratulations! You guessed the word [{secret}] correctly!"}]
        if len(history) >= MAX_GUESSES:
            state["wordle_done"] = True
            return [{"role": "user", "content": f"You ran out of guesses. The word was [{secret}]."}]
        if len(word) != 5:
            text = f"[GAME] You entered an invalid guess [{guess}]: a 5-letter word in square brackets, e.g. [crane]."
        else:
            marks = " ".join(feedback(word, secret))
            left = MAX_GUESSES - len(history)
            text = (f"[GAME] You submitted [{word}].\nFeedback:\n{' '.join(word.upper())}\n{marks}\n\n"
                    f"You have {left} guesses left.")
        return [{"role": "user", "content": self.feedback_fn(text)}]

    def is_completed(self, messages: list[dict[str, Any]], state: dict, **kwargs: Any) -> bool:
        return bool(state.get("wordle_done"))
