"""Find a taskset by id and build it (and its Env) from config fields.

An id is one of:
  - a built-in:            `reverse-text`  → module `vf.environments.reverse_text`
  - a variant of one:      `reasoning-gym:countdown` (sets the taskset's `VARIANT_FIELD`)
  - an installed package:  a name registered in the `vf.environments` entry-point group
                           (`name = "pkg.module"` or `"pkg.module:MyTaskset"`), else an
                           importable module of that name. As in verifiers v1, a hub prefix
                           `owner/` and a `@version` suffix are stripped, and the name is
                           lower-cased with `-` → `_` (`owner/Echo-V1@0.2` → `echo_v1`).
  - a path:                `./my_env.py` (its folder is importable, so sibling modules
                           import), a package folder `./my_env/`, or an environment project
                           folder (`pyproject.toml` + its package, as `vf-init` makes them)

A module must export exactly one `Taskset` subclass (in `__all__`, or defined in it), and may
export one `Env` subclass; without one (and no `Taskset.ENV`) the taskset runs as
`SingleAgentEnv`.

Code named by a config vf did not get from its user (a run dir's config.yaml on `--resume`) is
not imported unless the user said so (vf.imports: `untrusted_config`, `guard_code`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import vf.environments
from vf.config import config_errors, deep_merge
from vf.env import AgentConfig, Env, SingleAgentEnv
from vf.envs import BUILTIN_ENVS
from vf.errors import ConfigError, TasksetNotFound
from vf.imports import import_plugin, is_path_ref, normalize_id
from vf.taskset import Taskset
from vf.utils.exports import exported_subclasses

ENTRY_POINT_GROUP = "vf.environments"


def builtin_ids() -> list[str]:
    root = Path(vf.environments.__file__).parent
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


def _resolve_module(base: str) -> tuple[ModuleType, str | None]:
    """Import the module for an id (vf.imports.import_plugin's grammar; a `:` is a variant here);
    returns (module, the class an entry point names or None)."""
    found = import_plugin("taskset", base, builtin="vf.environments", group=ENTRY_POINT_GROUP, attrs=False)
    if found is not None:
        return found
    if is_path_ref(base):
        raise TasksetNotFound(f"no taskset file or folder at {base}")
    norm = normalize_id(base)
    raise TasksetNotFound(
        f"unknown taskset {base!r} (tried vf.environments.{norm}, {norm} and the {ENTRY_POINT_GROUP!r} entry points)",
        hint=f"built-ins: {', '.join(builtin_ids())}; or pass a path to a .py file, package or project folder",
    )


def _split_variant(taskset_id: str) -> tuple[str, str | None]:
    if ":" in taskset_id and not Path(taskset_id).exists():
        base, variant = taskset_id.split(":", 1)
        return base, variant
    return taskset_id, None


def taskset_class(taskset_id: str) -> type[Taskset]:
    base, _ = _split_variant(taskset_id)
    module, attr = _resolve_module(base)
    if attr:
        return getattr(module, attr)
    found = exported_subclasses(module, Taskset)
    if len(found) != 1:
        raise TasksetNotFound(
            f"{module.__name__} must export exactly one Taskset subclass, found {len(found)}"
            + (f": {[c.__name__ for c in found]}" if found else ""),
            hint="list the one to use in the module's __all__")
    return found[0]


def env_class(taskset_cls: type[Taskset]) -> type[Env]:
    """The taskset's Env: `Taskset.ENV`, else the one its module exports, else SingleAgentEnv."""
    if taskset_cls.ENV is not None:
        return taskset_cls.ENV
    module = sys.modules.get(taskset_cls.__module__)
    envs = [e for e in (exported_subclasses(module, Env) if module else []) if e is not SingleAgentEnv]
    if len(envs) > 1:
        raise TasksetNotFound(f"{module.__name__} exports {len(envs)} Env subclasses: {[e.__name__ for e in envs]}",
                              hint="export one Env in the module's __all__")
    return envs[0] if envs else SingleAgentEnv


def build_env(env_cls: type[Env], fields: dict[str, Any] | None) -> Env:
    """The env with its config from `--env.*`. `--env.agent.*` also sets defaults for every
    seat of a multi-agent env (seat flags win)."""
    fields = {k: v for k, v in (fields or {}).items() if k not in ("taskset",)}
    config_cls = env_cls.config_class()
    seats = [n for n, f in config_cls.model_fields.items() if isinstance(f.default, AgentConfig)
             or f.annotation is AgentConfig or (f.default_factory is AgentConfig)]
    if "agent" in fields and "agent" not in seats:
        shared = fields.pop("agent")
        for seat in seats:
            default = config_cls.model_fields[seat].get_default(call_default_factory=True)
            base = default.model_dump(exclude_unset=True) if isinstance(default, AgentConfig) else {}
            fields[seat] = deep_merge(deep_merge(base, shared), fields.get(seat) or {})
    try:
        config = config_cls(**fields)
    except Exception as e:  # pydantic.ValidationError
        raise ConfigError(config_errors(e, "env"),
                          hint=f"fields of {config_cls.__name__}: {', '.join(sorted(config_cls.model_fields))}") from None
    env = env_cls(config)
    if not env.seats():
        raise ConfigError([f"{env_cls.__name__} declares no agents"],
                          hint="declare each seat as an AgentConfig field of its EnvConfig "
                               "(`player: vf.AgentConfig = vf.AgentConfig()`); one seat is vf.SingleAgentEnv")
    return env


def load_taskset(taskset_id: str, fields: dict[str, Any] | None = None,
                 env_fields: dict[str, Any] | None = None) -> LoadedTaskset:
    """Build the taskset `taskset_id` with config `fields` (validated; unknown keys are errors),
    and its Env with `env_fields` (the run's `env` section)."""
    cls = taskset_class(taskset_id)
    fields = dict(fields or {})
    fields.pop("id", None)
    _, variant = _split_variant(taskset_id)
    if variant is not None:
        variant_field = getattr(cls, "VARIANT_FIELD", None)
        if not variant_field:
            raise TasksetNotFound(f"taskset {taskset_id.split(':')[0]!r} has no variants ({taskset_id!r})")
        fields.setdefault(variant_field, variant)
    config_cls = cls.config_class()
    try:
        config = config_cls(id=taskset_id, **fields)
    except Exception as e:  # pydantic.ValidationError
        raise ConfigError(config_errors(e, "taskset"),
                          hint=f"fields of {taskset_id}: {', '.join(sorted(config_cls.model_fields))}") from None
    taskset = cls(config)
    return LoadedTaskset(id=taskset_id, taskset=taskset, env=build_env(chosen_env(cls, env_fields), env_fields))


def chosen_env(taskset_cls: type[Taskset], env_fields: dict[str, Any] | None) -> type[Env]:
    """`--env.id ID` picks a built-in env (`best-of-n`, `user-sim`, `single-agent`,
    `isolated-verifier`, `agentic-judge`, `shared-agentic-judge`; vf.envs) over any taskset;
    without it, the taskset's own (`env_class`)."""
    env_id = (env_fields or {}).get("id")
    if not env_id:
        return env_class(taskset_cls)
    key = normalize_id(env_id)
    if key not in BUILTIN_ENVS:
        raise TasksetNotFound(f"unknown env id {env_id!r}",
                              hint=f"built-in envs: {', '.join(k.replace('_', '-') for k in BUILTIN_ENVS)}")
    return BUILTIN_ENVS[key]
