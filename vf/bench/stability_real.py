"""`stability_real` suite: the stability study with drift that is not injected noise.

The same runs as `stability` (`vf.trainer.loop.run`, the built-in tiny model SFT-warmed on
reverse-text, one run per loss: ipo eps 0.1/0.2/0.3, icepop, ppo, cispo, no masking = ipo eps
1e9), but the mismatch between the trainer's π and the engine's μ comes from how vf really runs:

- a low-precision engine: the embedded engine runs in bfloat16 (`drift.engine_dtype`) while the
  trainer stays fp32, so weights and kernels round differently (like a vLLM-in-bf16 engine);
- real staleness: continuous dispatch with `async.max_inflight` = `stale` batches, so rollouts
  wait in the pipeline and reach the trainer up to `stale` policy versions late (64 in the full
  size), bounded by `async.max_off_policy_steps` = `stale` (groups past it are dropped, counted);
- a learning rate 5× the `stability` suite's, so the policy moves far within that window.

Undrifted references (fp32 engine, one batch in flight: staleness ≤ 1, same LR) show what the
LR alone does. Per run: final reward (a drift-free evaluation of the trained policy), masked
fraction, mismatch KL, staleness (mean, histogram), dropped groups, diverged (non-finite, or the
final reward below half the start). Timing decides which rollout lands in which batch, so two
runs of this suite differ a little (the `stability` suite repeats exactly).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from vf.bench.stability import LOSSES, NOMASK, RL_LR, study

HIGH_LR = 5 * RL_LR

SIZES = {
    "full": {"warmup_steps": 40, "rl_steps": 96, "batch_size": 32, "group_size": 8, "max_tokens": 16,
             "eval_tasks": 40, "eval_rollouts": 2, "stale": 64,
             "losses": [n for n, _, _ in LOSSES], "undrifted": ["ipo eps0.3", NOMASK]},
    "quick": {"warmup_steps": 30, "rl_steps": 24, "batch_size": 16, "group_size": 4, "max_tokens": 12,
              "eval_tasks": 16, "eval_rollouts": 2, "stale": 16,
              "losses": [n for n, _, _ in LOSSES], "undrifted": ["ipo eps0.3"]},
    "tiny": {"warmup_steps": 2, "rl_steps": 3, "batch_size": 4, "group_size": 2, "max_tokens": 4,
             "eval_tasks": 2, "eval_rollouts": 1, "stale": 2, "losses": ["ipo eps0.3", NOMASK], "undrifted": []},
}


def setups(cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Config overrides of the drifted and the undrifted runs."""
    common = {"optim": {"lr": HIGH_LR}}
    return {
        "drifted": {**common, "drift": {"engine_dtype": "bfloat16"},
                    "async": {"deterministic": False, "max_inflight": cfg["stale"] * cfg["batch_size"], "max_off_policy_steps": cfg["stale"]}},
        "undrifted": {**common, "async": {"deterministic": False, "max_inflight": cfg["batch_size"], "max_off_policy_steps": 1}},
    }


def run(size: str = "full", plot_path: str | None = None, **_: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    cfg = {**SIZES[size], "size": size, "lr": HIGH_LR, "taskset": "reverse-text (trainer default)"}
    by_name = {n: (loss, params) for n, loss, params in LOSSES}
    over = setups(cfg)
    none = {"stale_steps": 0, "weight_noise": 0.0}
    runs = [{"name": f"{n} [{d}]", "loss": by_name[n][0], "params": by_name[n][1], "drift": none, "over": over[d]}
            for d, names in (("drifted", cfg["losses"]), ("undrifted", cfg["undrifted"])) for n in names]

    def checks(_n: str, drift: str, fig: dict[str, Any]) -> dict[str, bool]:
        if drift != "drifted":
            return {}
        # the setup did what it says: rollouts reached the trainer late
        oldest = max((int(k) for k in fig.get("off_policy_hist") or {}), default=0)
        return {"staleness reached": oldest >= cfg["stale"] // 2}

    notes = [(f"drifted = bfloat16 embedded engine (trainer fp32) + continuous dispatch with {cfg['stale']} batches "
              f"in flight (staleness up to {cfg['stale']}, max_off_policy_steps {cfg['stale']}); undrifted = fp32 "
              f"engine, one batch in flight; lr {HIGH_LR:g}; {cfg['rl_steps']} RL steps of {cfg['batch_size']} "
              f"rollouts after a {cfg['warmup_steps']}-step SFT warm-up; no masking = ipo eps 1e9")]
    own_plot = str(Path(plot_path).with_name(Path(plot_path).stem + "-real.png")) if plot_path else None
    return study("stability_real", cfg, runs, checks, notes, own_plot, t0)
