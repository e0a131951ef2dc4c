"""PVI for federated sparse GPs: inducing inputs as an auxiliary variable (HVM) with decoupled
pseudo-observations (DPO), asynchronous and streaming (docs/algorithms.md §7).

Each client's factor `t_k(u | Z, β)` is a small set of pseudo-observations (DPO `V_k, m_k, s_k`; or CPO,
`t_k(u) = N(u; m_k, s_k)`), and `Z` (``inducing="hvm"``) gets its own fully factorised Gaussian factors
`t_k(Z)`; the server keeps `q ∝ p · Π_k t_k` as every client's newest factor. FedAvg on `Z` (the paper's
Algorithm 1) and a fixed `Z` run in the same code. Kernel hyperparameters `β` are a configured point, or
(``learn_beta``) random with factors `t_k(β)` like `Z`.

* :mod:`.factors`, :mod:`.state` (the global `q`), :mod:`.posterior` (`q(u | Z, β)`), :mod:`.predictive`,
  :mod:`.likelihoods` (Gaussian, Bernoulli) — NumPy;
* :mod:`.free_energy` (the local free energy), :mod:`.refine` (a client's Adam step) — torch, imported
  on a client's first refinement only;
* :mod:`.client` / :mod:`.server` — the two halves; :mod:`.learner`, :mod:`.aggregation`, :mod:`.wire` —
  the plug-in contract; :mod:`.estimator` — River.

>>> import numpy as np
>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="pvi", n_inputs=2, params={"n_inducing": 4, "n_pseudo": 4})
>>> learner = ALGORITHM.learner(cfg, "a1", 0)
>>> mean, var = learner.predict(np.zeros(2))
>>> mean, round(var, 12)  # the prior: a² + σ²
(0.0, 1.25)
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from streamfed.algorithms.base import Algorithm, Mode, Params, ReplayVariant, params_of
from streamfed.core.durable import durable

if TYPE_CHECKING:
    from streamfed.algorithms.pvi.aggregation import PVIAggregation
    from streamfed.algorithms.pvi.learner import PVILearner
    from streamfed.algorithms.pvi.settings import RefineSettings
    from streamfed.algorithms.pvi.state import GlobalQ
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["ALGORITHM", "PVI", "PVIParams", "initial_state", "initial_state_of", "refine_settings"]


@durable("pvi.PVIParams")
class PVIParams(Params):
    """PVI's settings (docs/algorithms.md, "PVI").

    >>> PVIParams(n_inducing=8, parameterisation="cpo").n_inducing
    8
    >>> PVIParams(damping=0.5)
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for PVIParams
      Value error, a power of a DPO factor is not a DPO factor of the same size: DPO needs damping = 1 ...
    """

    kernel: Literal["se", "matern32", "matern52"] = "se"
    likelihood: Literal["gaussian", "bernoulli"] = "gaussian"
    parameterisation: Literal["dpo", "cpo"] = "dpo"
    inducing: Literal["hvm", "fedavg", "fixed"] = "hvm"
    learn_beta: bool = False  # β a configured point (False) or random with factors t_k(β)
    n_inducing: int = Field(32, ge=1, le=512)  # M
    n_pseudo: int = Field(32, ge=1, le=2048)  # M_k (DPO; CPO has M)
    amplitude: float = Field(1.0, gt=0, allow_inf_nan=False)
    lengthscale: float | None = Field(None, gt=0, allow_inf_nan=False)  # None: √(2d), as FSGP
    sigma: float = Field(0.5, gt=0, allow_inf_nan=False)
    inducing_scale: float = Field(1.0, gt=0, allow_inf_nan=False)  # initial Z ~ quasi-random N(0, scale² I)
    alpha: float = Field(0.1, ge=0, le=1)  # the KL on Z is scaled by α (the paper: 0.1)
    damping: float = Field(1.0, gt=0, le=1)  # ρ
    asynchronous: bool = True  # apply each factor as it arrives (else at the window's end)
    reservoir: int = Field(256, ge=2)
    refine_every: int = Field(64, ge=1)  # R: samples between refinements
    streaming: bool = True  # absorb each sample into the local factor between refinements (.streaming)
    calibrate: bool = True  # Gaussian: scale the predictive variance by a conformal factor (.calibration)
    steps: int = Field(30, ge=1)  # Adam steps per refinement
    learning_rate: float = Field(0.01, gt=0, allow_inf_nan=False)
    mc_samples: int = Field(1, ge=1, le=64)  # draws of φ per Adam step
    predict_draws: int = Field(8, ge=0, le=256)  # draws of φ in the predictive mixture (0: its mean)
    jitter: float = Field(1e-6, gt=0, le=1e-2)
    max_factors: int = Field(64, ge=1, le=4096)  # clients whose factors one global carries
    # robust aggregation ([fleet.robust] aggregation = "robust"): samples whose information any client's factor
    # may carry whatever the others hold (the cold start); None: 4 × refine_every
    robust_floor: float | None = Field(None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _dpo_undamped(self) -> PVIParams:
        if self.parameterisation == "dpo" and self.damping < 1.0:
            raise ValueError("a power of a DPO factor is not a DPO factor of the same size: DPO needs damping = 1 "
                             "(the paper runs undamped); damping applies to CPO")
        return self


def initial_state(cfg: FleetConfig) -> GlobalQ:
    """Version 0: no factors, the data-free design of `Z` (FSGP's, fleet seed) and the configured `β`."""
    return initial_state_of(params_of(cfg, PVIParams), cfg.n_inputs, cfg.seed)


def initial_state_of(p: PVIParams, d: int, seed: int) -> GlobalQ:
    """:func:`initial_state` from the parameters, the number of inputs and the seed (no fleet needed: the River
    estimator builds its model from these)."""
    import numpy as np

    from streamfed.algorithms.fsgp.design import gaussian_design
    from streamfed.algorithms.pvi.state import GlobalQ

    Z = gaussian_design(p.n_inducing, d, seed=seed, scale=p.inducing_scale)
    ls = p.lengthscale if p.lengthscale is not None else math.sqrt(2.0 * d)
    beta = np.concatenate(([math.log(p.amplitude)], np.full(d, math.log(ls)), [math.log(p.sigma)]))
    return GlobalQ.initial(p.kernel, Z, beta, p.inducing, p.learn_beta)


class PVI(Algorithm):
    """PVI for sparse GPs: order-free, Bayesian (predictions carry a variance).

    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pvi", n_inputs=1, params={"n_inducing": 2, "n_pseudo": 3})
    >>> ALGORITHM.bayesian, ALGORITHM.lockstep, ALGORITHM.kernel_version(cfg).startswith("pvi-se-hvm-dpo-m2-d1")
    (True, False, True)
    """

    name = "pvi"
    title = "PVI sparse GP (HVM on Z, decoupled pseudo-observations, asynchronous)"
    Params = PVIParams
    bayesian = True
    cheap_regret = False

    def feature_dim(self, cfg: FleetConfig) -> int:
        return int(params_of(cfg, PVIParams).n_inducing)

    def task_of(self, cfg: FleetConfig) -> Literal["regression", "classification"]:
        """A Bernoulli likelihood's target is a class label, 0 or 1 (its predictive mean is `P(y = 1)`)."""
        return "classification" if params_of(cfg, PVIParams).likelihood == "bernoulli" else "regression"

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.pvi.wire import schemas

        return schemas(cfg)

    def kernel_version(self, cfg: FleetConfig) -> str:
        g = initial_state(cfg)
        p = params_of(cfg, PVIParams)
        digest = hashlib.sha256(repr(p.model_dump()).encode())
        digest.update(g.Z.tobytes())
        digest.update(g.beta.tobytes())
        return f"pvi-{p.kernel}-{p.inducing}-{p.parameterisation}-m{g.m}-d{g.d}-{digest.hexdigest()[:12]}"

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async") -> PVILearner:
        from streamfed.algorithms.pvi.client import PVIClient
        from streamfed.algorithms.pvi.learner import PVILearner

        if mode == "lockstep":
            raise ValueError("PVI is order-free (use async)")
        p = params_of(cfg, PVIParams)
        return PVILearner(PVIClient(initial_state(cfg), refine_settings(p), client_id=client_id,
                                    reservoir=p.reservoir, refine_every=p.refine_every,
                                    predict_draws=p.predict_draws, seed=cfg.seed, jitter=p.jitter,
                                    streaming=p.streaming, calibrate=p.calibrate))

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True) -> PVIAggregation:
        from streamfed.algorithms.pvi.aggregation import PVIAggregation, RobustPVI
        from streamfed.algorithms.pvi.server import PVIServer

        p = params_of(cfg, PVIParams)
        server = PVIServer(initial_state(cfg), n_pseudo=p.n_pseudo, parameterisation=p.parameterisation,
                           damping=p.damping, asynchronous=p.asynchronous, max_factors=p.max_factors,
                           max_abs=max_abs)
        robust = None
        if cfg.robust.aggregation == "robust":
            # the cold-start floor: the information of robust_floor exact samples at the configured a, σ
            floor = p.robust_floor if p.robust_floor is not None else 4 * p.refine_every
            robust = RobustPVI(cfg.robust.share_cap, float(floor) * p.amplitude ** 2 / p.sigma ** 2)
        return PVIAggregation(server, p, robust)

    def replay_variants(self) -> list[ReplayVariant]:
        return [ReplayVariant(self.name, self.title)]

    def estimator(self, **params: Any) -> Any:
        from streamfed.algorithms.pvi.estimator import PVIRegressor

        return PVIRegressor(**params)

    def demo_settings(self) -> dict[str, Any]:
        return {"params": {"n_inducing": 16, "n_pseudo": 16, "refine_every": 64}}


def refine_settings(p: PVIParams) -> RefineSettings:
    """The :class:`~.settings.RefineSettings` of parameters `p` (no torch needed)."""
    from streamfed.algorithms.pvi.settings import RefineSettings

    return RefineSettings(likelihood=p.likelihood, parameterisation=p.parameterisation, n_pseudo=p.n_pseudo,
                          steps=p.steps, learning_rate=p.learning_rate, n_samples=p.mc_samples, alpha=p.alpha,
                          jitter=p.jitter)


ALGORITHM = PVI()
