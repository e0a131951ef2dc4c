"""PVI's factors, as plain arrays (docs/algorithms.md §7).

* :class:`DiagGauss` — a fully factorised Gaussian in natural parameters (`η₁ = μ/v`, `η₂ = -1/(2v)`):
  the prior `p̃(φ)`, a client's factor `t_k(φ)` (which may be improper on its own) and their product
  `q(φ) = p̃(φ) Π_k t_k(φ)`. `φ` is the inducing inputs `Z` (row-major), followed, when the kernel's
  hyperparameters are learned, by `log β = [log a, log ℓ_1..d, log σ]`.
* :class:`Factor` — one client's contribution: its pseudo-observations `t_k(u | Z, β)` — DPO
  `N(m_k; K_{V_k Z} K_{ZZ}⁻¹ u, diag s_k)`, or CPO `N(u; m_k, diag s_k)`, which is DPO with `V_k ≡ Z` —
  its `t_k(φ)`, the samples it summarises and, for FedAvg on `Z` (paper Algorithm 1), its local `Z`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from streamfed.core.durable import durable

__all__ = ["DiagGauss", "Factor", "finite_array"]


def finite_array(a: np.ndarray, what: str, ndim: int | None = None) -> np.ndarray:
    """A float64 copy of `a`; `ValueError` when a value is not finite or the rank is wrong."""
    out = np.array(a, dtype=np.float64)
    if ndim is not None and out.ndim != ndim:
        raise ValueError(f"{what} must have {ndim} dimensions, got shape {out.shape}")
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{what} contains a non-finite value")
    return out


@durable("pvi.DiagGauss")
@dataclass(frozen=True, eq=False)
class DiagGauss:
    """A fully factorised Gaussian in natural parameters; `*` multiplies densities, `/` divides them.

    >>> p = DiagGauss.from_moments(np.zeros(2), np.ones(2))
    >>> t = DiagGauss.from_moments(np.array([1.0, -1.0]), np.ones(2))
    >>> q = p * t
    >>> q.mean.tolist(), q.var.tolist(), bool(np.allclose((q / t).nat1, p.nat1))
    ([0.5, -0.5], [0.5, 0.5], True)
    >>> round(q.kl(p), 12)  # 2 · ½ (½ + ¼ - 1 + log 2) = log 2 - ¼
    0.44314718056
    """

    nat1: np.ndarray
    nat2: np.ndarray

    def __post_init__(self) -> None:
        n1 = finite_array(self.nat1, "η₁", 1)
        n2 = finite_array(self.nat2, "η₂", 1)
        if n1.shape != n2.shape:
            raise ValueError(f"η₁ and η₂ differ in shape: {n1.shape}, {n2.shape}")
        n1.setflags(write=False)
        n2.setflags(write=False)
        object.__setattr__(self, "nat1", n1)
        object.__setattr__(self, "nat2", n2)

    @classmethod
    def from_moments(cls, mean: np.ndarray, var: np.ndarray) -> DiagGauss:
        var = np.asarray(var, dtype=np.float64)
        if np.any(~(var > 0)):
            raise ValueError("variances must be > 0")
        return cls(np.asarray(mean, dtype=np.float64) / var, -0.5 / var)

    @classmethod
    def flat(cls, n: int) -> DiagGauss:
        """The factor equal to 1 (zero natural parameters)."""
        return cls(np.zeros(n), np.zeros(n))

    @property
    def size(self) -> int:
        return int(self.nat1.size)

    @property
    def proper(self) -> bool:
        """Every precision `-2η₂` positive (a density)."""
        return bool(np.all(self.nat2 < 0))

    @property
    def var(self) -> np.ndarray:
        if not self.proper:
            raise ValueError("an improper factor has no variance")
        return -0.5 / self.nat2

    @property
    def mean(self) -> np.ndarray:
        return self.nat1 * self.var

    def __mul__(self, other: DiagGauss) -> DiagGauss:
        return DiagGauss(self.nat1 + other.nat1, self.nat2 + other.nat2)

    def __truediv__(self, other: DiagGauss) -> DiagGauss:
        return DiagGauss(self.nat1 - other.nat1, self.nat2 - other.nat2)

    def power(self, rho: float) -> DiagGauss:
        """`t^ρ` (damping: `t_old^{1-ρ} t_new^ρ = t_old · (t_new/t_old)^ρ`)."""
        return DiagGauss(rho * self.nat1, rho * self.nat2)

    def kl(self, other: DiagGauss, weights: np.ndarray | None = None) -> float:
        """`KL(self ‖ other)`, per coordinate weighted by `weights` (the α on `Z`)."""
        v, w = self.var, other.var
        terms = 0.5 * (v / w + (self.mean - other.mean) ** 2 / w - 1.0 + np.log(w / v))
        return float(np.sum(terms if weights is None else weights * terms))


@durable("pvi.Factor")
@dataclass(frozen=True, eq=False)
class Factor:
    """Client `client`'s factor, its `seq`-th, summarising `n` samples.

    `V (M_k, d)` pseudo-inputs (None: CPO, `V ≡ Z`), `m (M_k,)` pseudo-targets, `log_s (M_k,)` log
    pseudo-variances; `phi` its `t_k(φ)` (None when `Z` and `β` are points); `Z` its local inducing inputs
    (FedAvg on `Z` only).

    >>> f = Factor("a", 1, 10.0, np.zeros((2, 1)), np.ones(2), np.zeros(2))
    >>> f.n_pseudo, f.n_numbers  # M_k (d + 2)
    (2, 6)
    """

    client: str
    seq: int
    n: float
    V: np.ndarray | None
    m: np.ndarray
    log_s: np.ndarray
    phi: DiagGauss | None = None
    Z: np.ndarray | None = None

    def __post_init__(self) -> None:
        m = finite_array(self.m, "m", 1)
        log_s = finite_array(self.log_s, "log s", 1)
        if m.shape != log_s.shape:
            raise ValueError(f"m and log s differ in shape: {m.shape}, {log_s.shape}")
        if np.any(np.abs(log_s) > 50.0):
            raise ValueError("a pseudo-variance is beyond e^±50")  # its inverse would swamp or vanish
        if not (math.isfinite(self.n) and self.n >= 0):
            raise ValueError(f"n = {self.n!r}")
        if self.seq < 1:
            raise ValueError(f"sequence numbers start at 1, got {self.seq}")
        object.__setattr__(self, "m", m)
        object.__setattr__(self, "log_s", log_s)
        if self.V is not None:
            V = finite_array(self.V, "V", 2)
            if V.shape[0] != m.size:
                raise ValueError(f"V has {V.shape[0]} rows, m {m.size}")
            object.__setattr__(self, "V", V)
        if self.Z is not None:
            object.__setattr__(self, "Z", finite_array(self.Z, "Z", 2))

    @property
    def n_pseudo(self) -> int:
        return int(self.m.size)

    @property
    def n_numbers(self) -> int:
        """Numbers carried: `M_k(d + 2)` (DPO) or `2M_k` (CPO), plus `2|φ|` and the local `Z`."""
        out = self.m.size * 2 + (0 if self.V is None else self.V.size)
        out += 0 if self.phi is None else 2 * self.phi.size
        return out + (0 if self.Z is None else self.Z.size)
