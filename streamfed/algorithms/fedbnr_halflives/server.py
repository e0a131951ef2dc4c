"""The server half over half-lives (docs/algorithms.md §4.15): one ordinary :class:`FedBNRServer` per half-life,
each summing its row of every upload — exactly, on the fleet's time base (§4.14) — and fitting its own `σ, λ` by
the evidence of its own discounted sums. Nothing is shared between the components but the uploads' envelope (client,
sequence number, raw count), so each component's global is the centralised discounted posterior of its half-life.

>>> from streamfed.core.stats import SufficientStats
>>> srv = HalfLifeServer([FedBNRServer(dim=2, kernel_version="v", min_samples=1, fit_hyperparameters=False),
...                       FedBNRServer(dim=2, kernel_version="v", min_samples=1, fit_hyperparameters=False,
...                                    half_life_s=10.0)])
>>> ones = SufficientStats.from_samples(np.ones((2, 1, 2)), np.ones(2), kernel_version="v")
>>> srv.apply([Upload("a", 1, 0, ones), Upload("a", 1, 0, ones, time=0.0, count=2)])
True
>>> srv.apply([Upload("a", 2, 0, ones), Upload("a", 2, 0, ones, time=10.0, count=2)])  # ten seconds later
True
>>> [float(g.stats.n) for g in srv.publish()]  # all four samples; the first two at half weight
[4.0, 3.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.fedbnr.messages import GlobalModel, Upload
from streamfed.algorithms.fedbnr.server import FedBNRServer
from streamfed.core.durable import durable

__all__ = ["FedBNRServer", "HalfLifeServer", "Upload"]


@durable("fedbnr-halflives.HalfLifeServer")
class HalfLifeServer:
    """`J` FedBNR servers, one per half-life, fed the rows of the same uploads (module docstring)."""

    def __init__(self, servers: Sequence[FedBNRServer]) -> None:
        if not servers:
            raise ValueError("a half-life dictionary needs at least one server")
        self.servers = list(servers)

    def apply(self, uploads: Sequence[Upload]) -> bool:
        """Sum one upload's rows, row `j` into server `j`; False for a duplicate (every server says the same)."""
        if len(uploads) != len(self.servers):
            raise ValueError(f"expected {len(self.servers)} rows, got {len(uploads)}")
        for s, up in zip(self.servers, uploads, strict=True):
            s.validate(up)  # all rows valid before any is summed
        return all([s.apply(up, validated=True) for s, up in zip(self.servers, uploads, strict=True)])

    def publish(self) -> list[GlobalModel]:
        """Every server's next global."""
        return [s.publish() for s in self.servers]

    @property
    def log_evidence(self) -> np.ndarray:
        """`(J, K)`: each server's log evidence of its sums at its `σ, λ` (as of its last publish)."""
        return np.stack([s.log_evidence for s in self.servers])
