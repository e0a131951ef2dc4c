"""A binary GP classifier by Pólya–Gamma augmentation and block Gibbs sampling — the full model (pFedGP
§4.1, appendix A.1–A.2). One tree node's classifier.

Labels `y_j ∈ {0, 1}`, `κ_j = y_j − ½`, prior `f ~ N(0, K)`, `Ω = diag(ω)`. The conditionals (eq. 14):

    f | ω, y ~ N(Σκ, Σ),   Σ = (K⁻¹ + Ω)⁻¹
    ω_j | f_j ~ PG(1, f_j)

`f | ω` is drawn without `K⁻¹` by conditioning a prior draw on the pseudo-observations `z = Ω⁻¹κ` with noise
`N(0, Ω⁻¹)` ("Matheron's rule"): `f = f₀ + K (K + Ω⁻¹)⁻¹ (z − f₀ − ε)`, `f₀ ~ N(0, K)`, `ε ~ N(0, Ω⁻¹)` — its
mean is `K(K + Ω⁻¹)⁻¹Ω⁻¹κ = Σκ` and its covariance `K − K(K + Ω⁻¹)⁻¹K = Σ`. `(K + Ω⁻¹)⁻¹ = Ω½ B⁻¹ Ω½` with
`B = I + Ω½ K Ω½` (eigenvalues ≥ 1: well conditioned; solved for all chains at once).

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
from scipy.linalg import cholesky

from streamfed.algorithms.pfedgp.polya_gamma import sample_pg
from streamfed.algorithms.pfedgp.quadrature import chain_log_probs, sigmoid_gauss
from streamfed.core.durable import durable

__all__ = ["FullPosterior", "JITTER", "gibbs", "sample_f"]

#: Added to `K`'s diagonal (relative to its largest entry) for the prior draw `f₀ ~ N(0, K)`.
JITTER = 1e-8


def _prior_factor(K: np.ndarray) -> np.ndarray:
    n = K.shape[0]
    scale = max(float(np.max(np.diag(K))), 1e-300) if n else 1.0
    return cholesky(K + JITTER * scale * np.eye(n), lower=True)


def _b_matrices(K: np.ndarray, omega: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`√ω (C, N)` and `B = I + Ω½ K Ω½` per chain `(C, N, N)` (batched: no Python loop over chains)."""
    sw = np.sqrt(omega)
    return sw, np.eye(K.shape[0]) + sw[:, :, None] * K[None] * sw[:, None, :]


def sample_f(K: np.ndarray, Lk: np.ndarray, kappa: np.ndarray, omega: np.ndarray, rng: np.random.Generator
             ) -> np.ndarray:
    """One draw of `f | ω, y` per chain (`omega (C, N)` → `(C, N)`), by Matheron's rule (module docstring)."""
    C, n = omega.shape
    sw, B = _b_matrices(K, omega)
    f0 = (Lk @ rng.standard_normal((n, C))).T
    eps = rng.standard_normal((C, n)) / sw
    r = kappa / omega - f0 - eps
    sol = np.linalg.solve(B, (sw * r)[:, :, None])[:, :, 0]  # B's eigenvalues are >= 1: well conditioned
    return f0 + (sw * sol) @ K


@durable("pfedgp.FullPosterior")
@dataclass
class FullPosterior:
    """A node's posterior as its Gibbs samples `omega (C, N)`, with what the predictive needs per chain:
    `alpha_c = (K + Ω_c⁻¹)⁻¹ Ω_c⁻¹ κ` and `A_c = (K + Ω_c⁻¹)⁻¹`."""

    omega: np.ndarray
    alpha: np.ndarray  # (C, N)
    A: np.ndarray  # (C, N, N)

    @classmethod
    def of(cls, K: np.ndarray, kappa: np.ndarray, omega: np.ndarray) -> FullPosterior:
        sw, B = _b_matrices(K, omega)
        A = sw[:, :, None] * np.linalg.inv(B) * sw[:, None, :]
        return cls(omega, np.einsum("cij,cj->ci", A, kappa / omega), A)

    def moments(self, kstar: np.ndarray, kss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`μ*, Σ*` per chain and test input: `kstar (N, T)` = `k(X, x*)`, `kss (T,)` → `(C, T)` each."""
        mu = self.alpha @ kstar
        var = kss[None, :] - np.sum(np.matmul(self.A, kstar) * kstar[None], axis=1)  # a batched product: BLAS
        return mu, np.maximum(var, 1e-12)

    def prob(self, kstar: np.ndarray, kss: np.ndarray) -> np.ndarray:
        """`p(y* = 1)` of each test input `(T,)`: eq. 18 averaged over the chains."""
        mu, var = self.moments(kstar, kss)
        return np.mean(sigmoid_gauss(mu, var), axis=0)

    def log_probs(self, kstar: np.ndarray, kss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(log p(y* = 1), log p(y* = 0))`, each `(T,)`: `prob` in the log domain, both sides computed."""
        return chain_log_probs(*self.moments(kstar, kss))


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
