"""verifiers 0.4.0 harness ids that vf resolves but cannot run: each refuses when it is named.

Six of them (hermes_agent, kimi_code, openclaw, pi, prime_agent, rlm) are ACP harnesses:
verifiers drives the agent as a live process over the Agent Client Protocol
(`runtime.open_process`), which vf's runtimes and harness driver do not offer; most also install
from outside the two registries vf installs agents from (pip's index, npm's registry): a GitHub
tarball, a vendor's `curl | bash` installer. browser_use drives a Chromium browser, which the
offline sandbox has none of. Naming one fails at config time, before any rollout or model call
(a `UsageError`: exit 2, no traceback), with a message saying what is missing
(docs/agents.md, "Which agents run").
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import create_model

from vf.configs.harness import HarnessConfig
from vf.errors import HarnessError, UsageError
from vf.harness import Harness

RUNNABLE = "mini_swe_agent, terminus_2, claude_code, codex, bash, null"
ACP = ("it is an ACP harness: verifiers runs the agent as a live process speaking the Agent Client "
       "Protocol (runtime.open_process), which vf does not implement")


class UnavailableHarness(Harness[HarnessConfig]):
    """Base of the refusing harnesses: `PEER` is verifiers' class, `MISSING` what vf lacks."""

    PEER: ClassVar[str] = ""
    MISSING: ClassVar[str] = ""
    CONFIG: ClassVar[type[HarnessConfig]] = HarnessConfig

    @classmethod
    def config_class(cls) -> type[HarnessConfig]:
        return cls.CONFIG

    def __init__(self, config: HarnessConfig):
        raise UsageError(f"harness {config.id!r} (verifiers 0.4.0's {self.PEER}) cannot run in vf: {self.MISSING}",
                         hint=f"use one vf runs ({RUNNABLE}), or a harness package of your own "
                              "(docs/agents.md)")

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data):
        raise HarnessError(f"harness {self.config.id!r} cannot run in vf")  # never built: __init__ refuses


def refusing(harness_id: str, peer: str, missing: str,
             **fields: tuple[Any, Any]) -> tuple[type[HarnessConfig], type[UnavailableHarness]]:
    """verifiers' `{peer}HarnessConfig` (its knobs: `fields`, name -> (type, default)) and a
    `{peer}Harness` that refuses with `missing`, both placed in `vf.harnesses.{harness_id}`."""
    module = f"vf.harnesses.{harness_id}"
    config = create_model(f"{peer}HarnessConfig", __base__=HarnessConfig, __module__=module,
                          id=(str, harness_id), **fields)
    harness = type(f"{peer}Harness", (UnavailableHarness,),
                   {"PEER": f"{peer}Harness", "MISSING": missing, "CONFIG": config, "__module__": module})
    return config, harness
