"""Carrying a client's statistics from one kernel version to the next (docs/algorithms.md, "URK-FedBNR",
carried statistics).

A new network changes every feature, so FedBNR's sums `S = Σ φφᵀ, b = Σ φy, q = Σ y²` of the old features say
nothing exact about the new ones. Only the reservoir's raw samples can be embedded again; without more,
everything else a client learned would be lost at each version (the last global would sum reservoirs plus what
came after). FSGP carries its statistics by a projection (:mod:`streamfed.algorithms.fsgp.projection`); URK's
features have no closed form in one another, so the projection is learned where both are known — the
reservoir, a uniform sample of the client's whole history (Vitter's algorithm R). With `z = [φ_old(x); y]`,
least squares on the reservoir's `r` rows,

    φ_new(x) ≈ A z,   A = Φ_newᵀ Z (ZᵀZ + εI)⁻¹,   R = (Φ_new − Z Aᵀ)ᵀ (Φ_new − Z Aᵀ) / r

and the augmented statistic `M = Σ z zᵀ = [[S, b], [bᵀ, q]]` of the samples no longer in the reservoir ("the
rest": the client's own statistics minus the reservoir's under the old network) carries as

    M' = T M Tᵀ + n_rest [[R, 0], [0, 0]],   T = [[A], [0 … 0 1]]

then `S' ← c S'`, `b' ← √c b'` with `c = n_rest ‖φ‖² / tr S'`, so that `tr S' = n' ‖φ‖²` exactly, as for any
sum of URK features (the aggregation's checks pin `n` by the trace); `q' = q`, `n' = n_rest`. This is the
expected statistic under `φ_new = A z + e` with `e` uncorrelated with `z` (least squares makes it so on the
reservoir): the residual adds to the scatter and, being uncorrelated with `y`, nothing to `b` — no bias
towards zero in the directions the old features miss. `M'` is positive semi-definite by construction (a
congruence of `M` plus a positive semi-definite term, then `diag(√c I, 1)` on both sides). The reservoir itself
is embedded again exactly by the caller. Samples are never counted twice and never lost: `n` of the new
version's statistics is `n` of the old.

When the network did not change the map is the identity, taken exactly (`M' = M`).

>>> rng = np.random.default_rng(0)
>>> phi = rng.standard_normal((50, 4)); y = rng.standard_normal(50)
>>> rest = SufficientStats.from_samples(phi[:30, None, :], y[:30])
>>> T, R = projection(phi[30:], phi[30:], y[30:])  # the same features: T = I, R = 0
>>> out = carry(rest, T, R, phi_sq=None)
>>> bool(np.allclose(out.S, rest.S) and np.allclose(out.b, rest.b)), out.n
(True, 30.0)
"""

from __future__ import annotations

import math

import numpy as np

from streamfed.core.stats import SufficientStats

__all__ = ["carry", "projection", "sample_stats"]


def projection(phi_old: np.ndarray, phi_new: np.ndarray, y: np.ndarray, ridge: float = 1e-8
               ) -> tuple[np.ndarray, np.ndarray]:
    """`(T, R)` from the reservoir's features under both maps (`(r, F_old)`, `(r, F_new)`) and its targets:
    `T (F_new + 1, F_old + 1)` the augmented least-squares map of the module docstring (ridge
    `ε = ridge · tr(ZᵀZ) / (F_old + 1)`, so a reservoir of fewer rows than features still has one), `R` the mean
    outer product of the residuals. Identical features: exactly `(I, 0)`."""
    phi_old = np.asarray(phi_old, dtype=np.float64)
    phi_new = np.asarray(phi_new, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if (phi_old.ndim != 2 or phi_new.ndim != 2 or phi_old.shape[0] != phi_new.shape[0] or phi_old.shape[0] < 1
            or y.shape != (phi_old.shape[0],)):
        raise ValueError(f"expected features and targets of the same rows, got {phi_old.shape}, {phi_new.shape}, "
                         f"{y.shape}")
    r, f_old = phi_old.shape
    f_new = phi_new.shape[1]
    if phi_old.shape == phi_new.shape and np.array_equal(phi_old, phi_new):
        return np.eye(f_new + 1), np.zeros((f_new, f_new))
    Z = np.concatenate([phi_old, y[:, None]], axis=1)
    G = Z.T @ Z
    eps = ridge * max(float(np.trace(G)), 1e-300) / (f_old + 1)
    A = np.linalg.solve(G + eps * np.eye(f_old + 1), Z.T @ phi_new).T  # G is symmetric: (G⁻¹ Zᵀ Φ_new)ᵀ
    E = phi_new - Z @ A.T
    T = np.zeros((f_new + 1, f_old + 1))
    T[:f_new], T[f_new, f_old] = A, 1.0
    return T, (E.T @ E) / r


def sample_stats(phi: np.ndarray, y: np.ndarray, like: SufficientStats) -> SufficientStats:
    """The statistics of rows `phi (r, F)` with targets `y`, shaped (one kernel) and versioned like `like`."""
    phi = np.asarray(phi, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    return SufficientStats((phi.T @ phi)[None], (phi.T @ y)[None], float(len(y)), float(y @ y),
                           like.kernel_version, like.epoch)


def carry(rest: SufficientStats, T: np.ndarray, R: np.ndarray, phi_sq: float | None) -> SufficientStats:
    """The statistics `rest` (one kernel, of the old features) carried to the new features by `(T, R)` of
    :func:`projection` (the module docstring's formula). `phi_sq`: `‖φ_new‖²` of every input, to pin the trace
    (None: not pinned, `c = 1`). `n` and `q` are unchanged."""
    S = np.asarray(rest.S, dtype=np.float64)
    if S.ndim != 3 or S.shape[0] != 1:
        raise ValueError(f"expected the statistics of one kernel, got S of shape {S.shape}")
    n, q = float(rest.n), float(rest.q)
    f_new = R.shape[0]
    if n <= 0:
        return SufficientStats(np.zeros((1, f_new, f_new)), np.zeros((1, f_new)), 0.0, 0.0, rest.kernel_version,
                               rest.epoch)
    if T.shape[0] == T.shape[1] and np.array_equal(T, np.eye(T.shape[0])) and not np.any(R):
        return SufficientStats(S.copy(), np.asarray(rest.b, dtype=np.float64).copy(), n, q, rest.kernel_version,
                               rest.epoch)
    b = np.asarray(rest.b[0], dtype=np.float64)
    M = np.block([[S[0], b[:, None]], [b[None, :], np.array([[q]])]])
    # M is a difference of sums (own − reservoir): positive semi-definite up to rounding. As a Gram matrix G Gᵀ
    # (G = T V Λ^½, rounding-level negative Λ dropped) the carried one stays so (as FSGP's projection does).
    lam, V = np.linalg.eigh(0.5 * (M + M.T))
    G = T @ (V * np.sqrt(np.clip(lam, 0.0, None)))
    Mn = G @ G.T
    S_new = Mn[:f_new, :f_new] + n * R
    b_new = Mn[:f_new, f_new].copy()
    if phi_sq is not None:
        tr = float(np.trace(S_new))
        if tr > 0 and math.isfinite(tr):
            c = n * float(phi_sq) / tr
            S_new *= c
            b_new *= math.sqrt(c)
    return SufficientStats(S_new[None], b_new[None], n, q, rest.kernel_version, rest.epoch)
