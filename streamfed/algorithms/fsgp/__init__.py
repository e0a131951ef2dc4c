"""FSGP — the federated sparse Gaussian process, streaming form (docs/algorithms.md, "FSGP").

Clients keep the additive statistics `Σ c(Z, x) c(x, Z)`, `Σ c(Z, x) y` of their samples under `M` shared
inducing inputs; their sums give exactly the centralised variational sparse-GP predictive. The covariance
(`θ`), the noise (`σ`) and `Z` are learned by FedAvg of local fits of Titsias' bound on bounded reservoirs,
versioned (the envelope's `epoch`); a new version carries every statistic over by the projection of Bui,
Nguyen & Turner (2017).

* :mod:`.kernels` (covariances, `Hyper`), :mod:`.design` (data-free initial `Z`), :mod:`.posterior`
  (statistics, predictive), :mod:`.elbo` (bound, gradient, local fit), :mod:`.projection`;
* :mod:`.client` / :mod:`.server` — the two halves; :mod:`.messages` — what they exchange;
* :mod:`.learner`, :mod:`.aggregation`, :mod:`.wire` — the plug-in contract; :mod:`.estimator` — River.

>>> import numpy as np
>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2, params={"n_inducing": 4})
>>> learner = ALGORITHM.learner(cfg, "a1", 0)
>>> mean, var = learner.predict(np.zeros(2))
>>> mean, round(var, 12)
(0.0, 1.25)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from streamfed.algorithms.base import Algorithm, Mode, Params, ReplayVariant, params_of

if TYPE_CHECKING:
    from streamfed.algorithms.calibration import CalibratedLearner
    from streamfed.algorithms.fsgp.aggregation import FSGPAggregation
    from streamfed.algorithms.fsgp.kernels import Hyper
    from streamfed.algorithms.fsgp.learner import FSGPLearner
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["ALGORITHM", "FSGP", "FSGPParams", "initial_hyper", "inducing_box"]


class FSGPParams(Params):
    """FSGP's settings (docs/algorithms.md, "FSGP"): the covariance, `M`, the initial `θ, σ` and design of
    `Z`, the privacy floor, and how hyperparameters are learned.

    >>> FSGPParams(n_inducing=8).n_inducing
    8
    """

    kernel: Literal["se", "matern32", "matern52"] = "se"
    # M; 32 kept by issue 34: no M in 32–256 makes the fleet's posterior beat local-only on Beijing, the
    # personalised predictive (`personal`) does at 32 (docs/results.md)
    n_inducing: int = Field(32, ge=1, le=1024)
    amplitude: float = Field(1.0, gt=0, allow_inf_nan=False)  # initial a
    # initial ℓ_d, every input; None: √(2d), the scale of distances between standardised inputs (as the
    # kernel dictionaries of streamed fleets, KernelDictionary.kernel_specs)
    lengthscale: float | None = Field(None, gt=0, allow_inf_nan=False)
    sigma: float = Field(0.5, gt=0, allow_inf_nan=False)  # initial noise σ
    inducing_scale: float = Field(1.0, gt=0, allow_inf_nan=False)  # initial Z ~ quasi-random N(0, scale²I)
    jitter: float = Field(1e-6, gt=0, le=1e-2)  # ε: C = c(Z, Z) + ε a² I
    min_upload: int = Field(32, ge=1)  # privacy floor: never publish statistics of fewer samples
    learn_hyperparameters: bool = True
    # scale the predictive variance by a conformal factor of the client's own prequential residuals
    # (streamfed.algorithms.calibration): the 95% interval covers ~95%; the mean and every upload are unchanged
    calibrate: bool = True
    # personalise (issue 34): predict with the fixed-share mixture of the fleet's posterior and the posterior of
    # the client's own samples alone (both under the fleet's θ, σ, Z); uploads and globals are unchanged
    personal: bool = True
    switch_rate: float = Field(0.01, ge=0.0, lt=1.0)  # fixed share's α between the two experts
    reservoir: int = Field(256, ge=2)  # raw samples a client keeps for its local fit (never uploaded)
    fit_every: int = Field(128, ge=1)  # samples before the first local fit, and between the first two
    # the interval between local fits doubles from fit_every up to this (fits at 128, 384, 896, 1920, 2944, …):
    # hyperparameters learn fast early, and a long stream pays for a fit every 1024 samples (issue 34's cost bound)
    fit_every_max: int = Field(1024, ge=1)
    fit_steps: int = Field(10, ge=1)  # Adam steps per local fit
    learning_rate: float = Field(0.05, gt=0, allow_inf_nan=False)
    min_proposal_weight: float = Field(256.0, gt=0)  # server: a new version needs proposals of this many samples
    proposal_quorum: float = Field(0.5, gt=0, le=1)  # ... from this share of the clients heard since the last one
    # declared bound on proposed inducing inputs, ±box per coordinate (local fits clip to it, the aggregator
    # refuses beyond); None: 2 × INPUT_CLIP = 10 when agents standardise (inputs winsorised at ±5), no box
    # otherwise. Widened to hold the initial design.
    inducing_box: float | None = Field(None, gt=0, allow_inf_nan=False)
    # robust aggregation ([fleet.robust] aggregation = "robust", docs/algorithms.md §6.13, §10.2): residual screening at
    # robust_screen × the median client, after robust_screen_clients others; the cold-start floor of samples any
    # client may hold (None: min_upload, one upload)
    robust_screen: float = Field(50.0, gt=1.0, allow_inf_nan=False)
    robust_screen_clients: int = Field(3, ge=1)
    robust_share_floor: float | None = Field(None, gt=0, allow_inf_nan=False)
    # robust mode's soft screen (algorithms/shares.py, as FedBNR's): a client whose average residual ratio is over
    # robust_soft × the others' median has its uploads down-weighted; 0 (the default) turns it off — at 1.0 the
    # attack-free Beijing fleet's MSE rose 18%, at 4.0 12% (docs/reliability.md §7.2.1), unlike FedBNR's
    robust_soft: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    # forgetting on the fleet's time base (docs/algorithms.md, FSGP "Forgetting"): a sample observed at time t
    # (the readings' timestamps, else the agents' clocks) weighs 2^(−Δ/half_life_s) in everything a client holds,
    # its uploads and the globals, exactly as FedBNR's; None: off
    half_life_s: float | None = Field(None, gt=0, allow_inf_nan=False)


def initial_hyper(cfg: FleetConfig) -> Hyper:
    """Version 0: the configured `a, ℓ, σ` and the data-free Gaussian design of `Z` (fleet seed)."""
    from streamfed.algorithms.fsgp.design import gaussian_design
    from streamfed.algorithms.fsgp.kernels import Hyper

    p = params_of(cfg, FSGPParams)
    Z = gaussian_design(p.n_inducing, cfg.n_inputs, seed=cfg.seed, scale=p.inducing_scale)
    ls = p.lengthscale if p.lengthscale is not None else math.sqrt(2.0 * cfg.n_inputs)
    return Hyper.initial(p.kernel, Z, amplitude=p.amplitude, lengthscale=ls, sigma=p.sigma)


def inducing_box(cfg: FleetConfig) -> float | None:
    """The declared box of the inducing inputs, `±box` per coordinate (`FSGPParams.inducing_box`), widened to
    hold the initial design; None: unbounded (agents that do not standardise, no box configured).

    >>> from streamfed.fleet.config import FleetConfig
    >>> inducing_box(FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2))
    10.0
    """
    import numpy as np

    from streamfed.core.standardise import INPUT_CLIP

    p = params_of(cfg, FSGPParams)
    box = p.inducing_box if p.inducing_box is not None else (
        2.0 * INPUT_CLIP if cfg.standardise == "online" else None)
    if box is None:
        return None
    return max(float(box), float(np.max(np.abs(initial_hyper(cfg).Z))))


def _check_time_base(cfg: FleetConfig, p: FSGPParams) -> None:
    # a masked sum adds its members' arrays, times included: statistics held at different times cannot be summed so
    if p.half_life_s is not None and cfg.secure_aggregation:
        raise ValueError("FSGP's half_life_s and secure aggregation are exclusive: a masked sum cannot bring its "
                         "members' statistics to one time")


class FSGP(Algorithm):
    """FSGP: order-free (no lock-step), Bayesian (predictions carry a variance)."""

    name = "fsgp"
    title = "FSGP (federated sparse GP: exact summed statistics, FedAvg-learned θ, σ, Z, Bui projection)"
    Params = FSGPParams
    bayesian = True
    cheap_regret = False  # O(M³): read per upload
    # share caps and the hard screen: +0.3% MSE without attackers since the personalised predictive (reliability.md)
    robust_by_default = True

    def feature_dim(self, cfg: FleetConfig) -> int:
        return int(params_of(cfg, FSGPParams).n_inducing)

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.fsgp.wire import schemas

        return schemas(cfg)

    def kernel_version(self, cfg: FleetConfig) -> str:
        h = initial_hyper(cfg)
        return f"fsgp-{h.kind}-m{h.m}-d{h.d}-{h.fingerprint()}"

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async"
                ) -> FSGPLearner | CalibratedLearner:
        from streamfed.algorithms.calibration import CalibratedLearner
        from streamfed.algorithms.fsgp.client import FSGPClient
        from streamfed.algorithms.fsgp.learner import FSGPLearner

        if mode == "lockstep":
            raise ValueError("FSGP is order-free (use async)")
        p = params_of(cfg, FSGPParams)
        _check_time_base(cfg, p)
        learner = FSGPLearner(FSGPClient(
            initial_hyper(cfg), jitter=p.jitter, min_upload=p.min_upload, client_id=client_id,
            learn_hyperparameters=p.learn_hyperparameters, reservoir=p.reservoir, fit_every=p.fit_every,
            fit_every_max=p.fit_every_max,
            fit_steps=p.fit_steps, learning_rate=p.learning_rate, seed=cfg.seed,
            label_bound=cfg.robust.label_bound, z_box=inducing_box(cfg), personal=p.personal,
            switch_rate=p.switch_rate, half_life_s=p.half_life_s))
        return CalibratedLearner(learner) if p.calibrate else learner

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True
                    ) -> FSGPAggregation:
        from streamfed.algorithms.fsgp.aggregation import FSGPAggregation
        from streamfed.algorithms.fsgp.server import FSGPServer, RobustFSGPServer
        from streamfed.algorithms.shares import Robust

        p, r = params_of(cfg, FSGPParams), cfg.robust
        _check_time_base(cfg, p)
        robust = Robust.of(r, p)
        server = (RobustFSGPServer if robust else FSGPServer)(
            initial_hyper(cfg), jitter=p.jitter, min_samples=p.min_upload,
            learn_hyperparameters=p.learn_hyperparameters, min_proposal_weight=p.min_proposal_weight,
            proposal_quorum=p.proposal_quorum, half_life_s=p.half_life_s)
        return FSGPAggregation(server, max_abs=max_abs, check_stats=check_stats, label_bound=r.label_bound,
                               max_weight=float(p.reservoir), z_box=inducing_box(cfg), robust=robust,
                               roster=len(cfg.clients) if cfg.clients else None)

    def replay_variants(self) -> list[ReplayVariant]:
        return [ReplayVariant(self.name, self.title),
                ReplayVariant("fsgp-local", "FSGP without federation (each client its own server)", "local")]

    def estimator(self, **params: Any) -> Any:
        from streamfed.algorithms.fsgp.estimator import FSGPRegressor

        return FSGPRegressor(**params)

    def demo_settings(self) -> dict[str, Any]:
        return {"params": {"n_inducing": 16, "min_upload": 32}}


ALGORITHM = FSGP()
