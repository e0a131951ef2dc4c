"""What pFedGP's halves exchange, before the envelope: one chunk of a client's proposal (:class:`ChunkItem`)
and the server's :class:`PFedGPGlobal`. The envelope's `epoch` is the network version: the parameters a
proposal's delta is relative to. A client's personal GP never travels."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamfed.algorithms.chunks import Chunk
from streamfed.core.durable import durable

__all__ = ["ChunkItem", "PFedGPGlobal", "ProposalSum"]


@durable("pfedgp.ChunkItem")
@dataclass(frozen=True)
class ChunkItem:
    """One chunk of a proposal — the delta `θ_c − θ_epoch` of a local update on a budget of `weight` samples —
    numbered `seq` like any upload; `chunk.seq` numbers the proposal.

    >>> ChunkItem("a", 3, 0, 0, Chunk(1, 0, 1, 2, np.zeros(2)), 64.0).chunk.count
    1
    """

    client: str
    seq: int
    base_version: int
    epoch: int
    chunk: Chunk
    weight: float


@durable("pfedgp.PFedGPGlobal")
@dataclass(frozen=True)
class PFedGPGlobal:
    """The server's model: the shared parameters `theta` of network version `epoch`, and `included` (per
    client: the highest upload seq with every seq up to it applied).

    >>> PFedGPGlobal(2, 1, np.zeros(3), {"a": 4}).included
    {'a': 4}
    """

    version: int
    epoch: int
    theta: np.ndarray
    included: dict[str, int] = field(default_factory=dict)


@durable("pfedgp.ProposalSum")
@dataclass(frozen=True)
class ProposalSum:
    """What a shard sends the reducer: the weighted sum of the whole proposals it received, their weight and
    how many clients proposed; `+` adds two.

    >>> (ProposalSum(np.ones(2), 3.0, 1) + ProposalSum(np.ones(2), 1.0, 2)).weight
    4.0
    """

    delta_sum: np.ndarray
    weight: float
    proposers: int

    def __add__(self, other: ProposalSum) -> ProposalSum:
        return ProposalSum(self.delta_sum + other.delta_sum, self.weight + other.weight,
                           self.proposers + other.proposers)
