"""`--env.<seat>.harness.*`: which program plays a seat, and its knobs (verifiers 0.4's
`verifiers.v1.configs.harness`). A harness with knobs of its own subclasses `HarnessConfig` and
names it as its generic parameter (`class MyHarness(Harness[MyConfig])`)."""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

PinnedVersion = Annotated[str, Field(pattern=r"^[A-Za-z0-9._+-]+$")]
"""A release a harness pins its program install to (no ranges, no URLs: an install is cached
under its version, so the same name must always mean the same program)."""


class HarnessConfig(BaseModel):
    """What every harness takes. Unknown keys are kept for the harness's own config class."""

    model_config = ConfigDict(extra="allow")
    id: str = "null"
    """A built-in harness (`null`, `bash`, `mini_swe_agent`, ...), an installed package's
    `vf.harnesses` entry point, a module exporting one `Harness` subclass, or `module:Class`."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra variables for the program; the harness's own (endpoint, key) take precedence."""
    forward_env: list[str] = Field(default_factory=list)
    """Host variables passed to the program by name (so no secret is written into a config)."""
    tool_timeout: float = Field(600.0, gt=0)
    """Seconds one tool call (or bash command) may take before it is stopped and reported."""
    disabled_tools: list[str] = Field(default_factory=list)

    @property
    def name(self) -> str:
        return self.id

    @property
    def resolved_env(self) -> dict[str, str]:
        forwarded = {k: os.environ[k] for k in self.forward_env if k in os.environ}
        return {**forwarded, **self.env}
