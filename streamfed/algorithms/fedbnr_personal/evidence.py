"""The exact evidence of hierarchical (shared + personal) FedBNR, and `σ, λ, τ` by type-II maximum likelihood
(docs/algorithms.md §5.1–10.3, §5.6).

Model (one feature map `φ`, `F` features). Client `k`'s samples follow

    y = φ(x)ᵀ(w + δ_k) + ε,    w ~ N(0, λ²I) (shared),   δ_k ~ N(0, τ²I) (personal),   ε ~ N(0, σ²)

`τ → 0` is exact (pooled) FedBNR, `λ → 0` is local-only learning; in between, every client borrows
strength from the others exactly as much as the evidence says the clients resemble each other.

**Marginalised contributions.** With `δ_k` integrated out, client `k`'s data are `y_k ~ N(Φ_k w, C_k)`,
`C_k = σ²I + τ²Φ_kΦ_kᵀ`. As a function of `w` this likelihood is

    log p(y_k | w) = -½ wᵀP_k w + r_kᵀ w + log Z_k,      B_k = τ⁻²I + σ⁻²S_k,
    P_k = Φ_kᵀC_k⁻¹Φ_k = τ⁻²σ⁻² B_k⁻¹ S_k,   r_k = Φ_kᵀC_k⁻¹y_k = τ⁻²σ⁻² B_k⁻¹ b_k,
    log Z_k = log N(y_k; 0, C_k) = the FedBNR evidence of (S_k, b_k, n_k, q_k) with prior scale τ

(Woodbury on `C_k⁻¹`; `P_k = σ⁻²S_k - σ⁻⁴S_kB_k⁻¹S_k` written without the cancellation). All of it depends
only on the client's statistics `(S_k, b_k, n_k, q_k)`. In the eigenbasis `S_k = U diag(e) Uᵀ`, `z = Uᵀb_k`:
`P_k = U diag(e / (σ² + τ²e)) Uᵀ` and `r_k = U (z / (σ² + τ²e))`.

**Shared posterior.** `w | all data ~ N(A⁻¹h, A⁻¹)` with `A = λ⁻²I + Σ_k P_k`, `h = Σ_k r_k`, and the exact
log evidence of the whole hierarchical model is

    log p(y) = Σ_k log Z_k  - F log λ - ½ log|A| + ½ hᵀA⁻¹h

:func:`fit_hierarchical` maximises it over `(σ, λ, τ)`. With one client the model is Bayesian linear regression
with prior variance `λ² + τ²` (`λ`, `τ` not separately identifiable), so it fits `(σ, √(λ²+τ²))` by the
evidence and splits the prior variance evenly (the local-only baseline: the same learner with a private
server per client).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import optimize
from scipy.linalg import blas, lapack

from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters, spectral_log_evidence
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["SEARCHES", "fit_hierarchical", "hierarchical_log_evidence", "marginal_contribution", "sym"]


def sym(a: np.ndarray) -> np.ndarray:
    """`(a + aᵀ)/2`: a matrix that should be symmetric, made exactly so."""
    return 0.5 * (a + a.T)


def marginal_contribution(stats: SufficientStats, sigma: float, tau: float) -> tuple[np.ndarray, np.ndarray, float]:
    """`(P, r, log Z)` of one client's statistics: its likelihood of the shared `w` with its personal
    `δ ~ N(0, τ²I)` integrated out is `exp(-½wᵀPw + rᵀw + log Z)` (module docstring).

    >>> rng = np.random.default_rng(0)
    >>> phi, y = rng.standard_normal((5, 2)), rng.standard_normal(5)
    >>> p, r, log_z = marginal_contribution(SufficientStats.from_samples(phi, y), 0.5, 2.0)
    >>> c = 0.25 * np.eye(5) + 4.0 * phi @ phi.T  # C = σ²I + τ²ΦΦᵀ
    >>> bool(np.allclose(p, phi.T @ np.linalg.solve(c, phi)) and np.allclose(r, phi.T @ np.linalg.solve(c, y)))
    True
    """
    s2, t2 = sigma * sigma, tau * tau
    f = stats.dim
    s_mat = sym(stats.S)
    b_mat = s_mat / s2 + np.eye(f) / t2
    chol = np.linalg.cholesky(b_mat)
    rhs = np.concatenate([s_mat, stats.b[:, None]], axis=1) / (t2 * s2)
    # B⁻¹[S | b] τ⁻²σ⁻² from the factor by two triangular solves (a general solve would factorise each triangle)
    sol, info = lapack.dpotrs(chol, rhs, lower=1)
    if info != 0:
        raise ValueError(f"triangular solve failed (LAPACK info {info})")
    p = sym(sol[:, :f])
    r = sol[:, f]
    # log Z: FedBNR evidence with prior scale τ, from the same factor (|I + τ²σ⁻²S| = τ^{2F}|B|).
    u, info = lapack.dtrtrs(chol, stats.b / s2, lower=1)
    if info != 0:
        raise ValueError(f"triangular solve failed (LAPACK info {info})")
    logdet = 2.0 * np.log(np.diag(chol)).sum() + f * math.log(t2)
    log_z = -0.5 * stats.n * math.log(2 * math.pi * s2) - 0.5 * logdet - 0.5 * (stats.q / s2 - u @ u)
    return p, r, float(log_z)


def hierarchical_log_evidence(
    client_stats: Sequence[SufficientStats], sigma: float, lam: float, tau: float
) -> tuple[float, np.ndarray, np.ndarray]:
    """`(log p(y), A, h)`: exact log evidence of the hierarchical model and the shared posterior's
    natural parameters (`w | y ~ N(A⁻¹h, A⁻¹)`), from each client's statistics."""
    f = client_stats[0].dim
    a = np.eye(f) / (lam * lam)
    h = np.zeros(f)
    total = 0.0
    for st in client_stats:
        p, r, log_z = marginal_contribution(st, sigma, tau)
        a += p
        h += r
        total += log_z
    chol = np.linalg.cholesky(a)
    u, info = lapack.dtrtrs(chol, h, lower=1)
    if info != 0:
        raise ValueError(f"triangular solve failed (LAPACK info {info})")
    total += -f * math.log(lam) - np.log(np.diag(chol)).sum() + 0.5 * u @ u
    return float(total), a, h


SEARCHES = ("nelder-mead", "l-bfgs-b", "newton")  # fit_hierarchical's methods


@durable("fedbnr-personal.Spectra")
class _Spectra:
    """Eigendecompositions of every client's `S_k`, for `O(K F²)`-per-point evidence evaluations."""

    def __init__(self, client_stats: Sequence[SufficientStats]) -> None:
        es, us, zs = [], [], []
        self.n = np.array([st.n for st in client_stats])
        self.q = np.array([st.q for st in client_stats])
        for st in client_stats:
            e, u = np.linalg.eigh(sym(st.S))
            es.append(np.clip(e, 0.0, None))
            us.append(u)
            zs.append(u.T @ st.b)
        self.e = np.stack(es)  # (K, F)
        self.z = np.stack(zs)  # (K, F)
        self.z2 = self.z**2
        # (F, K F): [U_1 | U_2 | ...], column-major: BLAS's syrk reads the scaled eigenvectors in place
        self.u_cat = np.asfortranarray(np.concatenate(us, axis=1))
        self.w = np.empty_like(self.u_cat)  # the scaled eigenvectors of the latest evaluation (work space)
        self.f = self.e.shape[1]

    def log_evidence(self, log_sigma: float, log_lam: float, log_tau: float) -> float:
        s2, l2, t2 = math.exp(2 * log_sigma), math.exp(2 * log_lam), math.exp(2 * log_tau)
        denom = s2 + t2 * self.e  # (K, F)
        per_client = spectral_log_evidence(self.e, self.z2, self.n, self.q, np.full(len(self.n), log_sigma),
                                           np.full(len(self.n), log_tau))
        # A = Σ_k U_k diag(e_k/(σ² + τ²e_k)) U_kᵀ + λ⁻²I as W Wᵀ, W = U_cat diag(√d): a symmetric rank-KF update
        # (syrk) computes the lower triangle only, half the multiplications of the general product
        w = np.multiply(self.u_cat, np.sqrt((self.e / denom).ravel()), out=self.w)
        a = blas.dsyrk(1.0, w, lower=1)
        a[np.diag_indices(self.f)] += 1.0 / l2
        h = self.u_cat @ (self.z / denom).ravel()
        # LAPACK directly: the factor's lower triangle (what np.linalg.cholesky returns) and one forward
        # substitution, where a general solve would factorise the triangle again (O(F³) per evaluation)
        chol, info = lapack.dpotrf(a, lower=1, clean=0, overwrite_a=1)
        if info != 0:
            return -math.inf
        u, info = lapack.dtrtrs(chol, h, lower=1)
        if info != 0:
            return -math.inf
        return float(per_client.sum() - self.f * log_lam - np.log(np.diag(chol)).sum() + 0.5 * u @ u)

    def log_evidence_and_grad(self, log_sigma: float, log_lam: float, log_tau: float
                              ) -> tuple[float, np.ndarray]:
        """The log evidence and its gradient in `(log σ, log λ, log τ)` (docs/algorithms.md §5.6): about two
        evaluations' work — the trace term needs `diag(U_catᵀA⁻¹U_cat)`, one triangular solve with `KF` columns.
        `(-inf, 0)` where `A` is not positive definite."""
        s2, l2, t2 = math.exp(2 * log_sigma), math.exp(2 * log_lam), math.exp(2 * log_tau)
        e, z, z2 = self.e, self.z, self.z2
        denom = s2 + t2 * e  # D = σ² + τ²e, (K, F)
        inv = 1.0 / denom
        d, c = e * inv, z * inv  # A = λ⁻²I + Σ U diag(d) Uᵀ, h = Σ U c
        w = np.multiply(self.u_cat, np.sqrt(d.ravel()), out=self.w)
        a = blas.dsyrk(1.0, w, lower=1)
        a[np.diag_indices(self.f)] += 1.0 / l2
        h = self.u_cat @ c.ravel()
        chol, info = lapack.dpotrf(a, lower=1, clean=1, overwrite_a=1)
        if info != 0:
            return -math.inf, np.zeros(3)
        u, info = lapack.dtrtrs(chol, h, lower=1)
        if info != 0:
            return -math.inf, np.zeros(3)
        m, _ = lapack.dtrtrs(chol, u, lower=1, trans=1)  # the posterior mean A⁻¹h
        v = (self.u_cat.T @ m).reshape(e.shape)  # U_kᵀ m
        # g = diag(U_catᵀA⁻¹U_cat) = the columns' squared norms of L⁻¹U_cat: L⁻¹ (F³/3) then a triangular
        # product (BLAS trmm), twice as fast here as a triangular solve with KF right-hand sides
        linv, info = lapack.dtrtri(chol, lower=1)
        if info != 0:
            return -math.inf, np.zeros(3)
        lw = blas.dtrmm(1.0, linv, self.u_cat, lower=1)
        g = np.einsum("ij,ij->j", lw, lw).reshape(e.shape)
        n_tot, q_tot = float(self.n.sum()), float(self.q.sum())
        # per client, Σ_k log Z_k: with Q = q - Σ z²τ²/D, ∂/∂log σ = -n + Σ τ²e/D + Q/σ² - Σ z²τ²/D²,
        # ∂/∂log τ = -Σ τ²e/D + Σ z²τ²/D²
        te = t2 * (e * inv).sum()
        zt = t2 * (z2 * inv * inv).sum()
        quad = q_tot - t2 * (z2 * inv).sum()
        per_client = (-0.5 * n_tot * math.log(2 * math.pi * s2) - 0.5 * np.log1p(t2 * e / s2).sum()
                      - 0.5 * quad / s2)
        value = float(per_client - self.f * log_lam - np.log(np.diag(chol)).sum() + 0.5 * u @ u)
        # the shared part -F log λ - ½ log|A| + ½ hᵀA⁻¹h: ∂ = -½ Σ (g + v²) ∂d + Σ v ∂c, with
        # ∂D/∂log σ = 2σ², ∂D/∂log τ = 2τ²e, ∂d = -e ∂D/D², ∂c = -z ∂D/D²
        gv = (g + v * v) * e - 2.0 * v * z  # -2 × the shared part's derivative per unit of (-∂D/D²)
        inv2 = inv * inv
        shared_s = s2 * (gv * inv2).sum()
        shared_t = t2 * (gv * e * inv2).sum()
        grad = np.array([
            -n_tot + te + quad / s2 - zt + shared_s,
            -self.f + (float((linv * linv).sum()) + float(m @ m)) / l2,
            -te + zt + shared_t,
        ])
        return value, grad


GTOL = 1e-8  # the gradient searches stop at |∂ log p(y) / ∂ log θ| ≤ GTOL per sample (the optimum to ~1e-5 in the logs)


def fit_hierarchical(
    client_stats: Sequence[SufficientStats], start: tuple[float, float, float] | None = None,
    *, max_evals: int = 300, fixed_tau: float | None = None, method: str = "nelder-mead",
    memory: dict[str, Any] | None = None,
) -> tuple[float, float, float, float]:
    """Type-II ML `(σ, λ, τ, log p(y))` of the hierarchical model, in the logs from `start` or from the pooled
    FedBNR fit, over a search box relative to the data scale as in `fit_hyperparameters`.

    `method`: `"nelder-mead"` on the evidence's values (to 1e-3 in the logs); `"l-bfgs-b"` on its gradient
    (:meth:`_Spectra.log_evidence_and_grad`); `"newton"`: quasi-Newton steps on the gradient from the curvature
    kept in `memory` by the previous fit of a warm-started chain (a finite-difference Hessian when there is none,
    BFGS updates along the way), L-BFGS-B when a step leaves the box. The gradient searches stop at the same
    tolerance (`GTOL`): the same optimum to ~1e-5.

    >>> rng = np.random.default_rng(0)
    >>> w = rng.standard_normal(3)
    >>> fleet = [SufficientStats.from_samples(x, x @ (w + 0.3 * rng.standard_normal(3)) + 0.1 * rng.standard_normal(60))
    ...          for x in rng.standard_normal((4, 60, 3))]
    >>> a, b = fit_hierarchical(fleet, method="l-bfgs-b"), fit_hierarchical(fleet, method="newton", memory={})
    >>> bool(np.allclose(np.log(a[:3]), np.log(b[:3]), atol=1e-4))
    True
    """
    if method not in SEARCHES:
        raise ValueError(f"method must be one of {SEARCHES}, got {method!r}")
    total = client_stats[0].copy()
    for st in client_stats[1:]:
        total += st
    if len(client_stats) > 1 and start is not None:  # warm start: the pooled fit would go unused
        sig0 = lam0 = math.nan
    else:
        sig0, lam0, _ = fit_hyperparameters(sym(total.S), total.b, total.n, total.q)
    if len(client_stats) == 1:  # λ, τ not identifiable: split the prior variance λ² + τ² evenly
        lam, tau = lam0 / math.sqrt(2.0), lam0 / math.sqrt(2.0)
        if fixed_tau is not None:
            tau = float(fixed_tau)
            lam = math.sqrt(max(lam0**2 - tau**2, 1e-6 * lam0**2))
        return sig0, lam, tau, float(spectral_log_evidence(
            *_one_spectrum(total), total.n, total.q, np.log(sig0), np.log(math.hypot(lam, tau))))
    spectra = _Spectra(client_stats)
    y_scale = math.sqrt(total.q / total.n)
    f_scale = math.sqrt(max(float(np.trace(total.S)) / total.n, 1e-300))
    lo = [math.log(y_scale * 1e-4), math.log(y_scale / f_scale * 1e-4), math.log(y_scale / f_scale * 1e-5)]
    hi = [math.log(y_scale * 10.0), math.log(y_scale / f_scale * 1e3), math.log(y_scale / f_scale * 1e3)]
    x0 = np.log(start) if start is not None else np.log([sig0, lam0, lam0 / 3.0])
    if fixed_tau is not None:
        x0, lo, hi = x0[:2], lo[:2], hi[:2]
    x0 = np.clip(x0, np.array(lo) + 1e-9, np.array(hi) - 1e-9)
    log_tau = None if fixed_tau is None else math.log(fixed_tau)

    def result(x: np.ndarray, value: float) -> tuple[float, float, float, float]:
        tau = math.exp(x[2]) if fixed_tau is None else float(fixed_tau)
        return math.exp(x[0]), math.exp(x[1]), tau, value

    if method == "nelder-mead":
        def neg(theta: np.ndarray) -> float:
            v = spectra.log_evidence(*theta) if log_tau is None else spectra.log_evidence(theta[0], theta[1],
                                                                                          log_tau)
            return -v if math.isfinite(v) else 1e300

        m = len(x0)
        res = optimize.minimize(neg, x0, method="Nelder-Mead", bounds=list(zip(lo, hi, strict=True)),
                                options={"xatol": 1e-3, "fatol": 1e-4, "maxfev": max_evals,
                                         "initial_simplex": x0 + np.vstack([np.zeros(m), 0.2 * np.eye(m)])})
        return result(res.x, -float(res.fun))
    scale = 1.0 / max(float(total.n), 1.0)  # per sample: gradients O(1), so GTOL is a tolerance in the logs

    def neg_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        full = theta if log_tau is None else np.array([theta[0], theta[1], log_tau])
        v, g = spectra.log_evidence_and_grad(*full)
        if not math.isfinite(v):  # A not positive definite in floating point: a value no step accepts
            return 1e300, np.zeros(len(theta))
        return -v * scale, -g[:len(theta)] * scale

    if method == "newton":
        found = _newton(neg_grad, x0, np.array(lo), np.array(hi), memory if memory is not None else {}, max_evals)
        if found is not None:
            return result(found[0], -found[1] / scale)
    res = optimize.minimize(neg_grad, x0, jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi, strict=True)),
                            options={"maxfun": max_evals, "ftol": 1e-15, "gtol": GTOL})
    return result(res.x, -float(res.fun) / scale)


def _newton(
    fg: Callable[[np.ndarray], tuple[float, np.ndarray]], x: np.ndarray, lo: np.ndarray, hi: np.ndarray,
    memory: dict[str, Any], max_evals: int,
) -> tuple[np.ndarray, float] | None:
    """Minimise `fg` (value, gradient) from `x` by Newton steps with the Hessian in `memory` (finite differences
    of the gradient when there is none of this size or it is not positive definite), BFGS-updated after each
    step, Armijo backtracking; `None` when a step leaves the box `(lo, hi)` or the curvature is not positive
    definite (the caller falls back to L-BFGS-B). `memory["hessian"]` is left at the last curvature."""
    f, g = fg(x)
    evals = 1
    if not f < 1e300:
        return None
    hess = memory.get("hessian")
    fresh = hess is None or np.shape(hess) != (x.size, x.size)

    def finite_difference() -> np.ndarray | None:
        nonlocal evals
        h = np.empty((x.size, x.size))
        for j in range(x.size):
            xp = x.copy()
            xp[j] += 1e-5
            fp, gp = fg(xp)
            evals += 1
            if not fp < 1e300:
                return None
            h[:, j] = (gp - g) / 1e-5
        return 0.5 * (h + h.T)

    if fresh:
        hess = finite_difference()
    memory["hessian"] = None
    while evals < max_evals and np.abs(g).max() > GTOL:
        if hess is None:
            return None
        try:
            step = -np.linalg.solve(hess, g)
            np.linalg.cholesky(hess)
        except np.linalg.LinAlgError:
            step = None
        if step is None or not g @ step < 0:
            if fresh:
                return None
            hess, fresh = finite_difference(), True  # the remembered curvature does not fit here: measure it
            continue
        t = 1.0
        while True:  # Armijo backtracking
            xn = x + t * step
            if np.any(xn <= lo) or np.any(xn >= hi):
                return None
            fn, gn = fg(xn)
            evals += 1
            if fn <= f + 1e-4 * t * (g @ step) or t < 1e-6 or evals >= max_evals:
                break
            t *= 0.5
        if not fn <= f:  # at the values' rounding: no further progress to be had
            break
        s, y = xn - x, gn - g
        if s @ y > 0:  # BFGS update of the Hessian
            hs = hess @ s
            hess = hess - np.outer(hs, hs) / (s @ hs) + np.outer(y, y) / (s @ y)
        x, f, g = xn, fn, gn
    memory["hessian"] = hess
    return x, f


def _one_spectrum(st: SufficientStats) -> tuple[np.ndarray, np.ndarray]:
    e, u = np.linalg.eigh(sym(st.S))
    return np.clip(e, 0.0, None), (u.T @ st.b) ** 2

