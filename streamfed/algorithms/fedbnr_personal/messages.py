"""What personalised FedBNR's two halves exchange, before the envelope (:mod:`.wire` puts them in messages):
a client's time-weighted :class:`HierUpload` and the server's shared posterior, :class:`HierGlobal`
(docs/algorithms.md §5.4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats, pack_upper, unpack_upper

__all__ = ["HierGlobal", "HierUpload"]


@durable("fedbnr-personal.HierUpload")
@dataclass(frozen=True)
class HierUpload:
    """Delta statistics of at least `min_upload` samples, time-weighted to `time` (`γ^(time - t_i)` per
    sample; plain sums without forgetting), plus the raw sample `count` (for the privacy floor).

    >>> up = HierUpload("a", 1, 5.0, 32, SufficientStats.zeros(2, (), "v"))
    >>> HierUpload.from_message(up.to_message()) == up
    True
    """

    client: str
    seq: int
    time: float
    count: int
    stats: SufficientStats

    def to_message(self) -> dict[str, Any]:
        msg = {"client": self.client, "seq": int(self.seq), "time": float(self.time), "count": int(self.count)}
        msg.update(self.stats.to_packed())
        return msg

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> HierUpload:
        return cls(str(msg["client"]), int(msg["seq"]), float(msg["time"]), int(msg["count"]),
                   SufficientStats.from_packed(msg))


@durable("fedbnr-personal.HierGlobal")
@dataclass(frozen=True)
class HierGlobal:
    """The shared posterior `w ~ N(A⁻¹h, A⁻¹)` at `time`, the hyperparameters and who is included.

    >>> g = HierGlobal(1, "v", 0, 3.0, 1.0, 0.5, 1.0, 0.2, np.eye(2), np.ones(2), -1.0, {"a": 2})
    >>> g2 = HierGlobal.from_message(g.to_message())
    >>> bool(np.array_equal(g2.A, g.A)) and g2.included == {"a": 2} and g2.tau == 0.2
    True
    """

    version: int
    kernel_version: str
    epoch: int
    time: float
    forgetting: float
    sigma: float
    lam: float
    tau: float
    A: np.ndarray
    h: np.ndarray
    log_evidence: float
    included: dict[str, int] = field(default_factory=dict)

    def to_message(self) -> dict[str, Any]:
        return {"version": int(self.version), "kernel_version": self.kernel_version, "epoch": int(self.epoch),
                "time": float(self.time), "forgetting": float(self.forgetting), "sigma": float(self.sigma),
                "lam": float(self.lam), "tau": float(self.tau), "A_upper": pack_upper(self.A),
                "h": np.array(self.h, dtype=np.float64), "log_evidence": float(self.log_evidence),
                "included": {str(k): int(v) for k, v in self.included.items()}}

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> HierGlobal:
        h = np.asarray(msg["h"], dtype=np.float64)
        return cls(int(msg["version"]), str(msg["kernel_version"]), int(msg["epoch"]), float(msg["time"]),
                   float(msg["forgetting"]), float(msg["sigma"]), float(msg["lam"]), float(msg["tau"]),
                   unpack_upper(np.asarray(msg["A_upper"], dtype=np.float64), h.shape[0]), h,
                   float(msg["log_evidence"]), {str(k): int(v) for k, v in dict(msg["included"]).items()})

