"""Bounds on what vf-migrate reads and parses, so one hostile or odd file can neither crash a run
nor take it over.

libcst's native parser recurses per nesting level: an 8 KB file of 2000 nested parentheses kills
the process (SIGSEGV, no output), and a 5.5 MB module takes minutes and gigabytes. So before
libcst sees a Python file, `check_python` has Python's own parser read it (fast, and it stops
cleanly at its own limits) and refuses it when it is larger than `MAX_PARSE_BYTES`, nested deeper
than `MAX_DEPTH`, or beyond what Python's parser takes at all; files over `MAX_READ_BYTES` are not
read. A refused file is reported (status `refused`, rule SRC900, naming the file and the limit),
nothing of it changes, the other files are migrated, and the command exits 2 at the end.

Real modules are far inside the bounds: v0 environments are a few KB and nest under 30 levels;
of 12,000 installed modules only generated tables nest past 100.
"""

from __future__ import annotations

import ast
from pathlib import Path

MAX_READ_BYTES = 64 * 1024 * 1024
"""Files larger than this are not read (a checkpoint or data file with a config-like name)."""
MAX_PARSE_BYTES = 256 * 1024
"""Python files larger than this are not parsed (libcst takes ~30 s and ~650 MB per MB)."""
MAX_DEPTH = 200
"""Syntax-tree levels a parsed Python file may nest (Python's own parser stops at 200 brackets)."""

_NESTING_ERRORS = ("too many nested parentheses", "too many levels of indentation", "too many statically nested")


class SourceRefused(ValueError):
    """A file vf-migrate will not read or parse: the message names the file, the limit and what to do."""

    def __init__(self, path: Path, what: str, limit: str):
        self.path, self.limit = path, limit
        super().__init__(f"{path}: not migrated: {what} ({limit}); nothing in it was changed: split it, or "
                         "migrate it by hand")


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n >= 1024 * 1024 else f"{n / 1024:.0f} KB"


def check_read(path: Path) -> None:
    """SourceRefused when `path` is too large to read."""
    size = path.stat().st_size
    if size > MAX_READ_BYTES:
        raise SourceRefused(path, f"the file is {_size(size)}", f"vf-migrate reads files up to {_size(MAX_READ_BYTES)}")


def _depth(tree: ast.AST) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:  # iterative: the tree may be deep
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def check_python(path: Path, source: str) -> SyntaxError | None:
    """Whether libcst may parse `source`: SourceRefused past a limit; the SyntaxError when Python
    cannot parse it for another reason (the caller flags it without parsing); None when it may."""
    size = len(source.encode("utf-8", errors="replace"))
    if size > MAX_PARSE_BYTES:
        raise SourceRefused(path, f"the module is {_size(size)}", f"vf-migrate parses Python modules up to "
                            f"{_size(MAX_PARSE_BYTES)}")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        if any(words in str(e.msg) for words in _NESTING_ERRORS):
            raise SourceRefused(path, f"line {e.lineno}: {e.msg}", f"nesting beyond Python's own parser's limit, "
                                f"and vf-migrate's of {MAX_DEPTH} levels") from None
        return e
    except ValueError as e:  # null bytes: no Python source
        return SyntaxError(str(e))
    except (RecursionError, MemoryError):
        raise SourceRefused(path, "Python's parser ran out of stack or memory on it",
                            f"vf-migrate parses modules nested up to {MAX_DEPTH} levels") from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise SourceRefused(path, f"its syntax tree nests {depth} levels", f"vf-migrate parses modules nested up to "
                            f"{MAX_DEPTH} levels")
    return None
