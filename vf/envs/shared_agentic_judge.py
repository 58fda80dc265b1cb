"""verifiers 0.4's import path for the shared agentic judge (`verifiers.v1.envs.shared_agentic_judge`),
so an env that subclasses it ports by its import alone; the code is vf.envs.agentic_judge."""

from vf.envs.agentic_judge import AgenticJudgeEnvConfig, SharedAgenticJudgeEnv

__all__ = ["AgenticJudgeEnvConfig", "SharedAgenticJudgeEnv"]
