"""Importing the code a config names: a `.py` file, a package or environment project folder, or
`module:attr`, under the trust guard for configs vf did not get from its user.

Code named by a config vf did not get from its user (`untrusted_config`: a run dir's
config.yaml on `--resume`) is not imported unless the user said so: a file path or a module
that is not a built-in or a registered entry point is refused (`guard_code`) with a hint naming
the flag. A run dir is data someone may hand you; importing what it names would run their code.

Part of the authoring API's floor: config validators (plugged judges, plugged rewards) resolve
what they name through it; the episode core's loaders (vf.episode.loading, vf.episode.harnesses)
build on it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from vf.errors import ConfigError, TasksetNotFound, UsageError

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


def is_path_ref(ref: str) -> bool:
    """Whether a plugin reference names a file or folder rather than an id or a module."""
    return ref.endswith(".py") or ref.startswith((".", "/", "~")) or Path(ref).exists()


def import_plugin(kind: str, ref: str, *, builtin: str | None = None, group: str | None = None,
                  attrs: bool = True, trusted: bool = False) -> tuple[ModuleType, str | None] | None:
    """The one plugin grammar every resolver uses (tasksets, harnesses, judges, losses): `ref` →
    (module, attribute it names or None: the resolver picks what the module exports), None when
    no such plugin exists. In order:

        `path/file.py:Attr`, `pkg.mod:Attr`  that module's attribute (`attrs` False: a `:` is the
                                             resolver's own, e.g. a taskset's variant)
        `path/file.py`, a folder             that file, package or environment project
        an id                                the `group` entry point of that name (its value may
                                             name the attribute), else the built-in module
                                             `{builtin}.{id}`, else an installed module `{id}`

    Ids normalise as verifiers' (`normalize_id`: `owner/` and `@version` dropped, lower case,
    `-` → `_`). What imports code that is neither built in nor registered (a path, `module:Attr`,
    an arbitrary installed module) passes `guard_code` first, unless the resolver vouches for
    `ref` (`trusted`: its own built-in table)."""
    if attrs and ":" in ref:
        target, _, attr = ref.rpartition(":")
        if not trusted:
            guard_code(kind, ref)
        if target.endswith(".py"):
            return import_path(Path(target).expanduser()), attr
        return importlib.import_module(target), attr
    if is_path_ref(ref):
        path = Path(ref).expanduser()
        if not path.exists():
            return None
        guard_code(kind, ref)
        return import_path(path), None
    name = normalize_id(ref)
    if not name.isidentifier() and not all(part.isidentifier() for part in name.split(".")):
        return None
    if group is not None:
        for point in entry_points(group=group):
            if point.name == ref or normalize_id(point.name) == name:
                module, _, attr = point.value.partition(":")
                return importlib.import_module(module.strip()), attr.strip() or None
    for module_name in ([f"{builtin}.{name}"] if builtin else []) + [name]:
        if module_name == name and not trusted:
            guard_code(kind, ref)  # an arbitrary installed module: not a built-in, not registered
        try:
            return importlib.import_module(module_name), None
        except ModuleNotFoundError as e:
            if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
                continue  # that module does not exist (an import error inside it is the plugin's own)
            raise
    return None


def import_function(spec: str) -> Callable:
    """`pkg.mod:func`, `pkg.mod.func` or `path/file.py:func` → the function."""
    target, sep, attr = spec.rpartition(":")
    if not sep:
        target, _, attr = spec.rpartition(".")
    if target.endswith(".py"):
        module = import_path(Path(target))
    else:
        module = importlib.import_module(target)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError([f"{spec}: {module.__name__} has no {attr!r}"]) from None
