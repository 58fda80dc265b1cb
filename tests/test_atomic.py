"""vf.atomic.write_atomic: the one write-then-rename every whole-file writer uses."""

import os

import pytest

from vf import atomic
from vf.atomic import write_atomic


def test_replaces_whole_and_sets_mode(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    write_atomic(path, "new ✓")
    write_atomic(tmp_path / "script.py", b"print(1)\n", mode=0o640)
    assert path.read_text(encoding="utf-8") == "new ✓"
    assert (tmp_path / "script.py").stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["script.py", "summary.json"]


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text("steps: 3\n")

    def disk_full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(path, "steps: 4\n")
    assert path.read_text() == "steps: 3\n"
    assert os.listdir(tmp_path) == ["config.yaml"]
