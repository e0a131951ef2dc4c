"""The likelihoods of PVI's sparse GP (docs/algorithms.md, "PVI"): their expected log-likelihood under
`q(f(x)) = N(μ, v)` (torch, for the local free energy) and their predictive (NumPy).

* ``gaussian``: `E log N(y; f, σ²) = -½ log 2πσ² - ((y - μ)² + v) / (2σ²)` (closed form);
* ``bernoulli``: `y ∈ {0, 1}`, `p(y | f) = sigmoid((2y - 1) f)`; `E log sigmoid(±f)` by Gauss–Hermite
  quadrature, `∫ N(f; μ, v) g(f) df ≈ Σ_i (w_i / √π) g(μ + √(2v) x_i)`; the predictive `P(y = 1)` by
  the same rule.

torch is imported by the functions that need it, not by this module.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["LIKELIHOODS", "Likelihood", "expected_log_lik", "gauss_hermite", "predictive_y"]

Likelihood = Literal["gaussian", "bernoulli"]
LIKELIHOODS: tuple[str, ...] = ("gaussian", "bernoulli")
_LOG_2PI = math.log(2.0 * math.pi)


def gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes `x_i` and weights `w_i / √π` of `n`-point Gauss–Hermite quadrature for a standard normal
    after `f = μ + √(2v) x`.

    >>> x, w = gauss_hermite(3)
    >>> round(float(w.sum()), 12), round(float((w * 2 * x ** 2).sum()), 12)  # E[1], E[ε²]
    (1.0, 1.0)
    """
    x, w = np.polynomial.hermite.hermgauss(int(n))
    return x, w / math.sqrt(math.pi)


def expected_log_lik(likelihood: str, y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                     log_sigma: torch.Tensor, n_quadrature: int = 20) -> torch.Tensor:
    """`Σ_n E_{N(f; μ_n, v_n)} log p(y_n | f)` (a torch scalar, differentiable)."""
    import torch

    if likelihood == "gaussian":
        s2 = torch.exp(2.0 * log_sigma)
        return torch.sum(-0.5 * (_LOG_2PI + 2.0 * log_sigma) - ((y - mean) ** 2 + var) / (2.0 * s2))
    if likelihood == "bernoulli":
        x, w = (torch.as_tensor(a, dtype=mean.dtype) for a in gauss_hermite(n_quadrature))
        f = mean[:, None] + torch.sqrt(2.0 * var)[:, None] * x[None, :]
        sign = (2.0 * y - 1.0)[:, None]
        return torch.sum(torch.nn.functional.logsigmoid(sign * f) @ w)
    raise ValueError(f"unknown likelihood {likelihood!r}; one of {LIKELIHOODS}")


def predictive_y(likelihood: str, means: np.ndarray, variances: np.ndarray, log_sigmas: np.ndarray,
                 n_quadrature: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of `y` under an equal-weight mixture over `S` draws of `(Z, β)`: `means`,
    `variances` (S, T) of `f`, `log_sigmas` (S,). Gaussian: the mixture's moments with `σ²` added;
    Bernoulli: `p = P(y = 1)` and `p(1 - p)`.

    >>> m, v = predictive_y("gaussian", np.array([[0.0], [2.0]]), np.array([[1.0], [1.0]]), np.zeros(2))
    >>> m.tolist(), v.tolist()  # mean of means; E[v + σ²] + Var[μ] = 2 + 1
    ([1.0], [3.0])
    >>> p, _ = predictive_y("bernoulli", np.array([[0.0]]), np.array([[4.0]]), np.zeros(1))
    >>> round(float(p[0]), 12)  # symmetric around 0
    0.5
    """
    means = np.asarray(means, dtype=np.float64)
    variances = np.asarray(variances, dtype=np.float64)
    if likelihood == "gaussian":
        s2 = np.exp(2.0 * np.asarray(log_sigmas, dtype=np.float64))[:, None]
        mean = means.mean(axis=0)
        var = (variances + s2).mean(axis=0) + (means ** 2).mean(axis=0) - mean ** 2
        return mean, np.maximum(var, s2.min())
    if likelihood == "bernoulli":
        x, w = gauss_hermite(n_quadrature)
        f = means[..., None] + np.sqrt(2.0 * variances)[..., None] * x
        p = (_sigmoid(f) @ w).mean(axis=0)
        return p, p * (1.0 - p)
    raise ValueError(f"unknown likelihood {likelihood!r}; one of {LIKELIHOODS}")


def _sigmoid(f: Any) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(f)))  # overflow-free form
