"""The one error the model package raises for a checkpoint it cannot load, the check that a
file lies under the weights root, and the bounded read of a model's JSON configs (torch-free: the
image processor uses them too)."""

from pathlib import Path

from vf.bounded import BoundsError, load_json
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


def read_json_object(f: Path) -> dict:
    """A model file's JSON object (config.json, preprocessor_config.json), read with vf.bounded's
    limits: a file we did not write may be deep, huge or not an object; each is ModelLoadError."""
    try:
        d = load_json(f.read_bytes())
    except BoundsError as e:
        raise ModelLoadError(f"{f}: {e}") from None
    except OSError as e:
        raise ModelLoadError(f"{f} cannot be read: {e}") from None
    if not isinstance(d, dict):
        raise ModelLoadError(f"{f} must hold a JSON object")
    return d
