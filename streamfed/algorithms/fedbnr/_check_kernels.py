"""The compiled pass behind :mod:`.packed_check` (FedBNR's per-upload check), registered with FedBNR's kernel
group (:mod:`._compiled`) so an aggregator on the ahead-of-time build never loads numba. Read it against
:mod:`.packed_check`'s doc: each inequality as the numpy code evaluates it, sums in numpy's pairwise order."""

from __future__ import annotations

import numba
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
from streamfed.algorithms.fedbnr._check_codes import REL as _REL
from streamfed.algorithms.fedbnr._check_codes import SLACK as _SLACK

__all__ = ["scan"]


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
def scan(s_upper: np.ndarray, b: np.ndarray, n: float, q: float, max_abs: float, phi_sq: float, use_phi: int,
          phi_sq_min: float, use_phi_min: int, label_bound: float, use_label: int, S: np.ndarray,
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
