#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with streamfed and its test tools,
# plus the Debian packages the integration tests start for real (when missing and we are root).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
# the tests take the optional torch extra too (torch==2.13.0 is the CPU wheel; gpytorch is a test oracle); the
# core never imports it (tests/test_architecture.py runs it with torch hidden)
# pip's output (and setuptools' multi-line editable-install warning banner) goes to a log that is shown only when
# the install fails: a set-up that works prints nothing of pip's, one that fails says so, loudly, and stops
log=$(mktemp)
if ! .venv/bin/python -m pip install --quiet -e '.[test,torch]' >"$log" 2>&1; then
  echo "error: installing streamfed into .venv failed (pip install -e '.[test,torch]'):" >&2
  cat "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
.venv/bin/python -c "import streamfed, numba, river" >/dev/null

# Debian packages used by the tests (real broker / real Prometheus). Installed only when missing.
need=()
for pkg in ${STREAMFED_APT_PACKAGES:-mosquitto mosquitto-clients openssl prometheus}; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "warning: missing Debian packages ${need[*]} (run as root to install them)" >&2
  fi
fi

# The learners' kernels compiled ahead of time (a no-op when a build of these sources exists): agents
# then run without numba and LLVM in memory. Without it everything still works on numba's JIT.
.venv/bin/streamfed kernels build >/dev/null
