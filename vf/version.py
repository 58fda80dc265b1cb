"""The package version, the git commit it was built from (when known) and the trace format version.

`version_info()` is what `vf --version`, `vf-* --version` print and what every run dir records
(`version.json`): the commit is read from git when the package runs from a checkout (an editable
install), else it is absent. Cheap: one `git` call, cached, only when asked.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__version__ = "0.1.0"

# The on-disk trace format version written on every record.
TRACE_VERSION = 1


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """HEAD of the checkout this package runs from (with "-dirty" when it has local changes), or None."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=5, check=True).stdout.strip()

        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "") if commit else None


def version_info() -> dict[str, str | int | None]:
    return {"name": "vf", "version": __version__, "commit": git_commit(), "trace_version": TRACE_VERSION}


def version_line() -> str:
    commit = git_commit()
    return f"vf {__version__}" + (f" (commit {commit[:12]}{'-dirty' if commit.endswith('-dirty') else ''})"
                                  if commit else "")
