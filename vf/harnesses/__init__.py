"""Built-in program harnesses: real third-party agents that play a seat (`--env.agent.harness.id
<module>`; vf.program resolves an id to `vf.harnesses.<id>`).

  mini_swe_agent  mini-SWE-agent (PyPI `mini-swe-agent`), one bash tool per call
  terminus_2      harbor's Terminus-2 (PyPI `harbor`), keystrokes into a tmux session
  claude_code     Claude Code (npm `@anthropic-ai/claude-code`)
  codex           OpenAI Codex CLI (npm `@openai/codex`)

Each is installed once on the host at its pinned version (vf.harnesses.install, vf.harnesses.npm)
and runs inside the rollout's runtime from that read-only install, its model calls sent to the
run's interception server: the sandbox needs no network during the episode. verifiers 0.4.0's
other ids (browser_use, hermes_agent, kimi_code, openclaw, pi, prime_agent, rlm) resolve to
modules here that refuse, naming what is missing (vf.harnesses.unavailable); `null` and `bash`
are vf.harness's in-process loops.

verifiers' class names import from here as from `verifiers.v1.harnesses` (`from vf.harnesses
import CodexHarnessConfig`), each loaded on first use: importing this package imports no harness.
"""

from __future__ import annotations

import importlib

_MODULES = {"mini_swe_agent": "MiniSWEAgent", "terminus_2": "Terminus2", "claude_code": "ClaudeCode",
            "codex": "Codex", "browser_use": "BrowserUse", "hermes_agent": "HermesAgent", "kimi_code": "KimiCode",
            "openclaw": "OpenClaw", "pi": "Pi", "prime_agent": "PrimeAgent", "rlm": "RLM"}
_EXPORTS = {f"{prefix}{suffix}": (f"vf.harnesses.{module}", f"{prefix}{suffix}")
            for module, prefix in _MODULES.items() for suffix in ("Harness", "HarnessConfig")}
_EXPORTS |= {"NullHarness": ("vf.episode.harnesses", "NullHarness"), "BashHarness": ("vf.episode.harnesses", "BashHarness"),
             "NullHarnessConfig": ("vf.configs.harness", "HarnessConfig"),
             "BashHarnessConfig": ("vf.configs.harness", "HarnessConfig")}
__all__ = ["BashHarness", "BashHarnessConfig", "BrowserUseHarness", "BrowserUseHarnessConfig",
           "ClaudeCodeHarness", "ClaudeCodeHarnessConfig", "CodexHarness", "CodexHarnessConfig",
           "HermesAgentHarness", "HermesAgentHarnessConfig", "KimiCodeHarness", "KimiCodeHarnessConfig",
           "MiniSWEAgentHarness", "MiniSWEAgentHarnessConfig", "NullHarness", "NullHarnessConfig",
           "OpenClawHarness", "OpenClawHarnessConfig", "PiHarness", "PiHarnessConfig", "PrimeAgentHarness",
           "PrimeAgentHarnessConfig", "RLMHarness", "RLMHarnessConfig", "Terminus2Harness",
           "Terminus2HarnessConfig"]


def __getattr__(name: str):
    """verifiers' names, imported when first asked for (a harness module imports vf.harness,
    which must not be imported by every user of vf.harnesses.install)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vf.harnesses' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)
