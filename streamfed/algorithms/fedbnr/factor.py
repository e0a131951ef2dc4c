"""A FedBNR client's working posterior as the augmented Cholesky factor, to and from statistics
(docs/algorithms.md §4.3). Per kernel the working posterior is the upper factor `Rₐ` of the augmented
precision

    M = [ A   h ]  = RₐᵀRₐ,    Rₐ = [ R  u ],    A = σ⁻²S + λ⁻² diag(P),  h = σ⁻²b,  c = σ⁻²q
        [ hᵀ  c ]                  [ 0  ρ ]

(`P = 1` without forgetting). A sample is one rank-one update of `Rₐ` (the compiled kernels); here are the
`O(F³)` steps around them: the factor of given statistics (on a new global), the statistics back from a
factor (with forgetting: the decayed ones) and one kernel's posterior.

>>> s, b = np.array([[[2.0]]]), np.array([[1.0]])
>>> ra = factorise(s, b, 1.0, np.ones(1), np.ones(1), np.ones((1, 1)))
>>> s2, b2 = stats_from_factor(ra, np.ones(1), np.ones(1), np.ones((1, 1)))
>>> bool(np.allclose(s2, s) and np.allclose(b2, b)), posterior_of_factor(ra[0])
(True, (array([0.33333333]), array([[0.33333333]])))
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import lapack

from streamfed.algorithms.fedbnr._compiled import kern

__all__ = ["factorise", "posterior_of_factor", "stats_from_factor"]


def factorise(s_mat: np.ndarray, b: np.ndarray, q: float, sigma: np.ndarray, lam: np.ndarray,
              pdiag: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The factors `Rₐ (K, F+1, F+1)` of statistics `(S (K,F,F), b (K,F), q)` at `σ, λ (K,)` with the prior
    precision `λ⁻² diag(P)`, `P = pdiag (K, F)`: `O(F³)` per kernel. `ValueError` for a precision that is
    not positive definite or a factor that is not finite. With `out`, written there (and returned) once every
    kernel's factor is made — nothing is written on a failure; kernel by kernel, so no `(K, F+1, F+1)`
    temporary is allocated (fresh pages of that size cost more than the Cholesky factors at F ~ 100)."""
    kk, f = pdiag.shape
    work = np.empty(f + 1)
    factors = []
    for k in range(kk):
        s2 = sigma[k] ** 2
        a = s_mat[k] / s2
        np.einsum("ii->i", a)[...] += pdiag[k] / lam[k] ** 2  # (the diagonal as a view: no index arrays)
        # LAPACK's Cholesky on the transpose (Fortran order, the same symmetric matrix: no copy), lower: in C order
        # its result is the upper factor R itself, the other triangle zeroed (`clean`)
        chol, info = lapack.dpotrf(a.T, lower=1, clean=1, overwrite_a=1)
        if info != 0:
            raise ValueError("working precision is not positive definite (corrupted or noisy statistics?)")
        rk = np.empty((f + 1, f + 1))
        rk[:f, :f] = chol.T
        rk[f, :f] = 0.0
        h = work  # h = σ⁻²b, then u = R⁻ᵀh in place
        np.divide(b[k], s2, out=h[:f])
        kern.solve_rt(rk, h, work, f)  # u = R⁻ᵀh
        rk[:f, f] = work[:f]
        rho2 = q / s2 - work[:f] @ work[:f]
        rk[f, f] = math.sqrt(max(rho2, 0.0))  # ≥ 0 mathematically; clip rounding
        if not kern.all_finite(rk.reshape(-1)):
            raise ValueError("refactorisation produced a non-finite factor")
        factors.append(rk)
    if out is None:
        return np.array(factors).reshape((kk, f + 1, f + 1))
    for k in range(kk):
        out[k] = factors[k]
    return out


def stats_from_factor(ra: np.ndarray, sigma: np.ndarray, lam: np.ndarray,
                      pdiag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(S (K,F,F), b (K,F))` behind factors `Rₐ`: `σ²(A - λ⁻² diag(P))` and `σ²h`."""
    f = pdiag.shape[1]
    m = np.matmul(np.swapaxes(ra, 1, 2), ra)  # M = RₐᵀRₐ
    s2 = (sigma**2)[:, None]
    prior = pdiag / (lam**2)[:, None]
    s = m[:, :f, :f].copy()
    s[:, np.arange(f), np.arange(f)] -= prior
    return s * s2[:, :, None], m[:, :f, f] * s2


def posterior_of_factor(ra: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean `m = σ⁻²A⁻¹b = R⁻¹u` and covariance `A⁻¹ = R⁻¹R⁻ᵀ` of one kernel's weights from its
    factor `Rₐ (F+1, F+1)` (`O(F³)`)."""
    f = ra.shape[0] - 1
    r = ra[:f, :f]
    u = ra[:f, f]
    r_inv = np.linalg.solve(r, np.eye(f))
    return r_inv @ u, r_inv @ r_inv.T
