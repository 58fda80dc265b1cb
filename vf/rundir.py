"""Run directories: the resolved config, the episodes, the summary, the logs.

    RUN_DIR/
      config.yaml      resolved config: enough to resume with no other flag
      traces.jsonl     one whole episode per line, appended and flushed as each finishes
      summary.json     aggregates (written at the end of every attempt)
      version.json     the vf version and git commit that last wrote the run (vf.version)
      logs/            one log per attempt
      traces.REASON.jsonl  lines resume took out of traces.jsonl, moved (not deleted): corrupt (did
                       not parse), errored (redone), duplicate (a later copy of an episode that
                       counts), unselected (a task no longer selected), after-step-N (vf-train:
                       rollouts of steps its checkpoint N does not cover, trained again)

Why one whole episode per line: a line is durable or torn, never half an episode, so a
`kill -9` at any moment loses at most the episodes still running.

Nothing already on disk is deleted. Resume keeps the lines that count, byte for byte, and moves
every other line to its `traces.REASON.jsonl` (`set_aside`: appended, never overwritten, fsync'd
before traces.jsonl is replaced atomically, so a crash leaves a line in both places, never in
neither). Which lines of an evaluation count is one rule (`counted`), shared by `--resume` and
`--score`. A command that fails before writing any result removes the run dir it created
(`discard`), and a resume writes its config only once the run has started.

An episode counts as done only once its line is on disk (written and fsync'd). In an async run
`commit()` does that off the event loop, and the episodes that finish while one fsync runs are
written together under the next (group commit): a few ms of fsync per episode would otherwise
stall every rollout in flight.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import secrets
import shutil
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vf.artifacts import write_artifacts
from vf.atomic import write_atomic
from vf.errors import UsageError, VfError
from vf.trace import Episode, TraceFormatError, parse_episode

CONFIG_FILE = "config.yaml"
"""Resolved config of the run (YAML)."""
TRACES_FILE = "traces.jsonl"
"""Episodes, one JSON object per line."""
CORRUPT_FILE = "traces.corrupt.jsonl"
"""Lines of traces.jsonl that did not parse, kept by `rewrite()` (see `aside_path`)."""
SUMMARY_FILE = "summary.json"
"""Aggregates over the episodes (see vf.summary)."""
VERSION_FILE = "version.json"
"""`vf.version.version_info()` of the program that last wrote the config."""
LOGS_DIR = "logs"
SKELETON = (CONFIG_FILE, VERSION_FILE, LOGS_DIR, "configs")
"""What a command writes into a run dir before its first result (`discard` may remove it)."""


def aside_path(path: Path, reason: str) -> Path:
    """Where `set_aside` moves the lines of `path` it takes out for `reason`:
    traces.jsonl → traces.REASON.jsonl."""
    return path.with_name(f"{path.stem}.{reason}{path.suffix}")


def after_step(step: int) -> str:
    """The set-aside reason of a training run's lines that checkpoint `step` does not cover."""
    return f"after-step-{step}"


def move_dir_aside(path: Path) -> Path:
    """Rename a directory that is about to be written again to PATH.earlier-K (the first free K)."""
    k = 1
    while (aside := path.with_name(f"{path.name}.earlier-{k}")).exists():
        k += 1
    path.rename(aside)
    return aside


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, raw bytes with the newline) of a JSONL file, split on b"\\n" only."""
    with open(path, "rb") as f:
        yield from enumerate(f, 1)


def set_aside(path: Path, reasons: dict[int, str]) -> dict[str, int]:
    """Move the lines numbered in `reasons` out of the JSONL file `path`, each appended to
    `aside_path(path, reason)`; every other line stays byte for byte. The aside files are
    fsync'd before `path` is replaced (temp file + rename), so a crash in between leaves a line
    in both places, never in neither. Returns {aside file name: lines moved}."""
    if not reasons or not path.exists():
        return {}
    counts = Counter(reasons.values())
    tmp = path.with_name(path.name + ".tmp")
    outs: dict[str, Any] = {}
    try:
        for r in counts:  # a planted symlink is refused, never followed (O_NOFOLLOW, O_EXCL)
            outs[r] = os.fdopen(os.open(aside_path(path, r), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                                        0o644), "ab")
        tmp.unlink(missing_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "wb") as keep:
            for n, raw in numbered_lines(path):
                if not raw.endswith(b"\n"):  # a torn or unterminated last line: the next append must not join it
                    raw += b"\n"
                (outs[reasons[n]] if n in reasons else keep).write(raw)
            for f in (*outs.values(), keep):
                f.flush()
                os.fsync(f.fileno())
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        error = UsageError if e.errno in (errno.ELOOP, errno.EEXIST) else VfError
        raise error(f"could not set lines of {path} aside: {e.strerror or e}"
                    + (f" ({e.filename})" if e.filename else ""),
                    hint="nothing was removed from it; fix the problem (e.g. free disk space, remove a symlink) "
                         "and resume again") from None
    finally:
        for f in outs.values():
            f.close()
    return {aside_path(path, r).name: c for r, c in sorted(counts.items())}


def identity(ep: Episode) -> tuple:
    """What makes an episode one result: in an evaluation its (task, rollout); in training, where
    the same task and rollout index recur every few steps, its step and episode id."""
    run = ep.run if isinstance(ep.run, dict) else {}
    if run.get("type") == "train":
        return ("train", str(run.get("step")), ep.id)
    return (ep.task.hash, ep.rollout)


def counted(episodes: Sequence[Episode]) -> list[bool]:
    """Which episodes of a traces file count, the one rule of `--resume` and `--score`: per
    `identity`, its first error-free episode, or, when it has none, its first errored one (the
    error the summary reports and `--resume` redoes). Every other line is a duplicate."""
    has_ok = {identity(e) for e in episodes if e.ok}
    seen: set[tuple] = set()
    out = []
    for e in episodes:
        key = identity(e)
        counts = key not in seen and (e.ok or key not in has_ok)
        if counts:
            seen.add(key)
        out.append(counts)
    return out


def default_run_dir(name: str, model: str | None = None) -> Path:
    """Where a run goes without `-o`: `outputs/<name>--<model>--<random>` for vf-eval and
    vf-rollout, `outputs/train--<name>--<random>` for vf-train (`model` None). `name` is the
    taskset's id or the mixture's label (vf.mixture.run_label)."""
    name = name.replace("/", "_").replace(":", "-")
    if model is None:
        return Path("outputs") / f"train--{name}--{secrets.token_hex(4)}"
    model = Path(model).name if "/" in model else model
    return Path("outputs") / f"{name}--{model}--{secrets.token_hex(4)}"


@dataclass
class ResumeState:
    kept: list[Episode] = field(default_factory=list)
    """The complete, error-free episodes that count (`counted`), in file order."""
    lines: list[int] = field(default_factory=list)
    """The line number of each kept episode."""
    aside: dict[int, str] = field(default_factory=dict)
    """Line number → reason, for every other line: `rewrite()` moves them aside."""

    def count(self, reason: str) -> int:
        return sum(1 for r in self.aside.values() if r == reason)


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._pending: list[tuple[bytes, asyncio.Future]] = []  # lines waiting for the next fsync
        self._flusher: asyncio.Task | None = None
        self._state: ResumeState | None = None
        """What `read()` found; `rewrite()` moves aside what it does not keep."""
        self._made: tuple[Path, bool] | None = None
        """(top directory `create()` made, or the empty one it was given; given?): for `discard`."""

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
        top = self.path
        while not top.parent.exists():  # `-o a/b/c`: the top directory this command makes
            top = top.parent
        given = self.path.exists()  # an empty dir: what goes into it is ours, the dir is not
        (self.path / LOGS_DIR).mkdir(parents=True, exist_ok=True)
        self.traces.touch()
        self._made = (self.path, True) if given else (top, False)

    def holds_results(self) -> bool:
        """Any non-empty file besides the config, version and logs a command writes first."""
        for p in self.path.rglob("*"):
            rel = p.relative_to(self.path).parts
            if rel[0] not in SKELETON and p.is_file() and not p.is_symlink() and p.stat().st_size:
                return True
        return False

    def discard(self) -> bool:
        """After a failed command: undo `create()` unless a result was written, so the command
        leaves no run dir behind (it removes the directories it made, or empties again the empty
        one it was given; a run dir it did not create is never touched). True when it did."""
        if self._made is None or not self.path.exists() or self.holds_results():
            return False
        top, given = self._made
        self._made = None
        if not given:
            shutil.rmtree(top, ignore_errors=True)
            return True
        for child in list(self.path.iterdir()):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        return True

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

    def _parse(self) -> Iterator[tuple[int, Episode | TraceFormatError]]:
        """(line number, episode or why it did not parse) of each non-blank line of traces.jsonl."""
        if not self.traces.exists():
            return
        for n, raw in numbered_lines(self.traces):
            line = raw.decode("utf-8", errors="replace")  # a bad byte fails its line, not the read
            if not line.strip():
                continue
            try:
                yield n, parse_episode(line, self.traces, n)
            except TraceFormatError as e:
                yield n, e

    def read(self) -> ResumeState:
        """An evaluation's episodes that count (`counted`) and are error-free; every other line
        is marked for `rewrite()` to move aside: corrupt, errored (redone) or duplicate."""
        state = ResumeState()
        parsed: list[tuple[int, Episode]] = []
        for n, item in self._parse():
            if isinstance(item, TraceFormatError):
                state.aside[n] = "corrupt"
            else:
                parsed.append((n, item))
        for (n, ep), counts in zip(parsed, counted([ep for _, ep in parsed])):
            if not ep.ok:
                state.aside[n] = "errored"
            elif not counts:
                state.aside[n] = "duplicate"
            else:
                state.kept.append(ep)
                state.lines.append(n)
        self._state = state
        return state

    def rewrite(self, episodes: list[Episode]) -> dict[str, int]:
        """Leave in traces.jsonl exactly `episodes` (kept by `read()`), byte for byte; move every
        other line aside under the reason `read()` gave it, or `unselected` (a kept episode of a
        task no longer selected). Returns {aside file name: lines moved}."""
        state = self._state if self._state is not None else self.read()
        wanted = {id(ep) for ep in episodes}
        reasons = dict(state.aside)
        for n, ep in zip(state.lines, state.kept):
            if id(ep) not in wanted:
                reasons[n] = "unselected"
        self._state = None
        return set_aside(self.traces, reasons)

    def keep_before(self, step: int) -> dict[str, int]:
        """Training resume from checkpoint `step`: every rollout line of a step before it stays,
        byte for byte (`identity`: step and episode id; errored rollouts were trained on too, they
        stay); the lines of later steps, which the resumed run trains again, move to
        traces.after-step-N.jsonl; corrupt and duplicate lines aside too."""
        reasons: dict[int, str] = {}
        seen: set[tuple] = set()
        for n, item in self._parse():
            if isinstance(item, TraceFormatError):
                reasons[n] = "corrupt"
                continue
            s = item.run.get("step") if isinstance(item.run, dict) else None
            if not isinstance(s, int) or s >= step:
                reasons[n] = after_step(step)
            elif identity(item) in seen:
                reasons[n] = "duplicate"
            else:
                seen.add(identity(item))
        return set_aside(self.traces, reasons)

    def append(self, episode: Episode) -> None:
        """Append one episode as one line; on a write failure, cut the torn tail and say so."""
        self._artifacts(episode)
        self._write((episode.to_json() + "\n").encode())

    def _artifacts(self, episode: Episode) -> None:
        """Archives the rollouts collected go beside the traces (vf.artifacts), before the line."""
        for i, trace in enumerate(episode.traces):
            write_artifacts(self.path, trace, f"{episode.id}-{i}")

    async def commit(self, episode: Episode) -> None:
        """`append` for async runs: returns once the episode's line is on disk, without blocking
        the event loop; concurrent commits share one fsync (see the module docstring)."""
        done = asyncio.get_running_loop().create_future()
        await asyncio.to_thread(self._artifacts, episode)
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
        write_atomic(self.path / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")

    def next_log(self) -> Path:
        logs = self.path / LOGS_DIR
        logs.mkdir(parents=True, exist_ok=True)
        n = 1 + sum(1 for p in logs.glob("attempt_*.log"))
        return logs / f"attempt_{n}.log"
