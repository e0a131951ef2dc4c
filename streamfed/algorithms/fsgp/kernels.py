"""Stationary ARD covariance functions of the federated sparse GP and its hyperparameters (docs/algorithms.md,
"FSGP").

`c(x, x') = a² g(ρ)`, `ρ² = Σ_d (x_d - x'_d)² / ℓ_d²`, with

* ``se``:        `g = exp(-ρ²/2)`                         (squared exponential, ARD)
* ``matern32``:  `g = (1 + √3 ρ) exp(-√3 ρ)`
* ``matern52``:  `g = (1 + √5 ρ + 5ρ²/3) exp(-√5 ρ)`

Gradients use `h(ρ) = -(1/ρ) ∂c/∂ρ`, finite at `ρ = 0` for all three (`a² g`, `3a² e^{-√3ρ}`,
`(5/3) a² (1 + √5ρ) e^{-√5ρ}`): `∂c/∂log ℓ_d = h δ_d²/ℓ_d²` and `∂c(z, x)/∂z_d = h δ_d/ℓ_d²` (`δ = x - z`).

:class:`Hyper` is everything the fleet learns and versions together: `log a`, `log ℓ (d,)`, `log σ` and the
inducing inputs `Z (M, d)` — `M·d + d + 2` numbers.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from streamfed.core.durable import durable

__all__ = ["KINDS", "KIND_CODES", "Hyper", "Kind", "cov", "cov_and_h"]

Kind = Literal["se", "matern32", "matern52"]
KINDS: tuple[str, ...] = ("se", "matern32", "matern52")
KIND_CODES = {k: i for i, k in enumerate(KINDS)}  # the covariance as the compiled kernels (_kernels.py) know it
_S3, _S5 = math.sqrt(3.0), math.sqrt(5.0)


@durable("fsgp.Hyper")
@dataclass(frozen=True, eq=False)
class Hyper:
    """One version of the learned quantities: kernel kind, `log a`, `log ℓ`, `log σ`, inducing inputs `Z`.

    >>> h = Hyper.initial("se", np.zeros((2, 3)), amplitude=2.0, lengthscale=1.0, sigma=0.5)
    >>> h.n_numbers, round(h.amplitude, 6), h.sigma
    (11, 2.0, 0.5)
    >>> Hyper.from_vector("se", h.to_vector(), 2, 3).same_as(h)
    True
    """

    kind: str
    log_amp: float
    log_ls: np.ndarray  # (d,)
    log_sigma: float
    Z: np.ndarray  # (M, d)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown covariance {self.kind!r}; one of {KINDS}")
        ls = np.array(self.log_ls, dtype=np.float64).reshape(-1)
        z = np.array(self.Z, dtype=np.float64)
        if z.ndim != 2 or z.shape[1] != ls.size or z.shape[0] < 1:
            raise ValueError(f"Z must be (M, d) with d = {ls.size}, got {z.shape}")
        if not (np.all(np.isfinite(ls)) and np.all(np.isfinite(z)) and math.isfinite(self.log_amp)
                and math.isfinite(self.log_sigma)):
            raise ValueError("hyperparameters must be finite")
        ls.setflags(write=False)
        z.setflags(write=False)
        object.__setattr__(self, "log_ls", ls)
        object.__setattr__(self, "Z", z)
        object.__setattr__(self, "log_amp", float(self.log_amp))
        object.__setattr__(self, "log_sigma", float(self.log_sigma))

    @classmethod
    def initial(cls, kind: str, Z: np.ndarray, *, amplitude: float = 1.0, lengthscale: float = 1.0,
                sigma: float = 0.5) -> Hyper:
        z = np.asarray(Z, dtype=np.float64)
        return cls(kind, math.log(amplitude), np.full(z.shape[1], math.log(lengthscale)), math.log(sigma), z)

    @property
    def m(self) -> int:
        return int(self.Z.shape[0])

    @property
    def d(self) -> int:
        return int(self.Z.shape[1])

    @property
    def amplitude(self) -> float:
        return math.exp(self.log_amp)

    @property
    def sigma(self) -> float:
        return math.exp(self.log_sigma)

    @property
    def noise_var(self) -> float:
        return math.exp(2.0 * self.log_sigma)

    @property
    def n_numbers(self) -> int:
        """`M·d + d + 2`: what one proposal or one global's hyperparameters carry."""
        return self.m * self.d + self.d + 2

    def to_vector(self) -> np.ndarray:
        """`[log a, log ℓ_1..d, log σ, Z row-major]` — the unconstrained parameters FedAvg averages."""
        return np.concatenate(([self.log_amp], self.log_ls, [self.log_sigma], self.Z.ravel()))

    @classmethod
    def from_vector(cls, kind: str, v: np.ndarray, m: int, d: int) -> Hyper:
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if v.size != m * d + d + 2:
            raise ValueError(f"a hyperparameter vector of M={m}, d={d} has {m * d + d + 2} numbers, got {v.size}")
        return cls(kind, float(v[0]), v[1:1 + d], float(v[1 + d]), v[2 + d:].reshape(m, d))

    def theta(self) -> np.ndarray:
        """`[log a, log ℓ_1..d]` (the wire's `theta`)."""
        return np.concatenate(([self.log_amp], self.log_ls))

    def same_kernel(self, other: Hyper) -> bool:
        """Same covariance function and inducing inputs, bit for bit (σ may differ)."""
        return (self.kind == other.kind and self.log_amp == other.log_amp
                and np.array_equal(self.log_ls, other.log_ls) and np.array_equal(self.Z, other.Z))

    def same_as(self, other: Hyper) -> bool:
        return self.same_kernel(other) and self.log_sigma == other.log_sigma

    def fingerprint(self) -> str:
        """A short hash of every number (for kernel versions and logs)."""
        h = hashlib.sha256(self.kind.encode())
        h.update(np.ascontiguousarray(self.to_vector()).tobytes())
        return h.hexdigest()[:12]


def _profile(kind: str, rho2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`g(ρ)` and `h(ρ)/a²` for squared scaled distances `ρ²`."""
    if kind == "se":
        g = np.exp(-0.5 * rho2)
        return g, g
    rho = np.sqrt(rho2)
    if kind == "matern32":
        e = np.exp(-_S3 * rho)
        return (1.0 + _S3 * rho) * e, 3.0 * e
    if kind == "matern52":
        e = np.exp(-_S5 * rho)
        return (1.0 + _S5 * rho + (5.0 / 3.0) * rho2) * e, (5.0 / 3.0) * (1.0 + _S5 * rho) * e
    raise ValueError(f"unknown covariance {kind!r}")


def _deltas(hyper: Hyper, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """`δ[i, j] = B_j - A_i`, shape `(len(A), len(B), d)` (differences, not the expanded square: exact at
    short distances, where the expansion `‖a‖² + ‖b‖² - 2aᵀb` loses every digit)."""
    return np.asarray(B, dtype=np.float64)[None, :, :] - np.asarray(A, dtype=np.float64)[:, None, :]


def cov_and_h_expanded(hyper: Hyper, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`c(A, B)` and `h(A, B)` from the expansion `ρ² = ‖a/ℓ‖² + ‖b/ℓ‖² - 2(a/ℓ)ᵀ(b/ℓ)` (floored at 0): one matrix
    product, no `(len(A), len(B), d)` differences — for the local fit's many samples, where a few ulps of `ρ²` at
    short distances do not matter (the predictive uses :func:`cov`, exact there).

    >>> h = Hyper.initial("se", np.zeros((1, 2)))
    >>> c, _ = cov_and_h_expanded(h, np.zeros((1, 2)), np.ones((1, 2)))
    >>> bool(abs(c[0, 0] - cov(h, np.zeros((1, 2)), np.ones((1, 2)))[0, 0]) < 1e-15)
    True
    """
    inv_ls = np.exp(-hyper.log_ls)
    As, Bs = np.asarray(A, dtype=np.float64) * inv_ls, np.asarray(B, dtype=np.float64) * inv_ls
    rho2 = np.einsum("id,id->i", As, As)[:, None] + np.einsum("jd,jd->j", Bs, Bs)[None, :] - 2.0 * (As @ Bs.T)
    g, h = _profile(hyper.kind, np.maximum(rho2, 0.0))
    a2 = math.exp(2.0 * hyper.log_amp)
    return a2 * g, a2 * h


def cov(hyper: Hyper, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """`c(A, B)`, shape `(len(A), len(B))`.

    >>> h = Hyper.initial("se", np.zeros((1, 1)))
    >>> float(cov(h, np.zeros((1, 1)), np.ones((1, 1)))[0, 0]) == math.exp(-0.5)
    True
    """
    inv_ls2 = np.exp(-2.0 * hyper.log_ls)
    dl = _deltas(hyper, A, B)
    g, _ = _profile(hyper.kind, np.einsum("ijd,ijd,d->ij", dl, dl, inv_ls2))
    return math.exp(2.0 * hyper.log_amp) * g


def cov_and_h(hyper: Hyper, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`c(A, B)`, `h(A, B)` (both scaled by `a²`) and the differences `δ = B_j - A_i` (for gradients)."""
    inv_ls2 = np.exp(-2.0 * hyper.log_ls)
    dl = _deltas(hyper, A, B)
    g, h = _profile(hyper.kind, np.einsum("ijd,ijd,d->ij", dl, dl, inv_ls2))
    a2 = math.exp(2.0 * hyper.log_amp)
    return a2 * g, a2 * h, dl
