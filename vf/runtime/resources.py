"""A task's `TaskData.resources` applied to its rollout's runtime config.

verifiers 0.4.0 (`resolve_runtime_config`) gives each task's requested resources to the runtime
fields of the same name where the runtime has them, and warns once per (runtime, resource) it
cannot honour. vf's runtimes have limits instead (vf.runtime.base.RuntimeConfig), in MiB; each
type says which one enforces a resource (`Runtime.RESOURCES`):

    memory GB  →  sandbox: total_memory_mb (the resident memory of all a command's processes);
                  docker: memory_mb (the container's); subprocess: not enforced
    disk GB    →  disk_mb (the working directory; in the sandbox also the file-size cap)
    cpu, gpu   →  no vf runtime enforces them: ignored, with a warning

The run's limits are a ceiling: a task asking for less gets less (restrictions compose, as in
verifiers), one asking for more is capped at the run's value with a warning naming the flag that
raises it. (verifiers lets a task raise a runtime's default; vf's defaults are the sandbox's safety
limits on the host, so only the operator raises them.)
"""

from __future__ import annotations

import math
import sys
from typing import Any

from vf.errors import TaskError
from vf.runtime.base import RuntimeConfig
from vf.runtime.registry import runtime_type

_warned: set[tuple[str, ...]] = set()


def warn_once(*key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"vf: warning: {message}", file=sys.stderr)


def with_resources(config: RuntimeConfig, resources: Any) -> RuntimeConfig:
    """`config` with the task's `resources` (a `TaskResources`; None fields: not asked) applied."""
    if resources is None:
        return config
    enforced = runtime_type(config.type).RESOURCES
    updates: dict[str, int] = {}
    for name, value in resources.model_dump(exclude_none=True).items():
        if name not in enforced:
            warn_once(config.type, name, message=f"runtime {config.type!r} doesn't support resource {name!r}; "
                                                 "ignoring it")
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise TaskError(f"task resource {name}={value!r} is not a positive number of GB")
        mib, field = math.ceil(value * 1024), enforced[name]
        allowed = getattr(config, field)
        if mib > allowed:
            flag = "--env.agent.runtime." + field.replace("_", "-")
            warn_once(config.type, name, message=f"a task asks for {name} {value:g} GB; {field} is capped at "
                      f"the run's {allowed} MiB (raise it with {flag})")
        updates[field] = min(mib, allowed)
    return config.model_copy(update=updates) if updates else config
