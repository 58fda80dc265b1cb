"""verifiers 0.4's `verifiers.v1.runtimes` names, for harness code written against them:
`Runtime`, `ProgramResult` (what a harness's program run returns) and the config. vf's runtimes
live in `vf.runtime`; this module only gives them verifiers' import path."""

from vf.runtime import CommandResult, Runtime, RuntimeConfig, make_runtime

ProgramResult = CommandResult
"""`ProgramResult(exit_code, stdout, stderr)`: one program run (the same record as a command's)."""

__all__ = ["ProgramResult", "Runtime", "RuntimeConfig", "make_runtime"]
