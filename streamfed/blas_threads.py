"""One BLAS thread per process unless the user says otherwise.

streamfed's dense algebra is small (a Cholesky update of a 101 × 101 factor, a 32 × 32 solve): a second BLAS
thread cannot speed it up, and on a machine with other work running the threads of OpenBLAS spin against
each other and against that work — `streamfed replay -a fedbnr` ran 10–18× slower on a busy 2-core machine
than with one thread. So every entry point (the CLI, the services, an estimator imported into a notebook)
limits BLAS to `STREAMFED_BLAS_THREADS` threads (default 1; ``0`` leaves the BLAS library's own choice).

How: this module runs when :mod:`streamfed` is imported. If numpy is not loaded yet it sets the BLAS
libraries' own variables (``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``, ...) unless the user set them; if
numpy was loaded first (an estimator imported after numpy), it limits the loaded BLAS through threadpoolctl,
process-wide, unless ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS`` was set by the user. OpenMP (torch's
threads, numba's parallel layer) is not touched.

>>> parse("1"), parse("4"), parse("0"), parse("auto")
(1, 4, None, None)
"""

from __future__ import annotations

import os
import sys

__all__ = ["ENV", "limit_blas_threads", "parse"]

ENV = "STREAMFED_BLAS_THREADS"
_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
_applied: str | None = None


def parse(value: str | None) -> int | None:
    """Threads asked for by a `STREAMFED_BLAS_THREADS` value: a positive count, or None for "leave BLAS alone"
    (``0``, ``auto``). Anything else is an error, said in one line."""
    if value is None or value.strip() == "":
        return 1
    text = value.strip().lower()
    if text in ("0", "auto"):
        return None
    if not text.isdigit():
        raise ValueError(f"{ENV}={value!r}: expected a number of threads (1, 2, …) or 0 / auto for the library's "
                         "default")
    return int(text)


def limit_blas_threads() -> str:
    """Apply the setting (once per process; later calls say what was done). Returns it in words."""
    global _applied
    if _applied is not None:
        return _applied
    try:
        n = parse(os.environ.get(ENV))
    except ValueError as e:
        print(f"warning: {e}; using 1 BLAS thread", file=sys.stderr)
        n = 1
    if n is None:
        _applied = "BLAS threads: the library's default (STREAMFED_BLAS_THREADS=0)"
    elif "numpy" not in sys.modules:
        for var in _BLAS_VARS:
            os.environ.setdefault(var, str(n))
        _applied = f"BLAS threads: {os.environ['OPENBLAS_NUM_THREADS']} (OPENBLAS_NUM_THREADS, set before numpy loaded)"
    elif any(var in os.environ for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")):
        _applied = "BLAS threads: as the environment set them before numpy loaded"
    else:
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=n, user_api="blas")  # process-wide, kept (not used as a context)
            _applied = f"BLAS threads: {n} (threadpoolctl: numpy was loaded before streamfed)"
        except Exception as e:  # noqa: BLE001 - an unknown BLAS must not stop an import
            _applied = f"BLAS threads: not limited ({type(e).__name__}: {e})"
    return _applied
