"""`browser_use`: verifiers 0.4.0's BrowserUseHarness (browser-use's agent, PyPI
`browser-harness`), which vf names but cannot run: naming it is refused at config time with what is
missing (vf.harnesses.unavailable)."""

from vf.harnesses.unavailable import refusing

MISSING = ("it drives a Chromium browser (launched in the runtime, or attached over CDP at `cdp_url`), and "
           "vf's sandbox has no browser and no network to reach one")
BrowserUseHarnessConfig, BrowserUseHarness = refusing("browser_use", "BrowserUse", MISSING,
    browser=(str, "chromium"), cdp_url=(str | None, None))

__all__ = ["BrowserUseHarness", "BrowserUseHarnessConfig"]
