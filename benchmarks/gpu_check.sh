#!/usr/bin/env bash
# The GPU acceptance check: one GPU, about ten minutes, every step checked and recorded in a JSON
# verdict (its path is the one line on stdout); exit 1 when a step failed, 2 on bad usage.
# The steps, their tolerances and the test hook are in benchmarks/gpu_check.py's docstring.
#
#   bash benchmarks/gpu_check.sh [--cpu] [--out DIR] [--steps env,train_parity,...] [--budget-s S]
#
# --cpu: every step that needs no CUDA runs with the CPU standing in for the device (CI runs this:
# tests/test_gpu_check.py); the CUDA-only steps are skipped with the reason.
# PYTHON: the interpreter to use (default: python3, else python).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3 || command -v python)}"
exec "$PY" benchmarks/gpu_check.py "$@"
