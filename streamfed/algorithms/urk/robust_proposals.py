"""Bounded influence and robust aggregation of network proposals (URK-FedBNR phase 1, pFedGP's shared network;
docs/algorithms.md §10.3, §9.4). Numpy only.

**The declared bound.** A proposal is `δ = v_s − θ` after `s = fit_steps` steps of `torch.optim.Adam` (the
defaults `β₁ = 0.9, β₂ = 0.999, ε = 10⁻⁸`, no weight decay, no gradient clipping, a fresh optimiser per fit)
at learning rate `η` from the global `θ`. Step `t` moves a coordinate by `η·|m̂_t|/(√v̂_t + ε)`, and with
`m_t = (1−β₁)Σ_i β₁^{t−i} g_i`, `v_t = (1−β₂)Σ_i β₂^{t−i} g_i²`, Cauchy–Schwarz
(`β₁^{t−i} = (β₁/√β₂)^{t−i}·√β₂^{t−i}`) gives, whatever the gradients,

    |m̂_t|/√v̂_t ≤ A_t = (1−β₁)/(1−β₁^t) · √((1−β₂^t)/(1−β₂)) · √(Σ_{j<t} (β₁²/β₂)^j)

(`A_1 = 1`; tight: `g_i ∝ (β₁/β₂)^{t−i}` attains it). So `‖δ‖_∞ ≤ η·Σ_{t≤s} A_t` (:func:`adam_reach`; 10.17·η
for 10 steps). The fits clamp some coordinates into a box after each step (log-lengthscales, URK's `log σ`,
`log λ`): a projection onto an interval, which moves a coordinate no further from `θ_i` when `θ_i` is inside
it, and at most `dist(θ_i, box)` further otherwise. Beyond that only rounding: one ulp per step.

**Robust combination.** :func:`robust_delta`: one delta per client (the mean of its proposals of the version),
each clipped to `clip_factor ×` the median of their L2 norms, then a coordinate-wise trimmed mean
(:mod:`streamfed.algorithms.robust_mean`, reused).

>>> round(adam_reach(1), 12), round(adam_reach(10), 4)
(1.0, 10.1655)
>>> b = ProposalBound(steps=1, learning_rate=0.01, max_weight=64)
>>> b.check(np.zeros(3), 0, np.array([0.01, -0.005, 0.0]), 10.0)
>>> try:
...     b.check(np.zeros(3), 0, np.array([0.0, 5.0, 0.0]), 10.0)
... except ValueError as e:
...     print(e)
proposal coordinate 1: |δ| = 5 is beyond the declared bound 0.01 (1 Adam step(s) at learning rate 0.01)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from streamfed.algorithms.robust_mean import clip_rows, clip_threshold, row_norms, trimmed_mean
from streamfed.core.durable import durable

__all__ = ["ADAM_BETAS", "ProposalBound", "RobustProposals", "adam_reach", "robust_delta"]

#: torch.optim.Adam's defaults: what every local fit and the distillation use
ADAM_BETAS = (0.9, 0.999)
# relative slack on the bound: far above the rounding of A_t, far below any attack
_REL = 1e-9
_ULP = 2.0**-52


def adam_reach(steps: int, betas: tuple[float, float] = ADAM_BETAS) -> float:
    """`Σ_{t=1}^{steps} A_t`: how far `steps` Adam steps at learning rate 1 can move one coordinate.

    >>> round(adam_reach(2), 6), adam_reach(0)
    (2.001358, 0.0)
    """
    b1, b2 = betas
    r = b1 * b1 / b2
    total, geo = 0.0, 0.0
    for t in range(1, int(steps) + 1):
        geo += r ** (t - 1)  # Σ_{j<t} r^j
        total += (1.0 - b1) / (1.0 - b1**t) * math.sqrt((1.0 - b2**t) / (1.0 - b2)) * math.sqrt(geo)
    return total


@durable("urk.ProposalBound")
@dataclass(frozen=True)
class ProposalBound:
    """The largest proposal an honest client sends (module docstring): every coordinate of `δ` within
    `learning_rate · adam_reach(steps)` (plus, for the `clamped` coordinates, their global's distance from
    `box`), a finite `weight` that is a whole number of samples in `[0, max_weight]`.

    >>> ProposalBound(steps=10, learning_rate=0.01, max_weight=256).reach.__round__(5)
    0.10165
    """

    steps: int
    learning_rate: float
    max_weight: float
    clamped: tuple[int, ...] = ()  # indices of the vector the fits clamp into `box` after every step
    box: tuple[float, float] = (-math.inf, math.inf)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def reach(self) -> float:
        return float(self.learning_rate) * adam_reach(self.steps)

    def allowance(self, theta: np.ndarray) -> np.ndarray:
        """Per coordinate of a proposal relative to `theta`, the largest honest `|δ_i|` (cached per `theta`)."""
        key = theta.tobytes()
        got = self._cache.get("theta")
        if got is not None and got[0] == key:
            return got[1]
        reach = self.reach
        # one rounding per step of the fit and one in δ = v − θ, each at most an ulp of |θ_i| + reach
        out = reach * (1.0 + _REL) + (self.steps + 2) * _ULP * (np.abs(theta) + reach)
        if self.clamped:
            idx = np.asarray(self.clamped, dtype=np.int64)
            lo, hi = self.box
            g = theta[idx]
            out[idx] += np.maximum(lo - g, 0.0) + np.maximum(g - hi, 0.0)
        out.setflags(write=False)
        self._cache["theta"] = (key, out)
        return out

    def check(self, theta: np.ndarray, start: int, data: np.ndarray, weight: float) -> None:
        """`ValueError` unless `data` (the proposal's coordinates `start…`) and `weight` are within the bound."""
        if not (math.isfinite(weight) and 0.0 <= weight <= self.max_weight and weight == math.floor(weight)):
            raise ValueError(f"proposal weight {weight!r} is not a number of samples in [0, {self.max_weight:g}] "
                             f"(a client's reservoir)")
        limit = self.allowance(theta)[start:start + data.size]
        bad = np.flatnonzero(~(np.abs(data) <= limit))  # NaN compares False: refused too
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"proposal coordinate {start + i}: |δ| = {abs(float(data[i])):.3g} is beyond the "
                             f"declared bound {float(limit[i]):.3g} ({self.steps} Adam step(s) at learning rate "
                             f"{self.learning_rate:g})")


@durable("urk.RobustProposals")
@dataclass(frozen=True)
class RobustProposals:
    """Robust combination settings (`[fleet.robust]`: `trim`, `clip_factor`).

    >>> RobustProposals(0.25, 2.0).trim
    0.25
    """

    trim: float
    clip_factor: float


def per_client_rows(clients: list[str], deltas: list[np.ndarray]) -> tuple[list[str], np.ndarray]:
    """One row per client: the mean of its deltas (a client that proposed twice in a version counts once),
    clients in order of their first proposal.

    >>> per_client_rows(["a", "b", "a"], [np.ones(2), np.zeros(2), 3 * np.ones(2)])[1].tolist()
    [[2.0, 2.0], [0.0, 0.0]]
    """
    order: dict[str, list[np.ndarray]] = {}
    for c, d in zip(clients, deltas, strict=True):
        order.setdefault(c, []).append(d)
    return list(order), np.stack([np.mean(v, axis=0) if len(v) > 1 else v[0] for v in order.values()])


def robust_delta(rows: np.ndarray, rule: RobustProposals) -> np.ndarray:
    """Clip each row to `clip_factor ×` the median row norm, then the coordinate-wise trimmed mean.

    >>> rows = np.array([[0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [1e3, -1e3]])
    >>> robust_delta(rows, RobustProposals(0.25, 2.0)).round(4).tolist()
    [0.1, 0.05]
    """
    rows = np.asarray(rows, dtype=np.float64)
    norms = row_norms(rows)
    return trimmed_mean(clip_rows(rows, clip_threshold(norms, rule.clip_factor), norms), rule.trim)
