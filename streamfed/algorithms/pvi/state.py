"""The global state of PVI for sparse GPs (docs/algorithms.md §7): every client's
latest factor, the prior `p̃(φ)` and the points (`Z`, `β`) not treated as random.

How `Z` is handled (`inducing`):

* ``hvm`` — the paper's method: `Z` is random, `q(Z) = p̃(Z) Π_k t_k(Z)`, `p̃(Z) = N(0, I)` on
  standardised inputs;
* ``fedavg`` — paper Algorithm 1 (the baseline): `Z` a point, each client's local `Z` averaged by the
  server with weights `N_k / N`;
* ``fixed`` — `Z` stays at its data-free initial design.

The kernel's `log β = [log a, log ℓ_1..d, log σ]` is a point (configured) or, with `learn_beta`, part of
`φ` with the prior `N(log β₀, I)` and fully factorised factors `t_k(β)`, exactly as `Z` under ``hvm`` but
with its KL unscaled (`β` is a parameter of the model; the `α` scaling is the HVM's device for `Z`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from streamfed.algorithms.pvi.factors import DiagGauss, Factor
from streamfed.core.durable import durable

__all__ = ["GlobalQ", "Inducing"]

Inducing = Literal["hvm", "fedavg", "fixed"]


@durable("pvi.GlobalQ")
@dataclass(frozen=True, eq=False)
class GlobalQ:
    """`q ∝ p · Π_k t_k` as its factors, at `version`.

    >>> g = GlobalQ.initial("se", np.zeros((2, 1)), np.zeros(3), "hvm", learn_beta=True)
    >>> g.phi_size, g.kl_weights(0.1).tolist()  # Z (M·d = 2 numbers), then log β (d + 2 = 3)
    (5, [0.1, 0.1, 1.0, 1.0, 1.0])
    >>> [z.shape for z, _ in g.points(2, np.random.default_rng(0))]
    [(2, 1), (2, 1)]
    """

    version: int
    kind: str
    Z: np.ndarray  # (M, d): the point Z (fixed, fedavg), the initial design (hvm)
    beta: np.ndarray  # (d + 2,): the point log β, or the prior's centre when learned
    inducing: Inducing
    learn_beta: bool
    factors: Mapping[str, Factor] = field(default_factory=dict)

    @classmethod
    def initial(cls, kind: str, Z: np.ndarray, beta: np.ndarray, inducing: Inducing = "hvm",
                learn_beta: bool = False) -> GlobalQ:
        return cls(0, kind, np.array(Z, dtype=np.float64), np.array(beta, dtype=np.float64), inducing,
                   bool(learn_beta), {})

    @property
    def m(self) -> int:
        return int(self.Z.shape[0])

    @property
    def d(self) -> int:
        return int(self.Z.shape[1])

    @property
    def n_z(self) -> int:
        """Entries of `φ` that are `Z` (0 unless ``hvm``)."""
        return self.m * self.d if self.inducing == "hvm" else 0

    @property
    def phi_size(self) -> int:
        return self.n_z + (self.d + 2 if self.learn_beta else 0)

    @property
    def n_samples(self) -> float:
        return float(sum(f.n for f in self.factors.values()))

    def kl_weights(self, alpha: float) -> np.ndarray:
        """The KL's weight per entry of `φ`: `α` on `Z`, 1 on `log β`."""
        return np.concatenate((np.full(self.n_z, float(alpha)), np.ones(self.phi_size - self.n_z)))

    def prior(self) -> DiagGauss:
        """`p̃(φ)`: `N(0, I)` on `Z`, `N(log β₀, I)` on `log β`."""
        mean = np.concatenate((np.zeros(self.n_z), self.beta if self.learn_beta else np.zeros(0)))
        return DiagGauss.from_moments(mean, np.ones(self.phi_size))

    def q_phi(self, exclude: str | None = None) -> DiagGauss:
        """`q(φ)`, or the cavity `q_\\k(φ)` without client `exclude`'s factor."""
        q = self.prior()
        for c, f in self.factors.items():
            if c != exclude and f.phi is not None:
                q = q * f.phi
        return q

    def others(self, exclude: str | None) -> list[Factor]:
        """Every factor but client `exclude`'s, in client order."""
        return [self.factors[c] for c in sorted(self.factors) if c != exclude]

    def split(self, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(Z, log β)` of a value of `φ` (the points where `φ` has no entry)."""
        Z = phi[: self.n_z].reshape(self.m, self.d) if self.n_z else self.Z
        beta = phi[self.n_z:] if self.learn_beta else self.beta
        return Z, beta

    def points(self, n: int, rng: np.random.Generator | None = None, exclude: str | None = None
               ) -> list[tuple[np.ndarray, np.ndarray]]:
        """`n` draws of `(Z, log β)` from `q(φ)` (`n = 0` or no `φ`: the single point at its mean)."""
        if self.phi_size == 0:
            return [(self.Z, self.beta)]
        q = self.q_phi(exclude)
        if n == 0 or rng is None:
            return [self.split(q.mean)]
        sd = np.sqrt(q.var)
        return [self.split(q.mean + sd * rng.standard_normal(q.size)) for _ in range(n)]

    def with_factor(self, f: Factor) -> GlobalQ:
        """This state with client `f.client`'s factor replaced (version unchanged)."""
        return replace(self, factors={**self.factors, f.client: f})
