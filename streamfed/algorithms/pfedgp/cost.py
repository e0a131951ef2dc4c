"""What a pFedGP client's work costs, and the credit that bounds it per sample.

The work model counts, in *work units*, what dominates each step: a Gibbs sweep of `C` chains on a tree node of
`n` samples factorises `C` matrices of `n × n` (`n³` each) plus a fixed overhead per call (`NODE_OVERHEAD`, the
cost of a small node being mostly Python and dispatch); a local update of the network does the same per Adam
step and chain, `FIT_FACTOR` times dearer (the torch graph and its backward pass); a prediction reads `C`
matrices of `n × n` per node. One unit is roughly a fraction of a nanosecond on one core — the counts, not the
clock, are what the tests assert on.

:class:`WorkCredit` earns `per_sample` units with every sample learnt and lets a refresh or a local update start
only when it is not in debt; the step's work is then charged (after the fact: its size is known only once it
ran). So after `n` samples the work done is at most `per_sample · n` plus one step's — bounded by the budget,
whatever the number of classes or samples seen. `per_sample = None`: no bound (every step runs when due).

>>> credit = WorkCredit(per_sample=100.0)
>>> credit.earn(); credit.allows()
True
>>> credit.charge(250.0); credit.earn(); credit.allows(), credit.spent
(False, 250.0)
>>> refresh_work([4, 2], chains=2, sweeps=1) == 2 * 2 * (4**3 + 2**3 + 2 * NODE_OVERHEAD)
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from streamfed.core.durable import durable

__all__ = ["FIT_FACTOR", "NODE_OVERHEAD", "WorkCredit", "fit_work", "predict_work", "refresh_work"]

#: Work units of one call on a node, whatever its size (≈ a 34-sample node's factorisation).
NODE_OVERHEAD = 40_000.0
#: A local update's chain-sweep against a refresh's: torch's graph, its backward pass, the predictive objective.
FIT_FACTOR = 4.0


def refresh_work(node_sizes: Iterable[int], *, chains: int, sweeps: int) -> float:
    """Units of a refresh: `sweeps` Gibbs sweeps plus the posterior's factorisation, per node, per chain."""
    return float(chains) * (int(sweeps) + 1) * sum(float(n) ** 3 + NODE_OVERHEAD for n in node_sizes)


def fit_work(node_sizes: Iterable[int], *, chains: int, gibbs_steps: int, steps: int) -> float:
    """Units of a local update: `steps` Adam steps, each `gibbs_steps` sweeps and the objective per node."""
    sizes = list(node_sizes)
    return FIT_FACTOR * int(steps) * refresh_work(sizes, chains=chains, sweeps=gibbs_steps)


def predict_work(node_sizes: Iterable[int], *, chains: int) -> float:
    """Units of one prediction: a quadratic form per node and chain."""
    return float(chains) * sum(float(n) ** 2 for n in node_sizes)


@durable("pfedgp.WorkCredit")
class WorkCredit:
    """Units earned per sample, spent by refreshes and local updates; `per_sample = None`: unbounded."""

    def __init__(self, per_sample: float | None = None) -> None:
        if per_sample is not None and not (math.isfinite(per_sample) and per_sample > 0):
            raise ValueError(f"per_sample must be finite and > 0 (or None), got {per_sample!r}")
        self.per_sample = None if per_sample is None else float(per_sample)
        self.balance = 0.0
        self.spent = 0.0  # every unit charged since the start
        self.largest = 0.0  # the dearest single step

    def earn(self) -> None:
        """One sample learnt."""
        if self.per_sample is not None:
            self.balance += self.per_sample

    def allows(self) -> bool:
        """Whether a step may start now (the balance is not in debt)."""
        return self.per_sample is None or self.balance >= 0.0

    def charge(self, units: float) -> None:
        """A step that ran: its units."""
        self.balance -= float(units)
        self.spent += float(units)
        self.largest = max(self.largest, float(units))
