"""The evidence of FedBNR's model and the hyperparameters it picks (docs/algorithms.md §4.2, §4.7).

`log p(y)` of `y = φ(x)ᵀw + ε`, `w ~ N(0, λ²I)`, `ε ~ N(0, σ²)`, from the additive statistics `(S, b, n, q)`
alone: exactly per kernel (:func:`log_evidence`), in the eigenbasis of `S` at `O(F)` a point
(:func:`spectral_log_evidence`), and type-II maximum likelihood of `σ, λ` (:func:`fit_hyperparameters`), which
the server runs on the global sums at every publish: a zooming grid over `(log σ, log λ)` after an
eigendecomposition (`search="grid"`), or a 1-d search over `log(λ/σ)` with `σ` maximised in closed form after a
tridiagonal reduction (`search="profile"`, :func:`profile_search_reference`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.linalg import lapack

from streamfed.algorithms.fedbnr._compiled import kern
from streamfed.core.stats import SufficientStats

__all__ = ["MAX_CONDITION", "SEARCHES", "fit_hyperparameters", "log_evidence", "profile_search_reference",
           "spectral_log_evidence", "zoom_search_reference"]


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


SEARCHES = ("grid", "profile")  # fit_hyperparameters' searches
MAX_CONDITION = 1e11  # largest condition number of a working precision the evidence fit may choose
_LOG_MAX_COND = math.log(MAX_CONDITION)


def fit_hyperparameters(
    s_mat: np.ndarray, b: np.ndarray, n: float, q: float, *, grid: int = 21, levels: int = 6,
    sigma_range: tuple[float, float] = (1e-4, 10.0), lam_range: tuple[float, float] = (1e-3, 1e3),
    search: str = "grid",
) -> tuple[float, float, float]:
    """Type-II maximum likelihood: `(σ, λ, log p(y))` maximising the exact evidence of one kernel.

    `search="grid"`: one eigendecomposition of `S`, then a zooming grid search over `(log σ, log λ)`: each level
    evaluates a `grid × grid` lattice (`O(F)` per point) and shrinks the box to ±2 cells around the
    best point. `search="profile"`: one tridiagonal reduction of `[[0, bᵀ], [b, S]]` (Householder: `S = QTQᵀ`
    with `Qᵀb = ‖b‖e₁`, no eigenvectors), then the same zoom over `log(λ/σ)` alone with `σ` at its closed-form
    maximum (:func:`profile_search_reference`): `levels × grid` points of `O(F)` instead of `levels × grid²`, and
    at least the grid's evidence up to the resolution of the zoom. The search box is relative to the data:
    `σ / rms(y) ∈ sigma_range`, `λ · rms‖φ‖ / rms(y) ∈ lam_range` (`λ‖φ‖` is the prior scale of `φᵀw`).
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
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {SEARCHES}, got {search!r}")
    if search == "profile":
        return _fit_profile(np.asarray(s_mat, dtype=np.float64), np.asarray(b, dtype=np.float64), n, q, grid,
                            levels, sigma_range, lam_range)
    eigvals, vecs = np.linalg.eigh(np.asarray(s_mat, dtype=np.float64))
    eigvals = np.clip(eigvals, 0.0, None)  # rounding (or DP noise) can leave tiny negative ones
    z2 = (vecs.T @ np.asarray(b, dtype=np.float64)) ** 2
    y_scale = math.sqrt(q / n)
    f_scale = math.sqrt(max(float(eigvals.sum()) / n, 1e-300))
    lo, hi = _box(y_scale, f_scale, sigma_range, lam_range)
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


def _box(y_scale: float, f_scale: float, sigma_range: tuple[float, float], lam_range: tuple[float, float]
         ) -> tuple[np.ndarray, np.ndarray]:
    lo = np.array([math.log(y_scale * sigma_range[0]), math.log(y_scale / f_scale * lam_range[0])])
    hi = np.array([math.log(y_scale * sigma_range[1]), math.log(y_scale / f_scale * lam_range[1])])
    return lo, hi


@functools.cache
def _sytrd_lwork(n: int) -> int:
    work, info = lapack.dsytrd_lwork(n, lower=1)
    return max(int(work), 1) if info == 0 else max(n, 1)


def _fit_profile(s_mat: np.ndarray, b: np.ndarray, n: float, q: float, grid: int, levels: int,
                 sigma_range: tuple[float, float], lam_range: tuple[float, float]) -> tuple[float, float, float]:
    f = b.shape[0]
    bordered = np.empty((f + 1, f + 1))
    bordered[0, 0] = 0.0
    bordered[0, 1:] = b
    bordered[1:, 0] = b
    bordered[1:, 1:] = s_mat
    # Householder tridiagonalisation: the first reflector maps b onto the first axis, the others leave it be.
    # (Symmetric, so its transpose is the same matrix in Fortran order: LAPACK works on it without a copy; with
    # the optimal workspace, blocked.)
    _, d, e, _, info = lapack.dsytrd(bordered.T, lower=1, lwork=_sytrd_lwork(f + 1), overwrite_a=1)
    if info != 0:
        raise ValueError(f"tridiagonal reduction failed (LAPACK info {info})")
    diag, off = np.ascontiguousarray(d[1:]), np.ascontiguousarray(e[1:])
    c = np.zeros(f)
    c[0] = e[0]
    if f > 1:  # the largest eigenvalue of T (= S's), by bisection
        top = float(lapack.dstebz(diag, off, 2, 0.0, 0.0, f, f, 0.0, "E")[1][0])
    else:
        top = float(diag[0])
    y_scale = math.sqrt(q / n)
    f_scale = math.sqrt(max(float(np.trace(s_mat)) / n, 1e-300))
    lo, hi = _box(y_scale, f_scale, sigma_range, lam_range)
    best = np.empty(2)
    value = kern.profile_search(diag, off, c, n, q, lo, hi, int(grid), int(levels), _LOG_MAX_COND,
                                math.log(max(top, 1e-300)), best)  # compiled; numpy: profile_search_reference
    return math.exp(float(best[0])), math.exp(float(best[1])), float(value)


def profile_search_reference(s_mat: np.ndarray, b: np.ndarray, n: float, q: float, lo: np.ndarray, hi: np.ndarray,
                             grid: int = 21, levels: int = 6) -> tuple[np.ndarray, float]:
    """The search of `fit_hyperparameters(search="profile")` in plain numpy on `S` itself (what the compiled
    `profile_search` runs on the tridiagonal form): the best `(log σ, log λ)` in the box `[lo, hi]` and its log
    evidence. Kept as the reference.

    At `u = log λ - log σ`, `r = λ²/σ² = e^{2u}`, the evidence is `-(n/2)log(2πσ²) - ½log|I + rS| - R/(2σ²)`
    with `R = q - r·bᵀ(I + rS)⁻¹b` (the residual term does not depend on `σ` at a fixed `r`), maximal in `σ`
    at `σ² = R/n`, clamped to the box (the function is concave in `log σ²`).

    >>> rng = np.random.default_rng(0)
    >>> phi = rng.standard_normal((400, 3)); y = phi @ [1.0, -1.0, 0.5] + 0.1 * rng.standard_normal(400)
    >>> st = SufficientStats.from_samples(phi, y)
    >>> (ls, ll), value = profile_search_reference(st.S, st.b, st.n, st.q, np.array([-9.0, -7.0]), np.array([2.0, 6.0]))
    >>> bool(0.08 < math.exp(ls) < 0.12), bool(np.isclose(value, log_evidence(st, math.exp(ls), math.exp(ll))))
    (True, True)
    """
    f = b.shape[0]
    log_top = math.log(max(float(np.linalg.eigvalsh(s_mat)[-1]), 1e-300))
    u_lo, u_hi = lo[1] - hi[0], hi[1] - lo[0]
    box = (u_lo, u_hi)
    best, best_u, best_val = 0.5 * (lo + hi), 0.5 * (u_lo + u_hi), -np.inf
    for _ in range(levels):
        us = np.linspace(box[0], box[1], grid)
        for u in us:
            if 2.0 * u + log_top > _LOG_MAX_COND:
                continue
            r = math.exp(2.0 * u)
            a = np.eye(f) + r * s_mat
            sign, logdet = np.linalg.slogdet(a)
            s_lo, s_hi = max(lo[0], lo[1] - u), min(hi[0], hi[1] - u)
            if sign <= 0 or np.any(np.linalg.eigvalsh(a) <= 0) or s_lo > s_hi:
                continue
            resid = q - r * float(b @ np.linalg.solve(a, b))
            ls = min(max(0.5 * math.log(resid / n) if resid > 0 else s_lo, s_lo), s_hi)
            v = -0.5 * n * math.log(2 * math.pi * math.exp(2 * ls)) - 0.5 * logdet - 0.5 * resid / math.exp(2 * ls)
            if v > best_val:
                best, best_u, best_val = np.array([ls, ls + u]), u, v
        step = (box[1] - box[0]) / (grid - 1)
        box = (max(best_u - 2 * step, u_lo), min(best_u + 2 * step, u_hi))
    return best, float(best_val)
