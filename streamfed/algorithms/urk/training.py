"""Phase 1 in torch (float64): the URK features as a differentiable function of the flat weight vector, the
exact log evidence of the Bayesian last layer (docs/algorithms.md §4), a client's local fit and the server's
knowledge distillation (thesis eq. 3.4). Import this module only where torch is installed: the rest of the
package does not need it.

The evidence of `n` samples with features `Φ (n, F)`, `S = ΦᵀΦ`, `b = Φᵀy`, `q = yᵀy`, `A = σ⁻²S + λ⁻²I`:

    log p(y) = −(n/2) log(2πσ²) − ½ log|I + λ²σ⁻²S| − ½ (σ⁻²q − σ⁻⁴ bᵀA⁻¹b)

computed through the Cholesky factor `L` of `A`: `log|I + λ²σ⁻²S| = F log λ² + 2 Σ log L_ii`.

>>> import torch
>>> from streamfed.algorithms.urk.network import URKArch, initial_weights, omega
>>> arch = URKArch(n_inputs=1, widths=(), n_omega=4)
>>> w = initial_weights(arch, 0)
>>> X = np.linspace(-1, 1, 20)[:, None]; y = np.sin(3 * X[:, 0])
>>> before = float(log_evidence(features_t(torch.tensor(w.to_vector()), arch, torch.tensor(omega(arch, 0)),
...                                         torch.tensor(X)), torch.tensor(y), torch.tensor(w.log_sigma),
...                             torch.tensor(w.log_lam)))
>>> fitted = fit_local(w, omega(arch, 0), X, y, steps=30, learning_rate=0.05)
>>> after = float(evidence_of(fitted, omega(arch, 0), X, y))
>>> after > before
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from streamfed.algorithms.urk.network import URKArch, URKWeights

__all__ = ["LOG_BOUNDS", "distill", "evidence_of", "features_t", "fit_local", "log_evidence"]

#: σ, λ and every lengthscale stay within [1e-3, 1e3] (the logs are clamped after each step): outside it the
#: last layer's precision is no longer trustworthy in float64, and no sensible fit goes there.
LOG_BOUNDS = (math.log(1e-3), math.log(1e3))


def _split(v: torch.Tensor, arch: URKArch) -> dict[str, torch.Tensor]:
    out, i = {}, 0
    for name, shape in arch.shapes():
        size = math.prod(shape)
        out[name] = v[i:i + size].reshape(shape)
        i += size
    out["log_sigma"], out["log_lam"] = v[i], v[i + 1]
    return out


def features_t(v: torch.Tensor, arch: URKArch, om: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """The URK features `(T, 2m)` as a function of the flat vector `v` (same maths as `network.features`)."""
    p = _split(v, arch)
    h = X
    n = len(arch.widths)
    for i in range(n):
        h = h @ p[f"W{i}"].T + p[f"c{i}"]
        if i < n - 1:
            h = torch.tanh(h)
    w = om * torch.exp(-p["log_ls"])
    if arch.shifter_width:
        w = w + torch.tanh(om @ p["H1"].T + p["h1"]) @ p["H2"].T
    u = h @ w.T
    parts = [torch.sin(u), torch.cos(u)] if arch.sines_first else [torch.cos(u), torch.sin(u)]
    return torch.cat(parts, dim=1) * arch.scale


def log_evidence(phi: torch.Tensor, y: torch.Tensor, log_sigma: torch.Tensor, log_lam: torch.Tensor
                 ) -> torch.Tensor:
    """Exact `log p(y)` of Bayesian linear regression on `phi` (see the module docstring)."""
    n, f = phi.shape
    log_sigma, log_lam = torch.as_tensor(log_sigma, dtype=phi.dtype), torch.as_tensor(log_lam, dtype=phi.dtype)
    s2, l2 = torch.exp(2.0 * log_sigma), torch.exp(2.0 * log_lam)
    S = phi.T @ phi
    b = phi.T @ y
    A = S / s2 + torch.eye(f, dtype=phi.dtype) / l2
    L = torch.linalg.cholesky(A)
    u = torch.linalg.solve_triangular(L, (b / s2)[:, None], upper=False)[:, 0]  # u = L⁻¹σ⁻²b: uᵀu = σ⁻⁴bᵀA⁻¹b
    logdet = f * torch.log(l2) + 2.0 * torch.log(torch.diagonal(L)).sum()
    return -0.5 * n * torch.log(2.0 * math.pi * s2) - 0.5 * logdet - 0.5 * ((y @ y) / s2 - u @ u)


def evidence_of(w: URKWeights, om: np.ndarray, X: np.ndarray, y: np.ndarray) -> torch.Tensor:
    """`log p(y)` of `(X, y)` under the weights `w` (their own `σ, λ`)."""
    v = torch.tensor(w.to_vector(), dtype=torch.float64)
    phi = features_t(v, w.arch, torch.tensor(om, dtype=torch.float64), torch.tensor(X, dtype=torch.float64))
    return log_evidence(phi, torch.tensor(y, dtype=torch.float64), v[-2], v[-1])


def _clamp_logs(v: torch.Tensor, arch: URKArch) -> None:
    """Keep `log σ`, `log λ` and the log-lengthscales inside :data:`LOG_BOUNDS` (in place)."""
    with torch.no_grad():
        v[-2:].clamp_(*LOG_BOUNDS)
        i = 0
        for name, shape in arch.shapes():
            size = math.prod(shape)
            if name == "log_ls":
                v[i:i + size].clamp_(*LOG_BOUNDS)
            i += size


def _adam(v0: np.ndarray, arch: URKArch, loss_fn: object, steps: int, learning_rate: float) -> np.ndarray | None:
    v = torch.tensor(v0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([v], lr=float(learning_rate))
    for _ in range(int(steps)):
        opt.zero_grad()
        try:
            loss = loss_fn(v)  # type: ignore[operator]
        except RuntimeError:  # torch.linalg.LinAlgError: A not positive definite in rounding
            return None
        if not torch.isfinite(loss):
            return None
        loss.backward()
        if v.grad is None or not torch.all(torch.isfinite(v.grad)):
            return None
        opt.step()
        _clamp_logs(v, arch)
    out = v.detach().numpy().copy()
    return out if np.all(np.isfinite(out)) else None


def fit_local(w: URKWeights, om: np.ndarray, X: np.ndarray, y: np.ndarray, *, steps: int = 10,
              learning_rate: float = 0.01) -> URKWeights | None:
    """FedAvg's local update: `steps` Adam steps maximising the log evidence per sample of `(X, y)` w.r.t.
    `θ, ψ, σ, λ`, from `w`. `None` when a step would leave finite numbers (nothing is proposed then)."""
    arch = w.arch
    om_t = torch.tensor(om, dtype=torch.float64)
    X_t, y_t = torch.tensor(X, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    n = max(int(y_t.shape[0]), 1)

    def loss(v: torch.Tensor) -> torch.Tensor:
        return -log_evidence(features_t(v, arch, om_t, X_t), y_t, v[-2], v[-1]) / n

    out = _adam(w.to_vector(), arch, loss, steps, learning_rate)
    return None if out is None else URKWeights.from_vector(arch, out)


def distill(start: URKWeights, clients: Sequence[URKWeights], om: np.ndarray, X_kd: np.ndarray, y_kd: np.ndarray, *,
            alpha: float = 1.0, steps: int = 20, learning_rate: float = 0.01, trim: float | None = None
            ) -> URKWeights | None:
    """Knowledge distillation (thesis eq. 3.4): from `start`, Adam on

        L_KD = −log p_kd(y_kd) / n_kd + α · MSE(Φ Φᵀ − mean_c Φ_c Φ_cᵀ)

    over the server-held `(X_kd, y_kd)`, `Φ` the global network's features and `Φ_c` client `c`'s (its proposed
    weights). The evidence is divided by `n_kd` as in the local fits (the thesis leaves the scale to `α`).
    `trim` (robust aggregation, docs/algorithms.md §8.11): the target is the entrywise trimmed mean of the
    clients' Gram matrices instead of their mean."""
    arch = start.arch
    om_t = torch.tensor(om, dtype=torch.float64)
    X_t, y_t = torch.tensor(X_kd, dtype=torch.float64), torch.tensor(y_kd, dtype=torch.float64)
    with torch.no_grad():
        target = torch.zeros((X_t.shape[0], X_t.shape[0]), dtype=torch.float64)
        grams = []
        for c in clients:
            phi_c = features_t(torch.tensor(c.to_vector(), dtype=torch.float64), arch, om_t, X_t)
            if trim is None:
                target += phi_c @ phi_c.T
            else:
                grams.append((phi_c @ phi_c.T).numpy().ravel())
        if trim is None:
            target /= max(len(clients), 1)
        elif grams:
            from streamfed.algorithms.robust_mean import trimmed_mean

            target = torch.tensor(trimmed_mean(np.stack(grams), trim).reshape(target.shape), dtype=torch.float64)
    n = max(int(y_t.shape[0]), 1)

    def loss(v: torch.Tensor) -> torch.Tensor:
        phi = features_t(v, arch, om_t, X_t)
        return -log_evidence(phi, y_t, v[-2], v[-1]) / n + float(alpha) * torch.mean((phi @ phi.T - target) ** 2)

    out = _adam(start.to_vector(), arch, loss, steps, learning_rate)
    return None if out is None else URKWeights.from_vector(arch, out)
