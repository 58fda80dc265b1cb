"""`rlm`: verifiers 0.4.0's RLMHarness (nano-rlm, a recursive language model agent), which vf names
but cannot run: naming it is refused at config time with what is missing
(vf.harnesses.unavailable)."""

from vf.harnesses.unavailable import ACP, refusing

MISSING = (f"{ACP}; and it installs from a git clone (github.com/PrimeIntellect-ai/nano-rlm), not pip or npm")
RLMHarnessConfig, RLMHarness = refusing("rlm", "RLM", MISSING,
    version=(str, "c38e20b60c90bbf625274d3fde2b2a384f390a66"))

__all__ = ["RLMHarness", "RLMHarnessConfig"]
