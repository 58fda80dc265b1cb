"""`kimi_code`: verifiers 0.4.0's KimiCodeHarness (Moonshot's Kimi Code), which vf names but cannot
run: naming it is refused at config time with what is missing (vf.harnesses.unavailable)."""

from vf.harnesses.unavailable import ACP, refusing

MISSING = (f"{ACP}; and it installs with its vendor's script (code.kimi.com/kimi-code/install.sh), "
           "not pip or npm")
KimiCodeHarnessConfig, KimiCodeHarness = refusing("kimi_code", "KimiCode", MISSING, version=(str, "2.0.2"))

__all__ = ["KimiCodeHarness", "KimiCodeHarnessConfig"]
