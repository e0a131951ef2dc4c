"""The FITC inducing-point binary classifier (pFedGP-IP-compute, §4.3 and appendix B): `M` inducing inputs
`X̄` shared by the fleet, cost `O(M²N + M³)` per Gibbs sweep — only `M × M` and diagonal inverses.

With `K_MM`, `K_NM`, the diagonal `k_N = diag K_NN`, `Q = K_NM K_MM⁻¹ K_MN`, `κ = y − ½`, `Ω = diag(ω)`:

    Λ = Ω⁻¹ + diag(K_NN − Q),          B = K_MM + K_MN Λ⁻¹ K_NM
    f | ω ~ N(K_NM B⁻¹ K_MN Λ⁻¹ Ω⁻¹ κ,  K_NN − K_NM (K_MM⁻¹ − B⁻¹) K_MN)         (eq. 6 / 21)
    f* | ω ~ N(k*ᵀ B⁻¹ K_MN Λ⁻¹ Ω⁻¹ κ,   k** − k*ᵀ (K_MM⁻¹ − B⁻¹) k*)            (eq. 22)
    p(y | ω) ∝ N(Ω⁻¹κ | 0, Λ + Q)                                                (eq. 7 / 23)

`ω_j | f ~ PG(1, f_j)` depends on `f_j` alone, so the next `ω` has the same law whether `f` is drawn jointly
or each `f_j` from its marginal: the sweep draws the marginals (`O(M²N)`, no `N × N` matrix). `Λ⁻¹Ω⁻¹κ` is
computed as `κ / (1 + ω d)`, `d = diag(K_NN − Q)`, and `Λ⁻¹ = ω / (1 + ω d)` (no `1/ω`).

>>> import numpy as np
>>> X = np.array([[-2.0], [-1.0], [1.0], [2.0]]); y = np.array([0, 0, 1, 1]); Z = np.array([[-1.5], [1.5]])
>>> k = lambda a, b: np.exp(-0.5 * (a - b.T) ** 2)
>>> post = fitc_gibbs(k(Z, Z), k(X, Z), np.ones(4), y, chains=8, steps=20, rng=np.random.default_rng(0))
>>> bool(post.prob(k(Z, np.array([[1.5]])), np.ones(1))[0] > 0.5)
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular

from streamfed.algorithms.pfedgp.polya_gamma import sample_pg
from streamfed.algorithms.pfedgp.quadrature import chain_log_probs, sigmoid_gauss
from streamfed.core.durable import durable

__all__ = ["FITCPosterior", "fitc_gibbs", "fitc_terms"]

_JITTER = 1e-8


def _kmm_factor(Kmm: np.ndarray) -> np.ndarray:
    m = Kmm.shape[0]
    return cholesky(Kmm + _JITTER * max(float(np.max(np.diag(Kmm))), 1e-300) * np.eye(m), lower=True)


def fitc_terms(Kmm: np.ndarray, Knm: np.ndarray, kdiag: np.ndarray, kappa: np.ndarray, omega: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For `ω (C, N)` (a chain per row): `c = B⁻¹ K_MN Λ⁻¹ Ω⁻¹ κ (C, M)`, `B⁻¹ (C, M, M)` and
    `d = diag(K_NN − Q) (N,)`. Batched over the chains."""
    Lm = _kmm_factor(Kmm)
    V = solve_triangular(Lm, Knm.T, lower=True)  # (M, N): Q = VᵀV
    d = np.maximum(kdiag - np.sum(V * V, axis=0), 0.0)
    lam_inv = omega / (1.0 + omega * d)  # (C, N)
    m = Kmm.shape[0]
    B = Kmm[None] + np.einsum("nm,cn,nk->cmk", Knm, lam_inv, Knm)
    B += _JITTER * np.max(np.diagonal(B, axis1=1, axis2=2), axis=1)[:, None, None] * np.eye(m)
    Binv = np.linalg.inv(B)
    c = np.einsum("cmk,ck->cm", Binv, (kappa / (1.0 + omega * d)) @ Knm)
    return c, Binv, d


@durable("pfedgp.FITCPosterior")
@dataclass
class FITCPosterior:
    """A node's FITC posterior: Gibbs samples `omega (C, N)`, per chain `c (C, M)` and `B⁻¹ (C, M, M)`, and
    `K_MM⁻¹` (shared)."""

    omega: np.ndarray
    c: np.ndarray
    Binv: np.ndarray
    Kmm_inv: np.ndarray

    @classmethod
    def of(cls, Kmm: np.ndarray, Knm: np.ndarray, kdiag: np.ndarray, kappa: np.ndarray, omega: np.ndarray
           ) -> FITCPosterior:
        c, Binv, _ = fitc_terms(Kmm, Knm, kdiag, kappa, omega)
        Lm = _kmm_factor(Kmm)
        return cls(omega, c, Binv, cho_solve((Lm, True), np.eye(Kmm.shape[0])))

    def moments(self, kstar: np.ndarray, kss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Eq. 22 per chain: `kstar (M, T)` = `k(X̄, x*)`, `kss (T,)` → `μ*, Σ*` of shape `(C, T)`."""
        mu = self.c @ kstar
        q = np.einsum("it,ij,jt->t", kstar, self.Kmm_inv, kstar)
        var = kss[None, :] - q[None, :] + np.einsum("it,cij,jt->ct", kstar, self.Binv, kstar)
        return mu, np.maximum(var, 1e-12)

    def prob(self, kstar: np.ndarray, kss: np.ndarray) -> np.ndarray:
        """`p(y* = 1)` of each test input `(T,)`, averaged over the chains."""
        mu, var = self.moments(kstar, kss)
        return np.mean(sigmoid_gauss(mu, var), axis=0)

    def log_probs(self, kstar: np.ndarray, kss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(log p(y* = 1), log p(y* = 0))`, each `(T,)`, in the log domain."""
        return chain_log_probs(*self.moments(kstar, kss))


def fitc_gibbs(Kmm: np.ndarray, Knm: np.ndarray, kdiag: np.ndarray, y: np.ndarray, *, chains: int = 10,
               steps: int = 5, rng: np.random.Generator, omega0: np.ndarray | None = None) -> FITCPosterior:
    """`steps` Gibbs sweeps of `chains` chains under FITC (module docstring); `omega0` continues chains."""
    Kmm, Knm = np.asarray(Kmm, dtype=np.float64), np.asarray(Knm, dtype=np.float64)
    kdiag, y = np.asarray(kdiag, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n, m = y.size, Kmm.shape[0]
    if Kmm.shape != (m, m) or Knm.shape != (n, m) or kdiag.shape != (n,) or not np.all((y == 0) | (y == 1)) \
            or not (np.all(np.isfinite(Kmm)) and np.all(np.isfinite(Knm)) and np.all(np.isfinite(kdiag))):
        raise ValueError("expected finite K_MM (M, M), K_NM (N, M), diag K_NN (N,) and labels in {0, 1}")
    kappa = y - 0.5
    omega = sample_pg(np.zeros((int(chains), n)), rng) if omega0 is None else np.array(omega0, dtype=np.float64)
    if omega.shape != (int(chains), n):
        raise ValueError(f"omega0 of shape {omega.shape}, expected {(int(chains), n)}")
    Lm = _kmm_factor(Kmm)
    V = solve_triangular(Lm, Knm.T, lower=True)
    q = np.sum(V * V, axis=0)
    for _ in range(int(steps)):
        c, Binv, _ = fitc_terms(Kmm, Knm, kdiag, kappa, omega)
        mean = c @ Knm.T
        var = np.maximum(kdiag - q + np.einsum("nm,cmk,nk->cn", Knm, Binv, Knm), 1e-12)
        f = mean + np.sqrt(var) * rng.standard_normal(omega.shape)
        omega = sample_pg(f, rng)
    return FITCPosterior.of(Kmm, Knm, kdiag, kappa, omega)
