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

import numba
import numpy as np

__all__ = ["BEYOND_MAX_ABS", "B_NORM", "B_ROW", "LABELS", "OK", "TRACE_HIGH", "TRACE_LOW", "Scan", "scan_upload"]

# what failed first, in the order the numpy checks run (their messages are the caller's)
OK, BEYOND_MAX_ABS, TRACE_HIGH, TRACE_LOW, LABELS, B_ROW, B_NORM = range(7)
_REL = 1e-9  # check_statistics' relative slack
_SLACK = 1e-9  # check_labelled_scatter's


class Scan(NamedTuple):
    """:func:`scan_upload`'s result: `code` (:data:`OK` or what failed first), the symmetric `S (K, F, F)` and
    `b (K, F)` copies the statistics own, the traces, and the augmented matrices to factorise (with `code == OK`
    and a `phi_sq`; otherwise not filled)."""

    code: int
    S: np.ndarray
    b: np.ndarray
    trace: np.ndarray
    aug: np.ndarray


@numba.njit(cache=True, nogil=True)
def _block_sum(a: np.ndarray, lo: int, n: int, step: int) -> float:  # pragma: no cover - compiled
    """numpy's `pairwise_sum` of at most 128 values: plain below 8, else eight accumulators and the rest."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i * step]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + step], a[lo + 2 * step], a[lo + 3 * step]
    r4, r5, r6, r7 = a[lo + 4 * step], a[lo + 5 * step], a[lo + 6 * step], a[lo + 7 * step]
    i = 8
    top = n - n % 8
    while i < top:
        p = lo + i * step
        r0 += a[p]
        r1 += a[p + step]
        r2 += a[p + 2 * step]
        r3 += a[p + 3 * step]
        r4 += a[p + 4 * step]
        r5 += a[p + 5 * step]
        r6 += a[p + 6 * step]
        r7 += a[p + 7 * step]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i * step]
        i += 1
    return res


@numba.njit(cache=True, nogil=True)
def _pairwise_sum(a: np.ndarray, lo: int, n: int, step: int) -> float:  # pragma: no cover - compiled
    """`a[lo], a[lo + step], …` (n values) summed as numpy's `add.reduce` sums a float64 row (its `pairwise_sum`):
    blocks of at most 128 (:func:`_block_sum`), longer runs split in two halves, the first a multiple of 8 long,
    and the halves added — the recursion, walked with a stack."""
    if n <= 128:
        return _block_sum(a, lo, n, step)
    los = np.empty(128, dtype=np.int64)
    ns = np.empty(128, dtype=np.int64)
    state = np.zeros(128, dtype=np.int64)
    res = np.empty(128)
    los[0], ns[0] = lo, n
    sp, rp = 1, 0
    while sp > 0:
        m, s0 = ns[sp - 1], los[sp - 1]
        if m <= 128:
            res[rp] = _block_sum(a, s0, m, step)
            rp += 1
            sp -= 1
        elif state[sp - 1] == 0:
            state[sp - 1] = 1
            h = m // 2
            h -= h % 8
            los[sp], ns[sp], state[sp] = s0 + h * step, m - h, 0  # the second half, summed after the first
            los[sp + 1], ns[sp + 1], state[sp + 1] = s0, h, 0
            sp += 2
        else:  # both halves summed: first + second
            res[rp - 2] = res[rp - 2] + res[rp - 1]
            rp -= 1
            sp -= 1
    return res[0]


@numba.njit(cache=True, nogil=True)
def _scan(s_upper: np.ndarray, b: np.ndarray, n: float, q: float, max_abs: float, phi_sq: float, use_phi: bool,
          phi_sq_min: float, use_phi_min: bool, label_bound: float, use_label: bool, S: np.ndarray,
          b_out: np.ndarray, trace: np.ndarray, aug: np.ndarray) -> int:  # pragma: no cover - compiled
    k_count, f = b.shape
    # ---- unpack (the symmetric S the statistics own, and the augmented matrix's S block when it will be
    # factorised), the b copy, and the ±max_abs bound with numpy's NaN rule: `S.max() > bound` is False when S
    # holds a NaN (the maximum is NaN), and so is `S.min() < -bound`
    s_nan = False
    s_over = False
    for k in range(k_count):
        pos = 0
        for i in range(f):
            for j in range(i, f):
                v = s_upper[k, pos]
                pos += 1
                S[k, i, j] = v
                S[k, j, i] = v
                if use_phi:
                    aug[k, i, j] = v
                    aug[k, j, i] = v
                if v != v:
                    s_nan = True
                elif v > max_abs or v < -max_abs:
                    s_over = True
    b_nan = False
    b_over = False
    for k in range(k_count):
        for i in range(f):
            v = b[k, i]
            b_out[k, i] = v
            if v != v:
                b_nan = True
            elif v > max_abs or v < -max_abs:
                b_over = True
    if abs(q) > max_abs or (s_over and not s_nan) or (b_over and not b_nan):
        return BEYOND_MAX_ABS
    if not use_phi:
        return OK
    flat = S.reshape(k_count * f * f)
    for k in range(k_count):
        trace[k] = _pairwise_sum(flat, k * f * f, f, f + 1)  # np.trace: the diagonal, summed
    high = n * phi_sq * (1.0 + _REL) + _REL
    for k in range(k_count):
        if trace[k] > high:
            return TRACE_HIGH
    if use_phi_min:
        low = n * phi_sq_min * (1.0 - _REL) - _REL
        for k in range(k_count):
            if trace[k] < low:
                return TRACE_LOW
    if use_label:
        bound2 = n * (label_bound * label_bound)
        if q > bound2 * (1.0 + _SLACK) + _SLACK:
            return LABELS
        qq = 0.0 if 0.0 > q else q  # Python's max(q, 0.0)
        b2 = np.empty(f)
        for k in range(k_count):
            for i in range(f):
                d = S[k, i, i]
                room = d if (d >= 0.0 or d != d) else 0.0  # np.maximum(d, 0.0): NaN stays
                room *= qq
                room *= 1.0 + _SLACK
                room += _SLACK
                bi = b[k, i]
                if bi * bi > room:
                    return B_ROW
        for k in range(k_count):
            for i in range(f):
                bi = b[k, i]
                b2[i] = bi * bi
            t = trace[k]
            t0 = t if (t >= 0.0 or t != t) else 0.0
            if _pairwise_sum(b2, 0, f, 1) > t0 * qq * (1.0 + _SLACK) + _SLACK:
                return B_NORM
    aq = abs(q)
    for k in range(k_count):
        for i in range(f):
            aug[k, i, f] = b[k, i]
            aug[k, f, i] = b[k, i]
        aug[k, f, f] = q
        x = trace[k] + aq
        jitter = 1e-9 * (x if (x >= 1.0 or x != x) else 1.0)  # np.maximum(x, 1.0)
        for i in range(f + 1):
            aug[k, i, i] += jitter
    return OK


def scan_upload(s_upper: np.ndarray, b: np.ndarray, n: float, q: float, *, max_abs: float, phi_sq: float | None,
                phi_sq_min: float | None, label_bound: float | None) -> Scan:
    """The checks of `check_statistics` after the count (which the caller checks first) on packed statistics
    `S_upper (K, F(F+1)/2)`, `b (K, F)`, with everything but the factorisation: see the module doc. `phi_sq`
    None: only the `±max_abs` bound (noised or masked uploads)."""
    b = np.asarray(b, dtype=np.float64)
    k_count, f = b.shape
    S = np.empty((k_count, f, f))
    b_out = np.empty((k_count, f))
    trace = np.empty(k_count)
    aug = np.empty((k_count, f + 1, f + 1))
    code = _scan(np.asarray(s_upper, dtype=np.float64), b, float(n), float(q), float(max_abs),
                 0.0 if phi_sq is None else float(phi_sq), phi_sq is not None,
                 0.0 if phi_sq_min is None else float(phi_sq_min), phi_sq_min is not None,
                 0.0 if label_bound is None else float(label_bound), label_bound is not None, S, b_out, trace, aug)
    return Scan(int(code), S, b_out, trace, aug)
