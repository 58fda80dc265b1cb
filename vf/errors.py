"""Errors that carry an exit code, so commands can turn them into a message without a traceback,
and verifiers 0.4's rollout-error taxonomy, in one hierarchy.

Exit codes (docs/architecture.md): 0 ok, 1 runtime failure, 2 bad usage or bad input, 3 a requested gate not met.

Rollout errors (`RolloutError` and the boundary types below, named and meant as in verifiers'
`verifiers.v1.errors`) say which boundary a failed rollout crossed: the model provider, the
harness, a toolset, the sandbox (runtime), the task's own code, or the interception server. A
rollout that ends on one records it on the trace (`errors[-1].type` = the class raised) and stops
as `<boundary>_error` (`TaskError` → `task_error`, `SandboxError` → `sandbox_error`); any other
exception stops it as `error`. vf's own subclasses (`EngineError`, the runtime's
`RuntimeLimitError`) keep their names on the trace and stop as their boundary's condition unless
they name their own (`RuntimeLimitError` stops as `limit`, as before).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator


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


# ---- verifiers 0.4's rollout-error taxonomy ----------------------------------------------------


class RolloutError(VfError):
    """Base for a failure recorded onto the trace rather than crashing the run (exit 1 when one
    does reach a command). Raised as verifiers raises them: `TaskError("no such file")`."""

    def __init__(self, message: str = "", hint: str | None = None):
        super().__init__(message, hint)

    @property
    def stop_condition(self) -> str:
        """The trace's stop condition when this error ends a rollout (see `stop_condition()`)."""
        return stop_condition(self)


class ProviderError(RolloutError):
    """A model-provider call failed (transport, HTTP status, timeout, or malformed response).
    `status_code` is the HTTP status to surface (the provider's own, or one chosen for a
    transport fault: 503, 504 for a timeout, else 502)."""

    def __init__(self, message: str = "", *, status_code: int | None = 502, hint: str | None = None):
        super().__init__(message, hint)
        self.status_code = status_code


MODEL_TRANSPORT_ERROR_EXIT_CODE = 97
"""verifiers' reserved harness exit code for an exhausted model-transport failure (read as an
`InterceptionError` from the harness's exit status)."""


class HarnessError(RolloutError):
    """The harness failed to install or launch, or its agent process exited unsuccessfully."""


class ToolsetError(RolloutError):
    """A task's toolset could not be built or served."""


class EnvError(RolloutError):
    """The environment's own hooks failed (`run()`/`finalize()` raised, or ran no agent).
    Episode-level; per-seat failures stay typed on their traces."""


class SandboxError(RolloutError):
    """A runtime/sandbox operation failed (provisioning, exec, or file I/O), or the runtime died."""


class TaskError(RolloutError):
    """Task-authored code failed: `setup`, `finalize`, or a reward/metric, or the task's data
    cannot be run (e.g. its `agent_user` does not exist)."""


class InterceptionError(RolloutError):
    """Communication with the host interception server failed."""


class TunnelError(InterceptionError):
    """A tunnel to the host interception server could not be established."""


BOUNDARIES: tuple[type[RolloutError], ...] = (
    ProviderError, HarnessError, ToolsetError, EnvError, SandboxError, TaskError, InterceptionError,
    TunnelError, RolloutError)
"""verifiers' own classes: a vf subclass records the stop condition of the first of these above it."""


def stop_condition(error: BaseException) -> str:
    """The stop condition a recorded error leaves on the trace: `<boundary>_error` for a typed
    rollout error (`SandboxError` → `sandbox_error`, `TunnelError` → `tunnel_error`; vf's own
    subclasses take their nearest verifiers class's, `EngineError` → `provider_error`), `error`
    for any other. A class may name its own by setting `STOP_CONDITION`."""
    own = getattr(type(error), "STOP_CONDITION", None)
    if isinstance(own, str):
        return own
    if isinstance(error, RolloutError):
        cls = next(c for c in type(error).__mro__ if c in BOUNDARIES)
        return "rollout_error" if cls is RolloutError else f"{cls.__name__.removesuffix('Error').lower()}_error"
    return "error"


@contextlib.asynccontextmanager
async def boundary(error_cls: type[RolloutError], what: str) -> AsyncIterator[None]:
    """Run code across a framework→code boundary, attributing an error escaping it to `error_cls`
    (`f"{what}: {type}: {message}"`, chained). A `RolloutError` passes through unchanged (it
    crossed a more specific boundary first); a `TimeoutError` the code raised itself becomes
    `error_cls` too (a stage deadline wraps the boundary from outside)."""
    try:
        yield
    except RolloutError:
        raise
    except TimeoutError as e:
        raise error_cls(f"{what} timed out") from e
    except Exception as e:
        raise error_cls(f"{what}: {type(e).__name__}: {e}") from e


class EngineError(ProviderError):
    """A model call failed. `type` names the failure class recorded on traces (vf's finer names:
    `BadRequest`, `ProviderError`, `Timeout`, ...); a `ProviderError` in verifiers' taxonomy, so
    the trace stops as `provider_error`."""

    def __init__(self, message: str, type: str = "EngineError", status_code: int | None = None,
                 retryable: bool = False):
        super().__init__(message, status_code=status_code)
        self.type = type
        self.retryable = retryable

