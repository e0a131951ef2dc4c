"""Numba kernels of the random Fourier feature map (docs/algorithms.md §2); the classes that use them
are in :mod:`streamfed.core.features`, which gets them through :mod:`streamfed.core.compiled` (ahead-of-time
build or numba's JIT)."""

from __future__ import annotations

import numba
import numpy as np

from streamfed.core.numerics import SINCOS_FAST_LIMIT, sincos_scaled


@numba.njit(cache=True, error_model="numpy")
def rff_sincos_flat(wt: np.ndarray, x: np.ndarray, scale: float, angle_bound: float, sines: np.ndarray,
                    cosines: np.ndarray) -> None:
    """All kernels' features of one sample, flat: for `j = p·D + i` (kernel `p`, frequency `i`),
    `sines[j] = scale·sin(a_j)` and `cosines[j] = scale·cos(a_j)` with `a = V x` and `scale = D^{-1/2}`,
    i.e. `z_p(x) = [sines[pD : pD+D], cosines[pD : pD+D]]`.

    `wt` is the frequency tensor laid out `(d, N*D)`, so every loop below runs over contiguous
    frequencies and vectorises. `sines` doubles as the scratch of the angles. `angle_bound` is
    `max_j Σ_k |V_jk|` (:attr:`RFFBank.angle_bound`) or `inf` if unknown: when it proves every
    `|a_j| <= SINCOS_FAST_LIMIT`, the angles are not checked one by one.
    """
    d, nd = wt.shape
    # numba does not check bounds: a short buffer would be silent memory corruption
    if d < 1 or x.shape[0] < d or sines.shape[0] < nd or cosines.shape[0] < nd:
        raise ValueError("rff_sincos_flat: x must hold d >= 1 values, sines and cosines N*D each")
    # a_j = Σ_k V_jk x_k, summed in k order (the plain left-to-right sum, bit for bit), four input
    # coordinates per pass so each angle is loaded and stored ~d/4 times instead of d times.
    x0 = x[0]
    x_max = abs(x0)
    for j in range(nd):
        sines[j] = wt[0, j] * x0
    k = 1
    while k + 4 <= d:
        x0, x1, x2, x3 = x[k], x[k + 1], x[k + 2], x[k + 3]
        x_max = max(x_max, abs(x0), abs(x1), abs(x2), abs(x3))
        for j in range(nd):
            sines[j] = (((sines[j] + wt[k, j] * x0) + wt[k + 1, j] * x1) + wt[k + 2, j] * x2) + wt[k + 3, j] * x3
        k += 4
    while k < d:
        xk = x[k]
        x_max = max(x_max, abs(xk))
        for j in range(nd):
            sines[j] += wt[k, j] * xk
        k += 1
    # |a_j| <= Σ_k |V_jk| |x_k| <= angle_bound · max|x|. (The reduction is exact up to |a| ~ 1.6e6, far
    # beyond the limit, so the rounding of this bound does not matter.)
    if angle_bound * x_max <= SINCOS_FAST_LIMIT:
        # One long loop over all N*D angles (vectorises far better than N short ones).
        for j in range(nd):
            sines[j], cosines[j] = sincos_scaled(sines[j], scale)
        return
    big = False
    for j in range(nd):
        a = sines[j]
        big |= abs(a) > SINCOS_FAST_LIMIT
        sines[j], cosines[j] = sincos_scaled(a, scale)
    if big:  # rare: heavy-tailed (Cauchy, Student-t) frequencies; libm for the large angles
        for j in range(nd):
            a = 0.0
            for k in range(d):  # the same sum as above, in the same order
                a += wt[k, j] * x[k]
            if abs(a) > SINCOS_FAST_LIMIT:
                sines[j] = scale * np.sin(a)
                cosines[j] = scale * np.cos(a)


@numba.njit(cache=True)
def rff_transform_into(wt: np.ndarray, x: np.ndarray, angles: np.ndarray, out: np.ndarray) -> None:
    """All kernels' features of one sample as rows: `out[p] = z_p(x)`, shape `(N, 2D)`.

    `wt` as in :func:`rff_sincos_flat`, `angles` a scratch of `2·N*D` (sines, then cosines).
    """
    d, nd = wt.shape
    n_kernels = out.shape[0]
    n_feat = out.shape[1] // 2
    if angles.shape[0] < 2 * nd or x.shape[0] < d or n_kernels * n_feat != nd:
        raise ValueError("rff_transform_into: scratch must hold 2*N*D values, x d values, out (N, 2D)")
    sines = angles[:nd]
    cosines = angles[nd : 2 * nd]
    rff_sincos_flat(wt, x, 1.0 / np.sqrt(n_feat), np.inf, sines, cosines)
    for p in range(n_kernels):
        base = p * n_feat
        for i in range(n_feat):
            out[p, i] = sines[base + i]
            out[p, n_feat + i] = cosines[base + i]


@numba.njit(cache=True)
def rff_transform_many(wt: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """`rff_transform_into` for each row of `xs` (`(T, d)` → `out` `(T, N, 2D)`)."""
    angles = np.empty(2 * wt.shape[1])
    for t in range(xs.shape[0]):
        rff_transform_into(wt, xs[t], angles, out[t])
