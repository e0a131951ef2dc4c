"""The compiled loop of causal standardisation (:func:`.normalise.online_standardise_rows`), in its own module so
that a process which never standardises a whole stream (a replay with the paper's constants) never imports numba."""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["past_standardise"]


@numba.njit(cache=True)
def past_standardise(v: np.ndarray, warmup: int, z: np.ndarray, offset: np.ndarray,
                      scale: np.ndarray, refused: np.ndarray) -> None:
    """Row `t` of `z` from the Welford statistics of the rows before `t` that were folded in; the first
    `warmup` folded rows are NaN. A row whose fold (or transform) would not be finite in some column — a
    value whose square overflows, like 1e300 — is refused as a whole: NaN in `z`, `refused[t]` set, the
    statistics unchanged (else one absurd cell would make that column's scale infinite and every later
    value of it 0)."""
    T, d = v.shape
    mean = np.zeros(d)
    m2 = np.zeros(d)
    new_mean = np.zeros(d)
    new_m2 = np.zeros(d)
    k = 0  # rows folded in so far
    for t in range(T):
        ok = True
        for j in range(d):
            delta = v[t, j] - mean[j]
            new_mean[j] = mean[j] + delta / (k + 1)
            new_m2[j] = m2[j] + delta * (v[t, j] - new_mean[j])
            if not (math.isfinite(new_mean[j]) and math.isfinite(new_m2[j])):
                ok = False
            if k >= warmup:
                s = math.sqrt(m2[j] / (k - 1)) if k >= 2 else 0.0
                if not s > 0.0:
                    s = abs(mean[j]) if mean[j] != 0.0 else 1.0
                offset[t, j] = mean[j]
                scale[t, j] = s
                z[t, j] = (v[t, j] - mean[j]) / s
                if not math.isfinite(z[t, j]):
                    ok = False
            else:
                z[t, j] = np.nan
                offset[t, j] = np.nan
                scale[t, j] = np.nan
        refused[t] = not ok
        if not ok:
            for j in range(d):
                z[t, j] = np.nan
            continue
        # fold sample t in only after it has been transformed
        for j in range(d):
            mean[j] = new_mean[j]
            m2[j] = new_m2[j]
        k += 1
