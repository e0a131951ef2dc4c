#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the code is ruff-clean, and stays so: a lint error fails the run before any test does
.venv/bin/ruff check --quiet .
# and type-checked ([tool.mypy] in pyproject.toml: every module; errors in the modules listed there not yet enforced)
.venv/bin/mypy --no-error-summary
# One BLAS thread: the learners' small dense solves only slow down when two threads fight for 2 cores.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest "$@"
