"""A noise level no minority of members can pull down (docs/reliability.md §7.2.1, issue 30).

The evidence fit (:func:`~.evidence.fit_hyperparameters`) reads `σ` off the global sums, where every member's
samples count by their number. A member whose labels are a smooth function of its inputs (an attacker echoing
the global's prediction, shifted) looks like noise-free data: the fit lowers `σ` and raises `λ` until the
kernel is flexible enough to follow it, and every member then predicts with that kernel. Here each member
votes once instead: under the posterior mean of the global fit, each member's own mean squared residual
`r_c = (q_c − 2b_cᵀμ + μᵀS_cμ)/n_c`, exactly from its summed statistics; the fleet's noise level is at least
the median member's, `σ² ≥ median_c r_c`, and `λ` is refitted by the evidence at that `σ`. Fewer than half
the members cannot move the median beyond the honest members' range. Without attackers the median member's
residual is at or below the pooled fit's `σ²` (stations with pollution episodes lift the mean, not the
median), so the floor rarely binds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters, log_evidence
from streamfed.core.stats import SufficientStats

__all__ = ["MIN_MEMBERS", "member_residuals", "noise_floored_fit", "posterior_mean", "robust_centre"]

# fewer members than this and a median is not a vote: the floor is off
MIN_MEMBERS = 3


def posterior_mean(s_mat: np.ndarray, b: np.ndarray, sigma: float, lam: float) -> np.ndarray:
    """`μ = (S + (σ/λ)² I)⁻¹ b` of one kernel.

    >>> posterior_mean(np.eye(2) * 3.0, np.array([3.0, 0.0]), 1.0, 1.0)
    array([0.75, 0.  ])
    """
    f = b.shape[-1]
    return np.linalg.solve(s_mat + (sigma / lam) ** 2 * np.eye(f), b)


def member_residuals(mean: np.ndarray, members: Sequence[tuple[np.ndarray, np.ndarray, float, float]]
                     ) -> np.ndarray:
    """Each member's mean squared residual under `mean`, `(q − 2bᵀμ + μᵀSμ)/n`, from its `(S, b, q, n)`.

    >>> s = SufficientStats.from_samples(np.array([[1.0], [1.0]]), np.array([1.0, 3.0]))
    >>> member_residuals(np.array([2.0]), [(s.S, s.b, s.q, s.n)])  # residuals ±1
    array([1.])
    """
    out = np.empty(len(members))
    for i, (s_mat, b, q, n) in enumerate(members):
        out[i] = max(float(q) - 2.0 * float(b @ mean) + float(mean @ s_mat @ mean), 0.0) / float(n)
    return out


def noise_floored_fit(s_mat: np.ndarray, b: np.ndarray, n: float, q: float,
                      members: Sequence[tuple[np.ndarray, np.ndarray, float, float]], *, search: str = "grid",
                      rounds: int = 2, leave_out: bool = False) -> tuple[float, float, float, float]:
    """`(σ, λ, log p(y), floor)` of one kernel: the evidence fit of the sums, with `σ` raised to the median
    member's residual level `floor` (module docstring) and `λ` refitted at it when the fit fell below; `rounds`
    alternations (the members' residuals are taken under the posterior of the previous round). With fewer than
    :data:`MIN_MEMBERS` members: the plain fit, `floor` 0. `leave_out`: each member's residual is taken under the
    posterior of the *other* members' sums (a predictive residual: the floor then binds without attackers too).

    >>> rng = np.random.default_rng(1)
    >>> x = rng.uniform(-3, 3, (900, 1)); phi = np.hstack([np.cos(x * w) for w in (0.5, 1, 2)] + [np.sin(x), x])
    >>> y = np.sin(x[:, 0]) + 0.3 * rng.standard_normal(900)
    >>> parts = [SufficientStats.from_samples(phi[i::3], y[i::3]) for i in range(3)]
    >>> total = parts[0] + parts[1] + parts[2]
    >>> s, lam, _, floor = noise_floored_fit(total.S, total.b, total.n, total.q, [(p.S, p.b, p.q, p.n) for p in parts])
    >>> bool(0.25 < s < 0.45), bool(s >= math.sqrt(floor))
    (True, True)
    """
    sigma, lam, value = fit_hyperparameters(s_mat, b, n, q, search=search)
    if len(members) < MIN_MEMBERS:
        return sigma, lam, value, 0.0
    floor = 0.0
    y_scale = math.sqrt(q / n)
    for _ in range(rounds):
        if leave_out:  # each member's residual under the posterior of the others' sums
            floor = float(np.median([member_residuals(posterior_mean(s_mat - m[0], b - m[1], sigma, lam), [m])[0]
                                     for m in members]))
        else:
            floor = float(np.median(member_residuals(posterior_mean(s_mat, b, sigma, lam), members)))
        if not floor > sigma**2:
            break
        sigma = math.sqrt(floor)
        rel = sigma / y_scale  # the search box is relative to rms(y): a box of one σ
        _, lam, value = fit_hyperparameters(s_mat, b, n, q, sigma_range=(rel, rel), search="grid")
    if not math.isfinite(value):
        value = float(log_evidence(SufficientStats(s_mat, b, n, q), sigma, lam))
    return sigma, lam, value, floor


def robust_centre(s_mat: np.ndarray, members: Sequence[tuple[np.ndarray, np.ndarray, float, float]], rho: float,
                  *, iterations: int = 50, means: np.ndarray | None = None) -> np.ndarray:
    """The geometric median of the members' own posterior means `μ_c = (S_c + ρI)⁻¹ b_c` of one kernel, in the
    metric of the fleet's inputs `‖Δ‖²_{S/n}` (the mean squared difference of the predictions over every
    member's inputs): a centre fewer than half the members cannot move beyond the others' spread (Weiszfeld
    iterations, started at the coordinate-wise median). `means`: the members' `μ_c` when the caller has them (an
    aggregator keeps each member's until its sums change: the solves are the centre's cost).

    >>> S = np.eye(1) * 10.0
    >>> members = [(S, S @ [v], 10.0 * v * v, 10.0) for v in (1.0, 1.1, 0.9, 50.0)]
    >>> bool(abs(robust_centre(S * 4, members, 1e-9)[0] - 1.0) < 0.1)
    True
    """
    f = s_mat.shape[-1]
    n = sum(float(m[3]) for m in members)
    scale = np.linalg.cholesky(s_mat / n + 1e-9 * np.trace(s_mat) / (n * f) * np.eye(f))  # S/n = L Lᵀ
    if means is None:
        means = np.array([np.linalg.solve(sm + rho * np.eye(f), bm) for sm, bm, _, _ in members])
    z = means @ scale  # each row (Lᵀμ_c)ᵀ
    c = np.median(z, axis=0)
    for _ in range(iterations):
        d = np.maximum(np.linalg.norm(z - c, axis=1), 1e-12)
        c_new = (z / d[:, None]).sum(axis=0) / (1.0 / d).sum()
        if np.linalg.norm(c_new - c) <= 1e-9 * (1.0 + np.linalg.norm(c)):
            c = c_new
            break
        c = c_new
    return np.linalg.solve(scale.T, c)
