"""What a URK-FedBNR aggregator, shard or reducer runs: every valid upload applied once, in its client's seq
order — statistics of the current kernel version summed, chunks reassembled into proposals — and a new global
at the end of a window in which something was applied.

An upload is validated completely before anything changes: statistics as FedBNR's (values bounded by
`max_abs`, `n` a whole number, `[[S, b], [bᵀ, q]]` positive semi-definite, `tr S ≤ n·‖φ‖²` with the exact
`‖φ‖²` of a URK feature vector: `m/(m−1)`, or 1 under the "rff" normalisation), chunks consistent with their
siblings and of the network's length.

Bounded influence (docs/algorithms.md §8.11, §10.3, always on when the factory builds it): every feature vector has
the same norm, so `tr S = n·‖φ‖²` pins `n` (a claim of more samples than the scatter holds is refused), and
labels clipped to `±label_bound` bound `q` and `b`; a proposal's coordinates may move at most as far as
`fit_steps` Adam steps can (:class:`~streamfed.algorithms.urk.robust_proposals.ProposalBound`), its weight at most a
reservoir. Robust aggregation lives in the server (:class:`~streamfed.algorithms.urk.server.URKServer`).

Sharding sums statistics exactly while the kernel version does not move; proposals do not travel through
shards, so with kernel learning run one aggregator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np

from streamfed.algorithms.fedbnr.aggregation import check_statistics
from streamfed.algorithms.in_order import check_room
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.algorithms.urk.messages import ChunkItem, StatsItem
from streamfed.algorithms.urk.robust_proposals import ProposalBound
from streamfed.algorithms.urk.server import URKServer
from streamfed.algorithms.urk.wire import global_message, read_update
from streamfed.core.discount import MAX_CLOCK_SKEW_S
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats, pack_upper, unpack_upper
from streamfed.wire.message import Message

__all__ = ["ROBUST_SHARDED", "URKAggregation"]

ROBUST_SHARDED = ("robust URK-FedBNR aggregation (share cap per client, trimmed mean of proposals) cannot be "
                  "computed from partial sums: run a single aggregator, or aggregation = \"exact\" with shards")


@durable("urk.URKAggregation")
class URKAggregation(SummingWindow):
    """The :class:`~streamfed.algorithms.base.Aggregation` of URK-FedBNR.

    >>> from streamfed.algorithms.urk.network import URKArch, initial_weights, omega
    >>> arch = URKArch(n_inputs=1, widths=(), n_omega=2)
    >>> agg = URKAggregation(URKServer(initial_weights(arch, 0), omega(arch, 0), "v", min_samples=1, fit=False))
    >>> st = SufficientStats.from_samples(np.full((2, 1, 4), 0.5), np.ones(2), "v")
    >>> agg.take("a", 1, StatsItem("a", 1, 0, 0, st)); agg.pending()
    True
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.included()
    (True, 1, {'a': 1})
    """

    # class-level defaults: an aggregation pickled before the declared bounds restores without them
    label_bound: float | None = None
    bound: ProposalBound | None = None

    def __init__(self, server: URKServer, *, max_abs: float = 1e100, check_stats: bool = True,
                 label_bound: float | None = None, bound: ProposalBound | None = None) -> None:
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.server = server
        self.max_abs = float(max_abs)
        self.check_stats = bool(check_stats)
        self.phi_sq = server.weights.arch.phi_sq  # ‖s(x)‖² = m·scale², for every x and every network
        self.label_bound = None if label_bound is None else float(label_bound)
        self.bound = bound
        self._dirty = False

    def for_partials(self, role: str) -> None:
        """A shard or the reducer: robust aggregation needs each client's uploads, so it is refused there; so are
        discounted statistics (a partial carries no time, as FedBNR's)."""
        if self.server.robust is not None or self.server.share is not None:
            raise ValueError(ROBUST_SHARDED)
        if self.server.discount is not None:
            raise ValueError(f"a URK-FedBNR {role} cannot sum discounted statistics (half_life_s) yet: run one "
                             "aggregator")

    def now(self) -> float:
        """The aggregator's clock (seconds since the epoch): no upload may be stamped far beyond it."""
        return time.time()

    def diagnostics(self) -> dict[str, float]:
        s = self.server
        out = {"epoch": float(s.epoch), "sigma": float(s.sigma), "lam": float(s.lam),
               "proposal_weight": s.prop_weight, "stale_stats": float(s.stale_stats),
               "stale_chunks": float(s.stale_chunks), "refused_proposals": float(s.refused_proposals),
               "failed_moves": float(s.failed_moves), "failed_fits": float(s.failed_fits)}
        if s.share is not None:
            shares = s.client_shares()
            out.update(tempered_uploads=float(s.tempered), largest_client_share=max(shares.values(), default=0.0))
        return out

    def client_shares(self) -> dict[str, float]:
        """Robust mode: each client's share of the current version's samples (empty in exact mode)."""
        return self.server.client_shares() if self.server.share is not None else {}

    # ---------------------------------------------------------------- updates
    def check(self, msg: Message) -> StatsItem | ChunkItem:
        s = self.server
        item = read_update(msg, s.weights.arch, s.kernel_version)
        if isinstance(item, StatsItem):
            checked = self.check_stats  # off only for noised uploads (differential privacy, docs/algorithms.md §12)
            timed = s.discount is not None
            # ‖φ‖² is the same for every input: the lower bound pins n to tr S / ‖φ‖² (discounted: every bound is
            # homogeneous in the sample weights, n is their sum)
            check_statistics(item.stats, max_abs=self.max_abs, phi_sq=self.phi_sq if checked else None,
                             label_bound=self.label_bound if checked else None,
                             phi_sq_min=self.phi_sq if checked and self.label_bound is not None else None,
                             whole_n=not timed)
            if not timed and int(msg.n_samples) != item.stats.n:  # what the token bucket charged is the count summed
                raise ValueError(f"n_samples = {msg.n_samples} but the statistics count n = {item.stats.n:g}")
            if timed and math.isfinite(item.time) and item.time > self.now() + MAX_CLOCK_SKEW_S:
                raise ValueError(f"upload time {item.time:.0f} is more than {MAX_CLOCK_SKEW_S:g} s ahead of this "
                                 f"aggregator's clock")
        elif float(np.max(np.abs(item.chunk.data))) > self.max_abs or item.weight > self.max_abs:
            raise ValueError(f"a proposed value is beyond ±{self.max_abs:g}")
        s.validate(item)  # shapes and siblings first: the bound reads the chunk's place in the vector
        if isinstance(item, ChunkItem) and self.bound is not None and item.epoch == s.epoch:
            # a chunk of an older version is counted stale and never used: nothing to bound against
            c = item.chunk
            self.bound.check(s.theta, c.index * -(-c.total // c.count), c.data, item.weight)
        check_room(s.included, s.waiting(), item.client, item.seq, s.max_buffered)
        return item

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[StatsItem | ChunkItem]) -> tuple[dict[str, np.ndarray], int, int]:
        self.for_partials("shard")
        s = self.server
        f = s.weights.arch.dim
        total = SufficientStats.zeros(f, (1,), s.kernel_version, s.epoch)
        for it in items:
            if isinstance(it, StatsItem) and it.epoch == s.epoch:
                total += SufficientStats(it.stats.S, it.stats.b, it.stats.n, it.stats.q, s.kernel_version, s.epoch)
        arrays = {"S_upper": pack_upper(total.S[0]), "b": total.b[0].copy(), "n": np.asarray(total.n),
                  "q": np.asarray(total.q)}
        return arrays, int(total.n), int(s.epoch)

    def read_partial(self, msg: Message) -> SufficientStats:
        self.for_partials("reducer")
        s = self.server
        if msg.epoch != s.epoch:
            raise ValueError(f"partial of kernel version {msg.epoch}; the reducer is at {s.epoch}")
        f = s.weights.arch.dim
        st = SufficientStats(unpack_upper(np.array(msg.arrays["S_upper"], dtype=np.float64), f)[None],
                             np.array(msg.arrays["b"], dtype=np.float64)[None], float(msg.arrays["n"]),
                             float(msg.arrays["q"]), s.kernel_version, s.epoch)
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
        return global_message(fleet, sender, self.server.global_model(), kernel_version,
                              timed=self.server.discount is not None)
