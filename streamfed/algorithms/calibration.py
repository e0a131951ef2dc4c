"""Online recalibration of a Gaussian predictive's variance (docs/algorithms.md §4.10, "Calibration"): a conformal scale
from a learner's own past prequential residuals, shared by every Bayesian learner.

A model's 95% interval `μ ± 1.96 √v` covers what it should only if its noise and posterior are right; a fixed or
evidence-fitted noise, a learned kernel or a drifting stream each make it too narrow or too wide. Each learned
sample's studentised residual `|y − μ| / √v` (the prediction made before the sample was learned, under the
model's own variance) goes into a window of the last `window`; the predictive variance is multiplied by
`(q / 1.96)²`, `q` the window's conformal 95% quantile — the `⌈(n + 1) · 0.95⌉`-th smallest of its `n`
residuals, split conformal's finite-sample rule (the plain 95% quantile covered 0.89–0.92 on a federated FSGP fleet,
docs/results.md "Calibration") — so that the interval `μ ± 1.96 √(v · scale)` is `μ ± q √v`: split conformal on
the past residuals, studentised by the model's variance. Until `min_samples` residuals are in, the
scale is 1. The mean is never changed, and nothing of it is uploaded: a federation's statistics are the same with
or without it.

Three pieces: :class:`VarianceCalibration` (the scale), :class:`CalibratedLearner` (a learner whose predictions an
agent reports through it) and :class:`PrequentialCalibration` (a River estimator's: the residuals of the
`predict_one` made before each `learn_one` of the same input). Cost per sample: one square root, a deque append and
an insertion into the window kept sorted (the quantile is then read off it, every `every` samples; ~1 µs).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from streamfed.algorithms.base import Learner, WrappedLearner
from streamfed.core.durable import durable

__all__ = ["CalibratedLearner", "PrequentialCalibration", "VarianceCalibration", "Z95", "conformal_quantile"]

Z95 = 1.959963984540054  # the two-sided 95% normal quantile
_SCALE_BOUNDS = (1e-4, 1e4)  # a scale outside these is a broken model, not a calibration: held at the bound
LEVEL = 0.95
# the tracking correction's step in log threshold per sample: 0.02 moves the threshold by ~2% per miss, so a
# window lagging a shrinking variance (PVI after each refinement) is corrected within tens of samples, while a
# stationary stream's correction wanders by a few percent around 0
TRACKING_RATE = 0.02
_LOG_C_BOUNDS = (-2.0, 2.0)  # the correction multiplies the window's threshold by at most e² either way


# the name is PVI's, where the class was first written: durable names outlive modules, so older states still load
@durable("pvi.VarianceCalibration")
class VarianceCalibration:
    """The conformal variance scale of the last `window` studentised residuals, refreshed every `every` samples,
    times a tracking correction `c` (`rate > 0`): the interval is `μ ± q·c·√v`, `q` the window's conformal
    quantile, and after each residual `log c += rate · (miss − 0.05)`, `miss` = 1 when it fell outside the interval
    just reported. The window alone lags a model whose variance shrinks or grows faster than `window` samples
    (PVI at its refinements covered 0.88–0.91 on Beijing); the correction makes the misses add up to 5% of the
    samples up to `Δ log c / rate` over any stream (online quantile tracking), while on a steady stream `c` stays
    near 1.

    >>> c = VarianceCalibration(window=100, min_samples=10, every=1, rate=0.0)  # the window alone
    >>> c.scale
    1.0
    >>> for i in range(100):
    ...     c.update(residual=2.0 * (1 if i % 2 else -1), var=1.0)  # |y - μ| = 2 √v, always
    >>> round(c.scale, 6)  # the interval must reach 2 √v: (2 / 1.95996...)²
    1.041271
    >>> for k in range(1, 101):
    ...     c.update(residual=float(k), var=1.0)  # 1, 2, …, 100: the ⌈101 · 0.95⌉ = 96th smallest is 96
    >>> round(c.scale, 6) == round((96 / 1.959963984540054) ** 2, 6)
    True
    >>> def miss_rate(rate):  # the model's variance says 1; the residuals' sd halves every 400 samples
    ...     t, rng, misses = VarianceCalibration(min_samples=10, every=1, rate=rate), np.random.default_rng(0), 0
    ...     for i in range(2000):
    ...         r = rng.normal() * 2.0 ** (-(i // 400))
    ...         misses += abs(r) > t.threshold
    ...         t.update(residual=r, var=1.0)
    ...     return round(misses / 2000, 3)
    >>> miss_rate(0.0), miss_rate(0.02)  # the window alone is too wide; with the correction, 5%
    (0.026, 0.048)
    """

    # class-level defaults: a state written before the tracking correction restores with it, at zero, and its
    # window's quantile is recomputed at its next residual
    _log_c = 0.0
    _q: float | None = None
    rate = TRACKING_RATE
    _ranked: list[float] | None = None  # the window's residuals in increasing order

    def __init__(self, window: int = 256, min_samples: int = 32, every: int = 8,
                 rate: float | None = None) -> None:
        if window < 1 or min_samples < 1 or every < 1:
            raise ValueError("window, min_samples and every must be >= 1")
        rate = TRACKING_RATE if rate is None else rate  # read here, so that the module's default can be changed
        if not (0.0 <= rate < 1.0):
            raise ValueError("rate must be in [0, 1)")
        self.min_samples, self.every = int(min_samples), int(every)
        self.rate = float(rate)
        self._z: deque[float] = deque(maxlen=int(window))
        self._since = 0
        self._q: float | None = None  # the window's conformal quantile (once min_samples residuals are in)
        self._log_c = 0.0  # the tracking correction's log: the threshold is q · exp(_log_c)
        self.scale = 1.0

    @property
    def threshold(self) -> float:
        """`t` of the current interval `μ ± t √v` (`Z95` · `√scale`)."""
        return Z95 * math.sqrt(self.scale)

    def update(self, residual: float, var: float) -> None:
        """Fold one prequential residual `y − μ` and the model's variance `v` of that prediction."""
        if not (math.isfinite(residual) and var > 0 and math.isfinite(var)):
            return  # nothing to learn from (the learners refuse non-finite samples before this)
        z = abs(residual) / math.sqrt(var)
        if len(self._z) >= self.min_samples and self.rate > 0.0:
            # quantile tracking: a miss of the interval just reported raises the threshold, a hit lowers it, so
            # that Σ (miss − 0.05) = Δ log c / rate — the long-run miss rate is 5% whatever the stream does
            miss = 1.0 if z > self.threshold else 0.0
            self._log_c = min(max(self._log_c + self.rate * (miss - (1.0 - LEVEL)), _LOG_C_BOUNDS[0]),
                              _LOG_C_BOUNDS[1])
        window, ranked = self._z, self._ranked
        if ranked is None or len(ranked) != len(window):  # (a state saved before the sorted window existed)
            ranked = self._ranked = sorted(window)
        if len(window) == window.maxlen:
            del ranked[bisect.bisect_left(ranked, window[0])]  # the residual the append below evicts
        window.append(z)
        bisect.insort(ranked, z)
        self._since += 1
        n = len(window)
        if n >= self.min_samples and (self._since >= self.every or self._q is None):
            self._since = 0
            self._q = ranked[min(math.ceil((n + 1) * LEVEL), n) - 1]  # conformal_quantile of the window
        if len(self._z) >= self.min_samples and self._q is not None:
            t = self._q * math.exp(self._log_c)
            self.scale = min(max((t / Z95) ** 2, _SCALE_BOUNDS[0]), _SCALE_BOUNDS[1])


def conformal_quantile(z: np.ndarray, level: float = 0.95) -> float:
    """The `⌈(n + 1) · level⌉`-th smallest of the `n` scores `z` (the largest when that is beyond `n`): a new
    exchangeable score is at most it with probability at least `level` (split conformal). By a partial sort.

    >>> conformal_quantile(np.arange(1.0, 20.0))  # n = 19: ⌈20 · 0.95⌉ = 19th smallest
    19.0
    >>> conformal_quantile(np.arange(1.0, 257.0))  # n = 256: ⌈257 · 0.95⌉ = 245th
    245.0
    """
    k = min(math.ceil((z.size + 1) * level), z.size)
    return float(np.partition(z, k - 1)[k - 1])


@durable("algorithms.CalibratedLearner")
class CalibratedLearner(WrappedLearner):
    """A Bayesian learner whose predictive variances are scaled by a :class:`VarianceCalibration` of its own
    prequential residuals (the prediction `begin_learn` made, folded in at `end_learn`). Means, uploads and
    globals pass through unchanged.

    >>> from streamfed.algorithms.base import BaseLearner
    >>> class TooSure(BaseLearner):  # predicts 0 with variance 1; the targets are ±3
    ...     def predict(self, x): return 0.0, 1.0
    ...     def begin_learn(self, x, y): return self.predict(x)
    >>> c = CalibratedLearner(TooSure(), VarianceCalibration(window=50, min_samples=10, every=1, rate=0.0))
    >>> for i in range(50):
    ...     _ = c.learn(np.zeros(1), 3.0 if i % 2 else -3.0)
    >>> m, v = c.predict(np.zeros(1)); m, round(1.959964 * v ** 0.5, 3)  # the interval reaches 3
    (0.0, 3.0)
    """

    def __init__(self, inner: Learner, calibration: VarianceCalibration | None = None) -> None:
        self.inner = inner
        self.calibration = calibration if calibration is not None else VarianceCalibration()
        self._pending: tuple[float, float] | None = None

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        mean, var = self.inner.predict(x)
        return mean, None if var is None else var * self.calibration.scale

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        self._pending = None
        mean, var = self.inner.begin_learn(x, y)
        if var is None:
            return mean, None
        self._pending = (float(y) - float(mean), float(var))
        return mean, var * self.calibration.scale

    def end_learn(self) -> None:
        self.inner.end_learn()
        if self._pending is not None:
            self.calibration.update(*self._pending)
            self._pending = None

    def diagnostics(self) -> Mapping[str, float]:
        return {**self.inner.diagnostics(), "variance_scale": float(self.calibration.scale)}

    def __getattr__(self, name: str) -> Any:
        # the contract is WrappedLearner's; anything else a family's learner has (its `client`, …) is read
        # through (only when not found here; never for dunders, so that copying and pickling see this object's own)
        if name.startswith("__") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


@durable("algorithms.PrequentialCalibration")
class PrequentialCalibration:
    """A River estimator's calibration: `predicted` records `predict_one`'s (mean, model variance) for its input
    and returns the calibrated variance; `learned` folds the residual in when `learn_one` is given the same input
    next (progressive validation); a `learn_one` without a prediction before it leaves the scale as it is, so a
    `learn_many` is still a loop of `learn_one`.

    >>> p = PrequentialCalibration(VarianceCalibration(window=20, min_samples=5, every=1, rate=0.0))
    >>> for i in range(20):
    ...     x = {"a": float(i)}
    ...     _ = p.predicted(x, 0.0, 4.0)  # sd 2; the targets are ±1: the interval shrinks to reach 1
    ...     p.learned(x, 1.0 if i % 2 else -1.0)
    >>> round(p.predicted({"a": 0.0}, 0.0, 4.0), 6)  # (q·sd / 1.96)² with q·sd = 1
    0.260318
    """

    def __init__(self, calibration: VarianceCalibration | None = None) -> None:
        self.calibration = calibration if calibration is not None else VarianceCalibration()
        self._last: tuple[Any, float, float] | None = None

    def predicted(self, x: Any, mean: float, var: float) -> float:
        """Record the prediction at `x` (before its label is known); the calibrated variance."""
        self._last = (x, float(mean), float(var))
        return float(var) * self.calibration.scale

    def learned(self, x: Any, y: float) -> None:
        """The label of `x` was learned: fold in the residual of the prediction made at `x`, if there was one."""
        last, self._last = self._last, None
        if last is not None and (last[0] is x or last[0] == x):
            self.calibration.update(float(y) - last[1], last[2])
