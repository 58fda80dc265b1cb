"""Shared fixtures: the scripted OpenAI-compatible stub server and a console-script runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from openai_stub import StubServer

BIN = Path(sys.executable).parent

# vendored v0 environments are test data, not tests (`tool_test.py` matches pytest's file pattern)
collect_ignore = ["migrate_corpus"]


@pytest.fixture(scope="session")
def stub():
    with StubServer() as server:
        yield server


def run_cli(*args: str, input: str | None = None, timeout: float = 120, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
    """Run a console script (vf-eval, vf-rollout, ...) as a real subprocess."""
    cmd = [str(BIN / args[0]), *args[1:]]
    full_env = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}")
    return proc


TRAIN_ENV = {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
"""vf-train subprocesses: one intra-op thread each, so tests that start several share 2 cores evenly."""


def run_train(*args, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m vf.commands.train ARGS` as a real subprocess (not checked: tests assert the exit code)."""
    return subprocess.run([sys.executable, "-m", "vf.commands.train", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=TRAIN_ENV, check=False)


def first_then_matrix(cases) -> list:
    """Parametrize values: the first runs by default, the rest only under `-m matrix` (one
    representative case of a matrix in CI, the full matrix on demand)."""
    cases = list(cases)
    return cases[:1] + [pytest.param(c, marks=pytest.mark.matrix) for c in cases[1:]]


def json_out(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def cli():
    return run_cli
