"""Artifacts: files gathered from a rollout's runtime after the agent stops (verifiers 0.4's
`vf.Artifact` / `vf.collect` / `restore`).

A task declares them in `TaskData.artifacts` (paths relative to the runtime's working
directory, or absolute ones inside it); the rollout collects them after `finalize`, before
scoring, into `trace.state.artifacts` (source → tar archive, None for a missing optional one),
and the run dir writes each archive under `artifacts/` and references it from the trace
(`trace.info["artifacts"]`: source, file, bytes, sha256). `restore` puts collected files into
another runtime (a grading box) at the same place relative to its working directory.

Everything in an archive was made by the agent: collection is bounded by
`TaskData.artifact_max_bytes` (the runtime's `read` enforces it while reading), and `restore`
validates on the host first — regular files and directories only, relative names below the
target — and writes through the runtime's link-safe `write` (vf.runtime.files), never `tar -x`.
Both bound what an archive expands to as well as its own size: a sparse member (or a GNU sparse
map) can say 2 GiB in a 10 KB archive, and reading it would make the host hold all 2 GiB. The
members' declared sizes are summed from their headers, before any member is read, against the
same budget (`MAX_ARTIFACT_BYTES` unless the caller names one).
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import uuid
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from vf.errors import SandboxError

if TYPE_CHECKING:
    from vf.runtime import Runtime
    from vf.trace import Trace

MAX_ARTIFACT_BYTES = 32 * 1024 * 1024


class Artifact(BaseModel):
    """One path to collect from the runtime (and restore elsewhere at the same place)."""

    source: str
    exclude: list[str] = Field(default_factory=list)
    """`tar --exclude` patterns, applied when `source` is a directory."""
    required: bool = True
    """A missing required artifact fails the rollout: grading a partial state scores it wrong."""


def _relative(runtime: Runtime, source: str) -> str:
    """`source` relative to the runtime's working directory (which is all that persists)."""
    workdir = PurePosixPath(str(runtime.workdir))
    path = PurePosixPath(source)
    if path.is_absolute():
        if not path.is_relative_to(workdir):
            raise SandboxError(f"artifact {source!r} is outside the runtime's working directory {workdir}")
        path = path.relative_to(workdir)
    if ".." in path.parts:
        raise SandboxError(f"artifact {source!r} leaves the working directory")
    return str(path) or "."


async def collect(runtime: Runtime, artifacts: list[Artifact | dict | str] | None = None, *,
                  max_bytes: int = MAX_ARTIFACT_BYTES, sweep: bool = True) -> dict[str, bytes | None]:
    """Tar each declared path out of `runtime`, keyed by its source, in declaration order,
    within `max_bytes` in all. A missing required artifact raises `SandboxError`.

    `sweep` is verifiers' switch for also collecting its `/logs/artifacts` convention dir; it is
    accepted so its tasks' calls run, and changes nothing here: only the working directory
    persists in vf's runtimes, so there is no convention dir outside it to sweep."""
    items = [a if isinstance(a, Artifact) else Artifact(source=a) if isinstance(a, str) else Artifact(**a)
             for a in artifacts or []]
    collected: dict[str, bytes | None] = {}
    budget = max_bytes
    for artifact in items:
        if artifact.source in collected:
            raise SandboxError(f"artifact {artifact.source!r} declared more than once")
        rel = _relative(runtime, artifact.source)
        name = f".vf-artifact-{uuid.uuid4().hex}.tar"
        excludes = " ".join(f"--exclude={shlex.quote(p)}" for p in [*artifact.exclude, name])
        result = await runtime.run(
            f"test -e {shlex.quote(rel)} || exit 3; tar -cf {name} {excludes} -- {shlex.quote(rel)}")
        try:
            if result.exit_code == 3:
                if artifact.required:
                    raise SandboxError(f"declared artifact {artifact.source!r} does not exist in the runtime")
                collected[artifact.source] = None
                continue
            if result.exit_code != 0:
                raise SandboxError(f"collecting artifact {artifact.source!r} failed: {result.stderr.strip()[-500:]}")
            try:
                archive = await runtime.read(name, max_bytes=budget)
            except Exception as e:  # noqa: BLE001 - over the budget, or the agent swapped the file
                raise SandboxError(f"artifact {artifact.source!r}: {e}") from None
        finally:
            await runtime.run(["rm", "-f", "--", name])
        budget -= max(len(archive), expanded_size(archive, budget, repr(artifact.source)))
        collected[artifact.source] = archive
    return collected


def expanded_size(archive: bytes, max_bytes: int, what: str = "archive") -> int:
    """Bytes the files of `archive` expand to, summed from their headers (nothing is read);
    SandboxError when that passes `max_bytes` (a sparse file's size, not its few stored bytes)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            total = sum(m.size for m in tar.getmembers() if m.isfile())
    except tarfile.TarError as e:
        raise SandboxError(f"artifact {what}: not a tar archive ({e})") from None
    if total > max_bytes:
        raise SandboxError(f"artifact {what} expands to {total} bytes, over its budget of {max_bytes} bytes "
                           "(a sparse or oversized file); nothing of it is read")
    return total


def safe_members(archive: bytes, max_bytes: int = MAX_ARTIFACT_BYTES) -> list[tuple[str, bytes | None]]:
    """(relative name, file bytes or None for a directory) of an untrusted archive; anything
    but regular files and directories, any name that is absolute or climbs, and an archive
    whose files expand past `max_bytes` (checked before any is read), are refused."""
    expanded_size(archive, max_bytes)
    out = []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        for member in tar.getmembers():
            path = PurePosixPath(member.name)
            if path.is_absolute() or ".." in path.parts:
                raise SandboxError(f"artifact member {member.name!r} leaves its root")
            if member.isdir():
                out.append((str(path), None))
            elif member.isfile():
                data = tar.extractfile(member)
                out.append((str(path), data.read() if data is not None else b""))
            else:
                raise SandboxError(f"artifact member {member.name!r} is not a regular file or directory")
    return out


async def restore(runtime: Runtime, collected: dict[str, bytes | None], *,
                  max_bytes: int = MAX_ARTIFACT_BYTES) -> list[str]:
    """Write collected files into `runtime` at the same paths below its working directory;
    returns the files written. Archives are validated before anything is written, and all of
    them together expand to at most `max_bytes`."""
    archives = [archive for archive in collected.values() if archive is not None]
    budget = max_bytes
    for source, archive in collected.items():
        if archive is not None:
            budget -= expanded_size(archive, budget, repr(source))
    members = [(name, data) for archive in archives for name, data in safe_members(archive, max_bytes)]
    written = []
    for name, data in members:
        if data is not None:
            await runtime.write(name, data)
            written.append(name)
    return written


def write_artifacts(run_dir: Path, trace: Trace, key: str) -> None:
    """Put a trace's collected archives under `run_dir/artifacts/` and reference them from the
    trace (`info["artifacts"]`), once; the archives themselves never go into traces.jsonl."""
    collected: dict[str, Any] = getattr(trace.state, "artifacts", None) or {}
    if not collected or trace.info.get("artifacts"):
        return
    folder = Path(run_dir) / "artifacts"
    folder.mkdir(exist_ok=True)
    refs = []
    for n, (source, archive) in enumerate(collected.items()):
        ref = {"source": source, "file": None, "bytes": 0, "sha256": None}
        if archive is not None:
            digest = hashlib.sha256(archive).hexdigest()
            name = f"{key}-{n}.tar"
            (folder / name).write_bytes(archive)
            ref.update(file=f"artifacts/{name}", bytes=len(archive), sha256=digest)
        refs.append(ref)
    trace.info["artifacts"] = refs
