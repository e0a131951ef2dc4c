"""PVI's variance calibration: the shared :mod:`streamfed.algorithms.calibration` (where it now lives, for every
Bayesian learner), re-exported under its first address."""

from __future__ import annotations

from streamfed.algorithms.calibration import Z95, VarianceCalibration

__all__ = ["Z95", "VarianceCalibration"]
