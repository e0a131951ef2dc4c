"""Numba kernels of online FedBNR (docs/algorithms.md §4).

The working posterior of one feature map is kept as the upper Cholesky factor of the *augmented*
precision matrix

    M = [ A   h ]      A = σ⁻² S + λ⁻² P   (P = I without forgetting)
        [ hᵀ  c ]      h = σ⁻² b,   c = σ⁻² q

    M = RₐᵀRₐ,   Rₐ = [ R  u ]      RᵀR = A,   Rᵀu = h,   ρ² = c - uᵀu
                      [ 0  ρ ]

A new sample `(φ, y)` adds `σ⁻²[φ; y][φ; y]ᵀ` to `M`, i.e. `A += σ⁻²φφᵀ`, `h += σ⁻²φy`, `c += σ⁻²y²`
all at once, so one rank-one Cholesky update of `Rₐ` (O(F²)) maintains everything:

- predictive: with `v = R⁻ᵀφ`, mean `φᵀA⁻¹h = vᵀu` and variance `σ² + φᵀA⁻¹φ = σ² + vᵀv`
  (one triangular solve, no posterior mean vector needed);
- evidence: `log|A| = 2 Σ log R_ii` and `σ⁻²q - σ⁻⁴bᵀA⁻¹b = c - uᵀu = ρ²`.

This is the square-root (QR) form of recursive least squares; it never forms `A⁻¹`, which is why it
is more stable than Sherman–Morrison on the inverse.

The pending (to-be-uploaded) scatter is not updated sample by sample: rows are staged in a small
buffer and folded into `S_pend` `B` at a time (:func:`flush`), which turns `B` memory-bound rank-one
passes over the `F²/2` triangle into one compute-bound pass (same sums, different rounding order).

Kernels use `fastmath` without the no-NaN/no-Inf assumptions (reassociation and FMA contraction only),
so results agree with a plain evaluation to rounding, and the finiteness checks upstream stay valid. The
factor's kernels (:func:`solve_rt`, :func:`predict_one`, :func:`chol_update`, :func:`predict_update`, and
:func:`learn_one`, into which LLVM inlines `chol_update` and whose function-level flags would then apply) use none:
their loops have no reductions to reorder, so they vectorise as well without, and the fused
:func:`predict_update` is then exactly the two kernels it fuses (whatever the compiler would contract where).
"""

from __future__ import annotations

import numba
import numpy as np

from streamfed.algorithms.fedbnr._layout import (
    _H_OFF,
    H_B,
    H_D,
    H_DIRTY,
    H_F,
    H_GAMMA,
    H_K,
    H_LAZY_GAP,
    H_N_PEND,
    H_N_WORK,
    H_ND,
    H_Q_PEND,
    H_Q_WORK,
    H_REFRESH_J,
    H_SQRT_GAMMA,
    H_STAGED,
)
from streamfed.core._feature_kernels import rff_transform_into

_FAST = {"reassoc", "contract", "arcp", "nsz"}  # not "nnan"/"ninf": NaN and Inf must stay visible
_HALF_LOG_2PI = 0.5 * np.log(2.0 * np.pi)


@numba.njit(cache=True)
def all_finite(a: np.ndarray) -> bool:
    """Every entry of a 1-d array finite (numpy's `all(isfinite)` costs microseconds per call)."""
    for i in range(a.shape[0]):
        if not np.isfinite(a[i]):
            return False
    return True


@numba.njit(cache=True)
def all_finite_scaled(a: np.ndarray, y: float) -> bool:
    """Every `a_i` and `a_i * y` finite (what a sample adds to `b`)."""
    for i in range(a.shape[0]):
        if not (np.isfinite(a[i]) and np.isfinite(a[i] * y)):
            return False
    return True


@numba.njit(cache=True)
def rff_bias_features(wt: np.ndarray, x: np.ndarray, angles: np.ndarray, out: np.ndarray) -> bool:
    """Default feature map in one call: Gaussian RFF of every kernel into `out[:, :-1]`, the bias
    feature 1 into `out[:, -1]`; `False` (and `out` meaningless) if `x` or a feature is not finite."""
    if not all_finite(x):
        return False
    f = out.shape[1]
    rff_transform_into(wt, x, angles, out[:, : f - 1])
    for k in range(out.shape[0]):
        out[k, f - 1] = 1.0
        if not all_finite(out[k]):
            return False
    return True


@numba.njit(cache=True)
def same_vector(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape[0] != b.shape[0]:
        return False
    for i in range(a.shape[0]):
        if a[i] != b[i]:
            return False
    return True


@numba.njit(cache=True, inline="always")
def _givens(rkk: float, xk: float) -> tuple[float, float, float, float]:
    """The rotation that zeroes `x_k` against row `k` (:func:`chol_update`'s docstring): `(r_kk', c, s, 1/c)` with
    `r_kk' = √(r_kk² + x_k²)`, `c = r_kk'/r_kk`, `s = x_k/r_kk` — one place for every kernel that rotates, each
    operation in the order the kernels' bit-for-bit tests pin. `r_kk` must be non-zero."""
    rnew = np.sqrt(rkk * rkk + xk * xk)
    inv_rkk = 1.0 / rkk
    return rnew, rnew * inv_rkk, xk * inv_rkk, rkk / rnew


@numba.njit(cache=True)
def chol_update(r: np.ndarray, x: np.ndarray) -> None:
    """Rank-one update in place: on return `rᵀr` equals the old `rᵀr + x xᵀ` (`r` upper, `x` is destroyed).

    Row `k` of `r` is rotated against the remaining part of `x` by the Givens rotation that zeroes
    `x[k]`:  `r_kk' = √(r_kk² + x_k²)`, `c = r_kk'/r_kk`, `s = x_k/r_kk`, then for `j > k`
    `r_kj' = (r_kj + s x_j)/c` and `x_j' = c x_j - s r_kj'` (the classical LINPACK `dchud` recurrence,
    written for the upper factor so every inner loop runs along a contiguous row).

    Rows are rotated two at a time (`_rotate_pair`): each entry of `x` right of the pair is loaded and stored once
    for both rows, and meets the same operations in the same order as row by row — the same numbers, with a
    third fewer stores (the loop is store-bound).
    """
    n = r.shape[0]
    k = 0
    while k < n:
        xk = x[k]
        if xk == 0.0:
            k += 1
            continue  # the rotation is the identity: row k and x stay as they are
        rkk = r[k, k]
        if k + 1 == n:
            r[k, k] = np.sqrt(rkk * rkk + xk * xk)
            break  # last row has no off-diagonal part (and r_kk may be 0 there: the ρ entry)
        rnew, c, s, inv_c = _givens(rkk, xk)
        if k + 2 < n:
            r01 = (r[k, k + 1] + s * x[k + 1]) * inv_c
            x1 = c * x[k + 1] - s * r01
            if x1 != 0.0:  # row k+1 rotates too: both in one sweep
                r[k, k] = rnew
                r[k, k + 1] = r01
                x[k + 1] = x1
                _rotate_pair(r, x, k, c, s, inv_c, n)
                k += 2
                continue
        r[k, k] = rnew
        # Slices indexed from 0: LLVM then vectorises the loop (with `range(k + 1, n)` it did not).
        rk = r[k, k + 1:]
        xt = x[k + 1:]
        for j in range(n - k - 1):
            rkj = (rk[j] + s * xt[j]) * inv_c
            rk[j] = rkj
            xt[j] = c * xt[j] - s * rkj
        k += 1


@numba.njit(cache=True, inline="always")
def _rotate_pair(r: np.ndarray, x: np.ndarray, k: int, c: float, s: float, inv_c: float, stop: int) -> None:
    """:func:`chol_update`'s rotations of rows `k` (its parameters `c, s, 1/c`; entries up to `k+1` done) and
    `k+1` (whose `x[k+1]` is final) over the columns `k+2 .. stop-1`."""
    x1 = x[k + 1]
    rkk1 = r[k + 1, k + 1]
    rnew1, c1, s1, inv_c1 = _givens(rkk1, x1)
    r[k + 1, k + 1] = rnew1
    r0 = r[k, k + 2:stop]
    r1 = r[k + 1, k + 2:stop]
    xt = x[k + 2:stop]
    for j in range(stop - k - 2):
        b0 = (r0[j] + s * xt[j]) * inv_c
        r0[j] = b0
        xj = c * xt[j] - s * b0
        b1 = (r1[j] + s1 * xj) * inv_c1
        r1[j] = b1
        xt[j] = c1 * xj - s1 * b1


@numba.njit(cache=True)
def predict_update(r: np.ndarray, phi: np.ndarray, y: float, inv_sigma: float, v: np.ndarray,
                   x: np.ndarray) -> tuple[float, float]:
    """:func:`predict_one` then :func:`chol_update` by `σ⁻¹[φ; y]`, in one pass over the rows of the augmented
    factor `r` (`(F+1, F+1)`): row `k` gives its forward-substitution step (old values) and is rotated in the same
    loop over its entries. The same operations on the same values as the two calls — and none of the three
    kernels lets the compiler contract or reorder them (no `fastmath`) — so the same numbers, in one sweep of
    memory instead of two. Rows go two at a time where both rotate (as in :func:`chol_update`: the vectors are
    loaded and stored once per pair). Returns `(φᵀA⁻¹h, φᵀA⁻¹φ)` of the factor before the update."""
    n = r.shape[0]
    f = n - 1
    for i in range(f):
        v[i] = phi[i]
        x[i] = phi[i] * inv_sigma
    x[f] = y * inv_sigma
    mean = 0.0
    quad = 0.0
    k = 0
    while k < f:
        vk = v[k] / r[k, k]  # solve_rt's step k, on the leading F×F block, and predict_one's sums (in its order)
        v[k] = vk
        mean += vk * r[k, f]
        quad += vk * vk
        xk = x[k]  # chol_update's step k
        if xk == 0.0:  # the rotation is the identity
            rr = r[k, k + 1:f]
            vt = v[k + 1:f]
            for j in range(f - k - 1):
                vt[j] -= rr[j] * vk
            k += 1
            continue
        rkk = r[k, k]
        rnew, c, s, inv_c = _givens(rkk, xk)
        if k + 2 < f:
            rold = r[k, k + 1]
            r01 = (rold + s * x[k + 1]) * inv_c
            x1 = c * x[k + 1] - s * r01
            if x1 != 0.0:  # row k+1 rotates too: both in one sweep
                r[k, k] = rnew
                r[k, k + 1] = r01
                x[k + 1] = x1
                v[k + 1] -= rold * vk
                vk1 = v[k + 1] / r[k + 1, k + 1]
                v[k + 1] = vk1
                mean += vk1 * r[k + 1, f]
                quad += vk1 * vk1
                rkk1 = r[k + 1, k + 1]
                rnew1, c1, s1, inv_c1 = _givens(rkk1, x1)
                r[k + 1, k + 1] = rnew1
                r0 = r[k, k + 2:f]
                r1 = r[k + 1, k + 2:f]
                vt = v[k + 2:f]
                xt = x[k + 2:f]
                for j in range(f - k - 2):
                    a0 = r0[j]
                    a1 = r1[j]
                    vj = vt[j] - a0 * vk
                    b0 = (a0 + s * xt[j]) * inv_c
                    r0[j] = b0
                    xj = c * xt[j] - s * b0
                    vt[j] = vj - a1 * vk1
                    b1 = (a1 + s1 * xj) * inv_c1
                    r1[j] = b1
                    xt[j] = c1 * xj - s1 * b1
                rkj = (r[k, f] + s * x[f]) * inv_c  # the last column (u): rotated only
                r[k, f] = rkj
                x[f] = c * x[f] - s * rkj
                rkj = (r[k + 1, f] + s1 * x[f]) * inv_c1
                r[k + 1, f] = rkj
                x[f] = c1 * x[f] - s1 * rkj
                k += 2
                continue
        r[k, k] = rnew
        rr = r[k, k + 1:f]
        vt = v[k + 1:f]
        xt = x[k + 1:f]
        for j in range(f - k - 1):
            rold = rr[j]
            vt[j] -= rold * vk
            rkj = (rold + s * xt[j]) * inv_c
            rr[j] = rkj
            xt[j] = c * xt[j] - s * rkj
        rkj = (r[k, f] + s * x[f]) * inv_c  # the last column (u): rotated only
        r[k, f] = rkj
        x[f] = c * x[f] - s * rkj
        k += 1
    xk = x[f]  # the last row: ρ
    if xk != 0.0:
        rkk = r[f, f]
        r[f, f] = np.sqrt(rkk * rkk + xk * xk)
    return mean, quad


@numba.njit(cache=True)
def update_predict(r: np.ndarray, x: np.ndarray, phi: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    """:func:`chol_update` by `x` then :func:`predict_one` of `φ`, in one pass over the rows of the augmented factor
    `r` (`(F+1, F+1)`): row `k` is rotated (chol_update's step `k`), then gives the forward-substitution step `k` of
    `φ` on its new values. Each entry meets the operations of the two calls in their order (chol_update's pairs of
    rows and solve_rt's are row by row per entry; no `fastmath`), so the same numbers in one sweep of memory instead
    of two: a sample learned, then the next one predicted (the River estimator's deferred learn). `x` is destroyed;
    returns `(φᵀA⁻¹h, φᵀA⁻¹φ)` of the updated factor, `v = R⁻ᵀφ`."""
    n = r.shape[0]
    f = n - 1
    for i in range(f):
        v[i] = phi[i]
    mean = 0.0
    quad = 0.0
    k = 0
    while k < f:
        xk = x[k]
        rr = r[k, k + 1:n]  # (its last entry is the u column)
        vt = v[k + 1:f]
        if xk != 0.0:
            rkk = r[k, k]
            rnew, c, s, inv_c = _givens(rkk, xk)
            if k + 2 < f:
                r01 = (r[k, k + 1] + s * x[k + 1]) * inv_c
                x1 = c * x[k + 1] - s * r01
                if x1 != 0.0:  # row k+1 rotates too: both in one sweep (as chol_update; per entry the same order)
                    r[k, k] = rnew
                    r[k, k + 1] = r01
                    x[k + 1] = x1
                    vk = v[k] / rnew
                    v[k] = vk
                    v[k + 1] -= r01 * vk
                    rkk1 = r[k + 1, k + 1]
                    rnew1, c1, s1, inv_c1 = _givens(rkk1, x1)
                    r[k + 1, k + 1] = rnew1
                    vk1 = v[k + 1] / rnew1
                    v[k + 1] = vk1
                    r0 = r[k, k + 2:f]
                    r1 = r[k + 1, k + 2:f]
                    vt = v[k + 2:f]
                    xt = x[k + 2:f]
                    for j in range(f - k - 2):
                        b0 = (r0[j] + s * xt[j]) * inv_c
                        r0[j] = b0
                        xj = c * xt[j] - s * b0
                        b1 = (r1[j] + s1 * xj) * inv_c1
                        r1[j] = b1
                        xt[j] = c1 * xj - s1 * b1
                        vt[j] = (vt[j] - b0 * vk) - b1 * vk1
                    rkj = (r[k, f] + s * x[f]) * inv_c  # the last column (u): rotated only
                    r[k, f] = rkj
                    x[f] = c * x[f] - s * rkj
                    rkj = (r[k + 1, f] + s1 * x[f]) * inv_c1
                    r[k + 1, f] = rkj
                    x[f] = c1 * x[f] - s1 * rkj
                    mean += vk * r[k, f]
                    quad += vk * vk
                    mean += vk1 * r[k + 1, f]
                    quad += vk1 * vk1
                    k += 2
                    continue
            r[k, k] = rnew
            vk = v[k] / rnew
            v[k] = vk
            xt = x[k + 1:n]
            for j in range(f - k - 1):
                rkj = (rr[j] + s * xt[j]) * inv_c
                rr[j] = rkj
                xt[j] = c * xt[j] - s * rkj
                vt[j] -= rkj * vk
            j = f - k - 1  # the u column: rotated only
            rkj = (rr[j] + s * xt[j]) * inv_c
            rr[j] = rkj
            xt[j] = c * xt[j] - s * rkj
        else:  # the rotation is the identity
            vk = v[k] / r[k, k]
            v[k] = vk
            for j in range(f - k - 1):
                vt[j] -= rr[j] * vk
        mean += vk * r[k, f]
        quad += vk * vk
        k += 1
    xk = x[f]  # the last row: ρ
    if xk != 0.0:
        rkk = r[f, f]
        r[f, f] = np.sqrt(rkk * rkk + xk * xk)
    return mean, quad


@numba.njit(cache=True)
def solve_rt(r: np.ndarray, rhs: np.ndarray, out: np.ndarray, n: int) -> None:
    """`out[:n] = R⁻ᵀ rhs[:n]` for the leading `n×n` block `R` of upper `r` (forward substitution,
    organised by rows of `R` so the inner loop is contiguous; two rows per sweep of `out`, each entry updated in
    the row-by-row order)."""
    for i in range(n):
        out[i] = rhs[i]
    k = 0
    while k + 2 < n:
        vk = out[k] / r[k, k]
        out[k] = vk
        v1 = (out[k + 1] - r[k, k + 1] * vk) / r[k + 1, k + 1]
        out[k + 1] = v1
        r0 = r[k, k + 2:n]  # 0-based slices vectorise, see chol_update
        r1 = r[k + 1, k + 2:n]
        ot = out[k + 2:n]
        for j in range(n - k - 2):
            ot[j] = (ot[j] - r0[j] * vk) - r1[j] * v1
        k += 2
    while k < n:
        vk = out[k] / r[k, k]
        out[k] = vk
        rk = r[k, k + 1:n]
        ot = out[k + 1:n]
        for j in range(n - k - 1):
            ot[j] -= rk[j] * vk
        k += 1


@numba.njit(cache=True)
def predict_one(ra: np.ndarray, phi: np.ndarray, work: np.ndarray) -> tuple[float, float]:
    """`(φᵀA⁻¹h, φᵀA⁻¹φ)` from the augmented factor `ra` (`(F+1, F+1)`) of one feature map."""
    f = phi.shape[0]
    solve_rt(ra, phi, work, f)
    mean = 0.0
    quad = 0.0
    for i in range(f):
        mean += work[i] * ra[i, f]
        quad += work[i] * work[i]
    return mean, quad


@numba.njit(cache=True)
def predict_rff(
    wt: np.ndarray, x: np.ndarray, angles: np.ndarray, phi: np.ndarray, ra: np.ndarray, sigma: np.ndarray,
    logw: np.ndarray, work: np.ndarray, means: np.ndarray, variances: np.ndarray,
) -> tuple[bool, float, float]:
    """:func:`rff_bias_features` into `phi`, then :func:`predict_mixture`, in one call (hot path)."""
    if not rff_bias_features(wt, x, angles, phi):
        return False, 0.0, 0.0
    mu, var = predict_mixture(ra, phi, sigma, logw, work, means, variances)
    return True, mu, var


@numba.njit(cache=True)
def log_evidence_from_factor(ra: np.ndarray, n: float, sigma: float, lam: float) -> float:
    """`log p(y)` of the statistics held in `ra` (section 3), in O(F):

    `-(n/2)log(2πσ²) - ½(log|A| + F log λ²) - ½ρ²`, using `|I + λ²σ⁻²S| = λ^{2F} |A|`.
    """
    f = ra.shape[0] - 1
    half_logdet = 0.0
    for i in range(f):
        half_logdet += np.log(ra[i, i])
    rho = ra[f, f]
    return (-0.5 * n * np.log(2.0 * np.pi * sigma * sigma) - half_logdet - f * np.log(lam)
            - 0.5 * rho * rho)


@numba.njit(cache=True)
def predict_mixture(
    ra: np.ndarray, phi: np.ndarray, sigma: np.ndarray, logw: np.ndarray, work: np.ndarray,
    means: np.ndarray, variances: np.ndarray,
) -> tuple[float, float]:
    """Each kernel's predictive (into `means`, `variances`) and the moment-matched Bayesian model
    average with log weights `logw` (normalised here, in the log domain). A kernel of log weight `-inf` (weight
    exactly 0: a lazy kernel, :func:`refresh_log_weights`) is not evaluated and its entries are left as they are."""
    n_kernels = ra.shape[0]
    for k in range(n_kernels):
        if n_kernels == 1 or logw[k] != -np.inf:
            m, quad = predict_one(ra[k], phi[k], work)
            means[k] = m
            variances[k] = sigma[k] * sigma[k] + quad
    return mix(logw, means, variances)


@numba.njit(cache=True)
def mix(logw: np.ndarray, means: np.ndarray, variances: np.ndarray) -> tuple[float, float]:
    """The moment-matched Bayesian model average of the kernels' predictives with log weights `logw` (normalised
    here, in the log domain; a kernel of log weight `-inf` is left out, its entries not read)."""
    n_kernels = means.shape[0]
    if n_kernels == 1:
        return means[0], variances[0]
    top = -np.inf
    for k in range(n_kernels):
        top = max(top, logw[k])
    total = 0.0
    for k in range(n_kernels):
        if logw[k] != -np.inf:
            total += np.exp(logw[k] - top)
    mu = 0.0
    second = 0.0
    for k in range(n_kernels):
        if logw[k] == -np.inf:
            continue
        w = np.exp(logw[k] - top) / total
        mu += w * means[k]
        second += w * (variances[k] + means[k] * means[k])
    return mu, max(second - mu * mu, 0.0)


@numba.njit(cache=True, fastmath=_FAST)
def flush(s_pend: np.ndarray, b_pend: np.ndarray, buf: np.ndarray, buf_y: np.ndarray, count: int) -> None:
    """Fold `count` staged rows into the pending statistics: upper triangle of
    `S_pend[k] += Σ_t φ_t φ_tᵀ` and `b_pend[k] += Σ_t φ_t y_t`. `buf` is laid out `(K, F, B)` so each
    entry is a contiguous dot product over the staged rows; they are taken in 2 × 2 tiles of `S` (four dot
    products from four rows of `buf`: half the loads per product, 1.4× faster at F = 101 and 401)."""
    n_kernels, f = buf.shape[0], buf.shape[1]
    for k in range(n_kernels):
        bk = buf[k]
        sp = s_pend[k]
        for i in range(f):
            bi = bk[i]
            acc_b = 0.0
            for t in range(count):
                acc_b += bi[t] * buf_y[t]
            b_pend[k, i] += acc_b
        for i in range(0, f - 1, 2):
            b0 = bk[i]
            b1 = bk[i + 1]
            a00 = 0.0
            a01 = 0.0
            a11 = 0.0
            for t in range(count):
                a00 += b0[t] * b0[t]
                a01 += b0[t] * b1[t]
                a11 += b1[t] * b1[t]
            sp[i, i] += a00
            sp[i, i + 1] += a01
            sp[i + 1, i + 1] += a11
            for j in range(i + 2, f - 1, 2):
                c0 = bk[j]
                c1 = bk[j + 1]
                a00 = 0.0
                a01 = 0.0
                a10 = 0.0
                a11 = 0.0
                for t in range(count):
                    a00 += b0[t] * c0[t]
                    a01 += b0[t] * c1[t]
                    a10 += b1[t] * c0[t]
                    a11 += b1[t] * c1[t]
                sp[i, j] += a00
                sp[i, j + 1] += a01
                sp[i + 1, j] += a10
                sp[i + 1, j + 1] += a11
            if (f - i) % 2 == 1:  # the last column, when the pairs of columns do not reach it
                c0 = bk[f - 1]
                a00 = 0.0
                a10 = 0.0
                for t in range(count):
                    a00 += b0[t] * c0[t]
                    a10 += b1[t] * c0[t]
                sp[i, f - 1] += a00
                sp[i + 1, f - 1] += a10
        if f % 2 == 1:  # the last row (its diagonal only)
            c0 = bk[f - 1]
            a00 = 0.0
            for t in range(count):
                a00 += c0[t] * c0[t]
            sp[f - 1, f - 1] += a00


@numba.njit(cache=True, fastmath=_FAST)
def chol_update_rows(r: np.ndarray, xs: np.ndarray) -> None:
    """`m` rank-one updates in place: on return `rᵀr` equals the old `rᵀr + Σ_t x_t x_tᵀ` (rows `x_t` of `xs`,
    destroyed). The rotations of :func:`chol_update`, the same numbers in the same order for each row of `r`, but
    row `k` of `r` meets every `x_t` while it is in cache: one pass over `r` for `m` samples instead of `m`."""
    n = r.shape[0]
    m = xs.shape[0]
    for k in range(n):
        rk = r[k, k + 1:]
        for t in range(m):
            xk = xs[t, k]
            if xk == 0.0:
                continue
            rkk = r[k, k]
            if k + 1 == n:
                r[k, k] = np.sqrt(rkk * rkk + xk * xk)
                continue  # last row: no off-diagonal part (and r_kk may be 0 there: the ρ entry)
            rnew, c, s, inv_c = _givens(rkk, xk)
            r[k, k] = rnew
            xt = xs[t, k + 1:]
            for j in range(n - k - 1):
                rkj = (rk[j] + s * xt[j]) * inv_c
                rk[j] = rkj
                xt[j] = c * xt[j] - s * rkj


@numba.njit(cache=True)
def fold_rows(factor: np.ndarray, stage: np.ndarray, stage_y: np.ndarray, start: int, stop: int) -> None:
    """Rank-one updates of the augmented factors `factor (K, F+1, F+1)` by the staged rows `start..stop-1`:
    `factor[k]ᵀfactor[k] += [φ_k; y][φ_k; y]ᵀ` for each row (`stage (K, F, B)`, `stage_y (B,)`) — the regret's
    comparator (:class:`~.metrics.RidgeComparator`) takes the client's own samples this way."""
    n_kernels, f = stage.shape[0], stage.shape[1]
    m = stop - start
    xs = np.empty((m, f + 1))
    for k in range(n_kernels):
        for t in range(m):
            for i in range(f):
                xs[t, i] = stage[k, i, start + t]
            xs[t, f] = stage_y[start + t]
        chol_update_rows(factor[k], xs)


@numba.njit(cache=True)
def decay_refresh(ra: np.ndarray, sqrt_g: float, refresh: np.ndarray, index: int, x: np.ndarray) -> None:
    """A half-life's step on every kernel's factor: `Rₐ ← √g Rₐ` (so `M ← gM`), then the prior refresh
    `A += refresh_k² e_j e_jᵀ` (`j = index`; `x`, `F + 1` entries, is scratch). One pass over each factor: row `k` is
    scaled just before it is rotated, the same numbers as scaling the whole factor and then :func:`chol_update_rows`
    (half-life forgetting paid two passes, the second from row `j` on, and a copy of the refresh per kernel)."""
    n_kernels, n = ra.shape[0], ra.shape[1]
    for kk in range(n_kernels):
        r = ra[kk]
        for i in range(n):
            x[i] = 0.0
        x[index] = refresh[kk]
        for k in range(n):
            rk = r[k, k:]
            for i in range(n - k):
                rk[i] *= sqrt_g
            xk = x[k]
            if xk == 0.0:
                continue
            rkk = r[k, k]
            if k + 1 == n:
                r[k, k] = np.sqrt(rkk * rkk + xk * xk)
                continue  # last row: no off-diagonal part (and r_kk may be 0 there: the ρ entry)
            rnew, c, s, inv_c = _givens(rkk, xk)
            r[k, k] = rnew
            ro = r[k, k + 1:]
            xt = x[k + 1:]
            for i in range(n - k - 1):
                rki = (ro[i] + s * xt[i]) * inv_c
                ro[i] = rki
                xt[i] = c * xt[i] - s * rki


@numba.njit(cache=True)
def fold_samples(factor: np.ndarray, phis: np.ndarray, ys: np.ndarray) -> None:
    """:func:`fold_rows` for samples given as `phis (T, K, F)`, `ys (T,)`."""
    n_kernels, f = phis.shape[1], phis.shape[2]
    m = phis.shape[0]
    xs = np.empty((m, f + 1))
    for k in range(n_kernels):
        for t in range(m):
            for i in range(f):
                xs[t, i] = phis[t, k, i]
            xs[t, f] = ys[t]
        chol_update_rows(factor[k], xs)


@numba.njit(cache=True)
def symmetric_from_upper(upper: np.ndarray, out: np.ndarray) -> None:
    """`out[k]`: the symmetric matrix whose upper triangle (diagonal included) is that of `upper[k]` (the
    pending scatter accumulates its upper triangle only; its lower one is not read). In 32 × 32 tiles, so the
    mirrored (column) writes stay in cache."""
    n_kernels, f = upper.shape[0], upper.shape[1]
    tile = 32
    for k in range(n_kernels):
        u = upper[k]
        o = out[k]
        for i0 in range(0, f, tile):
            i1 = min(i0 + tile, f)
            for j0 in range(i0, f, tile):
                j1 = min(j0 + tile, f)
                for i in range(i0, i1):
                    for j in range(max(i, j0), j1):
                        v = u[i, j]
                        o[i, j] = v
                        o[j, i] = v


@numba.njit(cache=True, inline="always")
def _stage_row(phi: np.ndarray, y: float, stage: np.ndarray, stage_y: np.ndarray, s_pend: np.ndarray,
               b_pend: np.ndarray, count: int) -> int:
    """Stage one sample's rows `φ_k` and `y` for the pending statistics (flushing a full stage first); returns the
    new number of staged rows, or -1 (nothing changed) if some `φ_i y` is not finite."""
    n_kernels, f = phi.shape
    for k in range(n_kernels):
        if not all_finite_scaled(phi[k], y):
            return -1
    if count == stage.shape[2]:
        flush(s_pend, b_pend, stage, stage_y, count)
        count = 0
    stage_y[count] = y
    for k in range(n_kernels):
        for i in range(f):
            stage[k, i, count] = phi[k, i]
    return count + 1


@numba.njit(cache=True)  # no fastmath: chol_update, inlined here, must round as in predict_update
def learn_one(
    ra: np.ndarray, s_pend: np.ndarray, b_pend: np.ndarray, buf: np.ndarray, buf_y: np.ndarray, count: int,
    phi: np.ndarray, y: float, inv_sigma: np.ndarray, sqrt_gamma: float, refresh: np.ndarray,
    refresh_index: int, work: np.ndarray, lazy: np.ndarray, bound: np.ndarray,
) -> int:
    """Add one sample to every kernel's pending statistics and working factor; returns the new number
    of staged rows, or -1 (and changes nothing) if some `φ_i y` is not finite.

    Pending statistics (exact, undecayed: they are what gets uploaded): the row is staged in `buf`
    (`count` rows already there) and the buffer is flushed into `S_pend, b_pend` when full. Working
    factor: with forgetting (`sqrt_gamma < 1`) first `Rₐ ← √γ Rₐ` (so `M ← γM`) and the prior refresh
    `A += refresh_k² e_j e_jᵀ` for `j = refresh_index`, then the sample `M += σ⁻²[φ; y][φ; y]ᵀ`.

    A lazy kernel (`lazy[k] ≠ 0`, no forgetting) skips its factor: its row is in the pending statistics, from
    which its factor is rebuilt when it wakes; its evidence bound grows by the largest log density any prediction
    of it can give the sample, `-½ log(2πσ_k²)` (the predictive variance is at least `σ_k²`).
    """
    n_kernels, f = phi.shape
    count = _stage_row(phi, y, buf, buf_y, s_pend, b_pend, count)
    if count < 0:
        return -1
    for k in range(n_kernels):
        if lazy[k] != 0.0:
            bound[k] += np.log(inv_sigma[k]) - _HALF_LOG_2PI
            continue
        rk = ra[k]
        if sqrt_gamma != 1.0:
            for i in range(f + 1):
                row = rk[i, i:]
                for j in range(f + 1 - i):
                    row[j] *= sqrt_gamma
            for i in range(f + 1):
                work[i] = 0.0
            work[refresh_index] = refresh[k]
            chol_update(rk, work)
        s = inv_sigma[k]
        for i in range(f):
            work[i] = phi[k, i] * s
        work[f] = y * s
        chol_update(rk, work)
    return count


@numba.njit(cache=True)
def learn_batch(
    ra: np.ndarray, s_pend: np.ndarray, b_pend: np.ndarray, buf: np.ndarray, buf_y: np.ndarray, count: int,
    phis: np.ndarray, ys: np.ndarray, sigma: np.ndarray, lam: np.ndarray, n_work: float, sqrt_gamma: float,
    refresh: np.ndarray, refresh_start: int, work: np.ndarray, out_mean: np.ndarray, out_var: np.ndarray,
) -> int:
    """Prequential loop over `T` samples: predict each (Bayesian model average, log weights = each
    kernel's working evidence), record the prediction, then learn it (as :func:`learn_one`).

    `n_work` is the working sample count before the first row; it advances by one per row (decayed by
    `γ` first when forgetting, matching the Python path).
    """
    n_kernels, f = phis.shape[1], phis.shape[2]
    inv_sigma = 1.0 / sigma
    gamma = sqrt_gamma * sqrt_gamma
    logw = np.zeros(n_kernels)
    means = np.empty(n_kernels)
    variances = np.empty(n_kernels)
    eager = np.zeros(n_kernels)  # every kernel updated (the caller wakes lazy ones first)
    j = refresh_start
    for t in range(phis.shape[0]):
        if n_kernels > 1:
            for k in range(n_kernels):
                logw[k] = log_evidence_from_factor(ra[k], n_work, sigma[k], lam[k])
        mu, var = predict_mixture(ra, phis[t], sigma, logw, work, means, variances)
        out_mean[t] = mu
        out_var[t] = var
        count = learn_one(ra, s_pend, b_pend, buf, buf_y, count, phis[t], ys[t], inv_sigma, sqrt_gamma,
                          refresh, j, work, eager, eager)  # (no kernel lazy: the bound is never written)
        n_work = gamma * n_work + 1.0
        if sqrt_gamma != 1.0:
            j = (j + 1) % f
    return count


# ============================================================================ packed client state
# (layout: :mod:`._fedbnr_layout`)


@numba.njit(cache=True, inline="always")
def _block(buf: np.ndarray, i: int, size: int) -> np.ndarray:
    start = int(buf[_H_OFF + i])
    return buf[start:start + size]


@numba.njit(cache=True)
def refresh_log_weights(ra: np.ndarray, n_work: float, sigma: np.ndarray, lam: np.ndarray, logw: np.ndarray,
                        lazy: np.ndarray, bound: np.ndarray, gap: float) -> bool:
    """The kernels' log weights, with lazy kernels (`gap > 0`; docs/algorithms.md §4.5).

    An active kernel's log weight is its evidence (:func:`log_evidence_from_factor`); one more than `2·gap`
    below the best becomes lazy (`lazy = 1`), its `bound` set to that evidence. A lazy kernel's log weight is
    `-inf` (it is left out of the mixture): its evidence is at most `bound` (:func:`learn_one`), so its weight in
    the full mixture is below `exp(bound - best)`; once that is above `exp(-gap)` it is marked to be woken
    (`lazy = 2`) and `True` is returned — the caller rebuilds its factor from the exact statistics."""
    n_kernels = ra.shape[0]
    top = -np.inf
    for j in range(n_kernels):
        if lazy[j] == 0.0:
            logw[j] = log_evidence_from_factor(ra[j], n_work, sigma[j], lam[j])
            top = max(top, logw[j])
    wake = False
    for j in range(n_kernels):
        if lazy[j] == 0.0:
            if gap > 0.0 and logw[j] < top - 2.0 * gap:
                lazy[j] = 1.0
                bound[j] = logw[j]
                logw[j] = -np.inf
        else:
            logw[j] = -np.inf
            if not bound[j] < top - gap:
                lazy[j] = 2.0
                wake = True
    return wake


@numba.njit(cache=True, inline="always")
def _unpack(buf: np.ndarray) -> tuple:
    """Views of the blocks of the packed state (:data:`._layout.BLOCKS`, in that order), shaped."""
    k, f, b, d, nd = int(buf[H_K]), int(buf[H_F]), int(buf[H_B]), int(buf[H_D]), int(buf[H_ND])
    return (_block(buf, 0, k * (f + 1) * (f + 1)).reshape((k, f + 1, f + 1)),  # ra
            _block(buf, 1, k * f * f).reshape((k, f, f)),  # s_pend
            _block(buf, 2, k * f).reshape((k, f)),  # b_pend
            _block(buf, 3, k * f * b).reshape((k, f, b)),  # stage
            _block(buf, 4, b),  # stage_y
            _block(buf, 5, f + 1),  # work
            _block(buf, 6, k * f).reshape((k, f)),  # phi
            _block(buf, 7, k),  # means
            _block(buf, 8, k),  # variances
            _block(buf, 9, k),  # logw
            _block(buf, 10, k),  # sigma
            _block(buf, 11, k),  # inv_sigma
            _block(buf, 12, k),  # lam
            _block(buf, 13, k),  # refresh
            _block(buf, 14, k * f).reshape((k, f)),  # pdiag
            _block(buf, 15, d * nd).reshape((d, nd)),  # wt
            _block(buf, 16, 2 * nd),  # angles
            _block(buf, 17, k),  # lazy
            _block(buf, 18, k))  # bound


@numba.njit(cache=True, inline="always")
def _features_and_weights(buf: np.ndarray, x: np.ndarray, ra: np.ndarray, phi: np.ndarray, logw: np.ndarray,
                          sigma: np.ndarray, lam: np.ndarray, wt: np.ndarray, angles: np.ndarray, lazy: np.ndarray,
                          bound: np.ndarray) -> int:
    """The predictive's prologue: features of `x` into `phi`, the kernels' log weights refreshed when stale.
    Status 0 ok, 1 bad input, 3 a lazy kernel must be woken first (:func:`refresh_log_weights`)."""
    if x.shape[0] != int(buf[H_D]):
        return 1
    if not rff_bias_features(wt, x, angles, phi):
        return 1
    if ra.shape[0] > 1 and buf[H_DIRTY] != 0.0:
        if refresh_log_weights(ra, buf[H_N_WORK], sigma, lam, logw, lazy, bound, buf[H_LAZY_GAP]):
            return 3  # (still dirty: the weights are refreshed again once the kernel is awake)
        buf[H_DIRTY] = 0.0
    return 0


@numba.njit(cache=True)
def packed_predict(buf: np.ndarray, x: np.ndarray) -> tuple[int, float, float]:
    """Features of `x` (RFF + bias maps) into the `phi` block and the predictive, from the
    packed state; refreshes the kernels' log weights first when they are stale. `(status, mean, var)`:
    status 0 ok, 1 bad input, 3 a lazy kernel must be woken first (:func:`refresh_log_weights`)."""
    (ra, _, _, _, _, work, phi, means, variances, logw, sigma, _, lam, _, _, wt, angles, lazy,
     bound) = _unpack(buf)
    status = _features_and_weights(buf, x, ra, phi, logw, sigma, lam, wt, angles, lazy, bound)
    if status != 0:
        return status, 0.0, 0.0
    mu, var = predict_mixture(ra, phi, sigma, logw, work, means, variances)
    return 0, mu, var


@numba.njit(cache=True)
def packed_learn(buf: np.ndarray, y: float) -> bool:
    """Learn the sample whose features are in the `phi` block (as :func:`learn_one`) and do the
    bookkeeping of the running scalars (pending and working `n, q`, the prior diagonal under
    forgetting, the refresh index). `False` (nothing changed) if `y²` or some `φ_i y` is not finite."""
    y2 = y * y
    if not np.isfinite(y2):
        return False
    (ra, s_pend, b_pend, stage, stage_y, work, phi, _, _, _, _, inv_sigma, _, refresh, pdiag, _, _, lazy,
     bound) = _unpack(buf)
    k, f = ra.shape[0], phi.shape[1]
    j = int(buf[H_REFRESH_J])
    sqrt_gamma = buf[H_SQRT_GAMMA]
    staged = learn_one(ra, s_pend, b_pend, stage, stage_y, int(buf[H_STAGED]), phi, y, inv_sigma,
                       sqrt_gamma, refresh, j, work, lazy, bound)
    if staged < 0:
        return False
    buf[H_STAGED] = staged
    buf[H_N_PEND] += 1.0
    buf[H_Q_PEND] += y2
    g = buf[H_GAMMA]
    if g == 1.0:
        buf[H_N_WORK] += 1.0
        buf[H_Q_WORK] += y2
    else:
        buf[H_N_WORK] = g * buf[H_N_WORK] + 1.0
        buf[H_Q_WORK] = g * buf[H_Q_WORK] + y2
        for kk in range(k):
            for i in range(f):
                pdiag[kk, i] *= g
            pdiag[kk, j] += f * (1.0 - g)
        buf[H_REFRESH_J] = (j + 1) % f
    buf[H_DIRTY] = 1.0
    return True


@numba.njit(cache=True)
def packed_step(buf: np.ndarray, x: np.ndarray, y: float) -> tuple[int, float, float]:
    """One prequential step in one call: features of `x`, predictive (returned), then learn `(x, y)`.
    Status 0 ok, 1 bad input `x`, 2 non-finite `y²` or `φy`, 3 a lazy kernel to wake first (nothing learned but
    ok). Without forgetting each kernel's predictive and update are one pass over its factor
    (:func:`predict_update`); the numbers are those of :func:`packed_predict` then :func:`packed_learn`."""
    if not np.isfinite(y * y):
        return 2, 0.0, 0.0
    if buf[H_SQRT_GAMMA] != 1.0:
        status, mu, var = packed_predict(buf, x)
        if status != 0:
            return status, 0.0, 0.0
        if not packed_learn(buf, y):
            return 2, mu, var
        return 0, mu, var
    (ra, s_pend, b_pend, stage, stage_y, work, phi, means, variances, logw, sigma, inv_sigma, lam, _, _, wt,
     angles, lazy, bound) = _unpack(buf)
    k, f = ra.shape[0], phi.shape[1]
    status = _features_and_weights(buf, x, ra, phi, logw, sigma, lam, wt, angles, lazy, bound)
    if status != 0:
        return status, 0.0, 0.0
    staged = _stage_row(phi, y, stage, stage_y, s_pend, b_pend, int(buf[H_STAGED]))  # learn_one's staging
    if staged < 0:
        return 2, 0.0, 0.0
    buf[H_STAGED] = staged
    v = np.empty(f)
    for kk in range(k):
        if k > 1 and lazy[kk] != 0.0:
            bound[kk] += np.log(inv_sigma[kk]) - _HALF_LOG_2PI
            continue
        m, quad = predict_update(ra[kk], phi[kk], y, inv_sigma[kk], v, work)
        means[kk] = m
        variances[kk] = sigma[kk] * sigma[kk] + quad
    mu, var = mix(logw, means, variances)
    y2 = y * y  # packed_learn's bookkeeping (γ = 1)
    buf[H_N_PEND] += 1.0
    buf[H_Q_PEND] += y2
    buf[H_N_WORK] += 1.0
    buf[H_Q_WORK] += y2
    buf[H_DIRTY] = 1.0
    return 0, mu, var


@numba.njit(cache=True)
def packed_learn_predict(buf: np.ndarray, y: float, x: np.ndarray) -> tuple[int, float, float]:
    """:func:`packed_learn` of the sample whose features are in the `phi` block with target `y`, then
    :func:`packed_predict` of `x`, without forgetting: each active kernel's update and prediction are one pass over
    its factor (:func:`update_predict`); the numbers are those of the two calls. Status 0 ok; 1 bad input `x`, 2
    non-finite `y²` or `φy` (nothing changed for either); 3 learned, but a lazy kernel must be woken before the
    prediction (the caller wakes it and calls :func:`packed_predict`)."""
    if not np.isfinite(y * y):
        return 2, 0.0, 0.0
    (ra, s_pend, b_pend, stage, stage_y, work, phi, means, variances, logw, sigma, inv_sigma, lam, _, _, wt,
     angles, lazy, bound) = _unpack(buf)
    k, f = ra.shape[0], phi.shape[1]
    if x.shape[0] != int(buf[H_D]):
        return 1, 0.0, 0.0
    phi_next = np.empty((k, f))
    if not rff_bias_features(wt, x, angles, phi_next):
        return 1, 0.0, 0.0
    staged = _stage_row(phi, y, stage, stage_y, s_pend, b_pend, int(buf[H_STAGED]))  # learn_one's staging
    if staged < 0:
        return 2, 0.0, 0.0
    buf[H_STAGED] = staged
    y2 = y * y  # packed_learn's bookkeeping (γ = 1)
    buf[H_N_PEND] += 1.0
    buf[H_Q_PEND] += y2
    buf[H_N_WORK] += 1.0
    buf[H_Q_WORK] += y2
    v = np.empty(f)
    for kk in range(k):
        if lazy[kk] != 0.0:  # learn_one's lazy kernel; predict_mixture would leave it out
            bound[kk] += np.log(inv_sigma[kk]) - _HALF_LOG_2PI
            continue
        s = inv_sigma[kk]
        for i in range(f):
            work[i] = phi[kk, i] * s
        work[f] = y * s
        m, quad = update_predict(ra[kk], work, phi_next[kk], v)
        means[kk] = m
        variances[kk] = sigma[kk] * sigma[kk] + quad
    for kk in range(k):
        for i in range(f):
            phi[kk, i] = phi_next[kk, i]
    buf[H_DIRTY] = 1.0
    if k > 1:  # _features_and_weights' refresh, on the updated factors
        if refresh_log_weights(ra, buf[H_N_WORK], sigma, lam, logw, lazy, bound, buf[H_LAZY_GAP]):
            return 3, 0.0, 0.0
        buf[H_DIRTY] = 0.0
    mu, var = mix(logw, means, variances)
    return 0, mu, var


@numba.njit(cache=True, fastmath=_FAST)
def evidence_grid(eigvals: np.ndarray, z2: np.ndarray, n: float, q: float, gs: np.ndarray, gl: np.ndarray,
                  out: np.ndarray) -> None:
    """`out[i, j]`: the spectral log evidence (:func:`~.evidence.spectral_log_evidence`) at `log σ = gs[i]`,
    `log λ = gl[j]`, the same sums written with `r = λ²/σ²`:
    `-(n/2)log(2πσ²) - ½Σ log(1 + r e_m) - ½(q - Σ z²_m r/(1 + r e_m))/σ²`.

    The log-determinant takes one `log` per 8 eigenvalues (of the product of their `1 + r e_m`, each ≥ 1, so the
    product cannot underflow; a product that would overflow is summed term by term): the grid search is
    otherwise bound by the `F` logarithms of every point."""
    f = eigvals.shape[0]
    for i in range(gs.shape[0]):
        s2 = np.exp(2.0 * gs[i])
        base = -0.5 * n * np.log(2.0 * np.pi * s2)
        for j in range(gl.shape[0]):
            r = np.exp(2.0 * gl[j]) / s2
            quad = 0.0
            logdet = 0.0
            for m0 in range(0, f, 8):
                m1 = min(m0 + 8, f)
                prod = 1.0
                for m in range(m0, m1):
                    t = 1.0 + r * eigvals[m]
                    prod *= t
                    quad += z2[m] * r / t
                if prod < 1e300:
                    logdet += np.log(prod)
                else:
                    for m in range(m0, m1):
                        logdet += np.log1p(r * eigvals[m])
            out[i, j] = base - 0.5 * logdet - 0.5 * (q - quad) / s2


@numba.njit(cache=True)
def zoom_search(eigvals: np.ndarray, z2: np.ndarray, n: float, q: float, lo: np.ndarray, hi: np.ndarray,
                grid: int, levels: int, log_max_cond: float, best: np.ndarray) -> float:
    """The zooming grid search of :func:`~.evidence.fit_hyperparameters` in one call (the same steps and
    arithmetic as its numpy transcription, no `fastmath`): `levels` lattices of `grid × grid` points
    (:func:`evidence_grid`) over the box `[lo, hi]` of `(log σ, log λ)`, points whose precision's condition
    number would exceed `exp(log_max_cond)` left out, the box shrunk to the best point ± 2 cells. The best
    point goes into `best`; returns its log evidence."""
    box_lo = lo.copy()
    box_hi = hi.copy()
    best[0] = 0.5 * (lo[0] + hi[0])
    best[1] = 0.5 * (lo[1] + hi[1])
    best_val = -np.inf
    gs = np.empty(grid)
    gl = np.empty(grid)
    vals = np.empty((grid, grid))
    log_top = np.log(max(eigvals[eigvals.shape[0] - 1], 1e-300))
    for _ in range(levels):
        for axis in range(2):  # np.linspace: start + k·step, the end point exact
            g = gs if axis == 0 else gl
            step = (box_hi[axis] - box_lo[axis]) / (grid - 1)
            for k in range(grid):
                g[k] = k * step + box_lo[axis]
            g[grid - 1] = box_hi[axis]
        evidence_grid(eigvals, z2, n, q, gs, gl, vals)
        bi, bj, top = 0, 0, -np.inf
        first = True
        for i in range(grid):
            for j in range(grid):
                v = vals[i, j]
                if not (np.isfinite(v) and 2.0 * (gl[j] - gs[i]) + log_top <= log_max_cond):
                    v = -np.inf
                if first or v > top:  # np.argmax: the first maximum
                    bi, bj, top = i, j, v
                    first = False
        if top >= best_val:
            best[0], best[1], best_val = gs[bi], gl[bj], top
        for axis in range(2):
            step = (box_hi[axis] - box_lo[axis]) / (grid - 1)
            box_lo[axis] = max(best[axis] - 2.0 * step, lo[axis])
            box_hi[axis] = min(best[axis] + 2.0 * step, hi[axis])
    return best_val


@numba.njit(cache=True, fastmath=_FAST)
def tridiagonal_terms(diag: np.ndarray, off: np.ndarray, c: np.ndarray, rs: np.ndarray, logdet: np.ndarray,
                      quad: np.ndarray) -> None:
    """For every `r` of `rs`, `log|I + rT|` into `logdet` and `cᵀ(I + rT)⁻¹c` into `quad`, for the symmetric
    tridiagonal `T` (diagonal `diag`, off-diagonal `off`) in `O(F)`: the pivots of `I + rT = L D Lᵀ`
    (`D_1 = 1 + r t_11`, `D_{i+1} = 1 + r t_{i+1,i+1} - (r t_{i,i+1})²/D_i`), `log|I + rT| = Σ log D_i` and, with
    `w = L⁻¹c`, `cᵀ(I + rT)⁻¹c = Σ w_i²/D_i`; `logdet = inf` where a pivot is not positive (`I + rT` not
    positive definite). The recurrence is serial in `i`, so the `r`s run side by side (independent lanes).
    One `log` per 8 pivots, of their product: for a positive semi-definite `T` every pivot lies in
    `[1, 1 + r·e_max]` (between the extreme eigenvalues of `I + rT`), so below a condition number of `10³⁸`
    the product of 8 can neither overflow nor underflow."""
    m = rs.shape[0]
    f = diag.shape[0]
    w = np.empty(m)
    prod = np.ones(m)
    dmin = np.empty(m)
    inv = np.empty(m)  # 1/D_i: one division a pivot
    for k in range(m):
        d0 = 1.0 + rs[k] * diag[0]
        inv[k] = 1.0 / d0
        w[k] = c[0]
        dmin[k] = d0
        logdet[k] = 0.0
        quad[k] = w[k] * w[k] * inv[k]
        prod[k] = d0
    for i in range(1, f):
        ti, ci, oi = diag[i], c[i], off[i - 1]
        for k in range(m):
            e = rs[k] * oi
            ell = e * inv[k]
            dk = 1.0 + rs[k] * ti - ell * e
            wk = ci - ell * w[k]
            ik = 1.0 / dk
            inv[k] = ik
            w[k] = wk
            quad[k] += wk * wk * ik
            prod[k] *= dk
            dmin[k] = min(dmin[k], dk)
        if (i & 7) == 7:
            for k in range(m):
                logdet[k] += np.log(prod[k])
                prod[k] = 1.0
    for k in range(m):
        logdet[k] += np.log(prod[k])
        if not dmin[k] > 0.0:
            logdet[k] = np.inf


@numba.njit(cache=True)
def profile_search(diag: np.ndarray, off: np.ndarray, c: np.ndarray, n: float, q: float, lo: np.ndarray,
                   hi: np.ndarray, grid: int, levels: int, log_max_cond: float, log_top: float,
                   best: np.ndarray) -> float:
    """The evidence maximised over `(log σ, log λ)` in the box `[lo, hi]` as a 1-d search (the profile
    likelihood; :func:`~.evidence.profile_search_reference` is its numpy transcription). With `u = log λ - log σ`,
    `r = e^{2u}` and `S = Q T Qᵀ`, `Qᵀb = c`, the evidence is `-(n/2)log(2πσ²) - ½log|I + rT| - R(u)/(2σ²)` with
    `R(u) = q - r·cᵀ(I + rT)⁻¹c`: concave in `log σ²` for a fixed `u`, so its maximum over the box's `σ` at that
    `u` is `σ² = R/n` clamped to `[max(lo₀, lo₁ - u), min(hi₀, hi₁ - u)]`. The search zooms over `u ∈ [lo₁ - hi₀,
    hi₁ - lo₀]` (`levels` lattices of `grid` points, the interval shrunk to the best ± 2 cells), points whose
    precision's condition number `1 + r·e_max` (`log_top = log e_max`) would exceed `exp(log_max_cond)` or
    where `I + rT` is not positive definite left out. The best `(log σ, log λ)` goes into `best`; returns its
    log evidence (`-inf` and the box's centre if no point qualifies)."""
    u_lo = lo[1] - hi[0]
    u_hi = hi[1] - lo[0]
    box_lo, box_hi = u_lo, u_hi
    best[0] = 0.5 * (lo[0] + hi[0])
    best[1] = 0.5 * (lo[1] + hi[1])
    best_u = 0.5 * (u_lo + u_hi)
    best_val = -np.inf
    log_2pi = np.log(2.0 * np.pi)
    us = np.empty(grid)
    rs = np.empty(grid)
    logdet = np.empty(grid)
    quad = np.empty(grid)
    for _ in range(levels):
        step = (box_hi - box_lo) / (grid - 1)
        for k in range(grid):
            us[k] = box_hi if k == grid - 1 else k * step + box_lo  # np.linspace: the end point exact
            rs[k] = np.exp(2.0 * us[k])
        tridiagonal_terms(diag, off, c, rs, logdet, quad)
        for k in range(grid):
            u = us[k]
            s_lo = max(lo[0], lo[1] - u)
            s_hi = min(hi[0], hi[1] - u)
            if 2.0 * u + log_top > log_max_cond or not np.isfinite(logdet[k]) or s_lo > s_hi:
                continue
            resid = q - rs[k] * quad[k]
            ls = 0.5 * np.log(resid / n) if resid > 0.0 else s_lo
            ls = min(max(ls, s_lo), s_hi)
            v = -0.5 * n * (log_2pi + 2.0 * ls) - 0.5 * logdet[k] - 0.5 * resid / np.exp(2.0 * ls)
            if np.isfinite(v) and v > best_val:
                best_val, best_u = v, u
                best[0], best[1] = ls, ls + u
        box_lo = max(best_u - 2.0 * step, u_lo)
        box_hi = min(best_u + 2.0 * step, u_hi)
    return best_val
