"""vf-train's defaults that more than one place states: the one place each is written.

The config (`trainer/config.py`), the loss (`trainer/losses/ipo.py`), the CLI's help texts
(`commands/train.py`) and `vf-migrate` (which writes vf's default loss into migrated configs and
says so in its notes) all read them from here, so changing a default changes it everywhere.
Importing this module needs nothing (no torch, no pydantic).
"""

from __future__ import annotations

DEFAULT_LOSS = "ipo"
"""The RL loss when none is named."""

IPO_EPS = 0.3
"""IPO's trust region |p − q| ≤ eps (an absolute probability difference, not a ratio)."""

IPO_KL_TAU = 0.0
"""IPO's KL term weight (0: off)."""

MAX_OFF_POLICY_STEPS = 8
"""The staleness bound (`async.max_off_policy_steps`): a group whose rollouts started more than
this many policy versions before the step that would train on it is cancelled or dropped."""

CKPT_EVERY = 10
"""Checkpoint cadence (`ckpt.every`): a checkpoint every N steps, and always at the end."""


def ipo_loss() -> dict:
    """vf's default loss as a config states it explicitly (`vf-migrate` writes it)."""
    return {"name": DEFAULT_LOSS, "params": {"eps": IPO_EPS}}
