"""Where a run's numbers go besides the run dir: one small interface the loop calls on rank 0.

    log(row, step)        every metrics.jsonl row, as written
    samples(step, rows)   a few rollouts (or SFT samples) trained on at `step` (`sample_rows`)
    eval(label, summary)  an evaluation's summary (RUN/evals/LABEL/summary.json)
    close(ok)             the run ended (ok: normally)

The loop calls `record(row, batch, tokenizer)` once per step (log, then samples, decoded only
when the monitor wants them), `eval` after each evaluation and `close` at the end.

`Monitor` does nothing: the default, and what ranks other than 0 get. The run's deployment
(`deployment.Deployment.monitor`) opens the one the config asks for: W&B (trainer/wandb_monitor.py,
which imports wandb only when `--wandb.project` is set, so a run without it never imports wandb).
Another backend is one more subclass with these four methods and one more branch there. The run dir stays the record; a monitor is a copy of it.
"""

from __future__ import annotations

from typing import Any


class Monitor:
    """The no-op monitor."""

    sample_limit = 0
    """Samples per step the monitor wants (`samples`); 0: none are decoded."""

    def record(self, row: dict[str, Any], batch, tokenizer) -> None:
        """The loop's hook after a step's metrics.jsonl row is written: `log`, then `samples`."""
        self.log(row, row["step"])
        if self.sample_limit:
            self.samples(row["step"], sample_rows(row["step"], batch, tokenizer, self.sample_limit))

    def log(self, row: dict[str, Any], step: int) -> None:
        pass

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass

    def eval(self, label: str, summary: dict[str, Any]) -> None:
        pass

    def close(self, ok: bool = True) -> None:
        pass


def sample_rows(step: int, batch, tokenizer, limit: int) -> list[dict[str, Any]]:
    """Up to `limit` samples of a step's batch, evenly spaced (a batch lists a group's rollouts
    together: the table shows several tasks), as table rows: the prompt (the tokens before the
    first loss token), the completion (from there on, tool results included), reward, advantage,
    and token counts: `loss_tokens` trained on and `masked_tokens`, the sample's tokens the loss
    mask excludes (prompt, tool results, sampled tokens not trained on)."""
    samples = batch.samples
    stride = max(1, len(samples) // max(limit, 1))
    out = []
    for s in samples[::stride][:limit]:
        first = next((i for i, m in enumerate(s.loss_mask) if m), len(s.token_ids))
        loss_tokens = sum(s.loss_mask)
        out.append({
            "step": step,
            "prompt": tokenizer.decode(s.token_ids[:first]),
            "completion": tokenizer.decode(s.token_ids[first:]),
            "reward": s.info.get("reward"),
            "advantage": s.advantage,
            "loss_tokens": loss_tokens,
            "masked_tokens": len(s.token_ids) - loss_tokens,
        })
    return out
