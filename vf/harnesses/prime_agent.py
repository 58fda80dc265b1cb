"""`prime_agent`: verifiers 0.4.0's PrimeAgentHarness (Prime Intellect's prime-agent), which vf
names but cannot run: naming it is refused at config time with what is missing
(vf.harnesses.unavailable)."""

from vf.harnesses.unavailable import ACP, refusing

MISSING = (f"{ACP}; and it installs from GitHub release tarballs (PrimeIntellect-ai/prime-agent), "
           "not pip or npm")
PrimeAgentHarnessConfig, PrimeAgentHarness = refusing("prime_agent", "PrimeAgent", MISSING,
    commit=(str, "a7d791bc1be09793ed5f3ec05bf4cccbc60679ea"), autonomous=(bool, False))

__all__ = ["PrimeAgentHarness", "PrimeAgentHarnessConfig"]
