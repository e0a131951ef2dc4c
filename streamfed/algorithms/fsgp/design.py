"""Initial inducing inputs without data: a quasi-random Gaussian design (docs/algorithms.md, "FSGP").

Every agent must start from the same `Z`, and no raw sample may leave a client to choose it (a shared
k-means or a random subset of the data would need one). Agents standardise their inputs, so the inputs
are spread roughly like `N(0, I)`: `Z` is the first `M` points of a Halton sequence (bases: the first `d`
primes, a random shift per axis from the fleet seed — Cranley–Patterson rotation) pushed through the
normal quantile function and scaled by `scale`. That covers the bulk of a standard normal evenly, needs
nothing but the configuration, and the clients' bound then moves `Z` to where the data are.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

__all__ = ["gaussian_design"]


def _primes(k: int) -> list[int]:
    out: list[int] = []
    c = 2
    while len(out) < k:
        if all(c % p for p in out if p * p <= c):
            out.append(c)
        c += 1
    return out


def _radical_inverse(i: int, base: int) -> float:
    f, out = 1.0, 0.0
    while i > 0:
        f /= base
        out += f * (i % base)
        i //= base
    return out


def gaussian_design(m: int, d: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """`M` points in `R^d` spread like `N(0, scale² I)`, a deterministic function of `(M, d, seed)`.

    >>> Z = gaussian_design(16, 2, seed=0)
    >>> Z.shape, bool(np.array_equal(Z, gaussian_design(16, 2, seed=0))), bool(abs(Z.mean()) < 0.5)
    ((16, 2), True, True)
    """
    if m < 1 or d < 1:
        raise ValueError(f"need M >= 1 and d >= 1, got {m}, {d}")
    shift = np.random.default_rng([int(seed), 0x65D]).uniform(size=d)
    nd = NormalDist()
    out = np.empty((m, d))
    for j, base in enumerate(_primes(d)):
        for i in range(m):
            u = (_radical_inverse(i + 1, base) + shift[j]) % 1.0
            out[i, j] = nd.inv_cdf(min(max(u, 1e-6), 1.0 - 1e-6))
    return scale * out
