"""The data side of verifiers' library environments that build their own rows: reasoning-gym's
generated problems (`ReasoningGymEnv`, 0.1.7+) and gym-style step/reset games (`GymEnv`, 0.1.9+).
`compat.ReasoningGymEnv` and `compat.GymEnv` are the v0 classes built on these; vf-migrate runs a
`load_environment()` returning one at load time (`compat.V0Taskset`, rule ENV013).

Both follow verifiers 0.1.14's code (0.2.x and 0.3.x's `verifiers.legacy` copies are the same):

- reasoning-gym: one procedural dataset of `train + eval` entries (a name, or a list of names /
  `DatasetSpec` dicts made into a composite); row i asks entry i's question and its answer is
  `str(i)`, the index the scorer looks the entry up by.
- gym: row i is the first observation of `env_cls(**env_kwargs).reset(seed=seed + i)` and its answer
  is that seed, with which each rollout resets its own copy of the game.

Nothing here imports reasoning_gym until such an env is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vf.errors import UsageError

RG_HINT = "pip install reasoning-gym   (or the vf extras: pip install 'vf[gym]')"


def reasoning_gym():
    """(the reasoning_gym module, its DatasetSpec, its SYSTEM_PROMPTS), or a UsageError saying what to install."""
    try:
        import reasoning_gym as rg
        from reasoning_gym.composite import DatasetSpec
        from reasoning_gym.utils import SYSTEM_PROMPTS
    except ImportError:
        raise UsageError("this migrated environment is a v0 ReasoningGymEnv, which needs the `reasoning-gym` "
                         "package; it is not installed", hint=RG_HINT) from None
    return rg, DatasetSpec, SYSTEM_PROMPTS


def reasoning_gym_dataset(gym: str | list[str | dict], size: int, seed: int) -> Any:
    rg, DatasetSpec, _ = reasoning_gym()
    if isinstance(gym, str):
        return rg.create_dataset(gym, size=size, seed=seed)
    specs = []
    for spec in gym:
        if isinstance(spec, str):
            specs.append(DatasetSpec(name=spec, weight=1.0, config={}))
        elif isinstance(spec, dict):
            specs.append(DatasetSpec(**spec))
        else:
            raise ValueError(f"Invalid dataset config: {spec}")
    return rg.create_dataset("composite", datasets=specs, size=size, seed=seed)


def reasoning_gym_rows(dataset: Any, num_train: int) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows): entry i → question, answer `str(i)`, its source dataset in info."""
    train, evals = [], []
    for i, entry in enumerate(dataset):
        row = {"question": entry["question"], "answer": str(i),
               "info": {"source_dataset": entry["metadata"]["source_dataset"]}}
        (train if i < num_train else evals).append(row)
    return train, evals


# ---- gym-style games --------------------------------------------------------------------------------


def normalize_reset(out: Any) -> tuple[Any, dict[str, Any]]:
    """`reset()` → (observation, info): a bare observation, or the (obs, info) of the newer gym API."""
    if isinstance(out, tuple) and len(out) == 2:
        return out
    return out, {}


def normalize_step(out: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    """`step()` → (obs, reward, terminated, truncated, info), from gym's 4-tuple or 5-tuple."""
    if not isinstance(out, (tuple, list)) or len(out) not in (4, 5):
        raise TypeError(f"env.step() returned {type(out).__name__} {out!r}, expected a tuple of length 4 or 5")
    if len(out) == 5:
        obs, reward, term, trunc, info = out
        return obs, reward, term, trunc, info
    obs, reward, done, info = out
    return obs, float(reward), bool(done), False, info


def gym_rows(env_cls: Callable[..., Any], env_kwargs: dict[str, Any], obs_to_text: Callable[[Any], str],
             num_train: int, num_eval: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows): one episode per seed, its first observation as the question."""
    train, evals = [], []
    env = env_cls(**env_kwargs)
    try:
        for i in range(num_train + num_eval):
            obs, _ = normalize_reset(env.reset(seed=seed + i))
            (train if i < num_train else evals).append({"question": obs_to_text(obs), "answer": str(seed + i)})
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()
    return train, evals
