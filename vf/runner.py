"""The old import path of vf.episode.runner (`run_episode`, `run_plan`, ...), which the commands,
the trainer and the docs use. Not part of the authoring API."""

from vf.episode.runner import (  # noqa: F401
    EpisodeSpec,
    Observer,
    Plan,
    check_harnesses,
    make_engine,
    make_plan,
    make_spec,
    retype_kept,
    run_episode,
    run_plan,
    run_stopper,
    seat_spec,
    taskset_toolsets,
    trace_task,
    with_shared_tools,
)
