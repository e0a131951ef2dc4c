"""The evidence of FedBNR's model and the hyperparameters it picks (docs/algorithms.md §4.2, §4.7).

`log p(y)` of `y = φ(x)ᵀw + ε`, `w ~ N(0, λ²I)`, `ε ~ N(0, σ²)`, from the additive statistics `(S, b, n, q)`
alone: exactly per kernel (:func:`log_evidence`), in the eigenbasis of `S` at `O(F)` a point
(:func:`spectral_log_evidence`), and type-II maximum likelihood of `σ, λ` (:func:`fit_hyperparameters`), which
the server runs on the global sums at every publish.
"""

from __future__ import annotations

import math

import numpy as np

from streamfed.algorithms.fedbnr._compiled import kern
from streamfed.core.stats import SufficientStats

__all__ = ["MAX_CONDITION", "fit_hyperparameters", "log_evidence", "spectral_log_evidence", "zoom_search_reference"]


def log_evidence(stats: SufficientStats, sigma: float | np.ndarray, lam: float | np.ndarray) -> np.ndarray:
    """Exact `log p(y)` from the sums, per kernel (Cholesky of `A`; `O(F³)`).

    `-(n/2)log(2πσ²) - ½log|I + λ²σ⁻²S| - ½(σ⁻²q - σ⁻⁴bᵀA⁻¹b)` with `A = σ⁻²S + λ⁻²I`.

    >>> s = SufficientStats.from_samples(np.array([[1.0], [2.0]]), np.array([0.5, 1.0]))
    >>> direct = -0.5 * 2 * np.log(2 * np.pi) - 0.5 * np.log(np.linalg.det(np.eye(2) + [[1, 2], [2, 4]]))
    >>> direct -= 0.5 * np.array([0.5, 1.0]) @ np.linalg.solve(np.eye(2) + [[1, 2], [2, 4]], [0.5, 1.0])
    >>> bool(np.isclose(log_evidence(s, 1.0, 1.0), direct))
    True
    """
    s_mat = stats.S.reshape((-1, stats.dim, stats.dim))
    b = stats.b.reshape((-1, stats.dim))
    kk = s_mat.shape[0]
    sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (kk,))
    lam_ = np.broadcast_to(np.asarray(lam, dtype=np.float64), (kk,))
    out = np.empty(kk)
    f = stats.dim
    for k in range(kk):
        s2, l2 = sig[k] ** 2, lam_[k] ** 2
        a = s_mat[k] / s2 + np.eye(f) / l2
        chol = np.linalg.cholesky(a)
        u = np.empty(f)
        kern.solve_rt(np.ascontiguousarray(chol.T), b[k] / s2, u, f)  # u = L⁻¹ σ⁻² b
        logdet = 2.0 * np.log(np.diag(chol)).sum() + f * np.log(l2)
        out[k] = (-0.5 * stats.n * np.log(2 * np.pi * s2) - 0.5 * logdet - 0.5 * (stats.q / s2 - u @ u))
    return out.reshape(stats.batch_shape) if stats.batch_shape else out[0]


def spectral_log_evidence(
    eigvals: np.ndarray, z2: np.ndarray, n: float, q: float, log_sigma: np.ndarray, log_lam: np.ndarray
) -> np.ndarray:
    """The same evidence in the eigenbasis of `S = U diag(e) Uᵀ` with `z = Uᵀb`: `O(F)` per point.

    `log|I + λ²σ⁻²S| = Σ log(1 + λ²e_i/σ²)` and `σ⁻⁴bᵀA⁻¹b = Σ z_i² λ² / (σ²(σ² + λ²e_i))`.
    `log_sigma`, `log_lam` broadcast against each other (e.g. a grid).
    """
    ls, ll = np.broadcast_arrays(np.asarray(log_sigma, dtype=np.float64),
                                 np.asarray(log_lam, dtype=np.float64))
    s2 = np.exp(2.0 * ls)[..., None]
    l2 = np.exp(2.0 * ll)[..., None]
    t = s2 + l2 * eigvals
    logdet = np.log1p(l2 * eigvals / s2).sum(axis=-1)
    quad = (q - (z2 * l2 / t).sum(axis=-1)) / s2[..., 0]
    return -0.5 * n * np.log(2.0 * np.pi * s2[..., 0]) - 0.5 * logdet - 0.5 * quad


MAX_CONDITION = 1e11  # largest condition number of a working precision the evidence fit may choose
_LOG_MAX_COND = math.log(MAX_CONDITION)


def fit_hyperparameters(
    s_mat: np.ndarray, b: np.ndarray, n: float, q: float, *, grid: int = 21, levels: int = 6,
    sigma_range: tuple[float, float] = (1e-4, 10.0), lam_range: tuple[float, float] = (1e-3, 1e3),
) -> tuple[float, float, float]:
    """Type-II maximum likelihood: `(σ, λ, log p(y))` maximising the exact evidence of one kernel.

    One eigendecomposition of `S`, then a zooming grid search over `(log σ, log λ)`: each level
    evaluates a `grid × grid` lattice (`O(F)` per point) and shrinks the box to ±2 cells around the
    best point. The search box is relative to the data: `σ / rms(y) ∈ sigma_range`,
    `λ · rms‖φ‖ / rms(y) ∈ lam_range` (`λ‖φ‖` is the prior scale of `φᵀw`).
    Points where the posterior precision `σ⁻²S + λ⁻²I` would have a condition number above
    `MAX_CONDITION` (`1 + λ²e_max/σ²`) are left out: there the evidence can still prefer them (a nearly
    noise-free fit, e.g. a stream whose target repeats exactly), but no Cholesky factor of that precision
    is trustworthy in float64.

    >>> rng = np.random.default_rng(0)
    >>> phi = rng.standard_normal((400, 3)); y = phi @ [1.0, -1.0, 0.5] + 0.1 * rng.standard_normal(400)
    >>> st = SufficientStats.from_samples(phi, y)
    >>> sigma, lam, lev = fit_hyperparameters(st.S, st.b, st.n, st.q)
    >>> bool(0.08 < sigma < 0.12)
    True
    """
    n, q = float(n), float(q)
    if not (n > 0 and q > 0 and math.isfinite(q)):
        raise ValueError("the evidence needs at least one sample with a non-zero target")
    eigvals, vecs = np.linalg.eigh(np.asarray(s_mat, dtype=np.float64))
    eigvals = np.clip(eigvals, 0.0, None)  # rounding (or DP noise) can leave tiny negative ones
    z2 = (vecs.T @ np.asarray(b, dtype=np.float64)) ** 2
    y_scale = math.sqrt(q / n)
    f_scale = math.sqrt(max(float(eigvals.sum()) / n, 1e-300))
    lo = np.array([math.log(y_scale * sigma_range[0]), math.log(y_scale / f_scale * lam_range[0])])
    hi = np.array([math.log(y_scale * sigma_range[1]), math.log(y_scale / f_scale * lam_range[1])])
    best = np.empty(2)
    value = kern.zoom_search(eigvals, np.ascontiguousarray(z2), n, q, lo, hi, int(grid), int(levels), _LOG_MAX_COND,
                             best)  # compiled; its numpy transcription: zoom_search_reference
    ls, ll = float(best[0]), float(best[1])
    return math.exp(ls), math.exp(ll), float(value)


def zoom_search_reference(eigvals: np.ndarray, z2: np.ndarray, n: float, q: float, lo: np.ndarray, hi: np.ndarray,
                          grid: int = 21, levels: int = 6) -> tuple[np.ndarray, float]:
    """The zooming grid search of :func:`fit_hyperparameters` in numpy (what the compiled `zoom_search` runs):
    the best `(log σ, log λ)` and its log evidence (:func:`spectral_log_evidence`). Kept as the reference."""
    box_lo, box_hi = lo.copy(), hi.copy()
    best = (0.5 * (lo + hi), -np.inf)
    for _ in range(levels):
        gs = np.linspace(box_lo[0], box_hi[0], grid)
        gl = np.linspace(box_lo[1], box_hi[1], grid)
        vals = spectral_log_evidence(eigvals, z2, n, q, gs[:, None], gl[None, :])
        cond_ok = 2.0 * (gl[None, :] - gs[:, None]) + math.log(max(float(eigvals[-1]), 1e-300)) <= _LOG_MAX_COND
        score = np.where(np.isfinite(vals) & cond_ok, vals, -np.inf)
        i, j = np.unravel_index(int(np.argmax(score)), score.shape)
        if score[i, j] >= best[1]:
            best = (np.array([gs[i], gl[j]]), float(score[i, j]))
        step = (box_hi - box_lo) / (grid - 1)
        box_lo = np.maximum(best[0] - 2 * step, lo)
        box_hi = np.minimum(best[0] + 2 * step, hi)
    return best[0], best[1]
