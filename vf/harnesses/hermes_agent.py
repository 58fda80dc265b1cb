"""`hermes_agent`: verifiers 0.4.0's HermesAgentHarness (Nous Research's Hermes Agent), which vf
names but cannot run: naming it is refused at config time with what is missing
(vf.harnesses.unavailable)."""

from vf.harnesses.unavailable import ACP, refusing

MISSING = (f"{ACP}; and it installs from a GitHub source tarball (NousResearch/hermes-agent), not pip or npm")
HermesAgentHarnessConfig, HermesAgentHarness = refusing("hermes_agent", "HermesAgent", MISSING,
    version=(str, "v2026.9.14"))

__all__ = ["HermesAgentHarness", "HermesAgentHarnessConfig"]
