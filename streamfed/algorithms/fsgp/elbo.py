"""The collapsed variational bound of a sparse GP (Titsias 2009) and its exact gradient, for the clients'
local fit of `(log a, log ℓ, log σ, Z)` on their reservoirs (docs/algorithms.md, "FSGP").

    F = log N(y | 0, Q + σ²I) - tr(K_nn - Q) / (2σ²),   Q = K_nm C⁻¹ K_mn

is written through the same statistics as the predictive (`P = K_mn K_nm`, `r = K_mn y`, `q = yᵀy`,
`B = C + σ⁻² P`), by the determinant lemma and Woodbury's identity:

    F = -n/2 log 2π - ½ (log|B| - log|C| + n log σ²) - ½ (q/σ² - rᵀB⁻¹r/σ⁴) - (n a² - tr C⁻¹P) / (2σ²)

so one evaluation costs `O(n M² + M³)`. The gradient comes from the gradients in `C`, `P`, `r`, `σ²`
(below, `β = B⁻¹r`, `s = σ⁻²`) carried to the kernel's parameters through `K_mn` and `C`:

    ∂F/∂C = ½ (C⁻¹ - B⁻¹ - s²ββᵀ - s C⁻¹PC⁻¹),    ∂F/∂P = ½ s (C⁻¹ - B⁻¹ - s²ββᵀ),    ∂F/∂r = s²β
    ∂F/∂K_mn = 2 ∂F/∂P · K_mn + ∂F/∂r yᵀ
    ∂F/∂σ² = tr(B⁻¹P)/(2σ⁴) - n/(2σ²) + q/(2σ⁴) - rᵀβ/σ⁶ + βᵀPβ/(2σ⁸) + (n a² - tr C⁻¹P)/(2σ⁴)
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg.lapack import dtrtrs

from streamfed.algorithms.fsgp.kernels import Hyper, cov_and_h, cov_and_h_expanded
from streamfed.algorithms.fsgp.posterior import cholesky, lower_solve

__all__ = ["LOG_BOUNDS", "collapsed_bound", "collapsed_bound_and_grad", "fit_hyper"]

_LOG_2PI = math.log(2.0 * math.pi)
LOG_BOUNDS = (math.log(1e-3), math.log(1e3))  # log a, log ℓ, log σ stay in [1e-3, 1e3]


def _pieces(hyper: Hyper, X: np.ndarray, y: np.ndarray, jitter: float) -> dict:
    a2 = hyper.amplitude ** 2
    m = hyper.m
    C, hC, _ = cov_and_h(hyper, hyper.Z, hyper.Z)
    C = C + jitter * a2 * np.eye(m)
    U, hU = cov_and_h_expanded(hyper, hyper.Z, X)  # (M, n)
    v = hyper.noise_var
    P = U @ U.T
    r = U @ y
    L_C = cholesky(C, "c(Z, Z)")
    B = C + P / v
    L_B = cholesky(0.5 * (B + B.T), "C + P/σ²")
    beta = _upper_solve(L_B, lower_solve(L_B, r))
    A = lower_solve(L_C, U)
    n = float(y.size)
    q = float(y @ y)
    tr_cp = float(np.sum(A * A))
    logdet_b = 2.0 * float(np.sum(np.log(np.diag(L_B))))
    logdet_c = 2.0 * float(np.sum(np.log(np.diag(L_C))))
    value = (-0.5 * n * _LOG_2PI - 0.5 * (logdet_b - logdet_c + n * math.log(v))
             - 0.5 * (q / v - float(r @ beta) / v ** 2) - (n * a2 - tr_cp) / (2.0 * v))
    return dict(a2=a2, C=C, hC=hC, U=U, hU=hU, v=v, P=P, r=r, L_C=L_C, L_B=L_B, beta=beta,
                n=n, q=q, tr_cp=tr_cp, value=value)


def collapsed_bound(hyper: Hyper, X: np.ndarray, y: np.ndarray, jitter: float = 1e-6) -> float:
    """Titsias' collapsed bound `F` on the samples `X (n, d)`, `y (n,)` (not divided by `n`).

    >>> h = Hyper.initial("se", np.array([[0.0], [1.0]]), sigma=0.3)
    >>> x = np.linspace(0, 1, 5)[:, None]
    >>> f = collapsed_bound(h, x, np.sin(3 * x[:, 0]))
    >>> bool(np.isfinite(f))
    True
    """
    X = np.asarray(X, dtype=np.float64)
    return float(_pieces(hyper, X, np.asarray(y, dtype=np.float64), jitter)["value"])


def collapsed_bound_and_grad(hyper: Hyper, X: np.ndarray, y: np.ndarray, jitter: float = 1e-6
                             ) -> tuple[float, np.ndarray]:
    """`F` and `∂F/∂(log a, log ℓ, log σ, Z)` in the layout of :meth:`Hyper.to_vector`."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    p = _pieces(hyper, X, y, jitter)
    m, d = hyper.m, hyper.d
    v, s = p["v"], 1.0 / p["v"]
    eye = np.eye(m)
    iLC, iLB = lower_solve(p["L_C"], eye), lower_solve(p["L_B"], eye)
    Cinv, Binv = iLC.T @ iLC, iLB.T @ iLB
    beta, P, r, U = p["beta"], p["P"], p["r"], p["U"]
    bb = np.outer(beta, beta)
    core = Cinv - Binv - s * s * bb
    G_P = 0.5 * s * core
    G_C = 0.5 * (core - s * (Cinv @ P @ Cinv))
    G_C = 0.5 * (G_C + G_C.T)
    G_U = 2.0 * G_P @ U + np.outer(s * s * beta, y)
    n, q, a2 = p["n"], p["q"], p["a2"]
    dv = (float(np.sum(Binv * P)) / (2 * v * v) - n / (2 * v) + q / (2 * v * v) - float(r @ beta) / v ** 3
          + float(beta @ P @ beta) / (2 * v ** 4) + (n * a2 - p["tr_cp"]) / (2 * v * v))
    inv_ls2 = np.exp(-2.0 * hyper.log_ls)
    grad = np.zeros(hyper.n_numbers)
    # log a: every covariance (jitter included) scales with a²; the trace term's Σ c(x, x) = n a²
    grad[0] = 2.0 * float(np.sum(G_C * p["C"])) + 2.0 * float(np.sum(G_U * U)) - n * a2 / v
    wU, wC = G_U * p["hU"], G_C * p["hC"]
    Z = hyper.Z
    sq_U, lin_U = _weighted_differences(wU, Z, X)
    sq_C, lin_C = _weighted_differences(wC, Z, Z)
    grad[1:1 + d] = (sq_U + sq_C) * inv_ls2
    grad[1 + d] = 2.0 * v * dv
    # c(z_m, x) depends on z_m through δ = x - z_m: ∂c/∂z_m = h δ / ℓ²; C twice (rows and columns)
    gZ = (lin_U + 2.0 * lin_C) * inv_ls2
    grad[2 + d:] = gZ.ravel()
    return float(p["value"]), grad


def _upper_solve(L: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`L⁻ᵀ b` for a lower-triangular `L` (LAPACK directly)."""
    x, info = dtrtrs(L, b, lower=1, trans=1)
    if info != 0:
        raise ValueError(f"triangular solve failed (LAPACK info {info})")
    return x


def _weighted_differences(w: np.ndarray, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """With `δ_ijd = B_jd - A_id`: `Σ_ij w_ij δ_ijd²` (d,) and `Σ_j w_ij δ_ijd` (len(A), d), by matrix products
    (no `(len(A), len(B), d)` array): `Σ_j w_ij δ_ijd = (wB)_id - (Σ_j w_ij) A_id`, and the square expanded."""
    wB = w @ B
    row = w.sum(axis=1)
    sq = w.sum(axis=0) @ (B * B) - 2.0 * np.einsum("id,id->d", A, wB) + row @ (A * A)
    return sq, wB - row[:, None] * A


def fit_hyper(hyper: Hyper, X: np.ndarray, y: np.ndarray, *, steps: int, learning_rate: float,
              jitter: float = 1e-6, z_box: float | None = None) -> Hyper | None:
    """`steps` of Adam on `F/n` from `hyper` (FedAvg's local update); `None` when a step fails (a
    non-positive-definite matrix, a non-finite value), so that nothing unusable leaves the client. `a, ℓ, σ`
    stay in `[1e-3, 1e3]` and (`z_box`) every inducing input within `±z_box` — the bounds the aggregator
    declares for a proposal, so an honest one always passes them.

    >>> h = Hyper.initial("se", np.array([[0.2], [0.8]]), sigma=1.0)
    >>> x = np.linspace(0, 1, 40)[:, None]; y = np.sin(6 * x[:, 0])
    >>> h2 = fit_hyper(h, x, y, steps=30, learning_rate=0.05)
    >>> collapsed_bound(h2, x, y) > collapsed_bound(h, x, y)
    True
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if y.size == 0:
        return None
    theta = hyper.to_vector()
    m1 = np.zeros_like(theta)
    m2 = np.zeros_like(theta)
    b1, b2, eps = 0.9, 0.999, 1e-8
    d = hyper.d
    logs = np.r_[0:1 + d, 1 + d]  # positions of log a, log ℓ, log σ
    try:
        for t in range(1, int(steps) + 1):
            h = Hyper.from_vector(hyper.kind, theta, hyper.m, d)
            _, g = collapsed_bound_and_grad(h, X, y, jitter)
            g = g / y.size
            if not np.all(np.isfinite(g)):
                return None
            m1 = b1 * m1 + (1 - b1) * g
            m2 = b2 * m2 + (1 - b2) * g * g
            theta = theta + learning_rate * (m1 / (1 - b1 ** t)) / (np.sqrt(m2 / (1 - b2 ** t)) + eps)
            theta[logs] = np.clip(theta[logs], *LOG_BOUNDS)
            if z_box is not None:
                theta[2 + d:] = np.clip(theta[2 + d:], -z_box, z_box)
        out = Hyper.from_vector(hyper.kind, theta, hyper.m, d)
        collapsed_bound(out, X, y, jitter)  # the result must itself be usable
    except ValueError:
        return None
    return out
