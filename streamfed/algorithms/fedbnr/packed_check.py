"""FedBNR's per-upload check in one compiled pass over the packed upper triangle (issue 27, aggregator ingest).

An aggregator checks every upload (`check_statistics` in :mod:`.aggregation`, docs/algorithms.md §4.11): the
count, every value within `±max_abs`, the trace bounds, the label bound, Cauchy–Schwarz on `b`, and the
Cholesky factorisation of the augmented scatter `[[S, b], [bᵀ, q]]` plus its jitter. Written with numpy, the
checks other than the factorisation cost some twenty array passes and temporaries per upload (~40 µs at
F = 101), more than the factorisation's own LAPACK call. :func:`scan_upload` does them in one loop over the
packed triangle, writing the symmetric `S` (which the sums need anyway) and the augmented matrix on the way; the
caller factorises that matrix with `numpy.linalg.cholesky`, as before.

Same verdicts, same numbers: each inequality is evaluated with the operations of the numpy code in the same
order, the traces and `Σ b_i²` with numpy's own pairwise summation (:func:`_pairwise_sum`), NaN treated as
numpy's reductions treat it, and the factorised matrix is bit for bit the one the numpy path built
(tests/test_ingest_fast_path.py holds both side by side on honest, hostile and knife-edge statistics).

>>> import numpy as np
>>> from streamfed.core.stats import SufficientStats, pack_upper
>>> st = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3))
>>> out = scan_upload(pack_upper(st.S), st.b, 3.0, float(st.q), max_abs=1e100, phi_sq=2.0, phi_sq_min=2.0,
...                   label_bound=1.0)
>>> out.code, bool(np.array_equal(out.S, st.S)), out.aug.shape
(0, True, (1, 3, 3))
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from streamfed.algorithms.fedbnr._check_codes import (
    B_NORM,
    B_ROW,
    BEYOND_MAX_ABS,
    LABELS,
    OK,
    TRACE_HIGH,
    TRACE_LOW,
)
from streamfed.algorithms.fedbnr._compiled import kern

__all__ = ["BEYOND_MAX_ABS", "B_NORM", "B_ROW", "LABELS", "OK", "TRACE_HIGH", "TRACE_LOW", "Scan", "scan_upload"]


class Scan(NamedTuple):
    """:func:`scan_upload`'s result: `code` (:data:`OK` or what failed first), the symmetric `S (K, F, F)` and
    `b (K, F)` copies the statistics own, the traces, and the augmented matrices to factorise (with `code == OK`
    and a `phi_sq`; otherwise not filled)."""

    code: int
    S: np.ndarray
    b: np.ndarray
    trace: np.ndarray
    aug: np.ndarray


def scan_upload(s_upper: np.ndarray, b: np.ndarray, n: float, q: float, *, max_abs: float, phi_sq: float | None,
                phi_sq_min: float | None, label_bound: float | None) -> Scan:
    """The checks of `check_statistics` after the count (which the caller checks first) on packed statistics
    `S_upper (K, F(F+1)/2)`, `b (K, F)`, with everything but the factorisation: see the module doc. `phi_sq`
    None: only the `±max_abs` bound (noised or masked uploads)."""
    b = np.ascontiguousarray(b, dtype=np.float64)
    k_count, f = b.shape
    S = np.empty((k_count, f, f))
    b_out = np.empty((k_count, f))
    trace = np.empty(k_count)
    aug = np.empty((k_count, f + 1, f + 1))
    code = kern.scan(np.ascontiguousarray(s_upper, dtype=np.float64), b, float(n), float(q), float(max_abs),
                     0.0 if phi_sq is None else float(phi_sq), int(phi_sq is not None),
                     0.0 if phi_sq_min is None else float(phi_sq_min), int(phi_sq_min is not None),
                     0.0 if label_bound is None else float(label_bound), int(label_bound is not None),
                     S, b_out, trace, aug)
    return Scan(int(code), S, b_out, trace, aug)
