"""What FedBNR's two halves exchange, before the envelope (:mod:`.wire` puts them in messages): a client's
:class:`Upload` of delta statistics and the server's :class:`GlobalModel` (docs/algorithms.md §4.6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["GlobalModel", "Upload"]


@durable("fedbnr.Upload")
@dataclass(frozen=True)
class Upload:
    """What a client publishes: delta statistics of at least `min_upload` samples.

    `stats` has batch shape `(K,)`: `S (K, F, F)` (only its upper triangle travels, see
    :meth:`to_message`), `b (K, F)`, `n`, `q` (scalars), tagged with the kernel version and epoch.

    >>> s = SufficientStats.zeros(2, (1,), kernel_version="v")
    >>> up = Upload("a", 1, 0, s)
    >>> Upload.from_message(up.to_message()) == up
    True
    """

    client: str
    seq: int
    base_version: int  # version of the global the client held when it made this upload
    stats: SufficientStats
    # with forgetting (half-life, :mod:`.discount`): the time the statistics are discounted to, and the raw
    # number of samples they summarise (`stats.n` is then a discounted, non-integer count); 0: no forgetting
    time: float = 0.0
    count: int = 0

    @property
    def n_samples(self) -> float:
        """The real number of samples (what the privacy floor and the rate limits charge)."""
        return float(self.count) if self.count else self.stats.n

    def to_message(self) -> dict[str, Any]:
        """Plain fields and float64 arrays for a codec (`S_upper` is `(K, F(F+1)/2)`)."""
        msg: dict[str, Any] = {"client": self.client, "seq": int(self.seq), "base_version": int(self.base_version)}
        msg.update(self.stats.to_packed())
        if self.count:
            msg.update(time=float(self.time), count=int(self.count))
        return msg

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> Upload:
        return cls(str(msg["client"]), int(msg["seq"]), int(msg["base_version"]),
                   SufficientStats.from_packed(msg), float(msg.get("time", 0.0)), int(msg.get("count", 0)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Upload):
            return NotImplemented
        same_id = (self.client, self.seq, self.base_version) == (other.client, other.seq, other.base_version)
        return same_id and (self.time, self.count) == (other.time, other.count) and self.stats == other.stats

    __hash__ = None  # type: ignore[assignment]


@durable("fedbnr.GlobalModel")
@dataclass(frozen=True)
class GlobalModel:
    """What the server broadcasts: the global sums, the hyperparameters and who is included.

    `stats` has batch shape `(K,)`; `sigma`, `lam`, `log_evidence` are `(K,)` (one per kernel of
    the dictionary; `K = 1` for one feature map); `included[client]` is the highest sequence number of
    that client summed into `stats` (every lower one is summed too).

    >>> g = GlobalModel(1, "v", 0, SufficientStats.zeros(2, (1,), "v"), np.ones(1), np.ones(1),
    ...                 np.zeros(1), {"a": 3})
    >>> g2 = GlobalModel.from_message(g.to_message())
    >>> g2.included, g2.best_kernel
    ({'a': 3}, 0)
    """

    version: int
    kernel_version: str
    epoch: int
    stats: SufficientStats
    sigma: np.ndarray
    lam: np.ndarray
    log_evidence: np.ndarray
    included: dict[str, int] = field(default_factory=dict)
    time: float = 0.0  # with forgetting: the reference time the statistics are discounted to

    @property
    def best_kernel(self) -> int:
        """Index of the kernel with the largest evidence."""
        return int(np.argmax(self.log_evidence))

    def to_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"version": int(self.version)}
        msg.update(self.stats.to_packed())
        msg.update(sigma=np.asarray(self.sigma, dtype=np.float64).copy(),
                   lam=np.asarray(self.lam, dtype=np.float64).copy(),
                   log_evidence=np.asarray(self.log_evidence, dtype=np.float64).copy(),
                   included={str(k): int(v) for k, v in self.included.items()}, time=float(self.time))
        return msg

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> GlobalModel:
        stats = SufficientStats.from_packed(msg)
        return cls(int(msg["version"]), stats.kernel_version, stats.epoch, stats,
                   np.asarray(msg["sigma"], dtype=np.float64), np.asarray(msg["lam"], dtype=np.float64),
                   np.asarray(msg["log_evidence"], dtype=np.float64),
                   {str(k): int(v) for k, v in dict(msg["included"]).items()}, float(msg.get("time", 0.0)))
