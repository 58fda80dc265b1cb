"""What a plugin module exports: the contract verifiers' packages follow (a taskset package's
`__all__` names one Taskset, and optionally one Env and one Harness)."""

from __future__ import annotations

from types import ModuleType


def exported_subclasses(module: ModuleType, base: type) -> list[type]:
    """Subclasses of `base` the module exports: those its `__all__` names, else the classes
    defined in it."""
    names = getattr(module, "__all__", None)
    items = [getattr(module, n) for n in names] if names else [
        v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
    return [c for c in items if isinstance(c, type) and issubclass(c, base) and c is not base]
