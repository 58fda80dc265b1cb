"""What a migration did: file changes (old → new text) and report entries (file, line, rule, status).

An entry is `migrated` when the rewrite is complete, `manual` when a person must finish it (the
code is kept and marked `TODO(vf-migrate)`), `info` for a note that needs no action, or
`refused` for a file vf-migrate would not read or parse (over a limit, vf.migrate.limits): it is
left as it is and the command exits 2 once every other file is done.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from pathlib import Path

MIGRATED, MANUAL, INFO, REFUSED = "migrated", "manual", "info", "refused"


@dataclass
class Entry:
    file: str
    line: int
    rule: str
    status: str
    message: str


@dataclass
class Change:
    """One file to write: `old` None = create, `new` None = delete."""

    path: Path
    old: str | None
    new: str | None

    @property
    def action(self) -> str:
        return "create" if self.old is None else "delete" if self.new is None else "modify"

    def diff(self) -> str:
        name = str(self.path)
        a = (self.old or "").splitlines(keepends=True)
        b = (self.new or "").splitlines(keepends=True)
        lines = difflib.unified_diff(a, b, "/dev/null" if self.old is None else f"a/{name}",
                                     "/dev/null" if self.new is None else f"b/{name}")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                       for line in lines)


@dataclass
class Report:
    changes: list[Change] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)

    def add(self, file: str | Path, line: int, rule: str, status: str, message: str) -> None:
        self.entries.append(Entry(str(file), line, rule, status, message))

    def change(self, path: Path, old: str | None, new: str | None) -> None:
        if old != new:
            self.changes.append(Change(path, old, new))

    def extend(self, other: Report) -> None:
        self.changes.extend(other.changes)
        self.entries.extend(other.entries)

    def summary(self) -> dict[str, int]:
        count = lambda s: sum(1 for e in self.entries if e.status == s)
        return {"files_changed": len(self.changes), "migrated": count(MIGRATED), "manual": count(MANUAL),
                "info": count(INFO), "refused": count(REFUSED)}

    def to_dict(self) -> dict:
        return {"changes": [{"path": str(c.path), "action": c.action} for c in self.changes],
                "entries": [asdict(e) for e in self.entries], "summary": self.summary()}

    def text_summary(self) -> str:
        lines = [f"{e.file}:{e.line}: [{e.rule}] {e.status}: {e.message}" for e in self.entries]
        s = self.summary()
        lines.append(f"{s['files_changed']} file(s) to change; {s['migrated']} migrated, "
                     f"{s['manual']} need a manual step, {s['info']} note(s)"
                     + (f"; {s['refused']} file(s) refused (not read or parsed)" if s["refused"] else ""))
        return "\n".join(lines)
