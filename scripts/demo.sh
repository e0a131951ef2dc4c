#!/usr/bin/env bash
# Set up (idempotent) and run the main job on the embedded defaults: the Beijing fleet replay.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/streamfed replay --out out/demo "$@"
