"""Host-side file access beneath a runtime's working directory that nothing inside can redirect.

A command may leave a process running that swaps any name in the working directory between a
file, a symbolic link and a hard link to a host file. So the host never opens a name it checked
earlier: every read and write starts at the working directory's descriptor and opens one
component at a time with O_NOFOLLOW (a symlink anywhere is refused; `..` is resolved by name
before anything is opened and may not leave the directory), then checks the file it opened
(`fstat`), not the name. That is what openat2's RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS gives, on
every kernel and with one code path. Reads take regular files with one name only (a second
name could be a host file) and stop at a size cap; writes go to a new file that is renamed over
the name, so whatever the name pointed at before is never opened, and ownership is set on the
new file's descriptor.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import PurePosixPath

from vf.errors import UsageError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 16


def parts_beneath(root: str, path: str) -> list[str]:
    """`path` (relative to `root`, or absolute under it) as its components below `root`, with
    `.` and `..` taken by name. Raises UsageError for a path that leaves `root`."""
    if "\0" in path:
        raise UsageError(f"path {path!r} contains a NUL byte")
    p = PurePosixPath(path)
    if p.is_absolute():
        if not p.is_relative_to(root):
            raise UsageError(f"path {path!r} lies outside the runtime's working directory")
        p = p.relative_to(root)
    out: list[str] = []
    for part in p.parts:
        if part == "..":
            if not out:
                raise UsageError(f"path {path!r} lies outside the runtime's working directory")
            out.pop()
        elif part not in ("", "."):
            out.append(part)
    return out


def _refused(path: str, why: str) -> UsageError:
    return UsageError(f"{path} {why}: refused (the runtime's file access follows no links)")


def open_dir(root_fd: int, parts: list[str], path: str, *, create: bool = False,
             owner: int | None = None) -> int:
    """A descriptor of the directory `parts` below `root_fd`, opened one component at a time
    without following links; missing ones are made when `create` (and given to `owner`)."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened (and checked) below like any other
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as e:  # ELOOP: a symlink; ENOTDIR: a file
                raise _refused(path, f"has a component ({part!r}) that is a symbolic link or not a "
                                     "directory") from e
            os.close(fd)
            fd = child
            if owner is not None:
                os.fchown(fd, owner, owner)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_beneath(root_fd: int, parts: list[str], path: str, max_bytes: int) -> bytes:
    """The bytes of regular file `parts` below `root_fd` (see module docstring); more than
    `max_bytes` raises UsageError without reading it."""
    if not parts:
        raise _refused(path, "is a directory")
    parent = open_dir(root_fd, parts[:-1], path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: a symlink fails
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise _refused(path, "is a symbolic link or cannot be opened") from e
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(path, "is not a regular file")
        if st.st_nlink > 1:  # another name for the same file may lie outside (a host file)
            raise _refused(path, f"is a hard link ({st.st_nlink} names)")
        if st.st_size > max_bytes:
            raise UsageError(f"{path} is larger than max_bytes={max_bytes} ({st.st_size} bytes)")
        os.set_blocking(fd, True)
        buf = bytearray()
        while chunk := os.read(fd, CHUNK):
            buf += chunk
            if len(buf) > max_bytes:  # grew while we read
                raise UsageError(f"{path} is larger than max_bytes={max_bytes}")
        return bytes(buf)
    finally:
        os.close(fd)


def write_beneath(root_fd: int, parts: list[str], path: str, data: bytes, owner: int | None = None) -> None:
    """Put `data` at `parts` below `root_fd`: a new file (owned by `owner`, if given) renamed over
    the name, so a symlink or hard link there is replaced, never written through."""
    if not parts:
        raise _refused(path, "is a directory")
    parent = open_dir(root_fd, parts[:-1], path, create=True, owner=owner)
    name, tmp = parts[-1], f".{parts[-1][:64]}.vf-{uuid.uuid4().hex[:12]}"
    try:
        try:  # keep a regular file's permission bits (lstat: a link's target is not looked at)
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
            mode = stat.S_IMODE(old.st_mode) & 0o777 if stat.S_ISREG(old.st_mode) else 0o644
        except FileNotFoundError:
            mode = 0o644
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=parent)
        try:
            try:
                if owner is not None:
                    os.fchown(fd, owner, owner)
                os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            if isinstance(e, IsADirectoryError):
                raise _refused(path, "is a directory") from e
            raise
    finally:
        os.close(parent)
