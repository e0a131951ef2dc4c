"""The server of vM-KOFL and eM-KOFL (docs/algorithms.md §3.7): POF-MKL's server plus fleet-wide kernel
log-weights (OFSKL and OFMKL-Avg use POF-MKL's server as it is)."""

from __future__ import annotations

import numpy as np

from streamfed.algorithms.kofl.messages import KOFLGlobal, KOFLUpdate
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.core.durable import durable

__all__ = ["KOFLServer"]


@durable("kofl.KOFLServer")
class KOFLServer(POFMKLServer):
    """Server of vM-KOFL (`sample=False`) and eM-KOFL (`sample=True`): averages `Δ` per kernel and
    keeps fleet log-weights `log v_p = -η Σ_{c,t} ℓ_{c,p}`; eM-KOFL draws the next kernel from them.

    >>> s = KOFLServer(2, 4, eta=0.1, sample=False)
    >>> s.apply_round([KOFLUpdate(np.array([0, 1]), np.ones((2, 4)), np.array([1.0, 3.0]))])
    1
    >>> np.round(s.global_params().logv, 12).tolist()
    [0.0, -0.2]
    """

    def __init__(self, n_kernels: int, dim: int, eta: float = 0.005, sample: bool = False,
                 rng: np.random.Generator | int | None = None) -> None:
        super().__init__(n_kernels, dim)
        self.eta, self.sample = float(eta), sample
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.logv = np.zeros(n_kernels)
        self.chosen = int(self.rng.integers(n_kernels)) if sample else -1
        self._loss_sum = np.zeros(n_kernels)

    def add(self, update: KOFLUpdate) -> None:  # type: ignore[override]
        losses = update.losses
        if losses is None or losses.shape != self.logv.shape or not np.all(np.isfinite(losses)):
            raise ValueError("vM/eM-KOFL update must carry N finite losses")
        super().add(update)
        self._loss_sum += losses

    def finish_round(self) -> int:
        version = super().finish_round()
        self.logv -= self.eta * self._loss_sum
        self.logv -= self.logv.max()  # keep the largest at 0; v̄ unchanged
        self._loss_sum[:] = 0.0
        if self.sample:
            v = np.exp(self.logv)
            self.chosen = int(np.searchsorted(np.cumsum(v / v.sum()), self.rng.random(), side="right"))
            self.chosen = min(self.chosen, self.logv.size - 1)
        return version

    def global_params(self) -> KOFLGlobal:
        return KOFLGlobal(super().global_params(), self.logv.copy(), self.chosen)
