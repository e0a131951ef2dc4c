"""What the POF-MKL paper's baselines exchange, before the envelope (:mod:`.wire` gives their schemas): a
client's :class:`KOFLUpdate` and the vM/eM-KOFL server's :class:`KOFLGlobal` (docs/algorithms.md §3.7)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from streamfed.algorithms.pofmkl.messages import GlobalTheta
from streamfed.core.durable import durable

__all__ = ["KOFLGlobal", "KOFLUpdate"]


@durable("kofl.KOFLUpdate")
class KOFLUpdate(NamedTuple):
    """Upload of a baseline client: `Δ` for some kernels and, for vM/eM-KOFL, every kernel's loss.

    >>> KOFLUpdate(np.array([0, 1]), np.zeros((2, 6)), np.zeros(2)).n_numbers
    14
    """

    kernels: np.ndarray
    delta: np.ndarray
    losses: np.ndarray | None = None
    n_samples: int = 1

    @property
    def n_numbers(self) -> int:
        return int(self.delta.size + (0 if self.losses is None else self.losses.size))


@durable("kofl.KOFLGlobal")
class KOFLGlobal(NamedTuple):
    """What the vM/eM-KOFL server broadcasts: `θ`, the fleet log-weights, the chosen kernel."""

    theta: GlobalTheta
    logv: np.ndarray
    chosen: int
