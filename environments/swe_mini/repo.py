"""The shipped repositories: one text file per repo in `repos/`, parsed into `Repo`.

A repo file is a few `key: value` header lines, then sections that each start with a line
`=== KIND PATH` and run to the next such line:

    name: median
    difficulty: easy
    kind: off-by-one
    symptom: `median([4, 1, 3, 2])` returns 3.5; it should return 2.5.
    test: test_stats.py
    === file stats.py            a file of the repo as the agent gets it (the bug included)
    === file test_stats.py       the visible test (also a file), run with `python3 test_stats.py`
    === hidden test_more.py      a hidden test, written only when the episode is scored
    === gold stats.py            the fix: `-` lines (old text) then `+` lines (new text);
                                 several replacements in one section are split by a line `@@`

Text, not Python modules: the repos are data the sandbox gets, never imported by vf, and a
plain file keeps a bug, its tests and its fix readable side by side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

HEADER_KEYS = ("name", "difficulty", "kind", "symptom", "test")
SECTION = re.compile(r"^=== (file|hidden|gold) (\S+)$")
TEST_METHOD = re.compile(r"^\s+def test\w*\s*\(", re.MULTILINE)
REPO_DIR = Path(__file__).parent / "repos"


@dataclass(frozen=True)
class Edit:
    """Replace `old` (which must occur exactly once) by `new` in `path`."""

    path: str
    old: str
    new: str


@dataclass
class Repo:
    name: str
    difficulty: str
    kind: str
    symptom: str
    test: str
    """The visible test file (one of `files`)."""
    files: dict[str, str] = field(default_factory=dict)
    hidden: dict[str, str] = field(default_factory=dict)
    gold: list[Edit] = field(default_factory=list)

    @property
    def suite(self) -> dict[str, str]:
        """What decides the reward: the pristine visible test and the hidden tests."""
        return {self.test: self.files[self.test], **self.hidden}

    def patched(self) -> dict[str, str]:
        """The repo's files with the gold edits applied (each `old` must occur exactly once)."""
        files = dict(self.files)
        for edit in self.gold:
            count = files[edit.path].count(edit.old)
            if count != 1:
                raise ValueError(f"{self.name}: gold text for {edit.path} occurs {count} times")
            files[edit.path] = files[edit.path].replace(edit.old, edit.new)
        return files


def count_tests(files: dict[str, str]) -> int:
    """Test methods defined in these unittest files (what a full run must report as run)."""
    return sum(len(TEST_METHOD.findall(text)) for text in files.values())


def _gold_edits(path: str, body: str) -> list[Edit]:
    edits = []
    for hunk in re.split(r"^@@$", body, flags=re.MULTILINE):
        lines = [line for line in hunk.split("\n") if line]
        old = [line[1:] for line in lines if line.startswith("-")]
        new = [line[1:] for line in lines if line.startswith("+")]
        if not old or len(old) + len(new) != len(lines):
            raise ValueError(f"gold {path}: every line must start with - or +, with at least one -")
        edits.append(Edit(path, "\n".join(old), "\n".join(new)))
    return edits


def parse(text: str) -> Repo:
    head, sections = {}, []
    current: list | None = None
    for line in text.split("\n"):
        m = SECTION.match(line)
        if m:
            current = [m.group(1), m.group(2), []]
            sections.append(current)
        elif current is not None:
            current[2].append(line)
        elif line.strip():
            key, sep, value = line.partition(":")
            if not sep or key.strip() not in HEADER_KEYS:
                raise ValueError(f"bad header line {line!r} (keys: {', '.join(HEADER_KEYS)})")
            head[key.strip()] = value.strip()
    missing = [k for k in HEADER_KEYS if k not in head]
    if missing:
        raise ValueError(f"repo header lacks {missing}")
    repo = Repo(**head)
    for kind, path, lines in sections:
        body = "\n".join(lines).strip("\n") + "\n"
        if kind == "file":
            repo.files[path] = body
        elif kind == "hidden":
            repo.hidden[path] = body
        else:
            repo.gold += _gold_edits(path, body.strip("\n"))
    if repo.test not in repo.files or not repo.hidden or not repo.gold:
        raise ValueError(f"{repo.name}: needs its visible test among the files, hidden tests and a gold fix")
    return repo


@lru_cache(maxsize=1)
def all_repos() -> tuple[Repo, ...]:
    """Every shipped repo, in file-name order."""
    return tuple(parse(p.read_text()) for p in sorted(REPO_DIR.glob("*.txt")))
