"""The one error the model package raises for a checkpoint it cannot load (torch-free)."""

from vf.errors import UsageError


class ModelLoadError(UsageError, ValueError):
    """A model directory that cannot be loaded: missing config/shard, unsupported architecture,
    missing or unexpected tensors. The message names the file or architecture and what is supported."""
