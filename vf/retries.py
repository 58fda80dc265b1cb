"""Whole-rollout and whole-episode retries (opt-in, verifiers' `--env.<seat>.retries` and
`--env.retries`).

Per-call provider retries belong to the engine (`--engine.max-retries`). Above them, a rollout
whose trace ends with an error may be run again from scratch (`Agent.run`), and an episode that
failed may be rerun whole (`run_episode`: the fallback for faults no seat owns, such as the env's
own hooks). Which errors qualify is decided by ordered rules; the first rule that matches an error
decides it (an exhausted or zero budget does not fall through to later rules), and `max_retries`
is the budget for errors no rule matches. Budgets count per rollout (per episode). The errors of
the failed attempts are kept in front of the final attempt's, so the record shows the history;
success is the `ok` stamp, not an empty error list.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RetryRule(BaseModel):
    """Every field given must match (`type`: the recorded error type, e.g. `EngineError`;
    `status_code`: codes or classes like "5xx"; `message`: a regex searched in the message)."""

    model_config = ConfigDict(extra="forbid")
    type: str | None = None
    status_code: list[int | Literal["1xx", "2xx", "3xx", "4xx", "5xx"]] | None = None
    message: str | None = None
    max_retries: int = Field(ge=0)
    """Retries for errors this rule matches; 0 excludes them."""

    @field_validator("message")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"invalid message regex: {e}") from None
        return value

    def matches(self, error) -> bool:
        if self.type is not None and error.type != self.type:
            return False
        if self.status_code is not None:
            code = error.status_code
            if code is None or not any(code == s if isinstance(s, int) else code // 100 == int(s[0])
                                       for s in self.status_code):
                return False
        return self.message is None or re.search(self.message, error.message or "") is not None


class RetryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_retries: int = Field(0, ge=0)
    """Retries for errors that match no rule (0: off)."""
    rules: list[RetryRule] = Field(default_factory=list)


class RetryBudget:
    """One rollout's (or episode's) retry budgets under `config`."""

    def __init__(self, config: RetryConfig | None):
        config = config or RetryConfig()
        self.rules = [*config.rules, RetryRule(max_retries=config.max_retries)]
        self.used = [0] * len(self.rules)

    @property
    def total(self) -> int:
        return sum(r.max_retries for r in self.rules)

    def take(self, errors: Iterable) -> bool:
        """Spend one retry on the first error (in recorded order) some rule allows."""
        for error in errors:
            for i, rule in enumerate(self.rules):
                if rule.matches(error):
                    if self.used[i] < rule.max_retries:
                        self.used[i] += 1
                        return True
                    break  # the first matching rule decides this error
        return False


def backoff(attempt: int) -> float:
    """Seconds before retry `attempt` (0-based): exponential with jitter, at most ~45 s."""
    return min(0.5 * 2 ** attempt, 30.0) * (0.5 + random.random())
