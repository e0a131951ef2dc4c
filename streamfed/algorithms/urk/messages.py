"""What URK-FedBNR's halves exchange, before the envelope: a client's statistics upload or one chunk of a
proposal (:class:`StatsItem`, :class:`ChunkItem`), and the server's :class:`URKGlobal`.

The envelope's `epoch` is the kernel version: the network every statistic was computed with, and the network
a proposal's delta is relative to."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamfed.algorithms.chunks import Chunk
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["ChunkItem", "StatsItem", "URKGlobal"]


@durable("urk.StatsItem")
@dataclass(frozen=True)
class StatsItem:
    """Phase 2: delta statistics `(S, b, n, q)` of at least `min_upload` samples under the network of `epoch`,
    numbered `seq` (the client's upload numbering, shared with its chunks).

    >>> StatsItem("a", 1, 0, 0, SufficientStats.zeros(2, (1,))).epoch
    0
    """

    client: str
    seq: int
    base_version: int
    epoch: int
    stats: SufficientStats
    # with forgetting (`half_life_s`): the time the statistics are discounted to and the raw number of samples
    # they summarise (`stats.n` is then a discounted count); count 0: no forgetting
    time: float = 0.0
    count: int = 0

    @property
    def n_samples(self) -> float:
        """The samples it summarises (the raw count with forgetting): what the privacy floor counts."""
        return float(self.count) if self.count else float(self.stats.n)


@durable("urk.ChunkItem")
@dataclass(frozen=True)
class ChunkItem:
    """Phase 1: one chunk of a proposal — the delta `θ_c − θ_epoch` (network, `log σ`, `log λ`) of a local
    fit on a reservoir of `weight` samples — numbered `seq` like any upload; `chunk.seq` numbers the proposal.

    >>> ChunkItem("a", 3, 0, 0, Chunk(1, 0, 1, 2, np.zeros(2)), 64.0).chunk.count
    1
    """

    client: str
    seq: int
    base_version: int
    epoch: int
    chunk: Chunk
    weight: float


@durable("urk.URKGlobal")
@dataclass(frozen=True)
class URKGlobal:
    """The server's model: the network of kernel version `epoch` (flat vector `theta`), the summed statistics
    of that version, the evidence-fitted `σ, λ` of the last layer and `included` (per client: the highest
    upload seq with every seq up to it applied).

    >>> g = URKGlobal(1, 0, np.zeros(3), SufficientStats.zeros(2, (1,)), 1.0, 1.0, 0.0, {"a": 2})
    >>> g.version, g.included
    (1, {'a': 2})
    """

    version: int
    epoch: int
    theta: np.ndarray
    stats: SufficientStats
    sigma: float
    lam: float
    log_evidence: float
    included: dict[str, int] = field(default_factory=dict)
    time: float = 0.0  # with forgetting: the reference time the statistics are discounted to
