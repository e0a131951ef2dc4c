"""Carrying a posterior to new inducing inputs and hyperparameters (Bui, Nguyen & Turner 2017), and the
alternative it is compared with, re-embedding a reservoir (docs/algorithms.md, "FSGP").

Old version `a` (inducing inputs `Z_a`, covariance `c_a`, noise `σ_a`) with statistics `(P_a, r_a)`: its
posterior is the prior times a Gaussian factor on `u_a = f(Z_a)` with precision `σ_a⁻² C_a⁻¹ P_a C_a⁻¹`
and natural mean `σ_a⁻² C_a⁻¹ r_a` (`C_a = c_a(Z_a, Z_a)` + jitter). Bui et al. keep that factor as a
likelihood of `f(Z_a)` under the *new* prior and project `f(Z_a)` on the new inducing values,
`f(Z_a) ≈ c_b(Z_a, Z_b) C_b⁻¹ u_b`; the optimal `q(u_b)` is then that of pseudo-statistics

    W   = c_b(Z_b, Z_a) C_a⁻¹                     (M_b × M_a, by Cholesky solves with C_a)
    P_b = (σ_b² / σ_a²) · W P_a Wᵀ,   r_b = (σ_b² / σ_a²) · W r_a,   q_b = (σ_b² / σ_a²) · q_a,   n unchanged

added to whatever new data arrives (`q`, which no prediction reads, is scaled like `P` and `r` so that the
augmented statistic `[[P, r], [rᵀ, q]]` stays positive semi-definite — the server's check of an upload
holds for carried statistics too; `n` still counts samples). The map is linear in `(P_a, r_a, q_a)`, so
projecting each client's statistics and summing equals projecting the sum: the server may project late
uploads one by one. With the same `Z` and covariance it is the identity (`W = I`, taken exactly, not
computed); the general formula differs from it by `O(ε·cond C)` since only `C_a` carries the jitter.
`W P_a Wᵀ` is computed as the Gram matrix `G Gᵀ`, `G = W V Λ^½` (`P_a = V Λ Vᵀ`), so that it stays positive
semi-definite whatever the conditioning of `C_a` (the direct product does not, see `ProjectionMap`).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_solve

from streamfed.algorithms.fsgp.kernels import Hyper, cov
from streamfed.algorithms.fsgp.posterior import Stats, cholesky
from streamfed.core.durable import durable

__all__ = ["ProjectionMap", "project", "reembed"]


@durable("fsgp.ProjectionMap")
class ProjectionMap:
    """The linear map of statistics from version `old` to version `new` (epoch `epoch`).

    >>> h = Hyper.initial("se", np.array([[0.0], [1.0]]))
    >>> s = Stats.zeros(2); s.add(np.array([0.3, 0.9]), 1.0)
    >>> t = ProjectionMap(h, h, epoch=1)(s)
    >>> t.epoch, bool(np.array_equal(t.P, s.P) and np.array_equal(t.r, s.r))
    (1, True)
    """

    def __init__(self, old: Hyper, new: Hyper, epoch: int, jitter: float = 1e-6) -> None:
        self.epoch = int(epoch)
        self.ratio = new.noise_var / old.noise_var
        self.W: np.ndarray | None = None  # None: the identity
        if not new.same_kernel(old):
            C_a = cov(old, old.Z, old.Z) + jitter * old.amplitude ** 2 * np.eye(old.m)
            L_a = cholesky(C_a, "old c(Z, Z)")
            K_ab = cov(new, old.Z, new.Z)  # (M_a, M_b), the new covariance between old and new inputs
            self.W = cho_solve((L_a, True), K_ab, check_finite=False).T

    def __call__(self, stats: Stats) -> Stats:
        if self.W is None:
            P, r = stats.P.copy(), stats.r.copy()
            if self.ratio != 1.0:
                P *= self.ratio
                r *= self.ratio
        else:
            # P is a sum of outer products, so positive semi-definite; W P Wᵀ formed directly loses that by
            # rounding of order ε‖W‖²‖P‖ — with an ill-conditioned C_a (long lengthscales, close inducing inputs)
            # enough to make B = C + P/σ² indefinite. As a Gram matrix G Gᵀ, G = W V Λ^½ from P = V Λ Vᵀ
            # (rounding-level negative Λ dropped), it stays positive semi-definite to ε‖P_b‖.
            lam, V = np.linalg.eigh(0.5 * (stats.P + stats.P.T))
            G = self.W @ (V * np.sqrt(np.clip(lam, 0.0, None)))
            P = self.ratio * (G @ G.T)
            r = self.ratio * (self.W @ stats.r)
        return Stats(P, r, stats.n, stats.q * self.ratio, self.epoch)


def project(stats: Stats, old: Hyper, new: Hyper, epoch: int, jitter: float = 1e-6) -> Stats:
    """`stats` under `old` carried to `new` (version `epoch`): :class:`ProjectionMap` once."""
    return ProjectionMap(old, new, epoch, jitter)(stats)


def reembed(X: np.ndarray, y: np.ndarray, hyper: Hyper, epoch: int) -> Stats:
    """The statistics of raw samples under `hyper` — what a client can rebuild from a reservoir alone
    (everything that left the reservoir is lost)."""
    X = np.asarray(X, dtype=np.float64)
    return Stats.from_samples(cov(hyper, X, hyper.Z), np.asarray(y, dtype=np.float64), epoch)
