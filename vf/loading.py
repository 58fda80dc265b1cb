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

Code named by a config vf did not get from its user (`untrusted_config`: a run dir's
config.yaml on `--resume`) is not imported unless the user said so: a file path or a module
that is not a built-in or a registered entry point is refused (`guard_code`) with a hint naming
the flag. A run dir is data someone may hand you; importing what it names would run their code.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from vf.env import AgentConfig, Env, SingleAgentEnv
from vf.errors import ConfigError, TasksetNotFound, UsageError
from vf.taskset import Taskset
from vf.utils.exports import exported_subclasses

ENTRY_POINT_GROUP = "vf.environments"


TRUST_FLAG = "--trust-run-dir"
"""The flag by which a user lets a resumed run import the code its config.yaml names."""
_untrusted: ContextVar[str | None] = ContextVar("vf_untrusted_config", default=None)


@contextlib.contextmanager
def untrusted_config(source: str | None) -> Iterator[None]:
    """While the config being acted on came from `source` (e.g. "run dir runs/x (config.yaml)"),
    not from the user: `guard_code` refuses to import host code it names. None: trusted (the
    user passed the trust flag, or wrote the config)."""
    token = _untrusted.set(source)
    try:
        yield
    finally:
        _untrusted.reset(token)


def guard_code(kind: str, ref: str) -> None:
    """UsageError when `ref` (a `kind` id that imports a file or an arbitrary module) comes from
    an untrusted config (`untrusted_config`); nothing otherwise."""
    source = _untrusted.get()
    if source is not None:
        raise UsageError(f"{source} names {kind} {ref!r}, which would import code from this host; "
                         "code named by a run dir is not imported unless you say so",
                         hint=f"check that {ref!r} is what you mean to run, then pass {TRUST_FLAG}")


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


def import_path(path: Path) -> ModuleType:
    """Import a .py file, a package folder, or an environment project folder. The folder that
    holds the module goes on sys.path, so the module's own sibling imports work."""
    path = path.resolve()
    if path.is_dir() and not (path / "__init__.py").exists():
        package = _project_package(path)
        if package is None:
            raise TasksetNotFound(f"{path} is neither a package (no __init__.py) nor an environment project",
                                  hint="point at a .py file, a package folder, or a folder with "
                                       "pyproject.toml and its package")
        path = package
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem if path.is_file() else path.name
    existing = sys.modules.get(name)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() in (
            path, path / "__init__.py"):
        return existing
    if path.is_file():
        spec = importlib.util.spec_from_file_location(name, path)
    else:
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _project_package(folder: Path) -> Path | None:
    """The package of an environment project folder: the one its pyproject names, else the only
    (or the same-named) package folder beside pyproject.toml."""
    pyproject = folder / "pyproject.toml"
    if not pyproject.exists():
        return None
    candidates = [p for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    candidates += [p for p in (folder / "src").glob("*") if p.is_dir() and (p / "__init__.py").exists()] \
        if (folder / "src").is_dir() else []
    try:
        import tomllib

        project = tomllib.loads(pyproject.read_text()).get("project", {}).get("name", "")
    except Exception:  # noqa: BLE001 - a malformed pyproject: fall back to the folder layout
        project = ""
    wanted = {normalize_id(project), normalize_id(folder.name)} - {""}
    for p in candidates:
        if p.name in wanted:
            return p
    return candidates[0] if len(candidates) == 1 else None


def normalize_id(taskset_id: str) -> str:
    """verifiers v1's id normalisation: strip `owner/` and `@version`, lower-case, `-` → `_`."""
    base = taskset_id.split("@", 1)[0]
    base = base.rsplit("/", 1)[-1]
    return base.lower().replace("-", "_")


def _is_path(base: str) -> bool:
    return base.endswith(".py") or base.startswith((".", "/", "~")) or Path(base).exists()


def _resolve_module(base: str) -> tuple[ModuleType, str | None]:
    """Import the module for an id; returns (module, explicit class name or None)."""
    if _is_path(base):
        p = Path(base).expanduser()
        if not p.exists():
            raise TasksetNotFound(f"no taskset file or folder at {base}")
        guard_code("taskset", base)
        return import_path(p), None
    norm = normalize_id(base)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if normalize_id(ep.name) == norm:
            modname, _, attr = ep.value.partition(":")
            return importlib.import_module(modname.strip()), (attr.strip() or None)
    tried = [f"vf.environments.{norm}", norm]
    for modname in tried:
        if modname == norm:
            guard_code("taskset", base)  # an arbitrary module, not a built-in
        try:
            return importlib.import_module(modname), None
        except ModuleNotFoundError as e:
            if e.name and modname.startswith(e.name):  # the module itself is missing: try the next
                continue
            raise
    raise TasksetNotFound(
        f"unknown taskset {base!r} (tried {', '.join(tried)} and the {ENTRY_POINT_GROUP!r} entry points)",
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
        from vf.config import deep_merge

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
    from vf.envs import BUILTIN_ENVS

    env_id = (env_fields or {}).get("id")
    if not env_id:
        return env_class(taskset_cls)
    key = normalize_id(env_id)
    if key not in BUILTIN_ENVS:
        raise TasksetNotFound(f"unknown env id {env_id!r}",
                              hint=f"built-in envs: {', '.join(k.replace('_', '-') for k in BUILTIN_ENVS)}")
    return BUILTIN_ENVS[key]
