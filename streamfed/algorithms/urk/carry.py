"""Carrying a client's statistics from one kernel version to the next (docs/algorithms.md, "URK-FedBNR",
carried statistics).

A new network changes every feature, so FedBNR's sums `S = Σ φφᵀ, b = Σ φy` of the old features say nothing
exact about the new ones. Only the reservoir's raw samples can be embedded again; without more, everything
else a client learned would be lost at each version (the last global would sum reservoirs plus what came
after). FSGP carries its statistics by a projection (:mod:`streamfed.algorithms.fsgp.projection`); URK's
features have no closed form in one another, so the projection is learned where both are known — the
reservoir, a uniform sample of the client's whole history (Vitter's algorithm R):

    W = Φ_newᵀ Φ_old (Φ_oldᵀ Φ_old + εI)⁻¹          least squares φ_new(x) ≈ W φ_old(x) on the reservoir
    R = (Φ_new − Φ_old Wᵀ)ᵀ (Φ_new − Φ_old Wᵀ) / r     the residual's second moment (what W misses)

The samples no longer in the reservoir ("the rest", their statistics `own − reservoir's under the old map`)
then carry as

    S' = c (W S_rest Wᵀ + n_rest R),   b' = √c · W b_rest,   q' = q_rest,   n' = n_rest

the expected scatter under `φ_new = W φ_old + e` with `e` uncorrelated with `φ_old` (least squares makes it so
on the reservoir), and `c = n_rest ‖φ‖² / tr(…)` so that `tr S' = n' ‖φ‖²` exactly, as for any sum of URK
features (the aggregation's checks pin `n` by the trace). `[[S', b'], [b'ᵀ, q']]` is positive semi-definite:
it is `diag(√c W, 1) [[S, b], [bᵀ, q]] diag(√c W, 1)ᵀ` plus `c·n_rest [[R, 0], [0, 0]]`. The reservoir itself
is embedded again exactly by the caller. Samples are never counted twice and never lost: `n` of the new
version's statistics is `n` of the old.

When the network did not change the map is the identity, taken exactly (`S' = S_rest`).

>>> rng = np.random.default_rng(0)
>>> phi = rng.standard_normal((50, 4)); y = rng.standard_normal(50)
>>> rest = SufficientStats.from_samples(phi[:30, None, :], y[:30])
>>> W, R = projection(phi[30:], phi[30:])  # the same features: W = I, R = 0
>>> out = carry(rest, W, R, phi_sq=None)
>>> bool(np.allclose(out.S, rest.S) and np.allclose(out.b, rest.b)), out.n
(True, 30.0)
"""

from __future__ import annotations

import math

import numpy as np

from streamfed.core.stats import SufficientStats

__all__ = ["carry", "projection", "sample_stats"]


def projection(phi_old: np.ndarray, phi_new: np.ndarray, ridge: float = 1e-8) -> tuple[np.ndarray, np.ndarray]:
    """`(W, R)` from the reservoir's features under both maps (`(r, F_old)`, `(r, F_new)`): `W` the least-squares
    map `φ_old → φ_new` (ridge `ε = ridge · tr(Φ_oldᵀΦ_old) / F_old`, so a reservoir of fewer rows than features
    still has one), `R` the mean outer product of its residuals. Identical features: exactly `(I, 0)`."""
    phi_old = np.asarray(phi_old, dtype=np.float64)
    phi_new = np.asarray(phi_new, dtype=np.float64)
    if phi_old.ndim != 2 or phi_new.ndim != 2 or phi_old.shape[0] != phi_new.shape[0] or phi_old.shape[0] < 1:
        raise ValueError(f"expected features of the same rows, got {phi_old.shape} and {phi_new.shape}")
    r, f_old = phi_old.shape
    f_new = phi_new.shape[1]
    if phi_old.shape == phi_new.shape and np.array_equal(phi_old, phi_new):
        return np.eye(f_new), np.zeros((f_new, f_new))
    G = phi_old.T @ phi_old
    eps = ridge * max(float(np.trace(G)), 1e-300) / f_old
    W = np.linalg.solve(G + eps * np.eye(f_old), phi_old.T @ phi_new).T  # G is symmetric: (G⁻¹ Φ_oldᵀ Φ_new)ᵀ
    E = phi_new - phi_old @ W.T
    return W, (E.T @ E) / r


def sample_stats(phi: np.ndarray, y: np.ndarray, like: SufficientStats) -> SufficientStats:
    """The statistics of rows `phi (r, F)` with targets `y`, shaped (one kernel) and versioned like `like`."""
    phi = np.asarray(phi, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    return SufficientStats((phi.T @ phi)[None], (phi.T @ y)[None], float(len(y)), float(y @ y),
                           like.kernel_version, like.epoch)


def carry(rest: SufficientStats, W: np.ndarray, R: np.ndarray, phi_sq: float | None) -> SufficientStats:
    """The statistics `rest` (one kernel, of the old features) carried to the new features by `(W, R)` of
    :func:`projection` (the module docstring's formula). `phi_sq`: `‖φ_new‖²` of every input, to pin the trace
    (None: not pinned, `c = 1`). `n` and `q` are unchanged."""
    S = np.asarray(rest.S, dtype=np.float64)
    if S.ndim != 3 or S.shape[0] != 1:
        raise ValueError(f"expected the statistics of one kernel, got S of shape {S.shape}")
    n = float(rest.n)
    if n <= 0:
        return SufficientStats(np.zeros((1, *R.shape)), np.zeros((1, R.shape[0])), 0.0, 0.0, rest.kernel_version,
                               rest.epoch)
    identity = W.shape[0] == W.shape[1] and np.array_equal(W, np.eye(W.shape[0])) and not np.any(R)
    if identity:
        S_new, b_new = S[0].copy(), np.asarray(rest.b[0], dtype=np.float64).copy()
    else:
        # S_rest is a difference of sums (own − reservoir): positive semi-definite up to rounding. As a Gram
        # matrix G Gᵀ (G = W V Λ^½, rounding-level negative Λ dropped) the projection stays so (as FSGP's).
        lam, V = np.linalg.eigh(0.5 * (S[0] + S[0].T))
        G = W @ (V * np.sqrt(np.clip(lam, 0.0, None)))
        S_new = G @ G.T + n * R
        b_new = W @ np.asarray(rest.b[0], dtype=np.float64)
    if phi_sq is not None and not identity:
        tr = float(np.trace(S_new))
        if tr > 0 and math.isfinite(tr):
            c = n * float(phi_sq) / tr
            S_new *= c
            b_new *= math.sqrt(c)
    return SufficientStats(S_new[None], b_new[None], n, float(rest.q), rest.kernel_version, rest.epoch)
