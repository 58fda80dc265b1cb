"""Aggregates over a run's episodes: what `summary.json` and `vf-eval --json` hold.

    mean_reward   mean total reward over scored (error-free) episodes; an episode's reward is the
                  mean over its trainable seats' traces (all seats when none is trainable)
    rewards       name → mean score; metrics: name → mean value (None values skipped)
    pass_at_k     k → unbiased pass@k over tasks with ≥ k scored rollouts (k = 1, 2, 4, … ≤ R),
                  where a rollout passes when its reward ≥ pass_threshold
    num_errors    episodes that ended with an error (redone by --resume)
    first_errors  the first FIRST_ERRORS errored episodes: task key, rollout, error type and message
                  (`first_error`: the first one as one line, kept for older readers)

`allowed_errors` reads `vf-eval --max-errors` (a count or a fraction of the episodes) and
`error_gate` says whether a run's errors exceed it: a run whose episodes failed must not
look like a success (exit 1), however good the mean reward of the rest is.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb
from typing import Any

from vf.trace import Episode

PASS_THRESHOLD = 0.5
FIRST_ERRORS = 5


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator 1 − C(n−c, k)/C(n, k) (n samples, c correct)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(episodes: list[Episode], num_rollouts: int = 1, wall_time: float | None = None,
              pass_threshold: float = PASS_THRESHOLD, **extra: Any) -> dict[str, Any]:
    scored = [e for e in episodes if e.ok]
    rewards: dict[str, list[float]] = defaultdict(list)
    metrics: dict[str, list[float]] = defaultdict(list)
    per_task: dict[str, list[float]] = defaultdict(list)
    for ep in scored:
        per_task[ep.task.hash].append(ep.reward)
        for t in ep.scored_traces:  # multi-seat episodes: the trainable seats' signals
            for name, r in t.rewards.items():
                if r is not None:
                    rewards[name].append(r.score)
            for name, v in t.metrics.items():
                if v is not None:
                    metrics[name].append(v)
    ks, k = [], 1
    while k <= num_rollouts:
        ks.append(k)
        k *= 2
    pass_k = {}
    for k in ks:
        vals = [pass_at_k(len(rs), sum(r >= pass_threshold for r in rs), k) for rs in per_task.values() if len(rs) >= k]
        if vals:
            pass_k[str(k)] = sum(vals) / len(vals)
    input_tokens = sum(e.num_input_tokens for e in episodes)
    output_tokens = sum(e.num_output_tokens for e in episodes)
    summary = {
        "mean_reward": _mean([e.reward for e in scored]),
        "num_episodes": len(episodes),
        "num_scored": len(scored),
        "num_errors": len(episodes) - len(scored),
        "num_tasks": len(per_task),
        "rewards": {k: _mean(v) for k, v in sorted(rewards.items())},
        "metrics": {k: _mean(v) for k, v in sorted(metrics.items())},
        "pass_at_k": pass_k,
        "pass_threshold": pass_threshold,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "wall_time": wall_time,
        "tokens_per_second": (output_tokens / wall_time) if wall_time else None,
    }
    failed = [e for e in episodes if not e.ok]
    if failed:  # why, not just how many (e.g. the server is not reachable at the URL)
        summary["first_errors"] = [_error_entry(e) for e in failed[:FIRST_ERRORS]]
        summary["first_error"] = summary["first_errors"][0]["error"]
    summary.update(extra)
    return summary


def _error_entry(episode: Episode) -> dict[str, Any]:
    """One errored episode: which task and rollout, and its first error as `Type: message`."""
    error = next((x for x in [*episode.errors, *(x for t in episode.traces for x in t.errors)]), None)
    text = "unknown" if error is None else error.message or error.type
    line = text if error is None or text.startswith(error.type) else f"{error.type}: {text}"
    return {"task": episode.task.key, "rollout": episode.rollout, "error": line}


def allowed_errors(max_errors: str | float | None, num_episodes: int) -> int:
    """How many errored episodes `--max-errors` allows: None → 0; a whole number (`3`) → that
    count; a decimal (`0.1`, `1.0`) → that share of the episodes, rounded down. Anything else is
    a ValueError that says what is accepted."""
    if max_errors is None:
        return 0
    text = str(max_errors).strip()
    try:
        if isinstance(max_errors, int) or text.isdigit():
            return int(text)
        share = float(text)
    except ValueError:
        share = float("nan")
    if not 0 <= share <= 1:  # NaN, negative, or a share above 100%
        raise ValueError(f"--max-errors {text!r}: expected a count of episodes (0, 3, ...) or a fraction of "
                         "them between 0 and 1 (0.1 = 10%, 1.0 = all)")
    return int(share * num_episodes + 1e-9)


def error_gate(summary: dict[str, Any], max_errors: str | float | None) -> str | None:
    """None when the run's errored episodes are within `--max-errors`; else what happened, in one
    message (how many of how many, what was allowed, the first errors)."""
    errors, total = summary.get("num_errors", 0), summary.get("num_episodes", 0)
    allowed = allowed_errors(max_errors, total)
    if errors <= allowed:
        return None
    lines = [f"{errors} of {total} episodes errored (allowed: {allowed}"
             + (f", --max-errors {max_errors}" if max_errors is not None else "") + ")"]
    for entry in summary.get("first_errors", []):
        lines.append(f"  task {entry['task']} rollout {entry['rollout']}: {entry['error']}")
    return "\n".join(lines)
