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
* **Robust aggregation, a fleet option.** `aggregation = "exact"` (the default, for trusted fleets) keeps
  every published global equal to the centralised / reference one; the bounds above then cap the damage of a
  hostile member, they do not remove it. `"robust"` gives that equality up: gradient-like updates (POF-MKL,
  the network proposals of URK-FedBNR and pFedGP) are combined by a coordinate-wise trimmed mean (`trim` off
  each side; 0.5 is the median) after clipping each client's update to `clip_factor` × the round's median
  norm; summed statistics (FedBNR, FSGP) cap each client's share of the samples in the global at `share_cap`
  and screen each upload's residuals under the current global (the algorithm's own settings).

>>> r = Robustness()
>>> r.aggregation, r.label_bound, r.max_sample_rate
('exact', 10.0, 1000.0)
>>> Robustness(aggregation="robust", trim=0.5).trim
0.5
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Robustness"]


class Robustness(BaseModel):
    """A fleet's bounds on one member's influence, and whether it aggregates robustly (module docstring).

    >>> Robustness(label_bound=4.0).label_bound
    4.0
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Labels, in the learner's units. 10 standard deviations clips 4e-5 of the Beijing PM/CO targets.
    label_bound: float = Field(10.0, gt=0, allow_inf_nan=False)
    # Per client, on average over time (token buckets): generous for a sensor, tight for a flood.
    max_sample_rate: float = Field(1000.0, gt=0, allow_inf_nan=False)
    sample_burst: float = Field(100_000.0, ge=1, allow_inf_nan=False)  # a backlog a client may send at once
    max_upload_rate: float = Field(200.0, gt=0, allow_inf_nan=False)
    upload_burst: float = Field(2_000.0, ge=1, allow_inf_nan=False)
    aggregation: Literal["exact", "robust"] = "exact"
    # robust, gradient-like updates: fraction trimmed off each side per coordinate (0.5 = median), and each
    # client's update clipped to clip_factor × the median of the round's update norms
    trim: float = Field(0.25, ge=0.0, le=0.5)
    clip_factor: float = Field(2.0, ge=1.0, allow_inf_nan=False)
    # robust, summed statistics: the largest share of the global's samples one client may hold
    share_cap: float = Field(0.25, gt=0.0, le=1.0)
