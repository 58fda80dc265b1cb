"""Duel: an environment project (pyproject.toml + package) with a multi-seat Env."""

from duel_v1.taskset import DuelEnv, DuelTaskset

__all__ = ["DuelEnv", "DuelTaskset"]
