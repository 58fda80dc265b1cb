"""Find a taskset by id and build it from config fields.

An id is one of:
  - a built-in:            `reverse-text`  → module `vf.environments.reverse_text`
  - a variant of one:      `reasoning-gym:countdown` (sets the taskset's `VARIANT_FIELD`)
  - an installed package:  a name registered in the `vf.environments` entry-point group
                           (`name = "pkg.module"` or `"pkg.module:MyTaskset"`), else an
                           importable module of that name (`-` → `_`)
  - a path:                `./my_env.py` or a package folder `./my_env/`

A module must export exactly one `Taskset` subclass (in `__all__`, or defined in it), and may
export one `Env` subclass.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from vf.env import Env
from vf.errors import ConfigError, TasksetNotFound
from vf.taskset import Taskset

ENTRY_POINT_GROUP = "vf.environments"


def builtin_ids() -> list[str]:
    import vf.environments as pkg

    root = Path(pkg.__file__).parent
    return sorted(p.name.replace("_", "-") for p in root.iterdir()
                  if p.is_dir() and (p / "__init__.py").exists() and not p.name.startswith("_"))


@dataclass
class LoadedTaskset:
    id: str
    taskset: Taskset
    env: Env | None

    @property
    def config(self):
        return self.taskset.config


def _import_path(path: Path) -> ModuleType:
    path = path.resolve()
    if path.is_dir():
        init = path / "__init__.py"
        if not init.exists():
            raise TasksetNotFound(f"{path} is a folder without __init__.py",
                                  hint="point at a .py file or a package folder")
        name, location = path.name, init
        search = [str(path)]
    else:
        name, location, search = path.stem, path, None
    modname = f"vf_user_taskset_{name}"
    spec = importlib.util.spec_from_file_location(modname, location, submodule_search_locations=search)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    return module


def _resolve_module(base: str) -> tuple[ModuleType, str | None]:
    """Import the module for an id; returns (module, explicit class name or None)."""
    p = Path(base)
    if base.endswith(".py") or p.is_dir() or "/" in base:
        if not p.exists():
            raise TasksetNotFound(f"no taskset file or folder at {base}")
        return _import_path(p), None
    norm = base.lower().replace("-", "_")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower().replace("-", "_") == norm:
            modname, _, attr = ep.value.partition(":")
            return importlib.import_module(modname.strip()), (attr.strip() or None)
    tried = [f"vf.environments.{norm}", norm]
    for modname in tried:
        try:
            return importlib.import_module(modname), None
        except ModuleNotFoundError as e:
            if e.name and modname.startswith(e.name):  # the module itself is missing: try the next
                continue
            raise
    raise TasksetNotFound(
        f"unknown taskset {base!r} (tried {', '.join(tried)} and the {ENTRY_POINT_GROUP!r} entry points)",
        hint=f"built-ins: {', '.join(builtin_ids())}; or pass a path to a .py file or package folder",
    )


def _exports(module: ModuleType, base: type) -> list[type]:
    names = getattr(module, "__all__", None)
    items = [getattr(module, n) for n in names] if names else [
        v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
    return [c for c in items if isinstance(c, type) and issubclass(c, base) and c is not base]


def taskset_class(taskset_id: str) -> type[Taskset]:
    base = taskset_id.split(":", 1)[0] if ":" in taskset_id and not Path(taskset_id).exists() else taskset_id
    module, attr = _resolve_module(base)
    if attr:
        return getattr(module, attr)
    found = _exports(module, Taskset)
    if len(found) != 1:
        raise TasksetNotFound(
            f"{module.__name__} must export exactly one Taskset subclass, found {len(found)}"
            + (f": {[c.__name__ for c in found]}" if found else ""),
            hint="list the one to use in the module's __all__")
    return found[0]


def config_errors(exc: Exception, prefix: str) -> list[str]:
    """pydantic ValidationError → one readable line per problem."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return [f"{prefix}: {exc}"]
    out = []
    for err in errors():
        loc = ".".join(str(x) for x in err.get("loc", ()))
        key = f"{prefix}.{loc}" if loc else prefix
        if err.get("type") == "extra_forbidden":
            out.append(f"unknown key {key!r}")
        else:
            out.append(f"{key}: {err.get('msg')} (got {err.get('input')!r})")
    return out


def load_taskset(taskset_id: str, fields: dict[str, Any] | None = None) -> LoadedTaskset:
    """Build the taskset `taskset_id` with config `fields` (validated; unknown keys are errors)."""
    cls = taskset_class(taskset_id)
    fields = dict(fields or {})
    fields.pop("id", None)
    if ":" in taskset_id and not Path(taskset_id).exists():
        variant_field = getattr(cls, "VARIANT_FIELD", None)
        if not variant_field:
            raise TasksetNotFound(f"taskset {taskset_id.split(':')[0]!r} has no variants ({taskset_id!r})")
        fields.setdefault(variant_field, taskset_id.split(":", 1)[1])
    config_cls = cls.config_class()
    try:
        config = config_cls(id=taskset_id, **fields)
    except Exception as e:  # pydantic.ValidationError
        raise ConfigError(config_errors(e, "taskset"),
                          hint=f"fields of {taskset_id}: {', '.join(sorted(config_cls.model_fields))}") from None
    taskset = cls(config)
    env_cls = cls.ENV
    if env_cls is None:
        module = sys.modules.get(cls.__module__)
        envs = _exports(module, Env) if module else []
        env_cls = envs[0] if len(envs) == 1 else None
    return LoadedTaskset(id=taskset_id, taskset=taskset, env=env_cls() if env_cls else None)
