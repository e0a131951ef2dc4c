"""Numba kernels of the online standardiser (:mod:`streamfed.core.standardise`) for one row: what
`OnlineStandardiser.transform` and `.update` do with numpy, in one compiled call each (a River estimator
standardises every sample twice, and a dozen numpy calls on arrays of a few entries cost more than its model).

Plain IEEE arithmetic in the same order as the numpy code (no `fastmath`): the results are the same bits.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def standardise_row(mean: np.ndarray, m2: np.ndarray, count: int, clip: float, v: np.ndarray,
                    out: np.ndarray) -> None:
    """`out = (v - mean) / scale` within `±clip` (`clip <= 0`: none); `scale` per column as
    `OnlineStandardiser.scale`: the sample standard deviation `√(m2/(count-1))` when `count >= 2` and it is
    `> 0`, else `|mean|`, else 1."""
    for i in range(v.shape[0]):
        s = np.sqrt(m2[i] / (count - 1)) if count >= 2 else 0.0
        if not s > 0.0:
            s = abs(mean[i]) if mean[i] != 0.0 else 1.0
        z = (v[i] - mean[i]) / s
        if clip > 0.0:
            z = min(max(z, -clip), clip)
        out[i] = z


@numba.njit(cache=True)
def welford_row(mean: np.ndarray, m2: np.ndarray, count: int, v: np.ndarray, out_mean: np.ndarray,
                out_m2: np.ndarray) -> bool:
    """Welford's update of `(mean, m2)` after `count` values by the row `v`, into `out_mean, out_m2`;
    `False` (outputs meaningless) if a result is not finite."""
    for i in range(v.shape[0]):
        delta = v[i] - mean[i]
        mu = mean[i] + delta / (count + 1)
        s = m2[i] + delta * (v[i] - mu)
        if not (np.isfinite(mu) and np.isfinite(s)):
            return False
        out_mean[i] = mu
        out_m2[i] = s
    return True
