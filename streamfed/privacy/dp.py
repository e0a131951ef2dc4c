"""Differential privacy of one upload: per-sample clipping and the Gaussian mechanism (docs/privacy.md).

**Clipping.** Summing learners (FedBNR, FSGP) need no gradient clipping: their features are bounded
(`‖φ‖² <= P`, `P = 1` for random Fourier features, `2` with FedBNR's bias feature) and the label is
clipped to `|y| <= C_y`. One sample added to or removed from an upload of `K` kernels then moves the
noised part of it, `(S_upper, b, q)`, by at most (:func:`stats_sensitivity`)

    Δ₂ = sqrt( K·(P² + P·C_y²) + C_y⁴ )        (‖upper(φφᵀ)‖ <= ‖φφᵀ‖_F = ‖φ‖², ‖φy‖ <= √P·C_y)

and the count `n` is public (it is the upload's size, which its timing reveals anyway). Gradient
learners (POF-MKL) clip each upload's vector to `‖Δ‖ <= C` (:func:`clip_l2`): whatever the state
behind it, two uploads differ by at most `2C`.

**Gaussian mechanism.** Noise `N(0, (z·Δ₂)²)` on every noised number makes one upload `(ε, δ)`-DP for
the noise multiplier `z` of :func:`noise_multiplier` (the analytic Gaussian mechanism, Balle & Wang
2018, exact). The per-client accountant (:mod:`.accountant`) composes all uploads.

**The noisy FedBNR posterior stays positive definite.** The scatter noise is symmetric (noise on the
packed upper triangle, mirrored), so it is a symmetric Gaussian matrix `E` whose spectral norm is at
most `s·(2√F + t)` except with probability `exp(-t²/4)` (Gaussian concentration of a √2-Lipschitz
function around `E‖E‖ <= 2√F·s`). Each noised upload therefore also adds the public, data-independent
shift `τ = s·(2√F + 2√(ln F) + 12)` to the diagonal (:func:`psd_shift`): the shifts of `U` uploads add
up linearly (`U·τ`) while the summed noise grows like `√U·s`, so `S + ΣE + Uτ·I` stays positive
semi-definite, and the posterior precision `A = σ⁻²(S + ΣE + Uτ·I) + λ⁻²I` positive definite, except
with probability below `1e-15` per upload — no eigenvalue is ever clipped. The shift is a ridge term
(`σ⁻²Uτ` added to the prior precision); its bias is what DP costs besides the noise.

**Predictive variance.** Given the noisy global, the posterior mean `m = σ⁻²A⁻¹b̃` carries the noise of
`b̃` and of `S̃`; to first order `φ*ᵀm` has the extra variance (:func:`noise_variance_of_mean`)

    σ⁻⁴ [ s_b²‖a‖² + s_S²(‖a‖²‖m‖² + (aᵀm)² − Σ_i a_i² m_i²) ],   a = A⁻¹φ*,

(`s_b², s_S²` the summed noise variances per entry of `b` and of the upper triangle of `S`), which the
predictive variance `σ² + φ*ᵀA⁻¹φ*` gets added so that intervals stay calibrated.

>>> z = noise_multiplier(1.0, 1e-5)
>>> round(z, 3), round(gaussian_delta(1.0, z), 7)
(3.731, 1e-05)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["add_gaussian_noise", "clip_l2", "clip_label", "gaussian_delta", "noise_multiplier",
           "noise_variance_of_mean", "psd_shift", "stats_sensitivity", "symmetric_noise_upper"]


def clip_label(y: float, bound: float) -> float:
    """`y` clipped to `[-bound, bound]` (`ValueError` for a non-finite `y` or a bound that is not > 0).

    >>> clip_label(3.0, 2.0), clip_label(-0.5, 2.0)
    (2.0, -0.5)
    """
    if not (bound > 0 and math.isfinite(y)):
        raise ValueError(f"cannot clip y={y!r} to ±{bound!r}")
    return min(max(float(y), -float(bound)), float(bound))


def clip_l2(v: ArrayLike, bound: float) -> np.ndarray:
    """`v` scaled down to L2 norm `bound` if it is longer (a copy; float64).

    >>> clip_l2([3.0, 4.0], 1.0).tolist(), clip_l2([0.3, 0.4], 1.0).tolist()
    ([0.6000000000000001, 0.8], [0.3, 0.4])
    """
    a = np.array(v, dtype=np.float64)
    if not np.isfinite(a).all():
        raise ValueError("cannot clip a non-finite vector")
    norm = float(np.linalg.norm(a))
    return a * (bound / norm) if norm > bound else a


def stats_sensitivity(phi_sq: float, label_bound: float, n_kernels: int = 1) -> float:
    """L2 sensitivity of `(S_upper, b, q)` of `n_kernels` kernels to one sample with `‖φ‖² <= phi_sq` and
    `|y| <= label_bound` added or removed (the count `n` is public).

    >>> stats_sensitivity(1.0, 1.0)  # sqrt(1 + 1 + 1)
    1.7320508075688772
    """
    if not (phi_sq > 0 and label_bound > 0 and n_kernels >= 1):
        raise ValueError("need phi_sq > 0, label_bound > 0, n_kernels >= 1")
    c2 = label_bound * label_bound
    return math.sqrt(n_kernels * (phi_sq * phi_sq + phi_sq * c2) + c2 * c2)


def gaussian_delta(epsilon: float, z: float) -> float:
    """The exact `δ(ε)` of the Gaussian mechanism with noise multiplier `z` (noise std / L2 sensitivity),
    Balle & Wang 2018, Thm. 8: `Φ(1/(2z) − εz) − e^ε·Φ(−1/(2z) − εz)`.

    >>> round(gaussian_delta(0.0, 1.0), 6)  # = 2Φ(1/2) − 1
    0.382925
    """
    def phi(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2.0))

    a = 1.0 / (2.0 * z)
    return max(0.0, phi(a - epsilon * z) - math.exp(epsilon) * phi(-a - epsilon * z))


def noise_multiplier(epsilon: float, delta: float) -> float:
    """The smallest `z` making one Gaussian mechanism `(ε, δ)`-DP (bisection on :func:`gaussian_delta`,
    which decreases in `z`); `inf` for `ε = 0`, `0` for `ε = inf`.

    >>> round(noise_multiplier(8.0, 1e-5), 4)
    0.6002
    """
    if not (epsilon >= 0 and 0 < delta < 1):
        raise ValueError(f"need epsilon >= 0 and 0 < delta < 1, got {epsilon!r}, {delta!r}")
    if epsilon == math.inf:
        return 0.0
    if epsilon == 0:
        return math.inf
    lo, hi = 1e-6, 1.0
    while gaussian_delta(epsilon, hi) > delta:
        hi *= 2.0
        if hi > 1e12:
            raise ValueError("no noise multiplier reaches that delta")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(epsilon, mid) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def symmetric_noise_upper(dim: int, std: float, rng: np.random.Generator, n_rows: int = 1) -> np.ndarray:
    """Noise for `n_rows` packed upper triangles (numpy.triu_indices order) of `dim × dim` symmetric
    matrices: i.i.d. `N(0, std²)` per packed entry, so the mirrored matrix is symmetric Gaussian."""
    return rng.normal(0.0, std, size=(n_rows, dim * (dim + 1) // 2))


def psd_shift(dim: int, std: float) -> float:
    """The diagonal shift `τ = std·(2√F + 2√(ln F) + 12)` one noised scatter upload adds (see the module
    docstring): larger than the spectral norm of its symmetric noise except with probability < 1e-15.

    >>> round(psd_shift(101, 1.0), 2)
    36.4
    """
    f = max(int(dim), 1)
    return float(std) * (2.0 * math.sqrt(f) + 2.0 * math.sqrt(math.log(f) if f > 1 else 0.0) + 12.0)


def add_gaussian_noise(arrays: Mapping[str, np.ndarray], names: tuple[str, ...], std: float,
                       rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A copy of `arrays` with `N(0, std²)` added to each entry of the arrays named in `names` (float64;
    the others are passed through unchanged).

    >>> out = add_gaussian_noise({"a": np.zeros(3), "k": np.arange(2)}, ("a",), 0.0, np.random.default_rng(0))
    >>> out["a"].tolist(), out["k"].tolist()
    ([0.0, 0.0, 0.0], [0, 1])
    """
    out = {}
    for k, v in arrays.items():
        if k in names:
            a = np.array(v, dtype=np.float64)
            out[k] = a + rng.normal(0.0, std, size=a.shape) if std > 0 else a
        else:
            out[k] = v
    return out


def noise_variance_of_mean(a: ArrayLike, m: ArrayLike, sigma: float, s_S: float, s_b: float) -> float:
    """First-order variance that the noise of a noisy global adds to a FedBNR predictive mean `φ*ᵀm`, with
    `a = A⁻¹φ*`, `m` the posterior mean, `s_S`, `s_b` the summed noise standard deviations per entry of
    the upper triangle of `S` and of `b` (formula in the module docstring).

    >>> noise_variance_of_mean([1.0, 0.0], [0.0, 0.0], sigma=1.0, s_S=0.0, s_b=2.0)
    4.0
    """
    a, m = np.asarray(a, dtype=np.float64), np.asarray(m, dtype=np.float64)
    s4 = float(sigma) ** 4
    aa, mm, am = float(a @ a), float(m @ m), float(a @ m)
    cross = float(np.sum(a * a * m * m))
    return (s_b * s_b * aa + s_S * s_S * (aa * mm + am * am - cross)) / s4
