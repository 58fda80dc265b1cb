"""Errors that carry an exit code, so commands can turn them into a message without a traceback.

Exit codes (docs/architecture.md): 0 ok, 1 runtime failure, 2 bad usage or bad input, 3 a requested gate not met.
"""


class VfError(Exception):
    """Base for errors a user can act on. `hint` says what to do next."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(VfError):
    """Bad flags, bad config, unknown ids, a run dir that would be overwritten: exit 2."""

    exit_code = 2


class ConfigError(UsageError):
    """A config (file or CLI overrides) that does not validate. Lists every problem at once."""

    def __init__(self, problems: list[str], hint: str | None = None):
        self.problems = problems
        super().__init__("invalid config:\n" + "\n".join(f"  - {p}" for p in problems), hint)


class TasksetNotFound(UsageError):
    pass


class GateFailed(VfError):
    """A requested gate (e.g. --min-reward) was not met: exit 3."""

    exit_code = 3


class EngineError(VfError):
    """A model call failed. `type` names the failure class recorded on traces."""

    def __init__(self, message: str, type: str = "EngineError", status_code: int | None = None,
                 retryable: bool = False):
        super().__init__(message)
        self.type = type
        self.status_code = status_code
        self.retryable = retryable


# ---- verifiers 0.4's rollout error vocabulary (each names the boundary a failure crossed) ------

class RolloutError(Exception):
    """A failure recorded onto the trace rather than crashing the run."""


class HarnessError(RolloutError):
    """The harness failed to install or launch, or its program exited unsuccessfully."""


class SandboxError(RolloutError):
    """A runtime operation failed (provisioning, exec, file I/O), or the runtime died."""


class InterceptionError(RolloutError):
    """The program could not talk to the interception server."""


MODEL_TRANSPORT_ERROR_EXIT_CODE = 97
"""Exit code a harness program reserves for "my model connection failed for good"."""
