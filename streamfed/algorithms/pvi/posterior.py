"""The sparse-GP posterior `q(u | Z, β) ∝ p(u | Z, β) Π_k t_k(u | Z, β)` at one `(Z, β)`, in NumPy
(docs/algorithms.md §7).

With `K = k(Z, Z) + ε a² I` and a DPO factor `N(m_k; K_{V_k Z} K⁻¹ u, diag s_k)`, the natural parameters
`Λ = K⁻¹ + Σ_k A_kᵀ S_k⁻¹ A_k`, `η = Σ_k A_kᵀ S_k⁻¹ m_k` (`A_k = K_{V_k Z} K⁻¹`) are written through

    B = Σ_k K_{Z V_k} S_k⁻¹ K_{V_k Z},    b = Σ_k K_{Z V_k} S_k⁻¹ m_k

as `Λ = K⁻¹ (K + B) K⁻¹`, `η = K⁻¹ b`, so `q(u) = N(K w, K (K + B)⁻¹ K)` with `w = (K + B)⁻¹ b`, and
for any `x` (`k = k(Z, x)`):

    E[f(x)] = kᵀ w,    Var[f(x)] = k(x, x) - kᵀ K⁻¹ k + kᵀ (K + B)⁻¹ k.

A CPO factor `N(u; m_k, diag s_k)` is the DPO factor with `V_k = Z` (then `K_{V_k Z} K⁻¹ = I`). With
`V_k = X_k`, `m_k = y_k`, `s_k = σ²` this is FSGP's `B = C + σ⁻² P`, `b = σ⁻² r` exactly (the test oracle).
Only Cholesky factors and triangular solves are used; the kernels are FSGP's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.linalg import cho_solve

from streamfed.algorithms.fsgp.kernels import Hyper, cov
from streamfed.algorithms.fsgp.posterior import cholesky, lower_solve
from streamfed.algorithms.pvi.factors import Factor
from streamfed.core.durable import durable

__all__ = ["ConditionalQ", "beta_hyper", "natural_sums"]


def beta_hyper(kind: str, beta: np.ndarray, Z: np.ndarray) -> Hyper:
    """FSGP's :class:`~streamfed.algorithms.fsgp.kernels.Hyper` of `log β = [log a, log ℓ_1..d, log σ]`
    and `Z`."""
    beta = np.asarray(beta, dtype=np.float64)
    d = int(np.asarray(Z).shape[1])
    if beta.shape != (d + 2,):
        raise ValueError(f"log β has {d + 2} numbers for d = {d}, got shape {beta.shape}")
    return Hyper(kind, float(beta[0]), beta[1:1 + d], float(beta[1 + d]), Z)


def natural_sums(h: Hyper, K: np.ndarray, factors: Sequence[Factor]) -> tuple[np.ndarray, np.ndarray]:
    """`B = Σ K_{ZV} S⁻¹ K_{VZ}` and `b = Σ K_{ZV} S⁻¹ m` over `factors` at `h.Z`."""
    B = np.zeros_like(K)
    b = np.zeros(K.shape[0])
    for f in factors:
        Kzv = K if f.V is None else cov(h, h.Z, f.V)
        if Kzv.shape[1] != f.n_pseudo:
            raise ValueError(f"a CPO factor of {f.n_pseudo} pseudo-targets at M = {K.shape[0]}")
        prec = np.exp(-f.log_s)
        B += (Kzv * prec) @ Kzv.T
        b += Kzv @ (prec * f.m)
    return B, b


@durable("pvi.ConditionalQ")
class ConditionalQ:
    """`q(u | Z, β)` of `factors` and its marginals of `f`.

    >>> h = beta_hyper("se", np.zeros(3), np.array([[0.0], [1.0]]))
    >>> q = ConditionalQ(h, [])  # no factor: the prior
    >>> mean, var = q.predict_f(np.array([[0.5]]))
    >>> float(mean[0]), round(float(var[0]), 12)
    (0.0, 1.0)
    >>> f = Factor("a", 1, 1.0, np.array([[0.5]]), np.array([2.0]), np.array([np.log(0.01)]))
    >>> mean, var = ConditionalQ(h, [f]).predict_f(np.array([[0.5]]))
    >>> bool(1.9 < mean[0] < 2.0 and var[0] < 0.05)
    True
    """

    def __init__(self, hyper: Hyper, factors: Sequence[Factor], jitter: float = 1e-6) -> None:
        self.hyper = hyper
        m = hyper.m
        self.K = cov(hyper, hyper.Z, hyper.Z) + jitter * hyper.amplitude ** 2 * np.eye(m)
        self.L_K = cholesky(self.K, "k(Z, Z)")
        self.B, self.b = natural_sums(hyper, self.K, factors)
        A = self.K + self.B
        self.L = cholesky(0.5 * (A + A.T), "K + B")
        self.w = cho_solve((self.L, True), self.b, check_finite=False)

    def u_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """`E[u] = K w` and `Cov[u] = K (K + B)⁻¹ K`."""
        G = lower_solve(self.L, self.K)
        return self.K @ self.w, G.T @ G

    def predict_f(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Means and variances of `f(X)` (T,) under `q(f | Z, β)`."""
        Kzx = cov(self.hyper, self.hyper.Z, np.asarray(X, dtype=np.float64))
        a_K = lower_solve(self.L_K, Kzx)
        a_B = lower_solve(self.L, Kzx)
        var = self.hyper.amplitude ** 2 - np.sum(a_K * a_K, axis=0) + np.sum(a_B * a_B, axis=0)
        # k(x,x) - kᵀK⁻¹k >= 0 exactly; rounding must not make a variance negative
        return Kzx.T @ self.w, np.maximum(var, 0.0)
