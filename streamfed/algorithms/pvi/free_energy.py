"""The local free energy of client `k` (docs/algorithms.md §7), in torch (float64):

    L_k = E_{q(φ)} [ s_k Σ_n E_{q(f_n | Z, β)} log p(y_n | f_n) - KL( q(u | Z, β) ‖ q_\\k(u | Z, β) ) ]
          - Σ_i w_i KL( q(φ_i) ‖ q_\\k(φ_i) )

with `φ = (Z, log β)` as far as they are random, `w_i = α` on `Z` and 1 on `log β`, and `s_k = N_k / |R_k|`
(the reservoir `R_k` is a uniform sample of the client's `N_k` samples, so `s_k Σ_{R_k}` is an unbiased
estimate of the sum over all of them). `E_{q(φ)}` is a reparameterised Monte Carlo average,
`φ = μ + σ ⊙ ε`. In the notation of :mod:`.posterior` (`A = K + B`, `w = A⁻¹ b`; primes for the cavity,
whose `B'`, `b'` omit client `k`'s factor):

    KL( q(u) ‖ q_\\k(u) ) = ½ [ tr(A⁻¹ A') - M + log|A| - log|A'| + (w' - w)ᵀ A' (w' - w) ]

(`Cov[u] = K A⁻¹ K`, `E[u] = K w`: the `K`s cancel). torch is imported here, never by the core.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from streamfed.algorithms.pvi.likelihoods import expected_log_lik
from streamfed.core.durable import durable

__all__ = ["Cavity", "FreeEnergy", "torch_cov"]

_S3, _S5 = math.sqrt(3.0), math.sqrt(5.0)


def torch_cov(kind: str, log_amp: torch.Tensor, log_ls: torch.Tensor, A: torch.Tensor, B: torch.Tensor
              ) -> torch.Tensor:
    """FSGP's covariances (:mod:`streamfed.algorithms.fsgp.kernels`) in torch: `a² g(ρ)`, `ρ² = Σ δ²/ℓ²`.

    >>> t = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    >>> c = torch_cov("se", torch.tensor(0.0, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), t, t)
    >>> round(float(c[0, 1]), 12) == round(math.exp(-0.5), 12)
    True
    """
    delta = (B[None, :, :] - A[:, None, :]) * torch.exp(-log_ls)
    rho2 = torch.sum(delta * delta, dim=-1)
    a2 = torch.exp(2.0 * log_amp)
    if kind == "se":
        return a2 * torch.exp(-0.5 * rho2)
    rho = torch.sqrt(rho2 + 1e-300)  # finite gradient where two points coincide
    if kind == "matern32":
        return a2 * (1.0 + _S3 * rho) * torch.exp(-_S3 * rho)
    if kind == "matern52":
        return a2 * (1.0 + _S5 * rho + (5.0 / 3.0) * rho2) * torch.exp(-_S5 * rho)
    raise ValueError(f"unknown covariance {kind!r}")


@durable("pvi.Cavity")
@dataclass(frozen=True)
class Cavity:
    """What client `k` holds of the others: their pseudo-observations `(V or None, m, log s)` and the
    cavity `q_\\k(φ)` as mean and variance (empty when `φ` is).

    >>> one = torch.zeros(1, dtype=torch.float64)
    >>> len(Cavity([(None, one, one)], one, one + 1.0).factors)
    1
    """

    factors: Sequence[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]]
    phi_mean: torch.Tensor
    phi_var: torch.Tensor


def _sums(kind: str, log_amp: torch.Tensor, log_ls: torch.Tensor, Z: torch.Tensor, K: torch.Tensor,
          factors: Sequence[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    B = torch.zeros_like(K)
    b = torch.zeros(K.shape[0], dtype=K.dtype)
    for V, m, log_s in factors:
        Kzv = K if V is None else torch_cov(kind, log_amp, log_ls, Z, V)
        prec = torch.exp(-log_s)
        B = B + (Kzv * prec) @ Kzv.T
        b = b + Kzv @ (prec * m)
    return B, b


@durable("pvi.FreeEnergy")
class FreeEnergy:
    """`L_k` as a function of client `k`'s variational parameters.

    `point_Z` / `point_beta`: the points used where `φ` has no entry; `n_z`: the entries of `φ` that are `Z`
    (row-major `(M, d)`), the rest being `log β` when `learn_beta`.

    >>> import numpy as np
    >>> t = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64))
    >>> fe = FreeEnergy("se", "gaussian", Cavity([], t([]), t([])), t([[0.0], [1.0]]), t([0.0, 0.0, 0.0]),
    ...                 n_z=0, learn_beta=False, X=t([[0.5]]), y=t([1.0]), scale=1.0, kl_weights=t([]))
    >>> value = fe(own=(t([[0.5]]), t([1.0]), t([0.0])), phi_mean=t([]), phi_log_sd=t([]), eps=t(np.zeros((1, 0))))
    >>> bool(torch.isfinite(value))
    True
    """

    def __init__(self, kind: str, likelihood: str, cavity: Cavity, point_Z: torch.Tensor, point_beta: torch.Tensor,
                 *, n_z: int, learn_beta: bool, X: torch.Tensor, y: torch.Tensor, scale: float,
                 kl_weights: torch.Tensor, jitter: float = 1e-6, n_quadrature: int = 20) -> None:
        self.kind, self.likelihood = kind, likelihood
        self.cavity = cavity
        self.point_Z, self.point_beta = point_Z, point_beta
        self.n_z, self.learn_beta = int(n_z), bool(learn_beta)
        self.X, self.y, self.scale = X, y, float(scale)
        self.kl_weights = kl_weights
        self.jitter, self.n_quadrature = float(jitter), int(n_quadrature)
        self.m, self.d = int(point_Z.shape[0]), int(point_Z.shape[1])
        self._fixed_sums: tuple[torch.Tensor, torch.Tensor] | None = None

    def _split(self, phi: torch.Tensor, Z: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if Z is None:
            Z = phi[: self.n_z].reshape(self.m, self.d) if self.n_z else self.point_Z
        beta = phi[self.n_z:] if self.learn_beta else self.point_beta
        return Z, beta

    def conditional(self, own: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor], Z: torch.Tensor,
                    beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """At one `(Z, β)`: the expected log-likelihood (scaled by `s_k`) and `KL(q(u|Z,β) ‖ q_\\k(u|Z,β))`."""
        d = self.d
        log_amp, log_ls, log_sigma = beta[0], beta[1:1 + d], beta[1 + d]
        eye = torch.eye(self.m, dtype=Z.dtype)
        K = torch_cov(self.kind, log_amp, log_ls, Z, Z) + self.jitter * torch.exp(2.0 * log_amp) * eye
        random_point = self.n_z > 0 or self.learn_beta or Z.requires_grad
        if random_point or self._fixed_sums is None:
            sums = _sums(self.kind, log_amp, log_ls, Z, K, self.cavity.factors)
            if not random_point:
                self._fixed_sums = (sums[0].detach(), sums[1].detach())  # same Z and β every step
        else:
            sums = self._fixed_sums
        B_c, b_c = sums
        B_k, b_k = _sums(self.kind, log_amp, log_ls, Z, K, [own])
        A_c = K + B_c
        A = A_c + B_k
        L_c = torch.linalg.cholesky(0.5 * (A_c + A_c.T))
        L = torch.linalg.cholesky(0.5 * (A + A.T))
        w = torch.cholesky_solve((b_c + b_k)[:, None], L)[:, 0]
        w_c = torch.cholesky_solve(b_c[:, None], L_c)[:, 0]
        G = torch.linalg.solve_triangular(L, A_c, upper=False)
        G = torch.linalg.solve_triangular(L, G.T, upper=False)  # L⁻¹ A' L⁻ᵀ (A' symmetric)
        dw = w_c - w
        kl = 0.5 * (torch.trace(G) - self.m + 2.0 * torch.sum(torch.log(torch.diagonal(L)))
                    - 2.0 * torch.sum(torch.log(torch.diagonal(L_c))) + dw @ (A_c @ dw))
        Kzx = torch_cov(self.kind, log_amp, log_ls, Z, self.X)
        a_K = torch.linalg.solve_triangular(torch.linalg.cholesky(K), Kzx, upper=False)
        a_A = torch.linalg.solve_triangular(L, Kzx, upper=False)
        mean = Kzx.T @ w
        var = torch.clamp(torch.exp(2.0 * log_amp) - torch.sum(a_K * a_K, 0) + torch.sum(a_A * a_A, 0), min=1e-12)
        ell = self.scale * expected_log_lik(self.likelihood, self.y, mean, var, log_sigma, self.n_quadrature)
        return ell, kl

    def __call__(self, own: tuple[torch.Tensor | None, torch.Tensor, torch.Tensor], phi_mean: torch.Tensor,
                 phi_log_sd: torch.Tensor, eps: torch.Tensor, Z: torch.Tensor | None = None) -> torch.Tensor:
        """`L_k` with `S = len(eps)` reparameterised draws of `φ` (`eps`: (S, |φ|) standard normals);
        `Z`: FedAvg's local point `Z` (then `φ` holds no `Z`)."""
        total = torch.zeros((), dtype=phi_mean.dtype)
        for e in eps:
            Zs, beta = self._split(phi_mean + torch.exp(phi_log_sd) * e, Z)
            ell, kl = self.conditional(own, Zs, beta)
            total = total + ell - kl
        total = total / max(len(eps), 1)
        if phi_mean.numel():
            v = torch.exp(2.0 * phi_log_sd)
            cm, cv = self.cavity.phi_mean, self.cavity.phi_var
            kl_phi = 0.5 * (v / cv + (phi_mean - cm) ** 2 / cv - 1.0 + torch.log(cv) - 2.0 * phi_log_sd)
            total = total - torch.sum(self.kl_weights * kl_phi)
        return total
