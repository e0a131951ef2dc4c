"""Pólya–Gamma draws `ω ~ PG(1, c)` (Polson, Scott & Windle 2013; pFedGP appendix A.1, eq. 11).

The `polyagamma` package's exact sampler when it is installed (the torch extra brings it); otherwise the
series of eq. 11 truncated after `K` terms with the tail replaced by its mean, so that the mean is still
exact — `E[PG(1, c)] = tanh(c/2) / (2c)` — and only the variance is a little short (by the tail's, below
1e-4 of it for `K = 64`). An agent without the extra can therefore still predict.

>>> import numpy as np
>>> w = sample_pg(np.zeros(20000), np.random.default_rng(0))
>>> bool(abs(w.mean() - 0.25) < 0.01), bool((w > 0).all())
(True, True)
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SERIES_TERMS", "exact_sampler_available", "pg_mean", "sample_pg", "sample_pg_series"]

#: Terms of the truncated series used when the `polyagamma` package is missing.
SERIES_TERMS = 64


def exact_sampler_available() -> bool:
    """Whether the `polyagamma` package (an exact PG sampler) is importable."""
    try:
        import polyagamma  # noqa: F401
    except ImportError:
        return False
    return True


def pg_mean(c: np.ndarray) -> np.ndarray:
    """`E[PG(1, c)] = tanh(c/2) / (2c)`, `1/4` at `c = 0` (float64, elementwise).

    >>> pg_mean(np.array([0.0, 2.0])).round(6).tolist()
    [0.25, 0.190399]
    """
    c = np.abs(np.asarray(c, dtype=np.float64))
    small = c < 1e-6
    safe = np.where(small, 1.0, c)
    return np.where(small, 0.25 - c * c / 48.0, np.tanh(safe / 2.0) / (2.0 * safe))


def sample_pg_series(c: np.ndarray, rng: np.random.Generator, terms: int = SERIES_TERMS) -> np.ndarray:
    """`PG(1, c)` by eq. 11 truncated at `terms` gamma draws, plus the tail's mean (the fallback sampler).

    >>> w = sample_pg_series(np.full(20000, 3.0), np.random.default_rng(1))
    >>> bool(abs(w.mean() - float(pg_mean(np.array(3.0)))) < 0.005)
    True
    """
    c = np.asarray(c, dtype=np.float64)
    k = np.arange(1, int(terms) + 1, dtype=np.float64)
    denom = (k - 0.5) ** 2 + (c[..., None] / (2.0 * math.pi)) ** 2  # (…, K)
    g = rng.standard_gamma(1.0, size=denom.shape)
    head = np.sum(g / denom, axis=-1) / (2.0 * math.pi**2)
    head_mean = np.sum(1.0 / denom, axis=-1) / (2.0 * math.pi**2)
    return head + np.maximum(pg_mean(c) - head_mean, 0.0)


def sample_pg(c: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Independent draws `ω_j ~ PG(1, c_j)`, the shape of `c` (the exact sampler when available). `c` must be
    finite (a `ValueError` otherwise: nothing non-finite is drawn from)."""
    c = np.asarray(c, dtype=np.float64)
    if not np.all(np.isfinite(c)):
        raise ValueError("Pólya–Gamma tilt contains a non-finite value")
    if c.size == 0:
        return np.zeros(c.shape)
    try:
        from polyagamma import random_polyagamma
    except ImportError:
        return sample_pg_series(c, rng)
    out = np.asarray(random_polyagamma(1.0, c.ravel(), random_state=rng), dtype=np.float64)
    return out.reshape(c.shape)
