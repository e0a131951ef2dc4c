"""What an aggregator runs for FedBNR over half-lives (docs/algorithms.md §4.15): one ordinary
:class:`FedBNRAggregation` per half-life, each given its row of every update as a FedBNR update of its own.

So every check FedBNR makes applies per component, unchanged — finiteness and `max_abs`, the statistics of `n`
samples with bounded features and labels (`check_statistics`, homogeneous in the sample weights), the raw count
equal to `n_samples` (and `n ≤ n_samples` for a discounted row), the clock skew of a time stamp, the privacy
floor, sequence numbers, the robust shares and screening of `[fleet.robust]` — and an update is refused whole if
any row is refused, before anything is taken. The global's version is the family's own (one per window that changed
any component); each component's global is published at that version.

Not sharded: a partial carries no time, so discounted sums cannot be combined by a reducer (as FedBNR with a
half-life).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamfed.algorithms.base import BaseAggregation
from streamfed.algorithms.fedbnr.aggregation import FedBNRAggregation
from streamfed.algorithms.fedbnr.messages import Upload
from streamfed.algorithms.fedbnr_halflives.client import half_life_label
from streamfed.algorithms.fedbnr_halflives.server import HalfLifeServer
from streamfed.algorithms.fedbnr_halflives.wire import split_update, stack_globals
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["HalfLifeAggregation"]


@durable("fedbnr-halflives.HalfLifeAggregation")
class HalfLifeAggregation(BaseAggregation):
    """`J` FedBNR aggregations behind one contract (module docstring).

    >>> import numpy as np
    >>> from streamfed.algorithms.fedbnr.server import FedBNRServer
    >>> from streamfed.core.stats import SufficientStats
    >>> parts = [FedBNRAggregation(FedBNRServer(dim=2, kernel_version="v", min_samples=1, half_life_s=h,
    ...                                         fit_hyperparameters=False), phi_sq=2.0) for h in (None, 60.0)]
    >>> agg = HalfLifeAggregation(parts, (None, 60.0))
    >>> st = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3), kernel_version="v")
    >>> agg.take("a", 1, (Upload("a", 1, 0, st), Upload("a", 1, 0, st, time=5.0, count=3)))
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    shardable = False  # partials carry no time: discounted sums are not combined by a reducer
    recoverable = True  # every component rebases: the clients upload their totals again on a new epoch

    def __init__(self, parts: Sequence[FedBNRAggregation], half_lives: Sequence[float | None]) -> None:
        if len(parts) != len(half_lives) or not parts:
            raise ValueError(f"{len(parts)} aggregations for {len(half_lives)} half-lives")
        self.parts = list(parts)
        self.half_lives = tuple(half_lives)
        self.server = HalfLifeServer([p.server for p in self.parts])
        self._version = 0

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> tuple[Upload, ...]:
        """Every row checked by its own FedBNR aggregation (nothing changes; the first refusal is raised), after the
        one check across rows: an agent stamps every half-life's statistics with its one clock, so the forgetting
        rows carry one time and the others 0 — a row held at an older time would escape the other rows' discount."""
        if "time" in msg.arrays:
            times = [float(t) for t in msg.arrays["time"]]
            timed = {t for t, h in zip(times, self.half_lives, strict=True) if h is not None}
            if len(timed) > 1 or any(t != 0.0 for t, h in zip(times, self.half_lives, strict=True) if h is None):
                raise ValueError(f"the rows' times {times} are not one clock (0 for no forgetting)")
        return tuple(p.check(m) for p, m in zip(self.parts, split_update(msg, self.half_lives), strict=True))

    def take(self, client: str, seq: int, item: Sequence[Upload]) -> None:
        for p, up in zip(self.parts, item, strict=True):
            p.take(client, seq, up)

    def pending(self) -> bool:
        return any(p.pending() for p in self.parts)

    def close_window(self, order: Mapping[str, int], mark: Callable[[str], int]) -> bool:
        changed = [p.close_window(order, mark) for p in self.parts]  # every component, no short cut
        if any(changed):
            self._version += 1
        return any(changed)

    def apply_round(self, round: int, items: Sequence[tuple[str, Any]]) -> None:
        before = [p.version for p in self.parts]
        for j, p in enumerate(self.parts):
            p.apply_round(round, [(c, it[j]) for c, it in items])
        if [p.version for p in self.parts] != before:
            self._version += 1

    def included(self) -> dict[str, int]:
        """What *every* component's sums hold: per client, the smallest mark among them."""
        marks = [p.included() for p in self.parts]
        return {c: min(m.get(c, 0) for m in marks) for c in marks[0] if all(m.get(c, 0) for m in marks)}

    def rebase(self, version: int, epoch: int) -> None:
        for p in self.parts:
            p.rebase(version, epoch)
        self._version = int(version)

    def warm_up(self) -> None:
        for p in self.parts:
            p.warm_up()

    def diagnostics(self) -> dict[str, float]:
        """Each component's (robust mode's counters), prefixed by its half-life."""
        return {f"{half_life_label(h)}_{k}": float(v) for h, p in zip(self.half_lives, self.parts, strict=True)
                for k, v in p.diagnostics().items()}

    # ---------------------------------------------------------------- output
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        parts = [p.global_message(fleet, sender, kernel_version) for p in self.parts]
        return stack_globals(parts, self.half_lives, fleet=fleet, sender=sender, version=self.version,
                             included=self.included())
