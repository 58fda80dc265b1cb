"""Group-relative advantages (prime-rl `grpo`, Dr-GRPO style by default).

    A_i = r_i − mean_j(r_j)                      over the rollouts j of one group (same task)
    A_i = (r_i − mean) / (std + 1e-6)            with std_norm (population std)

A group whose rewards are all equal carries no learning signal (every A_i = 0): it is skipped —
not trained on — and counted (`zero_variance_groups`), so a batch that is all-solved or
all-failed shows up in the metrics instead of silently training on nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

EPS = 1e-6


@dataclass
class GroupAdvantages:
    advantages: list[list[float]] = field(default_factory=list)  # per kept group, per rollout
    kept: list[int] = field(default_factory=list)  # indices of the kept groups
    zero_variance: int = 0  # groups skipped


def group_advantages(rewards: list[float], std_norm: bool = False) -> list[float] | None:
    """Advantages of one group, or None when the group has zero reward variance."""
    n = len(rewards)
    if n == 0:
        return None
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if max(abs(c) for c in centred) <= EPS:
        return None
    if std_norm:
        std = math.sqrt(sum(c * c for c in centred) / n)
        return [c / (std + EPS) for c in centred]
    return centred


def compute(groups: list[list[float]], std_norm: bool = False) -> GroupAdvantages:
    """Advantages for several groups of rewards; zero-variance groups are skipped and counted."""
    out = GroupAdvantages()
    for i, rewards in enumerate(groups):
        adv = group_advantages(rewards, std_norm)
        if adv is None:
            out.zero_variance += 1
            continue
        out.kept.append(i)
        out.advantages.append(adv)
    return out
