"""The POF-MKL paper's baselines (docs/algorithms.md §3.7): OFSKL, OFMKL-Avg, vM-KOFL and eM-KOFL, for
the comparison tables. They run in the replay only (``in_fleet = False``): nobody deploys them, and their
uploads grow with the dictionary (`N·2D`) — the point POF-MKL makes.

* :mod:`.client` — the client halves; :mod:`.server` — the vM/eM-KOFL server; :mod:`.messages` — what they
  exchange;
* :mod:`.learner`, :mod:`.aggregation` — the learner and aggregation of the plug-in contract; :mod:`.wire` —
  their message kinds.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="vm-kofl", n_inputs=2, n_kernels=3, n_features=4)
>>> learner = VM_KOFL.learner(cfg, "a", 0)
>>> learner.learn(np.zeros(2), 1.0)
(0.0, None)
>>> sorted(learner.take_update().arrays)
['delta', 'kernels', 'losses']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import Field

from streamfed.algorithms.base import Algorithm, Mode, params_of
from streamfed.algorithms.dictionary import KernelDictionary, rff_bank

if TYPE_CHECKING:
    from streamfed.core.features import RFFBank
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["EM_KOFL", "KOFL", "KOFLParams", "OFMKL_AVG", "OFSKL", "VM_KOFL"]


class KOFLParams(KernelDictionary):
    """The kernel dictionary, the step size and regulariser of the baselines' gradient steps; `kernel`: OFSKL's
    kernel (index into the dictionary; default its middle bandwidth).

    >>> KOFLParams().eta
    0.005
    """

    eta: float = Field(0.005, gt=0, allow_inf_nan=False)
    lam: float = Field(1e-4, ge=0, allow_inf_nan=False)
    kernel: int | None = Field(None, ge=0)


class KOFL(Algorithm):
    """One of the four baselines (the class attribute `kind` says which)."""

    Params = KOFLParams
    lockstep = True
    in_fleet = False
    kind: ClassVar[str]

    def __init__(self, name: str, title: str) -> None:
        self.name, self.title = name, title  # type: ignore[misc]

    def _bank(self, cfg: FleetConfig) -> RFFBank:
        bank = rff_bank(cfg)
        if self.name == "ofskl":  # one pre-selected kernel of the dictionary
            p0 = bank.n_kernels // 2 if params_of(cfg, KOFLParams).kernel is None else params_of(cfg, KOFLParams).kernel
            if p0 >= bank.n_kernels:
                raise ValueError(f"OFSKL kernel {p0} is not in a dictionary of {bank.n_kernels}")
            return bank.kernel(p0).bank
        return bank

    def feature_dim(self, cfg: FleetConfig) -> int:
        return params_of(cfg, KOFLParams).dim

    def _weighted(self) -> bool:
        return self.name in ("vm-kofl", "em-kofl")

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.kofl.wire import schemas

        n = 1 if self.name == "ofskl" else params_of(cfg, KOFLParams).n_kernels
        m = 1 if self.name in ("ofskl", "em-kofl") else n
        return schemas(self.name, n, m, self.feature_dim(cfg), losses=self._weighted(), cfg=cfg)

    def kernel_version(self, cfg: FleetConfig) -> str:
        return self._bank(cfg).version

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async") -> Any:
        from streamfed.algorithms.kofl import client as kl
        from streamfed.algorithms.kofl.learner import KOFLLearner

        cls = {"ofskl": kl.OFSKLClient, "ofmkl-avg": kl.OFMKLAvgClient, "vm-kofl": kl.VMKOFLClient,
               "em-kofl": kl.EMKOFLClient}[self.name]
        return KOFLLearner(cls(self._bank(cfg), params_of(cfg, KOFLParams).eta, params_of(cfg, KOFLParams).lam))

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True) -> Any:
        from streamfed.algorithms.kofl.aggregation import KOFLAggregation
        from streamfed.algorithms.kofl.server import KOFLServer
        from streamfed.algorithms.pofmkl.server import POFMKLServer

        bank = self._bank(cfg)
        if self._weighted():
            server = KOFLServer(bank.n_kernels, bank.dim, params_of(cfg, KOFLParams).eta, sample=self.name == "em-kofl",
                                rng=np.random.default_rng([cfg.seed, 0xE3]))
        else:
            server = POFMKLServer(bank.n_kernels, bank.dim)
        return KOFLAggregation(server, self.name, max_abs=max_abs)


OFSKL = KOFL("ofskl", "OFSKL (one pre-selected Gaussian kernel, Fed-OMD)")
OFMKL_AVG = KOFL("ofmkl-avg", "OFMKL-Avg (all kernels learned independently, plain average)")
VM_KOFL = KOFL("vm-kofl", "vM-KOFL (all kernels uploaded, fleet-wide exponential weights)")
EM_KOFL = KOFL("em-kofl", "eM-KOFL (one server-sampled kernel per step)")
