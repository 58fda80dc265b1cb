"""`openclaw`: verifiers 0.4.0's OpenClawHarness (OpenClaw), which vf names but cannot run: naming
it is refused at config time with what is missing (vf.harnesses.unavailable)."""

from vf.harnesses.unavailable import ACP, refusing

MISSING = (f"{ACP}; and it installs with its vendor's script (openclaw.ai/install-cli.sh), not pip or npm")
OpenClawHarnessConfig, OpenClawHarness = refusing("openclaw", "OpenClaw", MISSING, version=(str, "2026.9.5"))

__all__ = ["OpenClawHarness", "OpenClawHarnessConfig"]
