"""One compiled pass over a POF-MKL upload's rows for the aggregator's check (issue 27, aggregator ingest).

`POFMKLAggregation.check` needs `max |Δ|` (the `±max_abs` bound) and, for the declared bound, each row's norm
against its limit. With numpy that is five small-array calls per upload (`abs`, `max`, `einsum`, `sqrt`, the
comparison) at ~1 µs of overhead each; :func:`scan_rows` gives `max |Δ|` and the rows' `Σ Δ²` in one call.

It only ever *shortens* the check: the caller accepts a row from these squares when its norm is below the limit by
a margin (:data:`CLEAR_MARGIN`) far wider than any difference in rounding between two orders of summing `2D`
squares (at most `2D · 2⁻⁵²` relative); every other upload — near a limit, over it, with a square that overflows
— is judged by the numpy expressions as before, so the verdicts and messages are those of the numpy path
(tests/test_ingest_fast_path.py).

>>> import numpy as np
>>> squares = np.empty(2)
>>> scan_rows(np.array([[3.0, -4.0], [0.0, 1.0]]), squares), squares.tolist()
(4.0, [25.0, 1.0])
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["CLEAR_MARGIN", "scan_rows"]

# relative margin below the limit within which the squares computed here decide alone: rounding differs from
# einsum's by ~1e-13 at 2D = 1000 (n · 2⁻⁵² for a sum of n non-negative terms), orders of magnitude below this
CLEAR_MARGIN = 1e-9


@numba.njit(cache=True, nogil=True)
def _scan(delta: np.ndarray, squares: np.ndarray) -> float:  # pragma: no cover - compiled
    rows, width = delta.shape
    largest = 0.0
    for i in range(rows):
        s = 0.0
        for j in range(width):
            v = delta[i, j]
            a = abs(v)
            if a > largest:
                largest = a
            elif a != a:  # numpy's max of a NaN is NaN
                largest = math.nan
                break
            s += v * v
        squares[i] = s
        if largest != largest:
            break
    return largest


def scan_rows(delta: np.ndarray, squares: np.ndarray) -> float:
    """`max |Δ|` of a float64 `(m, 2D)` array (NaN if it holds one, as `np.abs(delta).max()`), and each row's `Σ Δ²`
    written into `squares (m,)` (not filled after a NaN)."""
    return float(_scan(delta, squares))
