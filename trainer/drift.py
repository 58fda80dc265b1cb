"""Drift on purpose: make the inference policy μ differ from the trainer's π, so the loss masks
(IPO's probability trust region, IcePop's ratio band) are exercised and visible on CPU, where the
embedded engine otherwise reproduces the trainer's log-probs almost exactly.

Three knobs (config section `drift`, e.g. `--drift.weight-noise 0.05`):

- stale_steps K (deterministic replay only, `--async.deterministic`): batch b is generated with
  the policy of step b − async.level − K (instead of b − async.level). The traces record that
  older version; `off_policy/mean` in metrics.jsonl shows it, and `async.level + K` must stay
  within `async.max_off_policy_steps`. (Continuous dispatch has real staleness instead.)
- engine_dtype (`--drift.engine-dtype bfloat16`): the embedded engine runs in low precision
  while the trainer stays fp32 (`trainer/loop.py` builds the engine in that dtype).
- weight_noise σ: every weight push adds N(0, (σ·std(W))²) to each engine weight matrix W
  (seeded by (seed, version), so runs stay repeatable). μ then differs from π at every step, like
  a low-precision or quantised inference engine would.
"""

from __future__ import annotations


def rollout_version(batch: int, first_rl_step: int, async_level: int, stale_steps: int = 0) -> int:
    """Policy version (optimizer steps applied) that generates RL batch `batch`.

    Batch b trains at step b. With async.level a (deterministic replay), it is generated while the trainer works on step
    b − a … b − 1, from the weights after step b − a − 1, i.e. version b − a; never from before
    the SFT warm-up ended (version first_rl_step)."""
    return max(first_rl_step, batch - async_level - stale_steps)


def perturb(state: dict, sigma: float, seed: int, version: int) -> dict:
    """A copy of `state` with relative Gaussian noise on every floating matrix (norm weights,
    vectors, are left alone so the model stays well-conditioned). Each tensor's noise is seeded by
    (seed, version, its name), so a state perturbed group by group (the trainer streams its
    weights a layer at a time) gets the same noise as the whole."""
    if sigma <= 0:
        return state
    import zlib

    import torch

    out = {}
    for k, v in state.items():
        if v.is_floating_point() and v.dim() >= 2:
            g = torch.Generator().manual_seed((seed * 1_000_003 + version) * 4_294_967_311 % 2**63 ^ zlib.crc32(k.encode()))
            noise = torch.randn(v.shape, generator=g, dtype=torch.float32).to(v.dtype)
            v = v + noise * (sigma * float(v.float().std()))
        out[k] = v
    return out
