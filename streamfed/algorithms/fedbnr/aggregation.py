"""What a FedBNR aggregator, shard or reducer runs (docs/algorithms.md §3): every valid upload summed
exactly once (out-of-order ones wait for the gap), a new global — σ, λ refitted by the evidence — at the
end of a window in which something was summed. Sums split exactly across shards.

An upload is validated completely before anything changes: values bounded by `max_abs`, and the
statistics must be statistics of some samples — `n` a positive whole number, `[[S, b], [bᵀ, q]]` positive
semi-definite and `tr S_k <= n·max‖φ‖²` (features are bounded) — so one hostile upload cannot make the
global posterior improper for everyone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from streamfed.algorithms.fedbnr.learner import FedBNRServer, Upload
from streamfed.algorithms.fedbnr.wire import global_message, stats_fields
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.core.stats import SufficientStats
from streamfed.fleet.protocol import Message

__all__ = ["FedBNRAggregation", "check_statistics"]

_MAX_WHOLE = 2.0**53  # beyond this a float no longer counts samples exactly


def check_statistics(st: SufficientStats, *, max_abs: float, phi_sq: float | None, whole_n: bool = True) -> None:
    """`ValueError` unless `st` could be the statistics of `n` samples with `‖φ‖² <= phi_sq` (None: only the
    count and the bound are checked — for noised or masked uploads).

    >>> st = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3))
    >>> check_statistics(st, max_abs=1e100, phi_sq=2.0)
    >>> check_statistics(st, max_abs=1e100, phi_sq=1.0)
    Traceback (most recent call last):
    ...
    ValueError: tr S exceeds n·max‖φ‖²: not the scatter of n feature vectors
    """
    n, q = float(st.n), float(st.q)
    # time-weighted statistics (forgetting) count samples with weights: a positive total, not a whole number
    if not (0.0 < n <= _MAX_WHOLE and (n == math.floor(n) and n >= 1.0 if whole_n else True)):
        raise ValueError(f"n = {n!r} is not a count of samples")
    bound = max_abs
    if (abs(q) > bound or st.S.max() > bound or st.S.min() < -bound
            or (st.b.size and (st.b.max() > bound or st.b.min() < -bound))):
        raise ValueError(f"a statistic is beyond ±{bound:g}")
    if phi_sq is None:
        return
    f = st.dim
    trace = np.trace(st.S, axis1=-2, axis2=-1)
    if np.any(trace > n * phi_sq * (1.0 + 1e-9) + 1e-9):
        raise ValueError("tr S exceeds n·max‖φ‖²: not the scatter of n feature vectors")
    # Σ [φ; y][φ; y]ᵀ is positive semi-definite; jitter far above rounding, far below any signal
    aug = np.empty(st.S.shape[:-2] + (f + 1, f + 1))
    aug[..., :f, :f] = st.S
    aug[..., :f, f] = st.b
    aug[..., f, :f] = st.b
    aug[..., f, f] = q
    jitter = 1e-9 * np.maximum(trace + abs(q), 1.0)
    aug[..., np.arange(f + 1), np.arange(f + 1)] += jitter[..., None]
    np.linalg.cholesky(aug)  # LinAlgError (a ValueError) when not positive semi-definite


class FedBNRAggregation(SummingWindow):
    """The :class:`~streamfed.algorithms.base.Aggregation` of FedBNR.

    >>> server = FedBNRServer(dim=2, kernel_version="v", min_samples=1, fit_hyperparameters=False)
    >>> agg = FedBNRAggregation(server, phi_sq=2.0)
    >>> st = SufficientStats.from_samples(np.ones((3, 1, 2)), np.ones(3), kernel_version="v")
    >>> agg.take("a", 1, Upload("a", 1, 0, st)); agg.pending()
    True
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    def __init__(self, server: FedBNRServer, *, phi_sq: float, max_abs: float = 1e100,
                 check_stats: bool = True) -> None:
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.server = server
        self.max_abs = float(max_abs)
        # off only for clients that add DP noise or secure-aggregation masks to their deltas, which make
        # single deltas improper (docs/algorithms.md §9)
        self.check_stats = bool(check_stats)
        self.phi_sq = float(phi_sq)
        self._dirty = False  # something summed since the last global

    @property
    def version(self) -> int:
        return int(self.server.version)

    def included(self) -> dict[str, int]:
        return dict(self.server.included)

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> Upload:
        up = Upload.from_message(stats_fields(msg))
        check_statistics(up.stats, max_abs=self.max_abs, phi_sq=self.phi_sq if self.check_stats else None)
        # the server's own checks (kernel version/epoch, shapes, privacy floor, seq >= 1), without applying
        self.server.validate(up)
        waiting = self.server.waiting().get(up.client, [])
        if len(waiting) >= self.server.max_buffered and up.seq > self.server.included.get(up.client, 0) + 1:
            raise ValueError(f"client {up.client!r} has {len(waiting)} uploads waiting for an earlier seq")
        return up

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[Upload]) -> tuple[dict[str, np.ndarray], int, int]:
        st = items[0].stats.copy()
        for up in items[1:]:
            st += up.stats
        packed = st.to_packed()
        return ({k: np.asarray(packed[k], dtype=np.float64) for k in ("S_upper", "b", "n", "q")},
                int(st.n), int(self.server.epoch))

    def read_partial(self, msg: Message) -> SufficientStats:
        fields = {k: np.array(msg.arrays[k], dtype=np.float64) for k in ("S_upper", "b", "n", "q")}
        fields.update(kernel_version=msg.kernel_version, epoch=msg.epoch)
        st = SufficientStats.from_packed(fields)
        if st.tag != (self.server.kernel_version, self.server.epoch):
            raise ValueError(f"partial for kernel version/epoch {st.tag}")
        n = float(st.n)
        if not (n >= 1 and n == math.floor(n)):
            raise ValueError(f"n = {n!r} is not a count of samples")
        return st

    def apply_partial(self, total: SufficientStats, n_clients: int, included: Mapping[str, int]) -> None:
        self.server.stats += total
        self.server.included = dict(included)
        self.server.publish()

    # ---------------------------------------------------------------- output
    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        s = self.server
        packed = s.stats.to_packed()
        return global_message(fleet, sender, s.version, packed["S_upper"], packed["b"], packed["n"], packed["q"],
                              s.sigma, s.lam, s.log_evidence, dict(s.included), kernel_version=kernel_version,
                              epoch=s.epoch)

    def warm_up(self) -> None:
        pass
