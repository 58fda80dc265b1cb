"""vf-migrate: move v0 environments, scripts, configs and run dirs to v1.

`plan(paths)` walks the paths and returns a Report (file changes + entries) without touching
anything; `apply(report)` writes it, keeping a `.bak` of every file it changes or removes. Each
input kind has its own module: python_env (libcst codemod), scripts, configs, rundirs; the rule
table is in rules. Nothing here imports or runs the code being migrated.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from vf.atomic import write_atomic
from vf.migrate.report import MANUAL, REFUSED, Report

SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
SCRIPT_SUFFIXES = {".sh", ".bash", ".zsh", ".yml", ".yaml", ".mk"}
SCRIPT_NAMES = {"Makefile", "makefile", "GNUmakefile", "Justfile", "justfile", "Dockerfile"}


def _kind(path: Path) -> str | None:
    """What vf-migrate reads `path` as ("py", "toml", "script"), or None: not read at all."""
    if path.suffix == ".py":
        return "py"
    if path.suffix == ".toml":
        return "toml"
    if path.suffix in SCRIPT_SUFFIXES or path.name in SCRIPT_NAMES:
        return "script"
    return None


def _migrate_file(path: Path) -> Report:
    from vf.migrate import limits

    if _kind(path) is None:
        return Report()
    try:
        limits.check_read(path)
        source = path.read_text(encoding="utf-8")
    except limits.SourceRefused as e:
        return _refused(e)
    except (UnicodeDecodeError, OSError):
        return Report()
    report = _migrate_source(path, source)
    if not any(c.path == path for c in report.changes):
        _left_todos(path, source, report)
    return report


def _refused(e) -> Report:
    report = Report()
    report.add(e.path, 1, "SRC900", REFUSED, str(e).removeprefix(f"{e.path}: "))
    return report


def _left_todos(path: Path, source: str, report: Report) -> None:
    """A file this run leaves as it is may still carry `TODO(vf-migrate)` marks from an earlier
    `--write`: each is a manual step still open (and fails `--check`)."""
    from vf.migrate.python_env import TODO

    if path.suffix not in (".py", ".toml") and path.suffix not in SCRIPT_SUFFIXES and path.name not in SCRIPT_NAMES:
        return
    for n, line in enumerate(source.splitlines(), 1):
        if TODO in line:
            report.add(path, n, "TODO", MANUAL, f"left from an earlier migration: {line.strip()}")


def _migrate_source(path: Path, source: str) -> Report:
    from vf.migrate import configs, limits, python_env, scripts

    try:
        if path.suffix == ".py":
            env = python_env.is_v0_environment(source)
            helper = not env and python_env.imports_verifiers(source)
            if not env and not helper and not scripts.CMD_RE.search(source):
                return Report()  # nothing to migrate: never parsed
            if env and python_env.UNMIGRATED in source:
                return python_env.migrate_environment(path, source)  # flagged by an earlier run: not parsed
            broken = limits.check_python(path, source)  # before libcst sees it (SourceRefused past a limit)
            if broken is not None:
                return _unparsable(path, source, broken, env)
            if env:
                return python_env.migrate_environment(path, source)
            if helper:  # its verifiers names → compat; then any `prime env eval` it runs, as below
                report = python_env.migrate_helper(path, source)
                if report.changes:
                    more = scripts.migrate_python_subprocess(path, report.changes[-1].new)
                    if more.changes:
                        report.changes[-1].new = more.changes[-1].new
                    report.entries.extend(more.entries)
                return report
            return scripts.migrate_python_subprocess(path, source)
        if path.suffix == ".toml":
            return configs.migrate_toml(path, source)
        if path.suffix in SCRIPT_SUFFIXES or path.name in SCRIPT_NAMES:
            return scripts.migrate_text_file(path, source)
    except limits.SourceRefused as e:
        return _refused(e)
    except Exception as e:  # noqa: BLE001 - one odd file must not stop the migration of the rest
        r = Report()
        r.add(path, 1, "ENV900", "manual", f"not migrated: {type(e).__name__}: {e}")
        return r
    return Report()


def _unparsable(path: Path, source: str, error: SyntaxError, env: bool) -> Report:
    """A file Python cannot parse: a v0 environment gets the TODO header that says so (as any module
    the codemod cannot handle); another file is reported, and left as it is."""
    from vf.migrate import python_env

    reason = f"Python cannot parse it ({error.msg}, line {error.lineno})"
    if env:
        return python_env.unmigrated(path, source, reason)
    report = Report()
    report.add(path, error.lineno or 1, "ENV900", MANUAL, f"not migrated: {reason}")
    return report


def _walk(path: Path, report: Report) -> None:
    from vf.migrate import rundirs

    if path.is_dir():
        if rundirs.sniff(path) is not None:
            report.extend(rundirs.migrate_rundir(path))
            return
        for child in sorted(path.iterdir()):
            if child.name in SKIP_DIRS or child.name.endswith((".bak", ".tmp")) or ".bak." in child.name:
                continue
            _walk(child, report)
    elif path.is_file() and not path.name.endswith(".bak"):
        report.extend(_migrate_file(path))


def plan(paths: list[str | Path]) -> Report:
    """Everything that would change under `paths` (dry run)."""
    report = Report()
    for p in paths:
        _walk(Path(p), report)
    return report


def dirty_git_trees(paths: list[str | Path]) -> list[str]:
    """Git work trees containing `paths` that have uncommitted changes to tracked files."""
    dirty = []
    seen = set()
    for p in paths:
        d = Path(p) if Path(p).is_dir() else Path(p).parent
        try:
            top = subprocess.run(["git", "-C", str(d), "rev-parse", "--show-toplevel"], capture_output=True,
                                 text=True, check=False)
        except FileNotFoundError:
            return []
        if top.returncode != 0 or top.stdout.strip() in seen:
            continue
        root = top.stdout.strip()
        seen.add(root)
        status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=False)
        if status.stdout.strip():
            dirty.append(root)
    return dirty


def _backup(path: Path) -> None:
    bak = path.with_name(path.name + ".bak")
    n = 1
    while bak.exists():
        bak = path.with_name(f"{path.name}.bak.{n}")
        n += 1
    shutil.copy2(path, bak)


def apply(report: Report) -> None:
    """Write every change; a changed or removed file keeps `NAME.bak` (`NAME.bak.N` if taken)."""
    for c in report.changes:
        if c.old is not None and c.path.exists():
            _backup(c.path)
        if c.new is None:
            c.path.unlink(missing_ok=True)
        else:
            c.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(c.path, c.new)
