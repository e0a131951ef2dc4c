"""How far one member can move a fleet: the `[fleet.robust]` section of a fleet's configuration.

Two layers (docs/reliability.md § Bounded influence):

* **Bounds, always on.** An agent clips every label to `±label_bound` in the learner's units (standardised
  when the agent standardises: the learned robust range is the running mean ± `label_bound` running
  standard deviations) and counts what it clipped. Each algorithm's aggregation derives from the
  configuration the largest update an honest client can produce, and refuses anything beyond it with a
  reason. The aggregator holds each client to `max_sample_rate` samples and `max_upload_rate` uploads per
  second on average (token buckets `sample_burst` / `upload_burst` deep); an upload over the rate is
  refused as `rate_limited` and, since an honest agent keeps it in its outbox, sent again later — a
  backlog is slowed, never lost.
* **Robust aggregation, a fleet option.** `aggregation = "exact"` (for trusted fleets) keeps
  every published global equal to the centralised / reference one; the bounds above then cap the damage of a
  hostile member, they do not remove it. `"robust"` gives that equality up: gradient-like updates (POF-MKL,
  the network proposals of URK-FedBNR and pFedGP) are combined by a coordinate-wise trimmed mean (`trim` off
  each side; 0.5 is the median) after clipping each client's update to `clip_factor` × the round's median
  norm; summed statistics (FedBNR, FSGP) cap each client's share of the samples in the global at `fair_share`
  (1.5) times a fair share (or a fixed `share_cap`), screen each upload's residuals under the current global and
  down-weight a member whose residuals stay far from the fleet's (the algorithm's own settings). `"auto"` (the
  default) is robust on a production (authenticated) broker for the families whose robust rule costs nothing
  without attackers, exact otherwise (streamfed.fleet.aggregation_mode); whatever it resolves to, the
  aggregator's start-up line says, and what it trusts.

>>> r = Robustness()
>>> r.aggregation, r.label_bound, r.max_sample_rate
('auto', 10.0, 1000.0)
>>> Robustness(aggregation="robust", trim=0.5).trim
0.5
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Robustness"]


class Robustness(BaseModel):
    """A fleet's bounds on one member's influence, and whether it aggregates robustly (module docstring).

    >>> Robustness(label_bound=4.0).label_bound
    4.0
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Labels, in the learner's units. 10 standard deviations clips 4e-5 of the Beijing PM/CO targets.
    label_bound: float = Field(10.0, gt=0, allow_inf_nan=False)
    # The readings per second a member's sensor delivers, declared by the fleet. When given, the four rate
    # settings below that are not set follow from it (:meth:`_from_sensor_rate`): twice the declared rate, a
    # burst of ten minutes of it. Not declared: the generic limits below, and the aggregator's start-up line says so.
    sensor_rate: float | None = Field(None, gt=0, allow_inf_nan=False)
    # Per client, on average over time (token buckets): generous for a sensor, tight for a flood.
    max_sample_rate: float = Field(1000.0, gt=0, allow_inf_nan=False)
    sample_burst: float = Field(100_000.0, ge=1, allow_inf_nan=False)  # a backlog a client may send at once
    max_upload_rate: float = Field(200.0, gt=0, allow_inf_nan=False)
    upload_burst: float = Field(2_000.0, ge=1, allow_inf_nan=False)
    aggregation: Literal["auto", "exact", "robust"] = "auto"
    # robust, gradient-like updates: fraction trimmed off each side per coordinate (0.5 = median), and each
    # client's update clipped to clip_factor × the median of the round's update norms
    trim: float = Field(0.25, ge=0.0, le=0.5)
    clip_factor: float = Field(2.0, ge=1.0, allow_inf_nan=False)
    # robust, summed statistics: each member's share of the global's samples at most fair_share / (members heard
    # from) — 1.5 times a fair share, room for unequal rates — or, with fair_share = None, the fixed share_cap
    fair_share: float | None = Field(1.5, ge=1.0, allow_inf_nan=False)
    share_cap: float = Field(0.25, gt=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _from_sensor_rate(cls, data: Any) -> Any:
        """Rate limits from a declared `sensor_rate` r: samples and uploads at most 2r per second on average
        (an honest agent never uploads more than it reads; twice leaves a reconnecting agent room to drain its
        backlog), bursts of `max(600 r, 256)` (ten minutes of readings, at least one large upload). A limit set
        explicitly is kept.

        >>> r = Robustness(sensor_rate=1.0)
        >>> r.max_sample_rate, r.sample_burst, r.max_upload_rate, r.upload_burst
        (2.0, 600.0, 2.0, 600.0)
        >>> Robustness(sensor_rate=0.1, max_sample_rate=5.0).max_sample_rate
        5.0
        """
        if not isinstance(data, dict) or data.get("sensor_rate") is None:
            return data
        rate = float(data["sensor_rate"])
        if not (math.isfinite(rate) and rate > 0):
            return data  # the field's own validation says what is wrong
        burst = max(600.0 * rate, 256.0)
        derived = {"max_sample_rate": 2.0 * rate, "sample_burst": burst, "max_upload_rate": 2.0 * rate,
                   "upload_burst": burst}
        return {**derived, **data}

    @property
    def rates_declared(self) -> bool:
        """Whether the rate limits follow from a declared sensor rate (or were all set explicitly)."""
        return self.sensor_rate is not None or bool(
            {"max_sample_rate", "sample_burst", "max_upload_rate", "upload_burst"} & self.model_fields_set)
