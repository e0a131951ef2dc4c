"""Numba kernels of FSGP's per-sample path (docs/algorithms.md §6.3).

A client's working posterior under inducing inputs `Z` is kept as the upper Cholesky factor of the
*augmented* matrix (the form of FedBNR's kernels, with the prior precision `C` in place of `λ⁻²I`)

    [ B         σ⁻²r  ]  = RₐᵀRₐ,   Rₐ = [ R  u ]     B = C + σ⁻²P,  C = c(Z, Z) + ε a² I
    [ σ⁻²rᵀ     σ⁻²q  ]                  [ 0  ρ ]

so a sample `(x, y)` with `k = c(Z, x)` adds `σ⁻²[k; y][k; y]ᵀ` and is one rank-one update of `Rₐ`
(`O(M²)`), and the predictive of docs/algorithms.md §6.3 needs two triangular solves:

    v = R⁻ᵀk:      mean = σ⁻² kᵀB⁻¹r = vᵀu,        kᵀB⁻¹k = vᵀv
    w = U_C⁻ᵀk:    kᵀC⁻¹k = wᵀw                       (U_CᵀU_C = C, fixed for a version)
    var = a² + σ² - wᵀw + vᵀv

The sums `P, r, n, q` themselves are not touched per sample: each `[k, y]` row is staged and the rows
are folded into the sums a block at a time by the caller (one matrix product, same sums).
"""

from __future__ import annotations

import numba
import numpy as np

from streamfed.algorithms.fedbnr._kernels import chol_update, solve_rt

__all__ = ["covariance_column", "predictive", "step"]

_FAST = {"reassoc", "contract", "arcp", "nsz"}  # not "nnan"/"ninf": NaN and Inf must stay visible
_S3, _S5 = np.sqrt(3.0), np.sqrt(5.0)


@numba.njit(cache=True, fastmath=_FAST)
def covariance_column(Z: np.ndarray, inv_ls: np.ndarray, a2: float, kind: int, x: np.ndarray,
                      out: np.ndarray) -> bool:
    """`out = c(Z, x)`: `a² g(ρ_i)` with `ρ_i² = Σ_d ((Z_id - x_d)/ℓ_d)²` and `g` the SE (`exp(-ρ²/2)`),
    Matérn 3/2 (`(1+√3ρ)e^{-√3ρ}`) or 5/2 (`(1+√5ρ+5ρ²/3)e^{-√5ρ}`) profile. `False` if `x` is not finite."""
    d = x.shape[0]
    for j in range(d):
        if not np.isfinite(x[j]):
            return False
    for i in range(Z.shape[0]):
        rho2 = 0.0
        for j in range(d):
            t = (Z[i, j] - x[j]) * inv_ls[j]
            rho2 += t * t
        if kind == 0:
            out[i] = a2 * np.exp(-0.5 * rho2)
        else:
            rho = np.sqrt(rho2)
            if kind == 1:
                out[i] = a2 * (1.0 + _S3 * rho) * np.exp(-_S3 * rho)
            else:
                out[i] = a2 * (1.0 + _S5 * rho + (5.0 / 3.0) * rho2) * np.exp(-_S5 * rho)
    return True


@numba.njit(cache=True, fastmath=_FAST)
def step(Z: np.ndarray, inv_ls: np.ndarray, hyp: np.ndarray, kind: int, x: np.ndarray, y: float,
         uc: np.ndarray, ra: np.ndarray, stage: np.ndarray, row: int, predict: int, work: np.ndarray,
         out: np.ndarray) -> int:
    """One sample: (if `predict`) the predictive at `x` into `out = [mean, var]`, then (if `row >= 0`)
    learn `(x, y)`: the rank-one update of `ra` and `[k, y]` staged into `stage[row]`.

    `kind`: :data:`.kernels.KIND_CODES` of the covariance; `hyp = [a², σ², loss]` (`loss`: the running
    squared loss the prediction's error joins); `uc`: the upper factor of `C`; `work`: `3(M+1)` entries.
    Status: 0 done, 1 `x` not finite, 2 `y²`, `k y` or the loss would not be finite (nothing learned in
    1 or 2; in 2 `out` holds the prediction). Without `predict`, the caller predicted and checked the loss.
    """
    m = Z.shape[0]
    a2, s2 = hyp[0], hyp[1]
    k = work[:m]
    v = work[m + 1:2 * m + 2]  # m + 1 entries: it carries the update vector [k; y]/σ later
    w = work[2 * m + 2:3 * m + 2]
    if not covariance_column(Z, inv_ls, a2, kind, x, k):
        return 1
    if predict:
        predictive(ra, uc, k, a2, s2, v, w, out)
        e = out[0] - y
        if row >= 0 and not np.isfinite(hyp[2] + e * e):
            return 2
    if row < 0:
        return 0
    if not np.isfinite(y * y):
        return 2
    for i in range(m):
        if not np.isfinite(k[i] * y):
            return 2
    inv_s = 1.0 / np.sqrt(s2)
    for i in range(m):
        stage[row, i] = k[i]
        v[i] = k[i] * inv_s  # v is free again: the update vector σ⁻¹[k; y] (chol_update destroys it)
    stage[row, m] = y
    v[m] = y * inv_s
    chol_update(ra, v[:m + 1])
    return 0


@numba.njit(cache=True, fastmath=_FAST)
def predictive(ra: np.ndarray, uc: np.ndarray, k: np.ndarray, a2: float, s2: float, v: np.ndarray, w: np.ndarray,
               out: np.ndarray) -> None:
    """`out = [vᵀu, a² + σ² - wᵀw + vᵀv]` with `v = R⁻ᵀk`, `w = U_C⁻ᵀk` (the module's docstring)."""
    m = k.shape[0]
    solve_rt(ra, k, v, m)
    solve_rt(uc, k, w, m)
    mean = 0.0
    quad_b = 0.0
    quad_c = 0.0
    for i in range(m):
        mean += v[i] * ra[i, m]
        quad_b += v[i] * v[i]
        quad_c += w[i] * w[i]
    var = a2 + s2 - quad_c + quad_b
    # c(x,x) - kᵀC⁻¹k >= 0 in exact arithmetic; rounding must not take the variance below σ²
    out[0] = mean
    out[1] = var if var > s2 else s2
