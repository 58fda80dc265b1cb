"""The one error the model package raises for a checkpoint it cannot load, and the check that a
file lies under the weights root (torch-free: the image processor uses it too)."""

from pathlib import Path

from vf.errors import UsageError


class ModelLoadError(UsageError, ValueError):
    """A model directory that cannot be loaded: missing config/shard, unsupported architecture,
    missing or unexpected tensors. The message names the file or architecture and what is supported."""


def under_root(f: Path, root: Path | None) -> Path:
    """`f` itself, when no root confines reads or `f` resolves (links followed) under `root`. The
    check never looks at whether `f` exists, so a refusal says nothing about the host's files."""
    if root is not None and not f.resolve().is_relative_to(root):
        raise ModelLoadError(f"{f} resolves outside the weights root {root}",
                             hint="a checkpoint under --weights-root may only read files under it")
    return f
