"""Built-in envs, chosen with `--env.id ID` over any taskset (as in verifiers 0.4):

    single-agent  one seat `agent` (what every plain taskset runs as)
    best-of-n     `--env.n` independent attempts, compared in `finalize` (metrics `best`, `pass_at_n`)
    user-sim      a modeled user (seat `user`, not trainable) converses with the assistant
    isolated-verifier     the task's own scoring in a fresh runtime; only declared artifacts travel
    agentic-judge         a judge agent (seat `judge`) grades the solver in a fresh runtime
    shared-agentic-judge  the same judge, in the solver's own runtime after it finished
"""

from __future__ import annotations

from vf.env import Env, SingleAgentEnv
from vf.envs.agentic_judge import IsolatedAgenticJudgeEnv, SharedAgenticJudgeEnv
from vf.envs.best_of_n import BestOfNEnv
from vf.envs.isolated_verifier import IsolatedVerifierEnv
from vf.envs.user_sim import UserSimEnv

BUILTIN_ENVS: dict[str, type[Env]] = {
    "single_agent": SingleAgentEnv,
    "best_of_n": BestOfNEnv,
    "user_sim": UserSimEnv,
    "isolated_verifier": IsolatedVerifierEnv,
    "agentic_judge": IsolatedAgenticJudgeEnv,
    "shared_agentic_judge": SharedAgenticJudgeEnv,
}
"""Keyed by normalized id (`best-of-n` → `best_of_n`)."""

__all__ = ["BUILTIN_ENVS", "BestOfNEnv", "IsolatedAgenticJudgeEnv", "IsolatedVerifierEnv",
           "SharedAgenticJudgeEnv", "UserSimEnv"]
