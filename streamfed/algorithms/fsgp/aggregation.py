"""What an FSGP aggregator, shard or reducer runs (docs/algorithms.md, "FSGP"): every valid upload summed
exactly once under the current `(θ, σ, Z)`, a new global — after adopting averaged proposals when enough
came — at the end of a window in which something was summed.

An upload is validated completely before anything changes: values bounded by `max_abs`, `n` a whole
number, and (unless `check_stats=False`) `[[P, r], [rᵀ, q]]` positive semi-definite — true of the
statistics of any samples and of statistics carried to a new version alike (a client's pending samples
may have been carried; a bound on `tr P` would not survive the projection, so there is none), so one
hostile upload cannot make the global posterior improper.

Sharding sums exactly while the version does not move (fixed hyperparameters); a shard
cannot carry uploads across versions it has not seen, so with learned hyperparameters run one aggregator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from streamfed.algorithms.fsgp.messages import Upload
from streamfed.algorithms.fsgp.posterior import Stats
from streamfed.algorithms.fsgp.server import FSGPServer
from streamfed.algorithms.fsgp.wire import global_message, read_update
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.fleet.protocol import Message

__all__ = ["FSGPAggregation", "PartialSum", "check_statistics"]

_MAX_WHOLE = 2.0**53


def check_statistics(st: Stats, *, max_abs: float, psd: bool = True) -> None:
    """`ValueError` unless `n` counts samples, every value is within `±max_abs` and (`psd`) the augmented
    statistic is positive semi-definite (`psd=False`: for noised or masked uploads).

    >>> s = Stats.zeros(2); s.add(np.array([0.5, 0.5]), 1.0)
    >>> check_statistics(s, max_abs=1e100)
    >>> s.P[0, 1] = s.P[1, 0] = 5.0
    >>> check_statistics(s, max_abs=1e100)
    Traceback (most recent call last):
    ...
    numpy.linalg.LinAlgError: Matrix is not positive definite
    """
    n = float(st.n)
    if not (1.0 <= n <= _MAX_WHOLE and n == math.floor(n)):
        raise ValueError(f"n = {n!r} is not a count of samples")
    if max(abs(st.q), float(np.max(np.abs(st.P))), float(np.max(np.abs(st.r)))) > max_abs:
        raise ValueError(f"a statistic is beyond ±{max_abs:g}")
    if not psd:
        return
    m = st.m
    trace = float(np.trace(st.P))
    aug = np.empty((m + 1, m + 1))
    aug[:m, :m], aug[:m, m], aug[m, :m], aug[m, m] = st.P, st.r, st.r, st.q
    aug[np.arange(m + 1), np.arange(m + 1)] += 1e-9 * max(trace + abs(st.q), 1.0)
    np.linalg.cholesky(aug)  # LinAlgError (a ValueError) when not positive semi-definite


@dataclass(frozen=True)
class PartialSum:
    """A shard's sums: statistics and weighted sums of proposals. `+` adds two."""

    stats: Stats
    prop_sum: np.ndarray
    weight: float

    def __add__(self, other: PartialSum) -> PartialSum:
        return PartialSum(self.stats + other.stats, self.prop_sum + other.prop_sum, self.weight + other.weight)


class FSGPAggregation(SummingWindow):
    """The :class:`~streamfed.algorithms.base.Aggregation` of FSGP.

    >>> from streamfed.algorithms.fsgp.kernels import Hyper
    >>> h = Hyper.initial("se", np.zeros((2, 1)))
    >>> agg = FSGPAggregation(FSGPServer(h, min_samples=1, learn_hyperparameters=False))
    >>> s = Stats.zeros(2); s.add(np.array([0.5, 0.5]), 1.0)
    >>> agg.take("a", 1, Upload("a", 1, 0, s)); agg.pending()
    True
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    def __init__(self, server: FSGPServer, *, max_abs: float = 1e100, check_stats: bool = True) -> None:
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.server = server
        self.max_abs = float(max_abs)
        self.check_stats = bool(check_stats)
        self._dirty = False

    @property
    def version(self) -> int:
        return int(self.server.version)

    def included(self) -> dict[str, int]:
        return dict(self.server.included)

    def diagnostics(self) -> dict[str, float]:
        s = self.server
        return {"epoch": float(s.epoch), "sigma": s.hyper.sigma, "proposal_weight": s.prop_weight,
                "stale_dropped": float(s.stale_dropped)}

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> Upload:
        up = read_update(msg, self.server.hyper.kind)
        if msg.n_samples != int(up.stats.n):
            raise ValueError(f"n_samples {msg.n_samples} but n = {up.stats.n:g}")
        check_statistics(up.stats, max_abs=self.max_abs, psd=self.check_stats)
        if up.proposal is not None and float(np.max(np.abs(up.proposal.to_vector()))) > self.max_abs:
            raise ValueError(f"a proposed value is beyond ±{self.max_abs:g}")
        self.server.validate(up)
        waiting = self.server.waiting().get(up.client, [])
        if len(waiting) >= self.server.max_buffered and up.seq > self.server.included.get(up.client, 0) + 1:
            raise ValueError(f"client {up.client!r} has {len(waiting)} uploads waiting for an earlier seq")
        return up

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[Upload]) -> tuple[dict[str, np.ndarray], int, int]:
        s = self.server
        total = PartialSum(Stats.zeros(s.hyper.m, s.epoch), np.zeros(s.hyper.n_numbers), 0.0)
        for up in items:
            st = s.to_current(up.stats)
            if st is None:
                raise ValueError(f"upload of version {up.epoch} cannot be carried to {s.epoch}")
            w = up.weight if (up.proposal is not None and up.epoch == s.epoch) else 0.0
            vec = up.proposal.to_vector() * w if w > 0 and up.proposal is not None else 0.0
            total = PartialSum(total.stats + st, total.prop_sum + vec, total.weight + w)
        arrays = total.stats.packed()
        d = s.hyper.d
        v = total.prop_sum
        arrays.update(theta=v[:1 + d].copy(), log_sigma=np.asarray(v[1 + d]), Z=v[2 + d:].reshape(s.hyper.m, d),
                      weight=np.asarray(total.weight))
        return arrays, int(total.stats.n), int(s.epoch)

    def read_partial(self, msg: Message) -> PartialSum:
        s = self.server
        if msg.epoch != s.epoch:
            raise ValueError(f"partial of (θ, Z) version {msg.epoch}; the reducer is at {s.epoch}")
        stats = Stats.from_packed(dict(msg.arrays), msg.epoch)
        n = float(stats.n)
        if not (n >= 1 and n == math.floor(n)):
            raise ValueError(f"n = {n!r} is not a count of samples")
        vec = np.concatenate((np.asarray(msg.arrays["theta"], dtype=np.float64).ravel(),
                              [float(msg.arrays["log_sigma"])], np.asarray(msg.arrays["Z"], dtype=np.float64).ravel()))
        return PartialSum(stats, vec, float(msg.arrays["weight"]))

    def apply_partial(self, total: PartialSum, n_clients: int, included: Mapping[str, int]) -> None:
        # a partial does not say which clients proposed (sharding with learned hyperparameters is not supported)
        self.server.add_sums(total.stats, total.prop_sum, total.weight, set(included) if total.weight > 0 else set())
        self.server.included = dict(included)
        self.server.publish()

    # ---------------------------------------------------------------- output
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        return global_message(fleet, sender, self.server.global_model(), kernel_version)

    def warm_up(self) -> None:
        pass
