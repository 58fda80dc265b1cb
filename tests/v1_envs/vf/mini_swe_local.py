"""mini-swe-agent (the built-in `mini_swe_agent` harness) allowed on the host: verifiers 0.4.0
refuses a harness with NEEDS_CONTAINER on its subprocess runtime, and there is no docker here.
Name it `--env.agent.harness.id mini_swe_local` (this file on PYTHONPATH)."""

from vf.harnesses.mini_swe_agent import MiniSWEAgentHarness

__all__ = ["LocalMiniSWEAgentHarness"]


class LocalMiniSWEAgentHarness(MiniSWEAgentHarness):
    NEEDS_CONTAINER = False
