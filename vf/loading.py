"""The old import path of vf.episode.loading (taskset ids, their Env) and of vf.imports (importing
the code a config names, under the trust guard). Not part of the authoring API."""

from vf.config import config_errors  # noqa: F401
from vf.episode.loading import (  # noqa: F401
    ENTRY_POINT_GROUP,
    LoadedTaskset,
    build_env,
    builtin_ids,
    chosen_env,
    env_class,
    load_taskset,
    taskset_class,
)
from vf.imports import TRUST_FLAG, guard_code, import_path, normalize_id, untrusted_config  # noqa: F401
