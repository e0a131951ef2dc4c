"""What a pFedGP client's work costs, and the credit that bounds it per sample.

The work model counts, in *work units*, what dominates each step: a Gibbs sweep of `C` chains on a tree node of
`n` samples factorises `C` matrices of `n × n` (`n³` each) plus a fixed overhead per call (`NODE_OVERHEAD`, the
cost of a small node being mostly Python and dispatch); a local update of the network costs, per Adam step,
chain and node, `FIT_FACTOR · n³` plus `FIT_NODE_OVERHEAD` (torch's graph and backward pass on small matrices:
about 1.5 ms a node, whatever its size); a prediction reads `C` matrices of `n × n` per node. One unit is
0.25–0.35 ns on one core of the machine the benchmarks ran on (`benchmarks/bench_pfedgp_cost.py`) — the counts,
not the clock, are what the tests assert on.

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
>>> fit_work([4], chains=2, steps=3) == 3 * 2 * (FIT_FACTOR * 4**3 + FIT_NODE_OVERHEAD)
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from streamfed.core.durable import durable

__all__ = ["FIT_FACTOR", "FIT_NODE_OVERHEAD", "NODE_OVERHEAD", "WorkCredit", "fit_work", "predict_work", "refresh_work"]

#: Work units of one call on a node, whatever its size (≈ a 34-sample node's factorisation).
NODE_OVERHEAD = 40_000.0
#: A local update's `n³` term per Adam step and chain (Gibbs sweeps, the objective, its gradient).
FIT_FACTOR = 1.5
#: A local update's fixed work per Adam step, chain and node (measured: ≈ 1.5 ms, mostly torch's overhead).
FIT_NODE_OVERHEAD = 4.5e6


def refresh_work(node_sizes: Iterable[int], *, chains: int, sweeps: int) -> float:
    """Units of a refresh: `sweeps` Gibbs sweeps plus the posterior's factorisation, per node, per chain."""
    return float(chains) * (int(sweeps) + 1) * sum(float(n) ** 3 + NODE_OVERHEAD for n in node_sizes)


def fit_work(node_sizes: Iterable[int], *, chains: int, steps: int) -> float:
    """Units of a local update: `steps` Adam steps, each the Gibbs sweeps and the objective per node and chain."""
    return float(steps) * float(chains) * sum(FIT_FACTOR * float(n) ** 3 + FIT_NODE_OVERHEAD for n in node_sizes)


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
