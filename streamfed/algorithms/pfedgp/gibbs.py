"""A binary GP classifier by Pólya–Gamma augmentation and block Gibbs sampling — the full model (pFedGP
§4.1, appendix A.1–A.2). One tree node's classifier.

Labels `y_j ∈ {0, 1}`, `κ_j = y_j − ½`, prior `f ~ N(0, K)`, `Ω = diag(ω)`. The conditionals (eq. 14):

    f | ω, y ~ N(Σκ, Σ),   Σ = (K⁻¹ + Ω)⁻¹
    ω_j | f_j ~ PG(1, f_j)

`f | ω` is drawn without `K⁻¹` by conditioning a prior draw on the pseudo-observations `z = Ω⁻¹κ` with noise
`N(0, Ω⁻¹)` ("Matheron's rule"): `f = f₀ + K (K + Ω⁻¹)⁻¹ (z − f₀ − ε)`, `f₀ ~ N(0, K)`, `ε ~ N(0, Ω⁻¹)` — its
mean is `K(K + Ω⁻¹)⁻¹Ω⁻¹κ = Σκ` and its covariance `K − K(K + Ω⁻¹)⁻¹K = Σ`. `(K + Ω⁻¹)⁻¹ = Ω½ B⁻¹ Ω½` with
`B = I + Ω½ K Ω½` (eigenvalues ≥ 1: a Cholesky factor that never fails).

Given a Gibbs sample `ω`, the predictive of a new input (eq. 17) is

    μ* = k*ᵀ (Ω⁻¹ + K)⁻¹ Ω⁻¹ κ,   Σ* = k** − k*ᵀ (Ω⁻¹ + K)⁻¹ k*

and `p(y* = 1 | ω) = ∫ σ(f*) N(f*; μ*, Σ*) df*` (eq. 18, Gauss–Hermite); the predictive is its average over
the chains' samples. Chains are warm-started: a node that gains a sample continues its chains (the new
sample's `ω` starts from a `PG(1, 0)` draw).

>>> import numpy as np
>>> X = np.array([[-2.0], [-1.0], [1.0], [2.0]]); y = np.array([0, 0, 1, 1])
>>> K = np.exp(-0.5 * (X - X.T) ** 2)
>>> post = gibbs(K, y, chains=8, steps=20, rng=np.random.default_rng(0))
>>> p = post.prob(np.exp(-0.5 * (X - 1.5) ** 2), np.ones(1))  # k(X, x*) is (N, 1)
>>> bool(p[0] > 0.5)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_solve, cholesky

from streamfed.algorithms.pfedgp.polya_gamma import sample_pg
from streamfed.algorithms.pfedgp.quadrature import sigmoid_gauss

__all__ = ["FullPosterior", "JITTER", "gibbs", "sample_f"]

#: Added to `K`'s diagonal (relative to its largest entry) for the prior draw `f₀ ~ N(0, K)`.
JITTER = 1e-8


def _prior_factor(K: np.ndarray) -> np.ndarray:
    n = K.shape[0]
    scale = max(float(np.max(np.diag(K))), 1e-300) if n else 1.0
    return cholesky(K + JITTER * scale * np.eye(n), lower=True)


def sample_f(K: np.ndarray, Lk: np.ndarray, kappa: np.ndarray, omega: np.ndarray, rng: np.random.Generator
             ) -> np.ndarray:
    """One draw of `f | ω, y` per chain (`omega (C, N)` → `(C, N)`), by Matheron's rule (module docstring)."""
    C, n = omega.shape
    out = np.empty((C, n))
    for c in range(C):
        sw = np.sqrt(omega[c])
        L = cholesky(np.eye(n) + sw[:, None] * K * sw[None, :], lower=True)
        f0 = Lk @ rng.standard_normal(n)
        eps = rng.standard_normal(n) / sw
        r = kappa / omega[c] - f0 - eps
        out[c] = f0 + K @ (sw * cho_solve((L, True), sw * r))
    return out


@dataclass
class FullPosterior:
    """A node's posterior as its Gibbs samples `omega (C, N)`, with what the predictive needs per chain:
    `alpha_c = (K + Ω_c⁻¹)⁻¹ Ω_c⁻¹ κ` and `A_c = (K + Ω_c⁻¹)⁻¹`."""

    omega: np.ndarray
    alpha: np.ndarray  # (C, N)
    A: np.ndarray  # (C, N, N)

    @classmethod
    def of(cls, K: np.ndarray, kappa: np.ndarray, omega: np.ndarray) -> FullPosterior:
        C, n = omega.shape
        alpha, A = np.empty((C, n)), np.empty((C, n, n))
        for c in range(C):
            sw = np.sqrt(omega[c])
            L = cholesky(np.eye(n) + sw[:, None] * K * sw[None, :], lower=True)
            A[c] = sw[:, None] * cho_solve((L, True), np.diag(sw))
            alpha[c] = A[c] @ (kappa / omega[c])
        return cls(omega, alpha, A)

    def moments(self, kstar: np.ndarray, kss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`μ*, Σ*` per chain and test input: `kstar (N, T)` = `k(X, x*)`, `kss (T,)` → `(C, T)` each."""
        mu = self.alpha @ kstar
        var = kss[None, :] - np.einsum("it,cij,jt->ct", kstar, self.A, kstar)
        return mu, np.maximum(var, 1e-12)

    def prob(self, kstar: np.ndarray, kss: np.ndarray) -> np.ndarray:
        """`p(y* = 1)` of each test input `(T,)`: eq. 18 averaged over the chains."""
        mu, var = self.moments(kstar, kss)
        return np.mean(sigmoid_gauss(mu, var), axis=0)


def gibbs(K: np.ndarray, y: np.ndarray, *, chains: int = 10, steps: int = 5, rng: np.random.Generator,
          omega0: np.ndarray | None = None) -> FullPosterior:
    """`steps` block Gibbs sweeps (`f | ω`, then `ω | f`) of `chains` parallel chains on `(K, y)`; `omega0`
    `(chains, N)` continues earlier chains (else `ω` starts from `PG(1, 0)` draws)."""
    K = np.asarray(K, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = y.size
    if K.shape != (n, n) or not np.all(np.isfinite(K)) or not np.all((y == 0) | (y == 1)):
        raise ValueError(f"expected a finite ({n}, {n}) kernel and labels in {{0, 1}}")
    kappa = y - 0.5
    omega = sample_pg(np.zeros((int(chains), n)), rng) if omega0 is None else np.array(omega0, dtype=np.float64)
    if omega.shape != (int(chains), n):
        raise ValueError(f"omega0 of shape {omega.shape}, expected {(int(chains), n)}")
    Lk = _prior_factor(K)
    for _ in range(int(steps)):
        f = sample_f(K, Lk, kappa, omega, rng)
        omega = sample_pg(f, rng)
    return FullPosterior.of(K, kappa, omega)
