"""`vf-eval`'s exit status tells the truth about errored episodes (issue 34).

Every trace and the summary are written first; then the command exits 1 when more episodes
errored than `--max-errors` allows (a count, or a fraction of the episodes; default 0), and the
summary (summary.json, `--json`, the stderr table) names the first errors. A reward that raises
is an error on its trace (tests/test_cli_eval.py's BOOM taskset: 3 of 6 episodes raise).
"""

from __future__ import annotations

import json

import pytest
from conftest import json_out
from test_cli_eval import BOOM

from vf.summary import allowed_errors, error_gate


@pytest.fixture
def boom(tmp_path):
    path = tmp_path / "boom.py"
    path.write_text(BOOM)
    return path


def _eval(cli, stub, env, out, *extra):
    return cli("vf-eval", str(env), "-m", "echo", "--base-url", stub.url, "-o", str(out), *extra)


def test_errored_episodes_exit_1_after_everything_is_written(tmp_path, stub, cli, boom):
    out = tmp_path / "run"
    proc = _eval(cli, stub, boom, out, "--json")
    assert proc.returncode == 1, proc.stderr
    summary = json_out(proc)  # the summary is still printed...
    assert summary["num_episodes"] == 6 and summary["num_errors"] == 3 and summary["mean_reward"] == 1.0
    assert (out / "traces.jsonl").read_text().count("\n") == 6  # ...every trace is on disk...
    saved = json.loads((out / "summary.json").read_text())  # ...and so is summary.json, naming the errors
    # the same errors on stdout and on disk; listed as the episodes finished (concurrent: any order)
    assert saved["first_errors"] == summary["first_errors"]
    assert sorted(e["error"] for e in saved["first_errors"]) == [
        f"ValueError: reward 'ok': bad task {n}" for n in (1, 3, 5)]
    assert "3 of 6 episodes errored (allowed: 0)" in proc.stderr and "bad task " in proc.stderr
    assert "--max-errors" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("allow, code", [("3", 0), ("0.5", 0), ("2", 1), ("0.4", 1)])
def test_max_errors_count_or_fraction(tmp_path, stub, cli, boom, allow, code):
    proc = _eval(cli, stub, boom, tmp_path / "run", "--max-errors", allow)
    assert proc.returncode == code, proc.stderr
    # the table on stderr names the first errors either way
    assert "first errors" in proc.stderr and "reward 'ok': bad task 1" in proc.stderr


def test_bad_max_errors_is_refused_before_the_run(tmp_path, stub, cli, boom):
    proc = _eval(cli, stub, boom, tmp_path / "run", "--max-errors", "1.5")
    assert proc.returncode == 2 and "--max-errors '1.5'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_rescoring_a_run_with_errors_exits_1_and_min_reward_still_gates(tmp_path, stub, cli, boom):
    out = tmp_path / "run"
    _eval(cli, stub, boom, out)
    assert cli("vf-eval", "--score", str(out)).returncode == 1
    allowed = cli("vf-eval", "--score", str(out), "--max-errors", "3", "--min-reward", "1.5")
    assert allowed.returncode == 3, allowed.stderr  # errors allowed: the reward gate decides


def test_allowed_errors_reads_counts_and_fractions():
    assert [allowed_errors(v, 10) for v in (None, "0", "3", "0.1", "0.25", "1.0", 2)] == [0, 0, 3, 1, 2, 10, 2]
    for bad in ("-1", "x", "1.5", "nan", "2.5"):
        with pytest.raises(ValueError, match="a count of episodes"):
            allowed_errors(bad, 10)
    assert error_gate({"num_errors": 0, "num_episodes": 4}, None) is None
    assert error_gate({"num_errors": 1, "num_episodes": 4}, "0.25") is None
    assert error_gate({"num_errors": 2, "num_episodes": 4}, "0.25").startswith("2 of 4 episodes errored (allowed: 1")
