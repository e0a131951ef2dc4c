"""Numba kernel of one POF-MKL client step (ALGORITHMS.md section 2, steps 1-4).

Written to be read against the equations: each block is labelled with the step it implements.
The step is transactional: every result goes to scratch buffers first and the persistent state
(log-weights, loss accumulators) is written only after everything has been checked finite, so a bad
sample never corrupts the model.
"""

from __future__ import annotations

import numba
import numpy as np

from ..features import rff_transform_into

STEP_OK = 0
STEP_BAD_INPUT = 1
STEP_BAD_LABEL = 2
STEP_NON_FINITE = 3


@numba.njit(cache=True)
def pofmkl_predict(
    wt: np.ndarray,  # (d, N*D) frequencies, see features.rff_transform_into
    x: np.ndarray,  # (d,)
    theta: np.ndarray,  # (N, 2D) global parameters
    logw: np.ndarray,  # (N,) personal log-weights
    angles: np.ndarray,  # scratch (N*D,)
    z: np.ndarray,  # out (N, 2D) features
    f: np.ndarray,  # out (N,) per-kernel predictions
    wbar: np.ndarray,  # out (N,) normalised weights
) -> float:
    """Step 1 (eq. 6): features, per-kernel predictions `f_p = θ_pᵀ z_p(x)`, `ŷ = Σ w̄_p f_p`."""
    rff_transform_into(wt, x, angles, z)
    n_kernels, dim = z.shape
    for p in range(n_kernels):
        acc = 0.0
        for i in range(dim):
            acc += theta[p, i] * z[p, i]
        f[p] = acc
    # w̄ = w / Σ w computed from log-weights: subtract the max so exp never overflows or all-underflows
    m = logw.max()
    tot = 0.0
    for p in range(n_kernels):
        wbar[p] = np.exp(logw[p] - m)
        tot += wbar[p]
    yhat = 0.0
    for p in range(n_kernels):
        wbar[p] /= tot
        yhat += wbar[p] * f[p]
    return yhat


@numba.njit(cache=True)
def pofmkl_step(
    wt: np.ndarray,  # (d, N*D)
    x: np.ndarray,  # (d,)
    y: float,
    theta: np.ndarray,  # (N, 2D) global parameters (read only here)
    logw: np.ndarray,  # (N,) personal log-weights (updated on success)
    eta: float,
    lam: float,
    xi: float,
    bin_size: int,  # M
    u: float,  # uniform draw in [0, 1) for the bin choice
    acc: np.ndarray,  # (4 + 2N,) loss accumulators (updated on success), layout in pofmkl.py
    angles: np.ndarray,  # scratch (N*D,)
    z: np.ndarray,  # scratch (N, 2D)
    f: np.ndarray,  # scratch (N,)
    wbar: np.ndarray,  # scratch (N,)
    loss: np.ndarray,  # scratch (N,)
    order: np.ndarray,  # scratch (N,) int64
    sel: np.ndarray,  # out (M,) int64: selected kernels
    delta: np.ndarray,  # out (M, 2D): their updates Δ
    out: np.ndarray,  # out (2,): [ŷ, q_J]
) -> tuple[int, int]:
    """Steps 1-4 for one sample. Returns `(status, number of selected kernels)`."""
    n_kernels, dim = z.shape
    for k in range(x.shape[0]):
        if not np.isfinite(x[k]):
            return STEP_BAD_INPUT, 0
    if not np.isfinite(y):
        return STEP_BAD_LABEL, 0

    # Step 1 (eq. 6): predict with the weights before this step's update.
    yhat = pofmkl_predict(wt, x, theta, logw, angles, z, f, wbar)

    # Step 2 (eq. 8): sort kernels by weight, decreasing (stable: ties keep index order), cut into
    # B = ⌈N/M⌉ bins, q_j = (1-ξ) u_j + ξ/B, draw J by inverse CDF of the uniform `u`.
    if xi < 1.0:
        neg = np.empty(n_kernels)
        for p in range(n_kernels):
            neg[p] = -logw[p]
        order[:] = np.argsort(neg, kind="mergesort")
    else:
        for p in range(n_kernels):
            order[p] = p
    n_bins = (n_kernels + bin_size - 1) // bin_size
    cum = 0.0
    chosen = -1
    q_chosen = 0.0
    last_positive = 0
    q_last_positive = 0.0
    for j in range(n_bins):
        mass = 0.0
        for r in range(j * bin_size, min((j + 1) * bin_size, n_kernels)):
            mass += wbar[order[r]]
        q = (1.0 - xi) * mass + xi / n_bins
        if q > 0.0:
            last_positive = j
            q_last_positive = q
        cum += q
        if chosen < 0 and u < cum:
            chosen = j
            q_chosen = q
    if chosen < 0:  # u beyond the rounded total: take the last bin that has probability
        chosen = last_positive
        q_chosen = q_last_positive
    first = chosen * bin_size
    n_sel = min(first + bin_size, n_kernels) - first

    # Step 3 (eq. 7): ℓ_p = (f_p - y)² + λ‖θ_p‖²; log w_p ← log w_p - η ℓ_p (all kernels).
    for p in range(n_kernels):
        nrm = 0.0
        for i in range(dim):
            nrm += theta[p, i] * theta[p, i]
        e = f[p] - y
        loss[p] = e * e + lam * nrm

    # Step 4 (eq. 9): Δ_p = (η / q_J) (2 (f_p - y) z_p + 2 λ θ_p) for the selected bin only.
    g = eta / q_chosen
    for s in range(n_sel):
        p = order[first + s]
        sel[s] = p
        e2 = 2.0 * (f[p] - y)
        for i in range(dim):
            delta[s, i] = g * (e2 * z[p, i] + 2.0 * lam * theta[p, i])

    # Check everything before committing anything.
    ok = np.isfinite(yhat) and np.isfinite(q_chosen) and q_chosen > 0.0
    for p in range(n_kernels):
        ok = ok and np.isfinite(loss[p])
    for s in range(n_sel):
        for i in range(dim):
            ok = ok and np.isfinite(delta[s, i])
    if not ok:
        return STEP_NON_FINITE, 0

    # Commit: weights (renormalised so the largest log-weight is 0; w̄ is unchanged by this) and
    # the regret accumulators [Σ(ŷ-y)², Σ Σ_p w̄_p ℓ_p, steps, spare, Σ(f_p-y)² (N), Σ ℓ_p (N)].
    mx = -np.inf
    for p in range(n_kernels):
        logw[p] -= eta * loss[p]
        if logw[p] > mx:
            mx = logw[p]
    mixed = 0.0
    for p in range(n_kernels):
        logw[p] -= mx
        e = f[p] - y
        acc[4 + p] += e * e
        acc[4 + n_kernels + p] += loss[p]
        mixed += wbar[p] * loss[p]
    e = yhat - y
    acc[0] += e * e
    acc[1] += mixed
    acc[2] += 1.0
    out[0] = yhat
    out[1] = q_chosen
    return STEP_OK, n_sel


@numba.njit(cache=True)
def apply_kernel_deltas(theta: np.ndarray, sel: np.ndarray, delta: np.ndarray, scale: float) -> None:
    """`θ_p ← θ_p - scale · Δ_p` for each selected kernel (eq. 10 with scale = 1/|C_t|)."""
    dim = theta.shape[1]
    for s in range(sel.shape[0]):
        p = sel[s]
        for i in range(dim):
            theta[p, i] -= scale * delta[s, i]
