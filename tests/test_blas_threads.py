"""Every entry point runs on one BLAS thread unless the user says otherwise (streamfed/blas_threads.py).

Checked in fresh interpreters, with the BLAS that numpy actually loaded (threadpoolctl reads its thread count),
for both orders of import: streamfed first (the CLI, the services) and numpy first (an estimator imported in a
notebook). The machine has 2 cores, so "the library's default" is 2 threads there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streamfed.blas_threads import parse

PROBE = ("import json, {first}, {second}; from threadpoolctl import threadpool_info; "
         "print(json.dumps([i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']))")


def _threads(first: str, second: str, **env: str) -> list[int]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "STREAMFED_BLAS_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first, second=second)], capture_output=True,
                         text=True, env={**clean, **env}, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("first,second", [("streamfed", "numpy"), ("numpy", "streamfed")])
def test_one_blas_thread_by_default_whatever_the_import_order(first, second):
    threads = _threads(first, second)
    assert threads and all(n == 1 for n in threads), threads


def test_the_user_chooses(monkeypatch):
    assert all(n == 2 for n in _threads("streamfed", "numpy", STREAMFED_BLAS_THREADS="2"))
    # a BLAS variable set by the user wins over the default, in either order
    assert all(n == 2 for n in _threads("streamfed", "numpy", OPENBLAS_NUM_THREADS="2"))
    assert all(n == 2 for n in _threads("numpy", "streamfed", OPENBLAS_NUM_THREADS="2"))
    # 0: the library's own choice (one per core)
    cores = os.cpu_count() or 1
    assert all(n == cores for n in _threads("streamfed", "numpy", STREAMFED_BLAS_THREADS="0"))


def test_a_bad_setting_is_refused_in_words():
    assert parse(None) == 1 and parse(" 3 ") == 3 and parse("0") is None
    with pytest.raises(ValueError, match="STREAMFED_BLAS_THREADS='many'"):
        parse("many")
    # at import it warns in one line and keeps one thread: an import never fails on it
    assert _threads("streamfed", "numpy", STREAMFED_BLAS_THREADS="many") == [1]


def test_the_cli_says_so():
    out = subprocess.run([sys.executable, "-m", "streamfed.cli", "--help"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert "STREAMFED_BLAS_THREADS" in out.stdout
