"""Numba kernel of one POF-MKL client step (docs/algorithms.md §3.2, steps 1-4).

Written to be read against the equations: each block is labelled with the step it implements.
The step is transactional: every result goes to scratch buffers first and the persistent state
(log-weights, loss accumulators, the draw counter) is written only after everything has been checked
finite, so a bad sample never corrupts the model.

Features are kept flat (see :func:`streamfed.core.features.rff_sincos_flat`): kernel `p`'s features are
`z_p = [S[pD : pD+D], C[pD : pD+D]]` with `S`, `C` the scaled sines and cosines of all `N·D` angles,
so `θ_pᵀ z_p = θ_p[:D]·S_p + θ_p[D:]·C_p` and no `(N, 2D)` copy of the features is ever made.
"""

from __future__ import annotations

import numba
import numpy as np

from streamfed.algorithms.pofmkl._layout import (
    _I_HEADER,
    LOSS_CAP,
    N_DRAWS,
    STEP_BAD_INPUT,
    STEP_BAD_LABEL,
    STEP_BAD_SHAPE,
    STEP_CAP,
    STEP_NEED_DRAWS,
    STEP_NON_FINITE,
    STEP_OK,
)
from streamfed.core._feature_kernels import rff_sincos_flat


@numba.njit(cache=True, fastmath={"reassoc"})
def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """`aᵀb`. `reassoc` (and nothing else) lets LLVM sum in SIMD lanes: only the rounding of the sum
    changes (same error bound as any summation order), no NaN/Inf/sign assumption is made."""
    acc = 0.0
    for i in range(a.shape[0]):
        acc += a[i] * b[i]
    return acc


@numba.njit(cache=True, error_model="numpy")
def pofmkl_predict(
    wt: np.ndarray,  # (d, N*D) frequencies, see features.rff_sincos_flat
    x: np.ndarray,  # (d,)
    theta: np.ndarray,  # (N, 2D) global parameters
    logw: np.ndarray,  # (N,) personal log-weights
    sines: np.ndarray,  # out (N*D,) scaled sines, flat
    cosines: np.ndarray,  # out (N*D,) scaled cosines, flat
    f: np.ndarray,  # out (N,) per-kernel predictions
    wbar: np.ndarray,  # out (N,) normalised weights
    angle_bound: float,  # max_j Σ_k |V_jk| (RFFBank.angle_bound), or inf
) -> float:
    """Step 1 (eq. 6): features, per-kernel predictions `f_p = θ_pᵀ z_p(x)`, `ŷ = Σ w̄_p f_p`."""
    n_kernels = theta.shape[0]
    n_feat = theta.shape[1] // 2
    rff_sincos_flat(wt, x, 1.0 / np.sqrt(n_feat), angle_bound, sines, cosines)
    for p in range(n_kernels):  # f_p = θ_pᵀ z_p = θ_p[:D]·sin(V_p x)/√D + θ_p[D:]·cos(V_p x)/√D
        b = p * n_feat
        f[p] = _dot(theta[p, :n_feat], sines[b : b + n_feat]) + _dot(theta[p, n_feat:], cosines[b : b + n_feat])
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
def _sort_by_weight(logw: np.ndarray, order: np.ndarray) -> None:
    """Sort `order` by decreasing weight, ties by kernel index (a total order, so the result is the
    same as any stable sort of the weights). Insertion sort starting from the previous step's order:
    weights move little between steps, so the list is nearly sorted and this costs ~O(N)."""
    n = order.shape[0]
    for i in range(1, n):
        p = order[i]
        j = i - 1
        while j >= 0 and (logw[order[j]] < logw[p] or (logw[order[j]] == logw[p] and order[j] > p)):
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = p


@numba.njit(cache=True, error_model="numpy")
def pofmkl_step(
    wt: np.ndarray,  # (d, N*D) frequencies, see features.rff_sincos_flat
    x: np.ndarray,  # (d,)
    y: float,
    u: float,  # uniform draw in [0, 1) for the bin choice
    theta: np.ndarray,  # (N, 2D) global parameters (read only here)
    theta_sq: np.ndarray,  # (N,) ‖θ_p‖², cached with θ
    logw: np.ndarray,  # (N,) personal log-weights (updated on success)
    acc: np.ndarray,  # (4 + 2N,) loss accumulators (updated on success), layout in pofmkl.py
    hyper: np.ndarray,  # [η, λ, ξ, max_j Σ_k |V_jk|]
    bin_size: int,  # M
    scratch: np.ndarray,  # (2*N*D + 3N,) floats: sines, cosines, f, w̄, ℓ
    order: np.ndarray,  # (N,) int64 kernel order, kept between steps (warm start for the sort)
    sel: np.ndarray,  # out (M,) int64: selected kernels
    delta: np.ndarray,  # out (M, 2D): their updates Δ
) -> tuple[int, int, float, float]:
    """Steps 1-4 for one sample. Returns `(status, number of selected kernels, ŷ, q_J)`."""
    n_kernels, dim = theta.shape
    n_feat = dim // 2
    nd = n_kernels * n_feat
    eta, lam, xi = hyper[0], hyper[1], hyper[2]
    sines = scratch[:nd]
    cosines = scratch[nd : 2 * nd]
    f = scratch[2 * nd : 2 * nd + n_kernels]
    wbar = scratch[2 * nd + n_kernels : 2 * nd + 2 * n_kernels]
    loss = scratch[2 * nd + 2 * n_kernels : 2 * nd + 3 * n_kernels]
    if x.shape[0] != wt.shape[0]:
        return STEP_BAD_SHAPE, 0, 0.0, 0.0
    chk = 0.0
    for k in range(x.shape[0]):
        chk += x[k]
    if not np.isfinite(chk):
        return STEP_BAD_INPUT, 0, 0.0, 0.0
    if not np.isfinite(y):
        return STEP_BAD_LABEL, 0, 0.0, 0.0

    # Step 1 (eq. 6): predict with the weights before this step's update.
    yhat = pofmkl_predict(wt, x, theta, logw, sines, cosines, f, wbar, hyper[3])

    # Step 2 (eq. 8): sort kernels by weight, decreasing (ties by index), cut into B = ⌈N/M⌉ bins,
    # q_j = (1-ξ) u_j + ξ/B with u_j the bin's weight mass; draw J by inverse CDF of `u`.
    # With ξ = 1 every bin has probability 1/B, so no sort is needed: bins follow index order.
    if xi < 1.0:
        _sort_by_weight(logw, order)
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

    # Step 3 (eq. 7): ℓ_p = (f_p - y)² + λ‖θ_p‖² (applied to log w below, after the checks). A kernel
    # whose loss overflows (or exceeds LOSS_CAP) is counted and takes LOSS_CAP: its weight goes to ~0
    # and the step goes on. The ensemble's own error must be finite, else the label is unusable.
    n_over = 0
    for p in range(n_kernels):
        e = f[p] - y
        lp = e * e + lam * theta_sq[p]
        if not lp <= LOSS_CAP:  # also catches inf and NaN
            lp = LOSS_CAP
            n_over += 1
        loss[p] = lp
        chk += eta * lp
    e = yhat - y
    chk += e * e

    # Step 4 (eq. 9): Δ_p = (η / q_J) (2 (f_p - y) z_p + 2 λ θ_p) for the selected bin only,
    # with z_p = [S_p, C_p] (module doc), the step η/q_J capped at STEP_CAP (no overshoot, no divergence).
    g = min(eta / q_chosen, STEP_CAP)
    finite = True
    for s in range(n_sel):
        p = order[first + s]
        sel[s] = p
        e2 = 2.0 * (f[p] - y)
        b = p * n_feat
        for i in range(n_feat):
            v = g * (e2 * sines[b + i] + 2.0 * lam * theta[p, i])
            delta[s, i] = v
            finite &= abs(v) < np.inf  # False for ±inf and NaN
        for i in range(n_feat):
            v = g * (e2 * cosines[b + i] + 2.0 * lam * theta[p, n_feat + i])
            delta[s, n_feat + i] = v
            finite &= abs(v) < np.inf

    # Check before committing anything (a NaN or an overflow anywhere makes the sum non-finite).
    if not (finite and np.isfinite(chk) and np.isfinite(yhat) and q_chosen > 0.0):
        return STEP_NON_FINITE, 0, 0.0, 0.0

    # Commit: log w_p ← log w_p - η ℓ_p, renormalised so the largest is 0 (w̄ is unchanged by that),
    # and the regret accumulators [Σ(ŷ-y)², Σ Σ_p w̄_p ℓ_p, steps, kernel overflows, Σ(f_p-y)² (N), Σ ℓ_p (N)].
    mx = -np.inf
    for p in range(n_kernels):
        logw[p] -= eta * loss[p]
        if logw[p] > mx:
            mx = logw[p]
    mixed = 0.0
    for p in range(n_kernels):
        logw[p] -= mx
        e = f[p] - y
        acc[4 + p] += min(e * e, LOSS_CAP)  # an overflowed kernel's loss, as in step 3
        acc[4 + n_kernels + p] += loss[p]
        mixed += wbar[p] * loss[p]
    e = yhat - y
    acc[0] += e * e
    acc[1] += mixed
    acc[2] += 1.0
    acc[3] += n_over
    return STEP_OK, n_sel, yhat, q_chosen


@numba.njit(cache=True, error_model="numpy")
def pofmkl_step_packed(wt: np.ndarray, x: np.ndarray, y: float, state: np.ndarray, ints: np.ndarray
                       ) -> tuple[int, int, float]:
    """:func:`pofmkl_step` on the views of the two buffers of a client (float layout:
    :func:`packed_layout`; ints: `[N, D, M, order, selected]`), consuming the next uniform draw.
    Returns `(status, n_sel, ŷ)`; the upload is in `ints[3+N : 3+N+n_sel]` and the `delta` rows."""
    n, n_feat, m = ints[0], ints[1], ints[2]
    dim = 2 * n_feat
    o = 0
    hyper = state[o : o + 4]
    o += 4
    draws_at = o
    o += 1 + N_DRAWS
    theta = state[o : o + n * dim].reshape((n, dim))
    o += n * dim
    theta_sq = state[o : o + n]
    o += n
    logw = state[o : o + n]
    o += n
    acc = state[o : o + 4 + 2 * n]
    o += 4 + 2 * n
    scratch = state[o : o + 2 * n * n_feat + 3 * n]
    o += 2 * n * n_feat + 3 * n
    delta = state[o : o + m * dim].reshape((m, dim))
    o += m * dim
    # numba does not check bounds: buffers that do not match the frequencies would corrupt memory
    if o != state.shape[0] or ints.shape[0] != _I_HEADER + n + m or wt.shape[1] != n * n_feat:
        raise ValueError("pofmkl_step_packed: the buffers do not match packed_layout and the frequencies")
    order = ints[_I_HEADER : _I_HEADER + n]
    sel = ints[_I_HEADER + n : _I_HEADER + n + m]
    n_used = int(state[draws_at])
    if n_used >= N_DRAWS:
        return STEP_NEED_DRAWS, 0, 0.0
    u = state[draws_at + 1 + n_used]
    status, n_sel, yhat, _ = pofmkl_step(wt, x, y, u, theta, theta_sq, logw, acc, hyper, m, scratch, order, sel,
                                         delta)
    if status == STEP_OK:
        state[draws_at] = n_used + 1  # the draw is consumed only by a step that happened
    return status, n_sel, yhat


@numba.njit(cache=True)
def apply_kernel_deltas(theta: np.ndarray, sel: np.ndarray, delta: np.ndarray, scale: float) -> None:
    """`θ_p ← θ_p - scale · Δ_p` for each selected kernel (eq. 10 with scale = 1/|C_t|)."""
    dim = theta.shape[1]
    for s in range(sel.shape[0]):
        p = sel[s]
        for i in range(dim):
            theta[p, i] -= scale * delta[s, i]


@numba.njit(cache=True)
def accumulate_checked(total: np.ndarray, kernels: np.ndarray, delta: np.ndarray) -> int:
    """`total[k_s] += delta[s]` after checking indices (in range, distinct) and finiteness.

    Returns 0 on success, 1 for a bad or repeated kernel index, 2 for a non-finite value; on failure
    `total` is untouched.
    """
    n = total.shape[0]
    m = kernels.shape[0]
    for s in range(m):
        k = kernels[s]
        if k < 0 or k >= n:
            return 1
        for r in range(s):
            if kernels[r] == k:
                return 1
    chk = 0.0
    for s in range(m):
        for i in range(delta.shape[1]):
            chk += delta[s, i]
    if not np.isfinite(chk):
        return 2
    for s in range(m):
        k = kernels[s]
        for i in range(delta.shape[1]):
            total[k, i] += delta[s, i]
    return 0


@numba.njit(cache=True)
def row_sq_norms(theta: np.ndarray, out: np.ndarray) -> bool:
    """`out[p] = ‖θ_p‖²`; returns False if θ has a non-finite value."""
    chk = 0.0
    for p in range(theta.shape[0]):
        acc = 0.0
        for i in range(theta.shape[1]):
            acc += theta[p, i] * theta[p, i]
            chk += theta[p, i]
        out[p] = acc
    return np.isfinite(chk)
