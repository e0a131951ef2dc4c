"""The shared network's objectives in torch (float64): the marginal likelihood (pFedGP eq. 1–2, eq. 16;
FITC eq. 7/23) and the predictive likelihood (eq. 3–4, eq. 17–18; FITC eq. 22), each for Gibbs samples `ω`
held fixed — Fisher's identity: the gradient of `log p(y)` is the posterior average of the gradient of
`log p(y | ω)` (eq. 2). Import only where torch is installed.

Full model, per node and sample `ω` (`z = Ω⁻¹κ`, `B = I + Ω½KΩ½`, `L` its Cholesky factor):

    log N(z | 0, K + Ω⁻¹) = −(N/2) log 2π − ½ (log|B| − Σ log ω) − ½ ‖L⁻¹ (κ / √ω)‖²

FITC, with `Λ⁻¹ = ω / (1 + ωd)`, `B = K_MM + K_MN Λ⁻¹ K_NM`, `u = K_MN Λ⁻¹ z = K_MN (κ / (1 + ωd))`:

    log N(z | 0, Λ + Q) = −(N/2) log 2π − ½ (log|B| − log|K_MM| − Σ log Λ⁻¹) − ½ (zᵀΛ⁻¹z − uᵀB⁻¹u)

Predictive: `log ∫ σ(f)^{y*} σ(−f)^{1−y*} N(f; μ*, Σ*) df` by Gauss–Hermite (`log-sum-exp` over the nodes).

>>> import torch
>>> K = torch.eye(2, dtype=torch.float64); y = torch.tensor([1.0, 0.0], dtype=torch.float64)
>>> om = torch.full((1, 2), 0.25, dtype=torch.float64)  # z = ±2, K + Ω⁻¹ = 5 I
>>> round(float(log_marginal_full(K, y, om)), 6) == round(2 * (-0.5 * math.log(2 * math.pi * 5) - 0.4), 6)
True
"""

from __future__ import annotations

import math

import numpy as np
import torch

from streamfed.algorithms.pfedgp.quadrature import GH_POINTS

__all__ = ["gp_kernel_t", "log_marginal_fitc", "log_marginal_full", "log_predictive_fitc", "log_predictive_full",
           "rbf_t"]

_T, _W = (torch.tensor(a, dtype=torch.float64) for a in np.polynomial.hermite.hermgauss(GH_POINTS))
_JITTER = 1e-8


def rbf_t(A: torch.Tensor, B: torch.Tensor, lengthscale: float, outputscale: float) -> torch.Tensor:
    """The RBF kernel (`kernels.rbf`) in torch."""
    d = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * A @ B.T
    return outputscale * torch.exp(-0.5 * torch.clamp(d, min=0.0) / lengthscale**2)


def gp_kernel_t(A: torch.Tensor, B: torch.Tensor, dim: int | None, lengthscale: float, outputscale: float
                ) -> torch.Tensor:
    """The kernel on GP inputs (`kernels.gp_kernel`) in torch: RBF on the first `dim` columns plus the dot
    product of the rest (`dim` None: RBF on all)."""
    if dim is None:
        return rbf_t(A, B, lengthscale, outputscale)
    return rbf_t(A[:, :dim], B[:, :dim], lengthscale, outputscale) + A[:, dim:] @ B[:, dim:].T


def _eye(n: int) -> torch.Tensor:
    return torch.eye(n, dtype=torch.float64)


def _log_bernoulli_gh(mu: torch.Tensor, var: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`log E[σ(f)^y σ(−f)^{1−y}]`, `f ~ N(mu, var)`, elementwise."""
    f = mu[..., None] + torch.sqrt(2.0 * torch.clamp(var, min=1e-12))[..., None] * _T
    s = 2.0 * y[..., None] - 1.0
    ll = torch.nn.functional.logsigmoid(s * f)
    return torch.logsumexp(ll + torch.log(_W), dim=-1) - 0.5 * math.log(math.pi)


def log_marginal_full(K: torch.Tensor, y: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """`mean_c log N(Ω_c⁻¹κ | 0, K + Ω_c⁻¹)` over the chains `omega (C, N)` (eq. 16; the constant of the
    augmentation, free of `K`, left out)."""
    kappa = y - 0.5
    n = y.shape[0]
    total = torch.zeros((), dtype=torch.float64)
    for om in omega:
        sw = torch.sqrt(om)
        L = torch.linalg.cholesky(_eye(n) + sw[:, None] * K * sw[None, :])
        u = torch.linalg.solve_triangular(L, (kappa / sw)[:, None], upper=False)[:, 0]
        logdet = 2.0 * torch.log(torch.diagonal(L)).sum() - torch.log(om).sum()
        total = total - 0.5 * n * math.log(2 * math.pi) - 0.5 * logdet - 0.5 * (u @ u)
    return total / omega.shape[0]


def log_predictive_full(K: torch.Tensor, Ks: torch.Tensor, kss: torch.Tensor, y: torch.Tensor,
                        ys: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """`mean_c Σ_t log p(ys_t | ω_c, X, y)` (eq. 4, 17–18): `K (N, N)` on the conditioning points, `Ks (N, T)`
    to the predicted ones, `kss (T,)` their prior variances, `omega (C, N)` Gibbs samples on `(X, y)`."""
    kappa = y - 0.5
    n = y.shape[0]
    total = torch.zeros((), dtype=torch.float64)
    for om in omega:
        sw = torch.sqrt(om)
        L = torch.linalg.cholesky(_eye(n) + sw[:, None] * K * sw[None, :])
        a = sw * torch.cholesky_solve((kappa / sw)[:, None], L)[:, 0]  # (K + Ω⁻¹)⁻¹ Ω⁻¹ κ
        mu = Ks.T @ a
        V = torch.linalg.solve_triangular(L, sw[:, None] * Ks, upper=False)
        var = kss - (V * V).sum(0)
        total = total + _log_bernoulli_gh(mu, var, ys).sum()
    return total / omega.shape[0]


def _fitc_parts(Kmm: torch.Tensor, Knm: torch.Tensor, kdiag: torch.Tensor, kappa: torch.Tensor,
                om: torch.Tensor) -> tuple[torch.Tensor, ...]:
    m = Kmm.shape[0]
    Kj = Kmm + _JITTER * Kmm.diagonal().max() * _eye(m)
    Lm = torch.linalg.cholesky(Kj)
    V = torch.linalg.solve_triangular(Lm, Knm.T, upper=False)
    d = torch.clamp(kdiag - (V * V).sum(0), min=0.0)
    lam_inv = om / (1.0 + om * d)
    B = Kj + (Knm.T * lam_inv) @ Knm
    LB = torch.linalg.cholesky(B)
    u = Knm.T @ (kappa / (1.0 + om * d))
    return Lm, LB, lam_inv, u, d


def log_marginal_fitc(Kmm: torch.Tensor, Knm: torch.Tensor, kdiag: torch.Tensor, y: torch.Tensor,
                      omega: torch.Tensor) -> torch.Tensor:
    """`mean_c log N(Ω_c⁻¹κ | 0, Λ_c + Q)` (eq. 7/23) by the determinant lemma and Woodbury (docstring)."""
    kappa = y - 0.5
    n = y.shape[0]
    total = torch.zeros((), dtype=torch.float64)
    for om in omega:
        Lm, LB, lam_inv, u, _ = _fitc_parts(Kmm, Knm, kdiag, kappa, om)
        z = kappa / om
        w = torch.linalg.solve_triangular(LB, u[:, None], upper=False)[:, 0]
        logdet = 2.0 * torch.log(torch.diagonal(LB)).sum() - 2.0 * torch.log(torch.diagonal(Lm)).sum() \
            - torch.log(lam_inv).sum()
        quad = (z * lam_inv * z).sum() - w @ w
        total = total - 0.5 * n * math.log(2 * math.pi) - 0.5 * logdet - 0.5 * quad
    return total / omega.shape[0]


def log_predictive_fitc(Kmm: torch.Tensor, Knm: torch.Tensor, kdiag: torch.Tensor, Kms: torch.Tensor,
                        kss: torch.Tensor, y: torch.Tensor, ys: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """`mean_c Σ_t log p(ys_t | ω_c)` under FITC (eq. 22): `Kms (M, T)` = `k(X̄, x*)`."""
    kappa = y - 0.5
    total = torch.zeros((), dtype=torch.float64)
    for om in omega:
        Lm, LB, _, u, _ = _fitc_parts(Kmm, Knm, kdiag, kappa, om)
        mu = Kms.T @ torch.cholesky_solve(u[:, None], LB)[:, 0]
        A = torch.linalg.solve_triangular(Lm, Kms, upper=False)
        Bv = torch.linalg.solve_triangular(LB, Kms, upper=False)
        var = kss - (A * A).sum(0) + (Bv * Bv).sum(0)
        total = total + _log_bernoulli_gh(mu, var, ys).sum()
    return total / omega.shape[0]
