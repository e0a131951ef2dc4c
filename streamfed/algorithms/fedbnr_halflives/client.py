"""The client half of the maths beyond FedBNR (docs/algorithms.md §4.15): the prequential fixed-share mixture of the
components' predictives, one component per half-life. Each component is an ordinary FedBNR client (its own
statistics, discounted by its half-life on the fleet's time base); this module only mixes what they predict.

With weights `w_t` over the `J` components and their Gaussian predictives `N(μ_j, v_j)` of the observed `y_t`
(:mod:`streamfed.algorithms.fixed_share`):

    predict:  μ = Σ_j w_j μ_j,   v = Σ_j w_j (v_j + (μ_j − μ)²)
    Bayes:    u_j = w_j N(y_t; μ_j, v_j) / Σ_i w_i N(y_t; μ_i, v_i)
    share:    w_{t+1,j} = (1 − α) u_j + α/J

>>> m = HalfLifeMixture((None, 86400.0), switch_rate=0.0)
>>> m.labels, m.weights.tolist()
(('none', '1d'), [0.5, 0.5])
>>> m.predict(np.array([0.0, 1.0]), np.array([1.0, 1.0]))
(0.5, 1.25)
>>> _ = m.update(1.0, np.array([0.0, 1.0]), np.array([1.0, 1.0]))  # the 1-day component predicted y exactly
>>> round(float(m.weights[1]), 6)  # e^0 / (e^0 + e^-1/2)
0.622459
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.fixed_share import FixedShare, gaussian_log_density, mixture_moments
from streamfed.core.durable import durable

__all__ = ["HalfLifeMixture", "half_life_label"]


def half_life_label(h: float | None) -> str:
    """A half-life as a short name for metrics: `none`, whole days `7d`, whole hours `24h`... else seconds.

    >>> [half_life_label(h) for h in (None, 604800.0, 3600.0, 90.0, 5400.0)]
    ['none', '7d', '1h', '90s', '90m']
    """
    if h is None:
        return "none"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if h >= size and h % size == 0:
            return f"{int(h // size)}{unit}"
    return f"{h:g}s"


@durable("fedbnr-halflives.HalfLifeMixture")
class HalfLifeMixture:
    """Fixed-share weights over one predictive per half-life (module docstring), in the log domain.

    >>> HalfLifeMixture((None, 3600.0, 60.0)).weights.round(3).tolist()
    [0.333, 0.333, 0.333]
    """

    def __init__(self, half_lives: Sequence[float | None], switch_rate: float = 0.01) -> None:
        self.half_lives = tuple(half_lives)
        self.labels = tuple(half_life_label(h) for h in self.half_lives)
        self.share = FixedShare(len(self.half_lives), switch_rate)

    @property
    def weights(self) -> np.ndarray:
        """The weights of the next prediction, one per half-life."""
        return self.share.weights

    def predict(self, means: np.ndarray, variances: np.ndarray) -> tuple[float, float]:
        """The mixture's mean and exact variance at the current weights."""
        return mixture_moments(self.share.weights, np.asarray(means, dtype=np.float64),
                               np.asarray(variances, dtype=np.float64))

    def log_densities(self, y: float, means: np.ndarray, variances: np.ndarray) -> np.ndarray:
        """Each component's log predictive density of the observed `y`."""
        return gaussian_log_density(np.asarray(float(y)), np.asarray(means, dtype=np.float64),
                                    np.asarray(variances, dtype=np.float64))

    def update(self, y: float, means: np.ndarray, variances: np.ndarray) -> float:
        """Fold the observed `y` under the components' predictives made before it; returns the mixture's log loss."""
        return self.update_log_densities(self.log_densities(y, means, variances))

    def update_log_densities(self, log_p: np.ndarray) -> float:
        """:meth:`update` from the log densities themselves (what a learner staged at its prediction)."""
        return self.share.update(log_p)
