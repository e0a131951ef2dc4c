"""Personalised FedBNR — a shared weight vector plus a personal offset per client, inferred exactly from
sufficient statistics (docs/algorithms.md §5): `y = φ(x)ᵀ(w + δ_k) + ε`, `w ~ N(0, λ²I)` shared,
`δ_k ~ N(0, τ²I)` personal. `τ → 0` is pooled FedBNR, `λ → 0` local-only learning; the server fits
`σ, λ, τ` by the exact evidence, so each client borrows as much strength as the data say the clients
resemble each other. One kernel (the first of the fleet's dictionary).

* :mod:`.client` / :mod:`.server` — the two halves; :mod:`.evidence` — the exact evidence, `σ, λ, τ` by
  type-II ML; :mod:`.mixture` — the `τ`-mixture of a fixed grid (both halves);
* :mod:`.learner` / :mod:`.aggregation` — the learner and aggregation of the plug-in contract;
* :mod:`.messages` — `HierUpload` / `HierGlobal`; :mod:`.wire` — their message kinds.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fedbnr-personal", n_inputs=2, n_features=3, kernels=["gaussian:1.0"])
>>> cfg.params.tau, cfg.feature_dim
(1.0, 7)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from streamfed.algorithms.base import Mode, ReplayVariant, params_of
from streamfed.algorithms.dictionary import kernel_specs
from streamfed.algorithms.fedbnr import FedBNR, RFFFeatures
from streamfed.algorithms.fedbnr_personal.server import EVIDENCE_SEARCH, REFIT_GROWTH

if TYPE_CHECKING:
    from streamfed.algorithms.calibration import CalibratedLearner
    from streamfed.algorithms.fedbnr_personal.aggregation import PersonalAggregation
    from streamfed.algorithms.fedbnr_personal.learner import PersonalLearner
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["ALGORITHM", "FedBNRPersonal", "PersonalParams"]


class PersonalParams(RFFFeatures):
    """Hyperparameters of personalised FedBNR (docs/algorithms.md §5): the kernel dictionary (it learns over the
    first kernel), initial `σ, λ, τ` (refitted by the evidence when `fit_hyperparameters`: at every global, or on
    the `refit_growth` schedule; `fit_tau=False` keeps `τ`), forgetting per time unit (one sample) on the shared and
    the own level, and the privacy floor.

    >>> PersonalParams(tau=0.5).tau
    0.5
    """

    sigma: float = Field(1.0, gt=0, allow_inf_nan=False)
    lam: float = Field(1.0, gt=0, allow_inf_nan=False)
    tau: float = Field(1.0, gt=0, allow_inf_nan=False)
    forgetting: float = Field(1.0, gt=0, le=1)
    own_forgetting: float | None = Field(None, gt=0, le=1)
    # forgetting on the fleet's one time base (docs/algorithms.md §5.3): a sample `Δ` seconds old by its reading's
    # time weighs 2^(−Δ/half_life_s) on both levels — instead of `forgetting` per sample, which counts time in each
    # client's own samples and so weighs a fast client's past less than a slow one's. None: off
    half_life_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    min_upload: int = Field(32, ge=1)
    fit_hyperparameters: bool = True
    fit_tau: bool = True
    # The evidence refit amortised (docs/algorithms.md §5.6): σ, λ, τ refitted at a global only once the samples
    # summed since the last fit reach this fraction of the samples it was fitted on (0: at every global; the first
    # fit always), by Newton steps on the exact evidence's gradient (`newton`, warm-started with the last fit's
    # curvature), L-BFGS-B on that gradient (`l-bfgs-b`) or Nelder-Mead on its values (`nelder-mead`)
    refit_growth: float = Field(REFIT_GROWTH, ge=0, allow_inf_nan=False)
    evidence_search: Literal["nelder-mead", "l-bfgs-b", "newton"] = EVIDENCE_SEARCH
    # scale the predictive variance by a conformal factor of the client's own prequential residuals
    # (streamfed.algorithms.calibration): the 95% interval covers ~95%; the mean and every upload are unchanged
    calibrate: bool = True
    # The prequential τ-mixture: one model per τ of this grid (σ, λ by the evidence at each), averaged per client
    # by their discounted prequential evidence on its own stream (docs/algorithms.md §5.7). None: one model, τ by
    # the evidence.
    tau_grid: tuple[float, ...] | None = None
    # Personalisation that never costs (docs/algorithms.md §5.9): predict with the fixed-share mixture of a
    # local-only, a pooled and the personalised expert (.experts); off, or with a tau_grid, the personalised
    # posterior alone. Client-side only: uploads and globals are the same either way.
    experts: bool = True
    switch_rate: float = Field(0.01, ge=0, lt=1)
    # the mixture's initial weights of (local, pooled, personal); None: uniform
    expert_prior: tuple[float, float, float] | None = None
    # evaluation only: every expert's prediction of every sample is kept (streamfed.evaluation.coldstart)
    trace_experts: bool = False

    @field_validator("expert_prior")
    @classmethod
    def _prior(cls, v: tuple[float, float, float] | None) -> tuple[float, float, float] | None:
        if v is not None and any(not (w > 0 and math.isfinite(w)) for w in v):
            raise ValueError("expert_prior: three positive finite weights")
        return v

    @model_validator(mode="after")
    def _one_clock(self) -> PersonalParams:
        if self.half_life_s is not None and (self.forgetting != 1.0 or self.own_forgetting is not None):
            raise ValueError("half_life_s (forgetting in seconds of the readings' time) replaces forgetting and "
                             "own_forgetting (per sample): set one or the other")
        return self

    def per_time_unit(self) -> tuple[float, float | None]:
        """`(forgetting, own_forgetting)` per unit of the clients' time: per second of the readings' time with
        `half_life_s`, else per sample.

        >>> round(PersonalParams(half_life_s=3600.0).per_time_unit()[0] ** 3600, 12)
        0.5
        """
        if self.half_life_s is None:
            return self.forgetting, self.own_forgetting
        g = 0.5 ** (1.0 / self.half_life_s)
        return g, g

    @field_validator("tau_grid")
    @classmethod
    def _grid(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and (not v or any(not (t > 0 and math.isfinite(t)) for t in v) or len(set(v)) != len(v)):
            raise ValueError("tau_grid: distinct positive finite values, at least one")
        return v


class FedBNRPersonal(FedBNR):
    """Personalised FedBNR: order-free, Bayesian, one kernel; FedBNR's feature map and demo settings."""

    name = "fedbnr-personal"
    title = "Personalised FedBNR (shared + personal weights, σ, λ, τ by the exact evidence)"
    Params = PersonalParams
    robust_by_default = False  # no robust aggregation of its own (shared + personal statistics)

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.fedbnr_personal.wire import schemas

        return schemas(cfg)

    def _client(self, cfg: FleetConfig, client_id: str = "client") -> Any:
        from streamfed.algorithms.fedbnr import feature_maps
        from streamfed.algorithms.fedbnr_personal.client import FedBNRHierClient
        from streamfed.algorithms.fedbnr_personal.experts import FedBNRExpertsClient
        from streamfed.algorithms.fedbnr_personal.mixture import FedBNRHierMixClient

        p = params_of(cfg, PersonalParams)
        forgetting, own_forgetting = p.per_time_unit()
        kw = dict(sigma=p.sigma, lam=p.lam, forgetting=forgetting, own_forgetting=own_forgetting,
                  min_upload=p.min_upload, client_id=client_id)
        if p.tau_grid:
            return FedBNRHierMixClient(p.tau_grid, feature_map=feature_maps(cfg)[0], **kw)
        if p.experts:
            return FedBNRExpertsClient(feature_maps(cfg)[0], tau=p.tau, switch_rate=p.switch_rate,
                                       prior=p.expert_prior, trace=p.trace_experts, **kw)
        return FedBNRHierClient(feature_maps(cfg)[0], tau=p.tau, **kw)

    def kernel_version(self, cfg: FleetConfig) -> str:
        return self._client(cfg).kernel_version

    def replay_variants(self) -> list[ReplayVariant]:
        # local-only personalised FedBNR is local-only FedBNR (one client: prior scale √(λ² + τ²))
        return [ReplayVariant(self.name, self.title)]

    def estimator(self, **params: Any) -> Any:
        """A fleet of one: with a single client the model is Bayesian linear regression with prior scale
        `√(λ² + τ²)` (λ and τ are not separately identifiable), i.e. FedBNR's River regressor."""
        from streamfed.algorithms.fedbnr.estimator import FedBNRRegressor

        lam, tau = float(params.pop("lam", 1.0)), float(params.pop("tau", 1.0))
        return FedBNRRegressor(lam=math.hypot(lam, tau), **params)

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async"
                ) -> PersonalLearner | CalibratedLearner:
        from streamfed.algorithms.calibration import CalibratedLearner
        from streamfed.algorithms.fedbnr_personal.learner import PersonalLearner

        if mode == "lockstep":
            raise ValueError("personalised FedBNR is order-free (use async)")
        p = params_of(cfg, PersonalParams)
        learner = PersonalLearner(self._client(cfg, client_id), kernel_names=kernel_specs(cfg)[:1],
                                  timed=p.half_life_s is not None)
        return CalibratedLearner(learner) if p.calibrate else learner

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True
                    ) -> PersonalAggregation:
        from streamfed.algorithms.fedbnr_personal.aggregation import PersonalAggregation
        from streamfed.algorithms.fedbnr_personal.mixture import FedBNRHierMixServer
        from streamfed.algorithms.fedbnr_personal.server import FedBNRHierServer

        probe = self._client(cfg)
        probe = getattr(probe, "personal", probe)  # the experts' mixture: the fleet sees its personal expert
        p = params_of(cfg, PersonalParams)
        if p.tau_grid:
            phi = probe.models[0].features_many(np.zeros((1, cfg.n_inputs)))
            server: Any = FedBNRHierMixServer.for_client(probe, fit_hyperparameters=p.fit_hyperparameters,
                                                         refit_growth=p.refit_growth, search=p.evidence_search)
        else:
            phi = probe.features_many(np.zeros((1, cfg.n_inputs)))
            server = FedBNRHierServer.for_client(probe, fit_hyperparameters=p.fit_hyperparameters, fit_tau=p.fit_tau,
                                                 refit_growth=p.refit_growth, search=p.evidence_search)
        phi_sq = float(np.sum(phi**2))  # RFF features with a bias: the same norm for every input
        return PersonalAggregation(server, phi_sq=phi_sq, max_abs=max_abs, check_stats=check_stats,
                                   label_bound=cfg.robust.label_bound, phi_sq_min=phi_sq,
                                   clock_time=p.half_life_s is not None)


ALGORITHM = FedBNRPersonal()
