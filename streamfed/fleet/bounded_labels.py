"""Labels within the fleet's bound before any learner sees them (issue 15: one reading can move the fleet).

A regression learner's update grows with its label: one sensor reading `y = 1e50` became an accepted
POF-MKL update of ~9e48 and a global θ ~1e50 for everyone; `y = 1e150` an update the aggregator refused,
after which the agent resent ~590 updates every 10 s forever. :class:`BoundedLabels` clips every label to
`±bound` in the learner's units (standard units when the agent standardises: then the bound is a robust
range learned from the stream, `mean ± bound·scale`, and the standardiser folds in the clipped value, see
:class:`~streamfed.fleet.standardised.StandardisedLearner`), and counts what it clipped. Each algorithm's
aggregation derives the largest honest update from the same bound (`cfg.robust.label_bound`) and refuses
anything beyond it, so an honest agent's uploads are never refused for their size.

Predictions are clipped to the same `±bound` (issue 30): every label the learner is scored on lies inside, so a
clipped prediction is never further from it, and a global an attacker pushed as far as the aggregation's declared
bounds allow still cannot make an honest agent predict beyond the label range (its squared error stays
below `(2·bound)²` in the learner's units).

Everything else passes through to the wrapped learner unchanged (:class:`~streamfed.algorithms.base.WrappedLearner`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamfed.algorithms.base import Learner, WrappedLearner
from streamfed.core.durable import durable

__all__ = ["BoundedLabels"]


@durable("fleet.BoundedLabels")
class BoundedLabels(WrappedLearner):
    """A :class:`~streamfed.algorithms.base.Learner` whose labels are clipped to `±bound` (counted).

    >>> from streamfed import algorithms
    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=1, n_kernels=2, n_features=3, standardise="none")
    >>> learner = BoundedLabels(algorithms.get("pofmkl").learner(cfg, "a", 0), bound=10.0)
    >>> _ = learner.learn(np.array([0.5]), 1e50)
    >>> learner.labels_clipped, learner.diagnostics()["labels_clipped"]
    (1, 1.0)
    >>> abs(learner.predict(np.array([0.5]))[0]) <= 10.0
    True
    """

    label_in_use: float | None = None  # set by this wrapper (an instance attribute), not the inner learner's

    def __init__(self, inner: Learner, bound: float) -> None:
        if not (bound > 0 and math.isfinite(bound)):
            raise ValueError(f"label bound must be finite and > 0, got {bound!r}")
        self.inner = inner
        self.bound = float(bound)
        self.labels_clipped = 0
        self._clipping = False  # the sample between begin_learn and end_learn was clipped
        self.label_in_use = 0.0  # the last label as learned (clipped), in the learner's units

    def _clip(self, y: float) -> float:
        y = float(y)
        if not math.isfinite(y):
            raise ValueError(f"label is not finite: {y!r}")
        self._clipping = abs(y) > self.bound
        self.label_in_use = math.copysign(self.bound, y) if self._clipping else y
        return self.label_in_use

    def _within(self, out: tuple[float, float | None]) -> tuple[float, float | None]:
        mean, var = out
        return (max(-self.bound, min(self.bound, mean)) if math.isfinite(mean) else mean), var

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        return self._within(self.inner.predict(x))

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        return self._within(self.inner.begin_learn(x, self._clip(y)))

    def end_learn(self) -> None:
        self.inner.end_learn()
        self.labels_clipped += self._clipping
        self._clipping = False

    def learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        out = self.inner.learn(x, self._clip(y))  # a refused sample raises here: nothing is counted
        self.labels_clipped += self._clipping
        self._clipping = False
        return self._within(out)

    def diagnostics(self) -> dict[str, float]:
        return {**self.inner.diagnostics(), "labels_clipped": float(self.labels_clipped)}

    def __getattr__(self, name: str) -> Any:
        # the contract is WrappedLearner's; anything else a family's learner has (its `client`, …) is read
        # through (only when not found here; never for dunders, so that copying and pickling see this
        # object's own state)
        if name.startswith("__") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
