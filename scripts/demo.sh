#!/usr/bin/env bash
# Set up (idempotent) and run the main job: a demo fleet on the embedded defaults (no configuration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"  # small dense solves: threads only contend
exec .venv/bin/streamfed demo "$@"
