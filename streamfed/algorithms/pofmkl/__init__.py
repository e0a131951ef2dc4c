"""POF-MKL — personalized online federated multi-kernel learning (Ghari & Shen, NeurIPS 2022);
docs/algorithms.md §3.

A dictionary of random-Fourier-feature kernels, per-agent multiplicative kernel weights (log domain), and
each step uploads one sampled bin of at most `M` kernels (`M·2D` numbers, whatever the dictionary size).

* :mod:`.client`, :mod:`.server` — the client and server halves (`POFMKLClient`, `POFMKLServer`);
  :mod:`.messages` — what they exchange (`KernelUpdate`, `GlobalTheta`);
* :mod:`.learner` — what an agent runs (lock-step uploads, or error feedback in asynchronous mode);
* :mod:`.estimator` — the River regressor (`POFMKLRegressor`);
* :mod:`.aggregation` — what the aggregator, the shards and the reducer run;
* :mod:`.wire` — its message kinds;
* ``_kernels`` / ``_layout`` — the numba loops and their buffer layout.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3, n_kernels=4, n_features=5)
>>> learner = ALGORITHM.learner(cfg, "a1", 0)
>>> type(learner).__name__, learner.kernel_weights.round(2).tolist()
('POFMKLLearner', [0.25, 0.25, 0.25, 0.25])
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from streamfed.algorithms.base import Algorithm, Mode, ReplayVariant, params_of
from streamfed.algorithms.dictionary import KernelDictionary, rff_bank

if TYPE_CHECKING:
    from streamfed.algorithms.pofmkl.aggregation import POFMKLAggregation
    from streamfed.algorithms.pofmkl.learner import POFMKLLearner
    from streamfed.core.features import RFFBank
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["ALGORITHM", "POFMKL", "POFMKLParams"]


class POFMKLParams(KernelDictionary):
    """POF-MKL hyperparameters (docs/algorithms.md §3): the kernel dictionary, the bin size `M` (the kernels an
    update may carry), the step size, regulariser and exploration rate, the radius of θ; defaults match
    `POFMKLClient`.

    >>> POFMKLParams().eta, POFMKLParams(n_kernels=4, bin_size=2).bin_size
    (0.005, 2)
    """

    bin_size: int = Field(1, ge=1)  # M
    eta: float = Field(0.005, gt=0, allow_inf_nan=False)
    lam: float = Field(1e-4, ge=0, allow_inf_nan=False)
    xi: float = Field(0.1, ge=0, le=1)
    # R: the server keeps every ‖θ_p‖ ≤ R (projection), and the declared bound of an update uses it. None: B/√λ
    # (B the fleet's label bound), beyond which no regularised comparator lies; 100·B when λ = 0.
    theta_radius: float | None = Field(None, gt=0, allow_inf_nan=False)

    def radius(self, label_bound: float) -> float:
        """`theta_radius`, or its default for labels within `±label_bound`.

        >>> POFMKLParams().radius(10.0), POFMKLParams(lam=0.0).radius(2.0)
        (1000.0, 200.0)
        """
        if self.theta_radius is not None:
            return float(self.theta_radius)
        return float(label_bound / math.sqrt(self.lam)) if self.lam > 0 else 100.0 * float(label_bound)

    @model_validator(mode="after")
    def _bin_fits(self) -> POFMKLParams:
        if self.bin_size > self.n_kernels:
            raise ValueError(f"bin_size (M={self.bin_size}) must be <= n_kernels (N={self.n_kernels})")
        return self


class POFMKL(Algorithm):
    """The POF-MKL family: itself, and in the replay its local-only and centralised arrangements."""

    name = "pofmkl"
    title = "POF-MKL (personal kernel weights, one sampled bin of M kernels uploaded)"
    Params = POFMKLParams
    lockstep = True

    def bank(self, cfg: FleetConfig) -> RFFBank:
        return rff_bank(cfg)

    def feature_dim(self, cfg: FleetConfig) -> int:
        return params_of(cfg, POFMKLParams).dim

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.pofmkl.wire import schemas

        return schemas(cfg)

    def kernel_version(self, cfg: FleetConfig) -> str:
        return self.bank(cfg).version

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async") -> POFMKLLearner:
        """Client `index` draws its bins from `default_rng([seed, index])`, as in the replay."""
        import numpy as np

        from streamfed.algorithms.pofmkl.client import POFMKLClient
        from streamfed.algorithms.pofmkl.learner import POFMKLLearner

        p = params_of(cfg, POFMKLParams)
        client = POFMKLClient(self.bank(cfg), p.eta, p.lam, p.xi, p.bin_size,
                              rng=np.random.default_rng([cfg.seed, index]))
        return POFMKLLearner(client, mode)

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True
                    ) -> POFMKLAggregation:
        """The server half. Every update is held to the largest an honest client can send (`StepBound`, from
        η, λ, ξ, N, M and `cfg.robust.label_bound`; not with `check_stats=False`: noised uploads are not
        bounded per step); `cfg.robust.aggregation = "robust"` combines rows by `RobustRule`."""
        from streamfed.algorithms.pofmkl.aggregation import POFMKLAggregation, RobustRule, StepBound

        p, r = params_of(cfg, POFMKLParams), cfg.robust
        bound = (StepBound.of(p.eta, p.lam, p.xi, p.n_kernels, p.bin_size, r.label_bound,
                              p.radius(r.label_bound)) if check_stats else None)
        robust = RobustRule(r.trim, r.clip_factor) if r.aggregation == "robust" else None
        return POFMKLAggregation(p.n_kernels, p.dim, max_abs=max_abs, bound=bound, robust=robust, bin_size=p.bin_size)

    def replay_variants(self) -> list[ReplayVariant]:
        return [ReplayVariant(self.name, self.title),
                ReplayVariant("local-only", "POF-MKL without federation (each client its own server)", "local"),
                ReplayVariant("centralised", "POF-MKL as one learner on all data (each step's fleet samples one "
                              "mini-batch)", "centralised")]

    def estimator(self, **params: Any) -> Any:
        from streamfed.algorithms.pofmkl.estimator import POFMKLRegressor

        return POFMKLRegressor(**params)


ALGORITHM = POFMKL()
