"""Exponential forgetting on a shared time base (docs/algorithms.md §4.14, "Forgetting that federates"; FSGP's
section too): a sample observed at time `t` (seconds, on the clock every client and the aggregator share: the
readings' timestamps or the fleet's wall clock) counts `w(T) = 2^(−(T − t)/h)` at reference time `T`, `h` the
half-life. A discount is a scalar multiple of every additive statistic (FedBNR's `(S, b, n, q)`, FSGP's
`(P, r, n, q)`), so statistics held at different times are brought to one reference time by a scalar and then
summed exactly: the fleet's sum of discounted statistics is the centralised discounted statistics of all its
samples.

Statistics are only ever moved *forward* in time (a factor ≤ 1): nothing is inflated, so no discount can
overflow, and a discounted sample never weighs more than an undiscounted one (what the DP sensitivity needs).

>>> d = Discount(3600.0)
>>> d.factor(0.0, 7200.0)
0.25
>>> import numpy as np
>>> from streamfed.core.stats import SufficientStats
>>> st = SufficientStats.from_samples(np.ones((2, 1, 1)), np.ones(2))
>>> float(d.shift(st, 0.0, 3600.0).n)
1.0
"""

from __future__ import annotations

import math
from typing import Protocol, TypeVar

from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["COUNT_ROUNDING", "MAX_CLOCK_SKEW_S", "Discount", "Scalable", "add_at_latest", "check_time_base",
           "is_discounted_count"]

# how far ahead of an aggregator's clock an upload's time may be (clocks are not perfectly synced): a time further
# ahead would move the sums there and discount every other client's statistics
MAX_CLOCK_SKEW_S = 300.0

# a discounted count of samples that all weigh 1 (learned at the clock's time: a client behind the fleet's clock, or
# readings sharing a timestamp) can round a few ulp above the raw count — weights are staged relative to a reference
# time and scaled back when read — and must not be refused for it
COUNT_ROUNDING = 1e-12


def is_discounted_count(n: float, count: float) -> bool:
    """Whether `n` is a count of `count` samples each weighing in (0, 1]: `0 < n ≤ count`, up to rounding.

    >>> is_discounted_count(32.00000000000001, 32), is_discounted_count(32.001, 32), is_discounted_count(0.0, 32)
    (True, False, False)
    """
    return 0.0 < n <= count * (1.0 + COUNT_ROUNDING)


def check_time_base(client: str, forgets: bool, time: float, n: float, count: int) -> None:
    """`ValueError` unless an upload's time base is the server's: time-discounted (`count` > 0, the raw count
    of samples its discounted `n` sums, and a finite `time`) exactly when the server forgets.

    >>> check_time_base("a", True, 10.0, 31.5, 32)
    >>> check_time_base("a", False, 10.0, 31.5, 32)
    Traceback (most recent call last):
    ValueError: upload from 'a' is time-discounted, the server does not forget
    """
    if forgets != (count != 0):
        raise ValueError(f"upload from {client!r} is {'not ' if count == 0 else ''}time-discounted, "
                         f"the server {'forgets' if forgets else 'does not forget'}")
    # each sample weighs at most 1, so the weighted n never exceeds the raw count
    if count and not (math.isfinite(time) and is_discounted_count(n, count)):
        raise ValueError(f"upload from {client!r}: time {time!r} is not finite or its discounted count "
                         f"{n:g} is not in (0, {count}]")


class Scalable(Protocol):
    """Additive statistics: a copy, and a copy scaled by a factor."""

    def copy(self) -> Scalable: ...

    def scaled(self, factor: float) -> Scalable: ...


S = TypeVar("S", bound=Scalable)


# (the durable tag names FedBNR, where the class was first written: files holding one keep loading)
@durable("fedbnr.Discount")
class Discount:
    """The weight `2^(−Δ/h)` of a sample `Δ ≥ 0` seconds old, and statistics moved forward in time by it.

    >>> Discount(10.0).factor(5.0, 5.0), Discount(10.0).factor(5.0, 4.0)  # never inflates
    (1.0, 1.0)
    """

    def __init__(self, half_life_s: float) -> None:
        h = float(half_life_s)
        if not (math.isfinite(h) and h > 0):
            raise ValueError(f"half_life_s must be finite and > 0, got {half_life_s!r}")
        self.half_life_s = h
        self._rate = math.log(2.0) / h  # log-domain: the weight is exp(−rate·Δ)

    def factor(self, t_from: float, t_to: float) -> float:
        """`2^(−(t_to − t_from)/h)` for `t_to ≥ t_from`, 1 otherwise (statistics are never moved back in time);
        0 when `t_from` is −∞ (nothing held yet)."""
        if not t_to > t_from:
            return 1.0
        return math.exp(-self._rate * (t_to - t_from))  # underflows to 0 for very old statistics: still exact

    def shift(self, st: S, t_from: float, t_to: float) -> S:
        """`st` (held at `t_from`) as held at `t_to` (a copy)."""
        g = self.factor(t_from, t_to)
        return st.copy() if g == 1.0 else st.scaled(g)  # type: ignore[return-value]


def add_at_latest(held: tuple[SufficientStats, float] | None, st: SufficientStats, time: float,
                  discount: Discount | None) -> tuple[SufficientStats, float]:
    """Sums held at a time plus `st` taken at `time`: the total and its time — with a half-life both moved to the
    later of the two times first; without, `held`'s sums added to in place (they keep their time).

    >>> import numpy as np
    >>> one = SufficientStats.from_samples(np.ones((1, 1)), np.ones(1))
    >>> total, t = add_at_latest(add_at_latest(None, one, 0.0, Discount(1.0)), one, 1.0, Discount(1.0))
    >>> float(total.n), t
    (1.5, 1.0)
    """
    if held is None:
        return st.copy(), time
    if discount is None:
        held[0].__iadd__(st)
        return held
    t = max(time, held[1])
    return discount.shift(held[0], held[1], t) + discount.shift(st, time, t), t
