"""Built-in envs, chosen with `--env.id ID` over any taskset (as in verifiers 0.4):

    single-agent  one seat `agent` (what every plain taskset runs as)
    best-of-n     `--env.n` independent attempts, compared in `finalize` (metrics `best`, `pass_at_n`)
    user-sim      a modeled user (seat `user`, not trainable) converses with the assistant
"""

from __future__ import annotations

from vf.env import Env, SingleAgentEnv
from vf.envs.best_of_n import BestOfNEnv
from vf.envs.user_sim import UserSimEnv

BUILTIN_ENVS: dict[str, type[Env]] = {
    "single_agent": SingleAgentEnv,
    "best_of_n": BestOfNEnv,
    "user_sim": UserSimEnv,
}
"""Keyed by normalized id (`best-of-n` → `best_of_n`)."""

__all__ = ["BUILTIN_ENVS", "BestOfNEnv", "UserSimEnv"]
