"""The server half of pFedGP: proposals reassembled from their chunks (:mod:`streamfed.algorithms.chunks`)
and averaged — FedAvg weighted by the samples each local update saw — and a new network version adopted
once enough proposals came (URK-FedBNR's and FSGP's quorum rule). There is nothing else to aggregate: every
client's GP stays on the client.

Uploads are applied once and in each client's seq order; a chunk computed under an older version is counted
(`stale_chunks`) and logged, not used, but its seq is marked applied (its delta belongs to a network that is
gone). A new version drops every open proposal.

Robust aggregation (docs/algorithms.md §9.4, §10.3; `robust` set by the factory from
`[fleet.robust]`): the new network is `θ + robust_delta(one delta per client)` — each client's deltas of
the version averaged, clipped to `clip_factor ×` the median norm, then a coordinate-wise trimmed mean —
instead of the weighted mean.

>>> from streamfed.algorithms.chunks import split_vector
>>> server = PFedGPServer(np.zeros(3), min_proposal_weight=1.0)
>>> for i, c in enumerate(split_vector(1, np.array([1.0, 2.0, 3.0]), 2)):
...     _ = server.apply(ChunkItem("a", i + 1, 0, 0, c, 10.0))
>>> g = server.publish()
>>> g.version, g.epoch, g.theta.tolist(), g.included
(1, 1, [1.0, 2.0, 3.0], {'a': 2})
"""

from __future__ import annotations

import logging
import math

import numpy as np

from streamfed.algorithms.chunks import Reassembly
from streamfed.algorithms.in_order import apply_in_order
from streamfed.algorithms.pfedgp.messages import ChunkItem, PFedGPGlobal
from streamfed.algorithms.urk.robust_proposals import RobustProposals, per_client_rows, robust_delta
from streamfed.core.durable import durable

__all__ = ["PFedGPServer"]

log = logging.getLogger(__name__)


@durable("pfedgp.PFedGPServer")
class PFedGPServer:
    """Idempotent reassembly, FedAvg of proposals, versioned globals. A proposal's weight is capped at
    `max_proposal_weight` (a client's budget: nobody outweighs the fleet by claiming more); values beyond
    `max_abs` are refused."""

    # class-level defaults: a server pickled before robust aggregation existed restores as the exact one
    robust: RobustProposals | None = None
    heard_before: set[str] = frozenset()  # type: ignore[assignment]
    deltas: list[tuple[str, np.ndarray]] | None = None

    def __init__(self, theta: np.ndarray, *, min_proposal_weight: float = 64.0, proposal_quorum: float = 0.5,
                 max_proposal_weight: float = math.inf, max_abs: float = 1e6, max_buffered: int = 256,
                 robust: RobustProposals | None = None) -> None:
        if not 0.0 < proposal_quorum <= 1.0:
            raise ValueError(f"proposal_quorum must be in (0, 1], got {proposal_quorum!r}")
        self.theta = np.array(theta, dtype=np.float64)
        if not np.all(np.isfinite(self.theta)):
            raise ValueError("initial parameters contain a non-finite value")
        self.min_proposal_weight, self.proposal_quorum = float(min_proposal_weight), float(proposal_quorum)
        self.max_proposal_weight, self.max_abs = float(max_proposal_weight), float(max_abs)
        self.max_buffered = int(max_buffered)
        self.robust = robust
        self.epoch = self.version = 0
        self.included: dict[str, int] = {}
        self._buffer: dict[str, dict[int, ChunkItem]] = {}
        self.chunks = Reassembly()
        self.stale_chunks = self.refused_proposals = self.moves = 0
        self._reset_proposals()

    def _reset_proposals(self) -> None:
        self.prop_sum = np.zeros_like(self.theta)
        self.prop_weight = 0.0
        self.proposers: set[str] = set()
        # the clients heard in the version before count towards the quorum too: right after a new version
        # nobody has been heard, and a hostile client proposing first would meet the quorum alone, version
        # after version — each move within the bound, but as many moves as it likes (docs/algorithms.md §10.3)
        self.heard_before: set[str] = set(getattr(self, "heard", ()))
        self.heard: set[str] = set()
        self.extra_proposers = 0  # proposers counted by shards (their names stay there)
        self.deltas = [] if self.robust is not None else None  # robust mode: every (client, delta) of the version

    # ------------------------------------------------------------------ uploads
    def validate(self, item: ChunkItem) -> None:
        """`ValueError` for an item that can never be applied (changes nothing); an older epoch passes (stale)."""
        if item.seq < 1:
            raise ValueError(f"sequence numbers start at 1, got {item.seq}")
        if item.epoch > self.epoch or item.epoch < 0:
            raise ValueError(f"upload of network version {item.epoch}; the server is at {self.epoch}")
        c = item.chunk
        if c.total != self.theta.size:
            raise ValueError(f"a proposal of {c.total} numbers; the parameters have {self.theta.size}")
        if not (math.isfinite(item.weight) and item.weight >= 0):
            raise ValueError(f"proposal weight {item.weight!r}")
        if float(np.max(np.abs(c.data))) > self.max_abs:
            raise ValueError(f"a proposed change beyond ±{self.max_abs:g}")
        if item.epoch == self.epoch:
            self.chunks.check(item.client, c)

    def apply(self, item: ChunkItem) -> bool:
        """Apply an item once, in its client's seq order (`False` for a duplicate)."""
        self.validate(item)
        return apply_in_order(self.included, self._buffer, item.client, item.seq, item, self._apply, self.max_buffered)

    def waiting(self) -> dict[str, list[int]]:
        return {c: sorted(w) for c, w in self._buffer.items() if w}

    def _apply(self, item: ChunkItem) -> None:
        if item.epoch != self.epoch:
            self.stale_chunks += 1
            log.info("chunk %s/%d of network version %d not used: the server is at %d", item.client, item.seq,
                     item.epoch, self.epoch)
            return
        self.heard.add(item.client)
        delta = self.chunks.add(item.client, item.chunk)
        if delta is None or item.weight <= 0:
            return
        self.add_proposal(item.client, delta, item.weight)

    def add_proposal(self, client: str, delta: np.ndarray, weight: float) -> None:
        """Fold one whole proposal into the running FedAvg sum."""
        if not np.all(np.isfinite(self.theta + delta)):
            self.refused_proposals += 1
            return
        w = min(float(weight), self.max_proposal_weight)
        self.prop_sum += w * delta
        self.prop_weight += w
        self.proposers.add(client)
        if self.deltas is not None:
            self.deltas.append((client, np.array(delta, dtype=np.float64)))

    # ------------------------------------------------------------------ versions
    def ready_to_move(self) -> bool:
        n_prop = len(self.proposers) + self.extra_proposers
        quorum = max(1, math.ceil(self.proposal_quorum * (len(self.heard | self.proposers | self.heard_before)
                                                          + self.extra_proposers)
                                  - 1e-9))
        return self.prop_weight >= self.min_proposal_weight and n_prop >= quorum

    def move(self) -> None:
        """Adopt `θ + Σ w δ / Σ w` (robust mode: `θ + robust_delta(one delta per client)`) as network version
        `epoch + 1`; open chunks dropped."""
        if self.robust is not None and self.deltas:
            _, rows = per_client_rows([c for c, _ in self.deltas], [d for _, d in self.deltas])
            self.theta = self.theta + robust_delta(rows, self.robust)
        else:
            self.theta = self.theta + self.prop_sum / self.prop_weight
        self.epoch += 1
        self.moves += 1
        self._reset_proposals()
        self.chunks.drop_open()

    def publish(self) -> PFedGPGlobal:
        """The next global (version + 1), a new network version first when the proposals are ready."""
        if self.ready_to_move():
            self.move()
        self.version += 1
        return self.global_model()

    def global_model(self) -> PFedGPGlobal:
        return PFedGPGlobal(self.version, self.epoch, self.theta.copy(), dict(self.included))
