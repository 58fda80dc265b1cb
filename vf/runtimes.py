"""verifiers 0.4's `verifiers.v1.runtimes` import path, for harness code written against it:
`Runtime`, `ProgramResult` (what a harness's program run returns) and the config. vf's runtimes
live in `vf.runtime`; vf's own code imports them from there."""

from vf.runtime import ProgramResult, Runtime, RuntimeConfig, make_runtime

__all__ = ["ProgramResult", "Runtime", "RuntimeConfig", "make_runtime"]
