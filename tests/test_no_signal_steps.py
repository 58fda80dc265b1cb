"""A step whose groups all had equal rewards (nothing to learn from) says so, and its undefined
metrics (no loss tokens: NaN) print as "—", not "nan" (issue 36: `masked nan kl nan`)."""

import math
from types import SimpleNamespace

from vf.commands.train import StepPrinter
from vf.trainer.loop import no_signal_message


def test_a_step_with_no_loss_tokens_prints_dashes_not_nan():
    row = {"phase": "rl", "loss": 0.0, "reward": 0.0, "masked_fraction": math.nan, "mismatch_kl": math.nan,
           "staleness": 1.0, "tokens_per_s": 0.0, "step_time": 1.5}
    line = StepPrinter.stats(row)
    assert "nan" not in line
    assert "masked —" in line and "kl —" in line
    assert "reward 0.000" in line  # a real zero stays a number


def test_the_no_signal_message_names_the_groups_and_the_ways_out():
    batch = SimpleNamespace(metrics={"zero_variance_groups": 8, "reward": 0.0, "num_samples": 0})
    msg = no_signal_message(3, batch)
    assert msg.startswith("step 3: all 8 groups had all-equal rewards (mean reward 0.000)")
    assert "--orchestrator.refill" in msg and "--orchestrator.group-size" in msg
