"""FedBNR over a dictionary of half-lives, mixed by fixed share (docs/algorithms.md §4.15): forgetting chosen by
the data, not by the user.

How fast a stream drifts decides the right half-life (on 12 Beijing stations 24 h beat no forgetting by 22% of
MAE, 3 h lost 30%: benchmarks/results/drift.md), and it is not known in advance. This family runs `J` ordinary
FedBNR fleets side by side, one per half-life of `half_lives_s` (`None`: no forgetting), each on the fleet's
one time base (§4.14) and each federated exactly: a component's global is the centralised discounted statistics
of its half-life. Every agent predicts with the prequential fixed-share mixture of its `J` components'
predictives (:mod:`.client`), so its log loss stays within `log J + T·log(1/(1 − α))` of the best single
half-life's — and within `m·log(J/α)` more of the best sequence of half-lives with `m` switches.

* :mod:`.client` — the mixture (`HalfLifeMixture`) and the component settings (`component_params`);
* :mod:`.server` — `HalfLifeServer`, one `FedBNRServer` per half-life;
* :mod:`.learner` — `HalfLifeLearner`, one FedBNR `StatsLearner` per half-life and the mixture;
* :mod:`.aggregation` — `HalfLifeAggregation`, one `FedBNRAggregation` per half-life (every check per component);
* :mod:`.wire` — the stacked message kinds and their split into FedBNR's.

>>> from streamfed.fleet.config import FleetConfig
>>> cfg = FleetConfig(fleet="f", algorithm="fedbnr-halflives", n_inputs=2, n_features=3, kernels=["gaussian:1.0"])
>>> cfg.params.half_lives_s, cfg.feature_dim
((None, 604800.0, 86400.0, 10800.0), 7)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from pydantic import Field, field_validator, model_validator

from streamfed.algorithms.base import Aggregation, Algorithm, Learner, Mode, params_of
from streamfed.algorithms.fedbnr import ALGORITHM as FEDBNR
from streamfed.algorithms.fedbnr import FedBNRParams

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig
    from streamfed.wire.schema import MessageSchema

__all__ = ["ALGORITHM", "FedBNRHalfLives", "HalfLivesParams", "MAX_HALF_LIVES"]

MAX_HALF_LIVES = 8  # each half-life is a whole FedBNR fleet: uploads grow J-fold


def _as_half_life(v: Any) -> float | None:
    """A half-life as configured: seconds, or no forgetting (`None`, `inf` or the text "none")."""
    if v is None or (isinstance(v, str) and v.strip().lower() in ("none", "inf", "infinity")):
        return None
    try:
        if isinstance(v, bool):
            raise TypeError
        h = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"a half-life is a number of seconds or none, got {v!r}") from None
    if math.isinf(h) and h > 0:
        return None
    if not (math.isfinite(h) and h > 0):
        raise ValueError(f"half-lives must be > 0 seconds (or none), got {v!r}")
    return h


class HalfLivesParams(FedBNRParams):
    """FedBNR's settings, with a dictionary of half-lives `half_lives_s` (seconds of the readings' clock; `None` —
    in a file `"none"` or `inf` — is no forgetting) in place of one `half_life_s`, and fixed share's `switch_rate`.

    >>> HalfLivesParams(half_lives_s=["none", 3600]).half_lives_s
    (None, 3600.0)
    >>> try:
    ...     HalfLivesParams(half_lives_s=[3600, 3600.0])
    ... except ValueError as e:
    ...     print(e.errors()[0]["msg"])
    Value error, half-lives are repeated: [3600.0, 3600.0]
    """

    # none, a week, a day, three hours: on 8 Beijing stations this dictionary beat every one of its half-lives
    # alone (benchmarks/results/drift_mixture.md), 3 h included though it is worse than none by itself
    half_lives_s: tuple[float | None, ...] = (None, 7 * 86400.0, 86400.0, 3 * 3600.0)
    # fixed share's α: every weight stays ≥ α/J, so a half-life that lost for a while can lead again
    switch_rate: float = Field(0.01, ge=0, lt=1, allow_inf_nan=False)

    @field_validator("half_lives_s", mode="before")
    @classmethod
    def _half_lives(cls, v: Any) -> tuple[float | None, ...]:
        if isinstance(v, str | bytes) or not isinstance(v, Sequence):
            raise ValueError(f"half_lives_s is a list of half-lives in seconds (or none), got {v!r}")
        hs = tuple(_as_half_life(h) for h in v)
        if not 1 <= len(hs) <= MAX_HALF_LIVES:
            raise ValueError(f"half_lives_s needs 1 to {MAX_HALF_LIVES} half-lives, got {len(hs)}")
        if len(set(hs)) != len(hs):
            raise ValueError(f"half-lives are repeated: {list(hs)}")
        return hs

    @model_validator(mode="after")
    def _one_dictionary(self) -> HalfLivesParams:
        if self.half_life_s is not None or self.forgetting != 1.0:
            raise ValueError("fedbnr-halflives forgets by its half_lives_s: half_life_s and forgetting are FedBNR's "
                             "single choice, leave them unset")
        return self

    def components(self) -> tuple[FedBNRParams, ...]:
        """One FedBNR configuration per half-life: these settings with that `half_life_s`, uncalibrated (the
        mixture's predictive is calibrated as a whole)."""
        base = self.model_dump(exclude={"half_lives_s", "switch_rate", "half_life_s", "calibrate", "forgetting"})
        return tuple(FedBNRParams(**base, half_life_s=h, calibrate=False) for h in self.half_lives_s)


def component_fleets(cfg: FleetConfig) -> tuple[FleetConfig, ...]:
    """The fleet configuration as each component sees it: the same fleet with one half-life's FedBNR settings."""
    return tuple(cfg.model_copy(update={"params": p}) for p in params_of(cfg, HalfLivesParams).components())


class FedBNRHalfLives(Algorithm):
    """FedBNR over a dictionary of half-lives mixed by fixed share (module docstring): order-free, Bayesian."""

    name = "fedbnr-halflives"
    title = "FedBNR over a dictionary of half-lives, mixed by fixed share (forgetting chosen by the data)"
    Params = HalfLivesParams
    bayesian = True
    cheap_regret = False  # as FedBNR's, once per component
    robust_by_default = True  # every component is an ordinary FedBNR aggregation, robust rules included

    def feature_dim(self, cfg: FleetConfig) -> int:
        return FEDBNR.feature_dim(cfg)  # FedBNR's features: the same for every half-life

    def schemas(self, cfg: FleetConfig) -> list[MessageSchema]:
        from streamfed.algorithms.fedbnr_halflives.wire import schemas

        return schemas(cfg)

    def kernel_version(self, cfg: FleetConfig) -> str:
        return FEDBNR.kernel_version(component_fleets(cfg)[0])  # one feature map for every half-life

    def learner(self, cfg: FleetConfig, client_id: str, index: int, mode: Mode = "async") -> Learner:
        from streamfed.algorithms.calibration import CalibratedLearner
        from streamfed.algorithms.fedbnr_halflives.learner import HalfLifeLearner

        if mode == "lockstep":
            raise ValueError("lock-step mode is POF-MKL's protocol; FedBNR is order-free (use async)")
        p = params_of(cfg, HalfLivesParams)
        parts = [FEDBNR.learner(c, client_id, index, mode) for c in component_fleets(cfg)]
        learner = HalfLifeLearner(parts, p.half_lives_s, switch_rate=p.switch_rate)  # type: ignore[arg-type]
        # (cast: the contract's Protocol declares as instance members what BaseLearner declares on the class)
        return cast("Learner", CalibratedLearner(cast("Learner", learner)) if p.calibrate else learner)

    def aggregation(self, cfg: FleetConfig, *, max_abs: float = 1e100, check_stats: bool = True) -> Aggregation:
        from streamfed.algorithms.fedbnr_halflives.aggregation import HalfLifeAggregation

        parts = [FEDBNR.aggregation(c, max_abs=max_abs, check_stats=check_stats) for c in component_fleets(cfg)]
        return cast("Aggregation", HalfLifeAggregation(parts, params_of(cfg, HalfLivesParams).half_lives_s))

    def estimator(self, **params: Any) -> Any:
        raise NotImplementedError("fedbnr-halflives has no River estimator (a River stream has no shared clock)")


ALGORITHM = FedBNRHalfLives()
