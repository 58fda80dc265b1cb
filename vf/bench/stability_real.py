"""`stability_real` suite: the stability study with drift that is not injected noise.

The same runs as `stability` (`vf.trainer.loop.run`, the built-in tiny model SFT-warmed on
reverse-text, one run per loss: ipo eps 0.1/0.2/0.3, icepop, ppo, cispo, no masking = ipo eps
1e9), but the mismatch between the trainer's π and the engine's μ comes from how vf really runs:

- a low-precision engine: the embedded engine runs in bfloat16 (`drift.engine_dtype`) while the
  trainer stays fp32, so weights and kernels round differently (like a vLLM-in-bf16 engine);
- staleness up to `stale` policy versions (64 in the full size), two ways:
  `bf16 replay`: deterministic replay, batch b from exactly version b − stale (the same for every
  loss, repeatable; the first `stale` steps all train on the warm policy's rollouts);
  `bf16 async`: continuous dispatch with `async.max_inflight` = `stale` batches and
  `async.max_off_policy_steps` = `stale`: how late rollouts really arrive depends on whether the
  engine outruns the trainer (staleness counts from the version that admitted the prompt);
- a learning rate 5× the `stability` suite's, so the policy moves far within that window.

Undrifted references (fp32 engine, one batch in flight: staleness ≤ 1, same LR) show what the
LR alone does. Per run: final reward (a drift-free evaluation of the trained policy), masked
fraction, mismatch KL, staleness (mean, histogram), dropped groups, diverged (non-finite, or the
final reward below half the start). In `bf16 async` timing decides which rollout lands in
which batch, so two runs differ a little.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from vf.bench.stability import LOSSES, NOMASK, RL_LR, study

HIGH_LR = 5 * RL_LR

ALL = [n for n, _, _ in LOSSES]
SIZES = {
    "full": {"warmup_steps": 40, "rl_steps": 96, "batch_size": 32, "group_size": 8, "max_tokens": 16,
             "eval_tasks": 40, "eval_rollouts": 2, "stale": 64,
             "setups": {"bf16 replay": ALL, "bf16 async": ALL, "undrifted": ["ipo eps0.3", NOMASK]}},
    "quick": {"warmup_steps": 30, "rl_steps": 24, "batch_size": 16, "group_size": 4, "max_tokens": 12,
              "eval_tasks": 16, "eval_rollouts": 2, "stale": 16,
              "setups": {"bf16 replay": ALL, "undrifted": ["ipo eps0.3"]}},
    "tiny": {"warmup_steps": 2, "rl_steps": 3, "batch_size": 4, "group_size": 2, "max_tokens": 4,
             "eval_tasks": 2, "eval_rollouts": 1, "stale": 2,
             "setups": {"bf16 replay": ["ipo eps0.3", NOMASK], "bf16 async": ["ipo eps0.3"]}},
}


def setups(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Config overrides per setup (on top of the `stability` suite's run config)."""
    lr = {"optim": {"lr": HIGH_LR}}
    bf16 = {"engine_dtype": "bfloat16", "stale_steps": 0, "weight_noise": 0.0}
    stale = cfg["stale"]
    return {
        # batch b from exactly version b − stale (after the first `stale` steps): every loss sees
        # the same staleness, and a run repeats exactly
        "bf16 replay": {**lr, "drift": {**bf16, "stale_steps": stale - 1},
                        "async": {"deterministic": True, "level": 1, "max_off_policy_steps": stale}},
        # continuous dispatch with `stale` batches in flight: staleness is what the timing makes it
        "bf16 async": {**lr, "drift": bf16,
                       "async": {"deterministic": False, "max_inflight": stale * cfg["batch_size"],
                                 "max_off_policy_steps": stale}},
        "undrifted": {**lr, "async": {"deterministic": False, "max_inflight": cfg["batch_size"],
                                      "max_off_policy_steps": 1}},
    }


def run(size: str = "full", plot_path: str | None = None, **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = {**SIZES[size], "size": size, "lr": HIGH_LR, "taskset": "reverse-text (trainer default)"}
    by_name = {n: (loss, params) for n, loss, params in LOSSES}
    over = setups(cfg)
    none = {"stale_steps": 0, "weight_noise": 0.0}
    runs = [{"name": f"{n} [{d}]", "loss": by_name[n][0], "params": by_name[n][1], "drift": none, "over": over[d]}
            for d, names in cfg["setups"].items() for n in names]

    def checks(_n: str, setup: str, fig: dict[str, Any]) -> dict[str, bool]:
        if setup != "bf16 replay":
            return {}
        # the setup did what it says: rollouts reached the trainer `stale` versions late
        oldest = max((int(k) for k in fig.get("off_policy_hist") or {}), default=0)
        return {"staleness reached": oldest >= min(cfg["stale"], cfg["rl_steps"] - 1)}

    notes = [(f"bf16 = the embedded engine in bfloat16 (trainer fp32); replay = batch b from version b − {cfg['stale']} "
              f"(--async.deterministic, drift.stale_steps {cfg['stale'] - 1}); async = continuous dispatch with "
              f"{cfg['stale']} batches in flight (max_off_policy_steps {cfg['stale']}); undrifted = fp32 engine, one "
              f"batch in flight; lr {HIGH_LR:g}; {cfg['rl_steps']} RL steps of {cfg['batch_size']} rollouts after a "
              f"{cfg['warmup_steps']}-step SFT warm-up; no masking = ipo eps 1e9")]
    own_plot = str(Path(plot_path).with_name(Path(plot_path).stem + "-real.png")) if plot_path else None
    return study("stability_real", cfg, runs, checks, notes, own_plot, t0)
