"""Runtime types by name: the built-in ones (importing them registers them) and any a module
registered through `register_runtime` (vf.runtime.base)."""

from __future__ import annotations

from pathlib import Path

from vf.errors import UsageError
from vf.runtime import docker, sandbox, subprocess  # noqa: F401  (importing registers their types)
from vf.runtime.base import _TYPES, Runtime, RuntimeConfig


def runtime_type(name: str) -> type[Runtime]:
    if name not in _TYPES:
        raise UsageError(f"unknown runtime type {name!r}", hint=f"choose one of: {', '.join(sorted(_TYPES))}")
    return _TYPES[name]


def make_runtime(config: RuntimeConfig | dict | None = None, workdir: Path | None = None) -> Runtime:
    config = config if isinstance(config, RuntimeConfig) else RuntimeConfig(**(config or {}))
    return runtime_type(config.type)(config, workdir)
