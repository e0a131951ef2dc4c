"""Online FedBNR — Bayesian regression over random features whose sufficient statistics are summed exactly
across agents (docs/algorithms.md §4): the global posterior equals a centralised one, with calibrated
predictive uncertainty and evidence-fitted hyperparameters. With several kernels in the fleet's
dictionary each kernel keeps its own posterior and predictions are their evidence-weighted average.

* :mod:`.client` — `FedBNRClient`, the client half: its statistics, predictions, rank-one steps, uploads and
  globals; its state in one buffer (:mod:`.packed_state`), its feature maps (:mod:`.features`), its working
  posterior as a Cholesky factor (:mod:`.factor`), the power prior and local `σ, λ` (:mod:`.personalisation`);
* :mod:`.server` — `FedBNRServer`, the server half; :mod:`.evidence` — the evidence, `σ, λ` by type-II ML;
* :mod:`.metrics` — prequential metrics and the regret's ridge comparator (kept by rank-one updates); :mod:`.checks`
  — what is refused;
* :mod:`.learner` — what an agent runs (`StatsLearner`); :mod:`.aggregation` — what aggregators, shards and
  the reducer run; :mod:`.estimator` — the River regressor (`FedBNRRegressor`);
* :mod:`.messages` — `Upload` / `GlobalModel`; :mod:`.wire` — their message kinds; ``_kernels`` / ``_layout`` —
  the numba loops.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_features=3, kernels=["gaussian:1.0"])
>>> learner = ALGORITHM.learner(cfg, "a1", 0)
>>> mean, var = learner.predict(np.zeros(2))
>>> mean, var > 0
(0.0, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from streamfed.algorithms.base import Algorithm, Mode, ReplayVariant, params_of
from streamfed.algorithms.dictionary import KernelDictionary, dictionary_of, kernel_specs

if TYPE_CHECKING:
    from streamfed.algorithms.calibration import CalibratedLearner
    from streamfed.algorithms.fedbnr.aggregation import FedBNRAggregation
    from streamfed.algorithms.fedbnr.learner import StatsLearner
    from streamfed.core.features import RFFMap
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["ALGORITHM", "FedBNR", "FedBNRParams", "RFFFeatures", "feature_maps"]


class RFFFeatures(KernelDictionary):
    """The kernel dictionary of the FedBNR families, with the constant feature they add to the `2D` random ones.

    >>> RFFFeatures().bias
    True
    """

    bias: bool = True  # a constant feature besides the 2D random ones (F = 2D + 1)


class FedBNRParams(RFFFeatures):
    """Online FedBNR hyperparameters (docs/algorithms.md §4): the kernel dictionary (a posterior per kernel), then
    the model's own; defaults match `FedBNRClient`.

    >>> FedBNRParams(min_upload=64).min_upload
    64
    """

    sigma: float = Field(1.0, gt=0, allow_inf_nan=False)
    lam: float = Field(1.0, gt=0, allow_inf_nan=False)
    min_upload: int = Field(32, ge=1)  # privacy floor: never publish statistics of fewer samples
    forgetting: float = Field(1.0, gt=0, le=1)
    # forgetting that federates exactly (docs/algorithms.md §4.14): a sample `Δ` seconds old (readings' times on
    # the agents' clocks) weighs 2^(−Δ/half_life_s) in uploads and globals alike; None: off
    half_life_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    fit_hyperparameters: bool = True
    # scale the predictive variance by a conformal factor of the client's own prequential residuals
    # (streamfed.algorithms.calibration): the 95% interval covers ~95%; the mean and every upload are unchanged
    calibrate: bool = True
    # [fleet.robust] aggregation = "robust" only (docs/algorithms.md §4.13, §10.2): an upload whose residual ratio
    # under the current global exceeds robust_screen × the median of the other clients' latest ratios is
    # taken with weight 0, once robust_screen_clients others have one; any client may hold
    # robust_share_floor samples whatever the share cap (None: min_upload, one upload: the cold start)
    robust_screen: float = Field(50.0, gt=1, allow_inf_nan=False)
    robust_screen_clients: int = Field(3, ge=1)
    robust_share_floor: int | None = Field(None, ge=1)
    # robust mode: a client whose average residual ratio is over robust_soft × the others' median has its
    # uploads down-weighted (algorithms/shares.py; 0 turns it off). 1.0 held adaptive attackers of 12 Beijing
    # stations to ×1.30 (1) and ×1.60 (3), the attack-free fleet 9% better than exact (docs/reliability.md §7.2.1)
    robust_soft: float = Field(1.0, ge=0.0, allow_inf_nan=False)


def feature_maps(cfg: FleetConfig) -> list[RFFMap]:
    """One Gaussian/Laplacian/Matérn RFF map per kernel of the fleet's dictionary (plus the bias feature
    when `params.bias`), frequencies derived from the fleet seed."""
    from streamfed.core.features import KernelSpec, RFFBank, RFFMap

    n_features = dictionary_of(cfg).n_features
    return [RFFMap(RFFBank([KernelSpec.parse(s)], n_features, cfg.n_inputs, seed=cfg.seed),
                   bias=params_of(cfg, RFFFeatures).bias) for s in kernel_specs(cfg)]


class FedBNR(Algorithm):
    """Online FedBNR: order-free (no lock-step), Bayesian (predictions carry a variance)."""

    name = "fedbnr"
    title = "Online FedBNR (exact federated Bayesian regression over random features, evidence-weighted kernels)"
    Params = FedBNRParams
    bayesian = True
    cheap_regret = False  # a read after a global refactorises the comparator (O(F³) a kernel): per upload
    robust_by_default = True  # share caps and screening: no measurable cost without attackers (reliability.md)

    def feature_dim(self, cfg: FleetConfig) -> int:
        return dictionary_of(cfg).dim + (1 if params_of(cfg, RFFFeatures).bias else 0)

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.fedbnr.wire import schemas

        return schemas(cfg)

    def _client(self, cfg: FleetConfig, client_id: str = "client") -> Any:
        from streamfed.algorithms.fedbnr.client import FedBNRClient

        p = params_of(cfg, FedBNRParams)
        return FedBNRClient(feature_maps(cfg), sigma=p.sigma, lam=p.lam, min_upload=p.min_upload,
                            forgetting=p.forgetting, client_id=client_id, half_life_s=p.half_life_s)

    def kernel_version(self, cfg: FleetConfig) -> str:
        return self._client(cfg).kernel_version

    def demo_settings(self) -> dict[str, Any]:
        # one kernel: a dictionary of 16 at F = 101 would cost 16 rank-one updates per sample
        return {"params": {"kernels": ["gaussian:2.0"], "n_kernels": 1, "min_upload": 32}}

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async"
                ) -> StatsLearner | CalibratedLearner:
        from streamfed.algorithms.calibration import CalibratedLearner
        from streamfed.algorithms.fedbnr.learner import StatsLearner

        if mode == "lockstep":
            raise ValueError("lock-step mode is POF-MKL's protocol; FedBNR is order-free (use async)")
        client = self._client(cfg, client_id)
        # RFF features have a constant norm: any input gives the bound (differential privacy needs it)
        phi_sq = float(np.max(np.sum(client.features(np.zeros(cfg.n_inputs)) ** 2, axis=-1)))
        learner = StatsLearner(client, phi_sq=phi_sq)
        return CalibratedLearner(learner) if params_of(cfg, FedBNRParams).calibrate else learner

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True
                    ) -> FedBNRAggregation:
        from streamfed.algorithms.fedbnr.aggregation import FedBNRAggregation, RobustFedBNRServer
        from streamfed.algorithms.fedbnr.server import FedBNRServer
        from streamfed.algorithms.shares import Robust

        probe = self._client(cfg)
        norms = np.sum(probe.features(np.zeros(cfg.n_inputs)) ** 2, axis=-1)
        # RFF features (plus the constant bias) have one norm for every input (docs/algorithms.md §2.1), so
        # the largest and the smallest ‖φ‖² are those of any input
        phi_sq, phi_sq_min = float(np.max(norms)), float(np.min(norms))
        p, r = params_of(cfg, FedBNRParams), cfg.robust
        robust = Robust.of(r, p)
        server = (RobustFedBNRServer if robust else FedBNRServer).for_client(
            probe, fit_hyperparameters=p.fit_hyperparameters)
        return FedBNRAggregation(server, phi_sq=phi_sq, max_abs=max_abs, check_stats=check_stats,
                                 label_bound=r.label_bound, phi_sq_min=phi_sq_min, robust=robust,
                                 roster=len(cfg.clients) if cfg.clients else None)

    def replay_variants(self) -> list[ReplayVariant]:
        return [ReplayVariant(self.name, self.title),
                ReplayVariant("fedbnr-local", "FedBNR without federation (each client its own server)", "local")]

    def estimator(self, **params: Any) -> Any:
        from streamfed.algorithms.fedbnr.estimator import FedBNRRegressor

        return FedBNRRegressor(**params)


ALGORITHM = FedBNR()
