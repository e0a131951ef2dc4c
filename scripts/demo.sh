#!/usr/bin/env bash
# Set up (idempotent) and run the main job: a demo fleet on the embedded defaults (no configuration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/streamfed demo "$@"
