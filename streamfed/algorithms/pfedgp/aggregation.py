"""What a pFedGP aggregator, shard or reducer runs: chunks applied once, in their client's seq order,
reassembled into proposals and averaged; a new global at the end of a window in which something was applied.

Shards: a shard reassembles the proposals whose chunks all reached it in its window and sends their weighted
sum; chunks of one proposal split across windows are lost to a shard (with kernel learning, one aggregator is
the sure arrangement, as for URK-FedBNR).

Bounded influence (docs/algorithms.md §9.4, §10.3, always on when the factory builds it): a
chunk's coordinates may move at most as far as `fit_steps` Adam steps at `learning_rate` can
(:class:`~streamfed.algorithms.urk.robust_proposals.ProposalBound`), its weight at most a full budget. Robust
aggregation (a clipped, coordinate-wise trimmed mean of one delta per client) lives in the server; it needs
each client's proposal, so shards and the reducer refuse it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from streamfed.algorithms.chunks import Reassembly
from streamfed.algorithms.in_order import check_room
from streamfed.algorithms.pfedgp.messages import ChunkItem, ProposalSum
from streamfed.algorithms.pfedgp.server import PFedGPServer
from streamfed.algorithms.pfedgp.wire import global_message, read_update
from streamfed.algorithms.summing_window import SummingWindow
from streamfed.algorithms.urk.robust_proposals import ProposalBound
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["ROBUST_SHARDED", "PFedGPAggregation"]

ROBUST_SHARDED = ("robust pFedGP aggregation (trimmed mean of the clients' proposals) cannot be computed from "
                  "partial sums: run a single aggregator, or aggregation = \"exact\" with shards")


@durable("pfedgp.PFedGPAggregation")
class PFedGPAggregation(SummingWindow):
    """The :class:`~streamfed.algorithms.base.Aggregation` of pFedGP.

    >>> from streamfed.algorithms.chunks import split_vector
    >>> agg = PFedGPAggregation(PFedGPServer(np.zeros(2), min_proposal_weight=1.0))
    >>> agg.take("a", 1, ChunkItem("a", 1, 0, 0, split_vector(1, np.ones(2), 4)[0], 5.0)); agg.pending()
    True
    >>> agg.close_window({}, lambda c: 0), agg.version, agg.server.epoch, agg.included()
    (True, 1, 1, {'a': 1})
    """

    bound: ProposalBound | None = None  # class-level default: pickled before the declared bound, none

    def __init__(self, server: PFedGPServer, *, bound: ProposalBound | None = None) -> None:
        self.server = server
        self.bound = bound
        self._dirty = False

    def for_partials(self, role: str) -> None:
        """A shard or the reducer: robust aggregation needs each client's proposal, so it is refused there."""
        if self.server.robust is not None:
            raise ValueError(ROBUST_SHARDED)

    def diagnostics(self) -> dict[str, float]:
        s = self.server
        return {"epoch": float(s.epoch), "proposal_weight": s.prop_weight, "proposers": float(len(s.proposers)),
                "stale_chunks": float(s.stale_chunks), "refused_proposals": float(s.refused_proposals)}

    def check(self, msg: Message) -> ChunkItem:
        s = self.server
        item = read_update(msg)
        s.validate(item)
        if self.bound is not None and item.epoch == s.epoch:
            # a chunk of an older version is counted stale and never used: nothing to bound against
            c = item.chunk
            self.bound.check(s.theta, c.index * -(-c.total // c.count), c.data, item.weight)
        check_room(s.included, s.waiting(), item.client, item.seq, s.max_buffered)
        return item

    # ---------------------------------------------------------------- shards and reducer
    def partial(self, items: Sequence[ChunkItem]) -> tuple[dict[str, np.ndarray], int, int]:
        self.for_partials("shard")
        s = self.server
        r = Reassembly(max_open=1 << 20)
        total, weight, proposers = np.zeros_like(s.theta), 0.0, set()
        for it in sorted(items, key=lambda i: (i.client, i.seq)):
            if it.epoch != s.epoch or it.weight <= 0:
                continue
            whole = r.add(it.client, it.chunk)
            if whole is not None:
                w = min(float(it.weight), s.max_proposal_weight)
                total += w * whole
                weight += w
                proposers.add(it.client)
        arrays = {"delta_sum": total, "weight": np.asarray(weight), "proposers": np.asarray(float(len(proposers)))}
        return arrays, 0, int(s.epoch)

    def read_partial(self, msg: Message) -> ProposalSum:
        self.for_partials("reducer")
        s = self.server
        if msg.epoch != s.epoch:
            raise ValueError(f"partial of network version {msg.epoch}; the reducer is at {s.epoch}")
        d = np.array(msg.arrays["delta_sum"], dtype=np.float64)
        w, k = float(msg.arrays["weight"]), float(msg.arrays["proposers"])
        if d.shape != s.theta.shape or not np.all(np.isfinite(d)) or not (math.isfinite(w) and w >= 0):
            raise ValueError("a partial's sum is malformed or not finite")
        return ProposalSum(d, w, int(k))

    def apply_partial(self, total: ProposalSum, n_clients: int, included: Mapping[str, int]) -> None:
        s = self.server
        s.prop_sum += total.delta_sum
        s.prop_weight += total.weight
        s.extra_proposers += int(total.proposers)
        s.included = dict(included)
        s.publish()

    def global_message(self, fleet: str, sender: str, kernel_version: str) -> Message:
        return global_message(fleet, sender, self.server.global_model(), kernel_version)
