"""`pi`: verifiers 0.4.0's PiHarness (the Pi coding agent: npm `@earendil-works/pi-coding-agent`
0.86.1 with `pi-acp` 0.0.33), which vf names but cannot run: naming it is refused at config time
with what is missing (vf.harnesses.unavailable)."""

from vf.harnesses.unavailable import ACP, refusing

MISSING = (f"{ACP} (its packages are on npm; the protocol is what is missing)")
PiHarnessConfig, PiHarness = refusing("pi", "Pi", MISSING, version=(str, "0.86.1"))

__all__ = ["PiHarness", "PiHarnessConfig"]
