"""`vf.clients.ModelContext`: the model, endpoint and sampling one rollout's calls go to (verifiers
0.4's name). A program harness never talks to this endpoint itself: its calls reach the
interception server, which answers them from this context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelContext:
    model: str
    client: Any = None
    """The engine answering the calls (`vf.engines.base.Engine`)."""
    sampling: dict[str, Any] = field(default_factory=dict)
