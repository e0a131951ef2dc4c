"""Numba kernel shared by the paper's baselines (OFSKL, OFMKL-Avg, vM-KOFL, eM-KOFL).

Every baseline computes, for each kernel `p` of its dictionary, the prediction `f_p = θ_pᵀ z_p(x)`,
the regularised loss `ℓ_p = (f_p - y)² + λ‖θ_p‖²` and the plain online-gradient update
`Δ_p = η (2 (f_p - y) z_p + 2 λ θ_p)`; they differ only in which `Δ_p` they upload and how they
combine the `f_p` into a prediction (see `baselines.py`).
"""

from __future__ import annotations

import numba
import numpy as np

from streamfed.core._feature_kernels import rff_transform_into


@numba.njit(cache=True)
def kernel_gradients(
    wt: np.ndarray,  # (d, N*D)
    x: np.ndarray,  # (d,)
    y: float,
    theta: np.ndarray,  # (N, 2D)
    theta_sq: np.ndarray,  # (N,) ‖θ_p‖²
    eta: float,
    lam: float,
    only: int,  # -1: Δ for every kernel; p >= 0: Δ for kernel p only (written to delta[0])
    angles: np.ndarray,  # scratch (2*N*D,)
    z: np.ndarray,  # out (N, 2D)
    f: np.ndarray,  # out (N,)
    loss: np.ndarray,  # out (N,)
    delta: np.ndarray,  # out (N, 2D) or (1, 2D)
) -> bool:
    """Fill `z, f, ℓ, Δ`; return False (outputs unusable) if anything is non-finite."""
    rff_transform_into(wt, x, angles, z)
    n_kernels, dim = z.shape
    chk = 0.0
    for p in range(n_kernels):
        acc = 0.0
        for i in range(dim):
            acc += theta[p, i] * z[p, i]
        f[p] = acc
        e = acc - y
        loss[p] = e * e + lam * theta_sq[p]
        chk += loss[p]
    lo, hi = (0, n_kernels) if only < 0 else (only, only + 1)
    for p in range(lo, hi):
        row = p - lo
        e2 = 2.0 * (f[p] - y)
        for i in range(dim):
            delta[row, i] = eta * (e2 * z[p, i] + 2.0 * lam * theta[p, i])
            chk += delta[row, i]
    return np.isfinite(chk)
