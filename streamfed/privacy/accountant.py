"""A per-client privacy accountant: every upload of a client is a Gaussian mechanism (noise multiplier
`z` = noise std / L2 sensitivity), and their adaptive composition is accounted with `dp_accounting`
(Rényi DP by default — fast and an upper bound; or privacy-loss distributions, tighter).

The accountant only records `(z, count)` pairs, so it is small, picklable (it travels in an agent's
durable state) and recomputes `ε(δ)` on demand from a fresh `dp_accounting` accountant.

>>> acc = PrivacyAccountant(delta=1e-5)
>>> acc.epsilon()
0.0
>>> acc.spend(4.0, count=10)
>>> round(acc.epsilon(), 2)
3.62
>>> acc.can_spend(4.0, budget=3.0)
False
"""

from __future__ import annotations

import math
from typing import Literal

import dp_accounting
from dp_accounting import pld, rdp

from streamfed.core.durable import durable

__all__ = ["PrivacyAccountant", "calibrate_noise_multiplier", "dp_event"]

Method = Literal["rdp", "pld"]
# Rényi orders: the dp_accounting defaults' range, denser at small orders where large-z mechanisms peak
_ORDERS = tuple([1.0 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128.0, 256.0, 512.0, 1024.0])


def dp_event(spent: dict[float, int]) -> dp_accounting.DpEvent:
    """The composition of `count` Gaussian mechanisms of multiplier `z` for each `(z, count)` of `spent`."""
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), c)
              for z, c in sorted(spent.items()) if c > 0]
    return dp_accounting.ComposedDpEvent(events)


def _fresh(method: Method) -> dp_accounting.PrivacyAccountant:
    if method == "rdp":
        return rdp.RdpAccountant(list(_ORDERS))
    return pld.PLDAccountant(value_discretization_interval=1e-3)


def _epsilon(spent: dict[float, int], delta: float, method: Method) -> float:
    if any(z == 0.0 and c > 0 for z, c in spent.items()):
        return math.inf  # a noiseless upload has no finite guarantee
    if not any(c > 0 for c in spent.values()):
        return 0.0
    acc = _fresh(method)
    acc.compose(dp_event(spent))
    return float(acc.get_epsilon(delta))


@durable("privacy.PrivacyAccountant")
class PrivacyAccountant:
    """The `(ε, δ)` a client has spent so far, over all its uploads (see the module docstring).

    `delta` is the δ at which ε is reported; `method` "rdp" or "pld".

    >>> PrivacyAccountant(delta=1e-5, method="pld").spent
    {}
    """

    def __init__(self, delta: float, method: Method = "rdp") -> None:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if method not in ("rdp", "pld"):
            raise ValueError(f"method must be 'rdp' or 'pld', got {method!r}")
        self.delta = float(delta)
        self.method: Method = method
        self.spent: dict[float, int] = {}
        self._eps: float | None = 0.0

    @property
    def uploads(self) -> int:
        """Mechanisms composed so far."""
        return sum(self.spent.values())

    def spend(self, z: float, count: int = 1) -> None:
        """Record `count` uploads with noise multiplier `z` (`0`: noiseless, ε becomes infinite)."""
        if not (z >= 0 and math.isfinite(z)) or count < 0:
            raise ValueError(f"need a finite z >= 0 and count >= 0, got {z!r}, {count!r}")
        if count:
            self.spent[float(z)] = self.spent.get(float(z), 0) + int(count)
            self._eps = None

    def epsilon(self) -> float:
        """ε at :attr:`delta` of everything spent so far."""
        if self._eps is None:
            self._eps = _epsilon(self.spent, self.delta, self.method)
        return self._eps

    def epsilon_after(self, z: float, count: int = 1) -> float:
        """ε if `count` more uploads with multiplier `z` were spent (nothing is recorded)."""
        trial = dict(self.spent)
        trial[float(z)] = trial.get(float(z), 0) + int(count)
        return _epsilon(trial, self.delta, self.method)

    def can_spend(self, z: float, budget: float | None) -> bool:
        """Whether one more upload with multiplier `z` keeps ε within `budget` (None: no budget)."""
        return budget is None or self.epsilon_after(z) <= budget


def calibrate_noise_multiplier(epsilon: float, delta: float, uploads: int, method: Method = "rdp") -> float:
    """The smallest `z` such that `uploads` Gaussian mechanisms of multiplier `z` compose to `(ε, δ)`
    (dp_accounting's calibration; `0` for `ε = inf`).

    >>> z = calibrate_noise_multiplier(4.0, 1e-5, 10)
    >>> PrivacyAccountant(1e-5).epsilon_after(z, 10) <= 4.0
    True
    """
    if epsilon == math.inf:
        return 0.0
    if not (epsilon > 0 and 0 < delta < 1 and uploads >= 1):
        raise ValueError(f"need epsilon > 0, 0 < delta < 1 and uploads >= 1, got {epsilon}, {delta}, {uploads}")
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: _fresh(method),
        lambda z: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), uploads),
        epsilon, delta, dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4))
