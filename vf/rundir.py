"""Run directories: the resolved config, the episodes, the summary, the logs.

    RUN_DIR/
      config.yaml      resolved config: enough to resume with no other flag
      traces.jsonl     one whole episode per line, appended and flushed as each finishes
      summary.json     aggregates (written at the end of every attempt)
      version.json     the vf version and git commit that last wrote the run (vf.version)
      logs/            one log per attempt
      traces.corrupt.jsonl  lines of traces.jsonl that resume could not parse, moved (not deleted)

Why one whole episode per line: a line is durable or torn, never half an episode, so a
`kill -9` at any moment loses at most the episodes still running. Resume keeps the complete,
error-free episodes, drops torn or errored lines, and rewrites the file atomically
(tmp + rename) before anything new is appended. A line that does not parse is not thrown away:
the rewrite moves it to traces.corrupt.jsonl, so nothing already on disk is lost.

An episode counts as done only once its line is on disk (written and fsync'd). In an async run
`commit()` does that off the event loop, and the episodes that finish while one fsync runs are
written together under the next (group commit): a few ms of fsync per episode would otherwise
stall every rollout in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vf.errors import UsageError, VfError
from vf.trace import Episode, TraceFormatError, iter_episodes

CONFIG_FILE = "config.yaml"
"""Resolved config of the run (YAML)."""
TRACES_FILE = "traces.jsonl"
"""Episodes, one JSON object per line."""
CORRUPT_FILE = "traces.corrupt.jsonl"
"""Lines of traces.jsonl that did not parse, kept by `rewrite()`."""
SUMMARY_FILE = "summary.json"
"""Aggregates over the episodes (see vf.summary)."""
VERSION_FILE = "version.json"
"""`vf.version.version_info()` of the program that last wrote the config."""
LOGS_DIR = "logs"


@dataclass
class ResumeState:
    kept: list[Episode] = field(default_factory=list)
    dropped_errored: int = 0
    dropped_corrupt: int = 0
    dropped_duplicate: int = 0


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._pending: list[tuple[bytes, asyncio.Future]] = []  # lines waiting for the next fsync
        self._flusher: asyncio.Task | None = None
        self._corrupt_lines: list[int] = []
        """Line numbers `read()` could not parse; `rewrite()` moves them aside."""

    @property
    def traces(self) -> Path:
        return self.path / TRACES_FILE

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    def has_results(self) -> bool:
        return self.traces.exists() and self.traces.stat().st_size > 0

    def create(self) -> None:
        """Prepare a fresh run dir; refuses one that already holds results."""
        if self.path.exists() and any(self.path.iterdir()):
            if self.has_results() or self.config_path.exists():
                raise UsageError(
                    f"{self.path} already holds a run",
                    hint=f"continue it with --resume {self.path}, or choose another -o DIR")
            raise UsageError(f"{self.path} is not empty", hint="choose an empty or new -o DIR")
        (self.path / LOGS_DIR).mkdir(parents=True, exist_ok=True)
        self.traces.touch()

    def load_config(self) -> dict[str, Any]:
        from vf.config import load_yaml

        if not self.config_path.exists():
            raise UsageError(f"{self.path} is not a run dir (no {CONFIG_FILE})",
                             hint="pass the directory a previous vf-eval/vf-rollout wrote with -o")
        return load_yaml(self.config_path)

    def save_config(self, config: dict[str, Any]) -> None:
        from vf.config import save_yaml

        from vf.version import version_info

        self.path.mkdir(parents=True, exist_ok=True)
        save_yaml(config, self.config_path)
        (self.path / VERSION_FILE).write_text(json.dumps(version_info(), indent=2) + "\n")

    def read(self) -> ResumeState:
        """All complete, error-free, unique episodes; counts what was dropped."""
        state = ResumeState()
        if not self.traces.exists():
            return state
        seen: set[tuple[str, int]] = set()
        for _, item in iter_episodes(self.traces, strict=False):
            if isinstance(item, TraceFormatError):
                state.dropped_corrupt += 1
                self._corrupt_lines.append(item.lineno)
                continue
            if not item.ok:
                state.dropped_errored += 1
                continue
            key = (item.task.hash, item.rollout)
            if key in seen:
                state.dropped_duplicate += 1
                continue
            seen.add(key)
            state.kept.append(item)
        return state

    def rewrite(self, episodes: list[Episode]) -> None:
        """Atomically replace traces.jsonl with exactly `episodes` (unparsable lines are moved aside)."""
        self._move_corrupt_lines()
        tmp = self.traces.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for ep in episodes:
                f.write(ep.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.traces)

    def _move_corrupt_lines(self) -> None:
        wanted = set(self._corrupt_lines)
        if not wanted or not self.traces.exists():
            return
        # split lines exactly as vf.trace.iter_episodes did (text mode), keep undecodable bytes as they were
        text = {"encoding": "utf-8", "errors": "surrogateescape"}
        with open(self.traces, **text) as src, open(self.path / CORRUPT_FILE, "a", **text) as dst:
            for lineno, raw in enumerate(src, 1):
                if lineno in wanted:
                    dst.write(raw if raw.endswith("\n") else raw + "\n")
            dst.flush()
            os.fsync(dst.fileno())
        self._corrupt_lines = []

    def append(self, episode: Episode) -> None:
        """Append one episode as one line; on a write failure, cut the torn tail and say so."""
        self._write((episode.to_json() + "\n").encode())

    async def commit(self, episode: Episode) -> None:
        """`append` for async runs: returns once the episode's line is on disk, without blocking
        the event loop; concurrent commits share one fsync (see the module docstring)."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append(((episode.to_json() + "\n").encode(), done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await done

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self._write, b"".join(line for line, _ in batch))
                error = None
            except Exception as e:  # noqa: BLE001 - the batch was cut off again: none of it is written
                error = e
            for _, done in batch:
                if done.done():
                    continue
                if error is not None:
                    done.set_exception(error)
                else:
                    done.set_result(None)

    def _write(self, data: bytes) -> None:
        """Append whole lines durably, or not at all (a failed write is cut off)."""
        with self._lock:
            fd = os.open(self.traces, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            start = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            except OSError as e:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    pass
                raise VfError(f"could not write to {self.traces}: {e.strerror or e}",
                              hint=f"episodes already written are safe; fix the problem (e.g. free disk space) "
                                   f"and continue with --resume {self.path}") from None
            finally:
                os.close(fd)

    def write_summary(self, summary: dict[str, Any]) -> None:
        tmp = self.path / (SUMMARY_FILE + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        tmp.replace(self.path / SUMMARY_FILE)

    def next_log(self) -> Path:
        logs = self.path / LOGS_DIR
        logs.mkdir(parents=True, exist_ok=True)
        n = 1 + sum(1 for p in logs.glob("attempt_*.log"))
        return logs / f"attempt_{n}.log"
