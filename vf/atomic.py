"""A file replaced whole or not at all: written under a temporary name beside it (the same
directory, so the same filesystem), then renamed over it. A reader sees the old content or the
new, never half; a crash or a full disk leaves the old file and at most a stray
`.<name>.<pid>.<random>.tmp`.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> None:
    """`data` at `path` (text as UTF-8), atomically; `mode`: the file's permission bits."""
    path = Path(path)
    # unique per call: two writers of one path in one process (concurrent rollouts) never share it
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
