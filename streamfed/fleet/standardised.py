"""An agent's stream on unit scales: any learner behind an online standardisation of inputs and target.

A deployed agent reads a user's stream as it is — pressures near 1000, a rating near 40 — while every
learner assumes unit scales (kernel bandwidths, `θ = 0`, a unit prior). :class:`StandardisedLearner`
wraps the algorithm's :class:`~streamfed.algorithms.base.Learner` and, for each sample, hands it
`z = (v - mean) / scale` from the running statistics of the client's *past* samples
(:class:`~streamfed.core.standardise.OnlineStandardiser`, the same rule as the replay's `"online"`
normalisation), then folds the sample in. Predictions go back to the stream's units: mean
`m_y + s_y·μ`, variance `s_y²·v`. The first two samples only set the scales; their prediction is the
running mean.

The learner itself, its updates and its globals live in standard units: what is federated is unchanged,
and FedBNR's statistics still sum exactly (each client's transform is fixed at the time of its sample).
Its regret is in standard units too; the agent's MSE and coverage are in the stream's units.

Under differential privacy the running scales are data outside the privacy boundary: one sample changes the
transform of every later one, hence every later upload. The agent then standardises with *declared* scales
(`[fleet.public_scales]`, :class:`~streamfed.core.standardise.DeclaredScales`) and refuses to start without
them (:data:`NEEDS_PUBLIC_SCALES`; docs/privacy.md).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from streamfed.algorithms.base import Learner, WrappedLearner
from streamfed.core.durable import durable
from streamfed.core.standardise import StreamScales

__all__ = ["NEEDS_PUBLIC_SCALES", "StandardisedLearner"]

NEEDS_PUBLIC_SCALES = (
    "differential privacy with standardise = \"online\" needs [fleet.public_scales] (x_mean, x_scale, y_mean, "
    "y_scale, from public knowledge of the sensors): the running scales of the stream would carry each sample into "
    "every later upload (docs/privacy.md); or set standardise = \"none\"")


@durable("fleet.StandardisedLearner")
class StandardisedLearner(WrappedLearner):
    """A :class:`~streamfed.algorithms.base.Learner` that sees its stream standardised online.

    >>> from streamfed import algorithms
    >>> from streamfed.fleet.config import FleetConfig
    >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=1, n_kernels=1, n_features=4)
    >>> learner = StandardisedLearner(algorithms.get("fedbnr").learner(cfg, "a", 0), n_inputs=1)
    >>> for v in (1000.0, 1002.0):
    ...     _ = learner.learn(np.array([v]), v / 10)
    >>> mean, var = learner.predict(np.array([1001.0]))
    >>> round(mean, 6)  # no sample learned yet: the running mean of the target
    100.1
    """

    # set by this wrapper itself (instance attributes), not the inner learner's
    label_in_use: float | None = None
    last_probabilities: np.ndarray | None = None

    def __init__(self, inner: Learner, n_inputs: int, target: bool = True, label_bound: float | None = None,
                 private: bool = False, scales: StreamScales | None = None) -> None:
        self.inner = inner
        # under differential privacy the stream's own statistics (the target's running mean and scale) are data:
        # they are not exported as metrics
        self.private = bool(private)
        # a target beyond mean ± label_bound·scale (the range learned so far) is folded into the scales at that
        # edge: one reading of 1e50 must not blow the scales up for every later sample (the learner below clips
        # the standardised label itself, fleet/bounded_labels.py)
        self.label_bound = None if label_bound is None else float(label_bound)
        self.targets_winsorised = 0
        self._winsorising = False
        self.label_in_use = 0.0
        # inputs winsorised at ±INPUT_CLIP, never the target; `scales`: fixed ones (DeclaredScales) instead of running
        self.scales = StreamScales(n_inputs) if scales is None else scales
        # a classifier's target is a class index: it is passed on as it is, and predictions are not mapped back
        self.target = bool(target)
        self._next: StreamScales | None = None  # the scales with the sample being learned folded in
        self._inner_pending = False
        # a classifier's probabilities of its last begin_learn: class probabilities are not mapped back
        self.last_probabilities: np.ndarray | None = None

    # -- what the agent reads (the rest is the inner learner's; its regret is in standard units) ----
    def diagnostics(self) -> Mapping[str, float]:
        out = dict(self.inner.diagnostics())
        y = self.scales.y
        if y.count and not getattr(self, "private", False):  # (states pickled before `private` existed)
            out["target_mean"] = float(y.mean[0])
            out["target_scale"] = float(y.scale[0])
        if self.label_bound is not None and not getattr(self, "private", False):  # a count of the data's outliers
            out["targets_winsorised"] = float(self.targets_winsorised)
        return out

    # -- predicting and learning ---------------------------------------------------------------
    def _fallback(self, with_var: bool) -> tuple[float, float | None]:
        m, v = self.scales.y.fallback()
        return m, (v if with_var else None)

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        if not self.target:
            return self.inner.predict(self._inputs(x))
        if not self.scales.ready:
            _, var = self.inner.predict(np.zeros_like(np.asarray(x, dtype=np.float64)))
            return self._fallback(var is not None)
        return self.scales.predict(x, self.inner.predict)

    def class_probabilities(self, x: np.ndarray) -> np.ndarray | None:
        """A classifier's class probabilities of `x` (inputs standardised as for `predict`); None for a
        learner without them."""
        return self.inner.class_probabilities(self._inputs(x))

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        """Predict and learn `(x, y)` in standard units (scales from the past), then fold it in — on
        copies first, so a refused sample (a value whose square overflows, or the learner's refusal)
        changes nothing."""
        if self._next is not None:
            raise RuntimeError("begin_learn called twice without end_learn")
        y = float(y)
        if not math.isfinite(y):
            raise ValueError(f"label is not finite: {y!r}")
        self._winsorising = False
        if self.target and self.label_bound is not None and self.scales.ready:
            y, self._winsorising = self._winsorised(y)
        self.label_in_use = y  # the label as learned, in the stream's units (what quality is measured against)
        zx, zy, nxt = self.scales.step(x, y)  # ValueError: nothing changed
        self.last_probabilities = None
        if not self.target:
            if zx is None:  # the first samples only set the input scales
                self._next, self._inner_pending = nxt, False
                p = self.inner.class_probabilities(self._inputs(x)) if self.inner.classifier else None
                if p is None:
                    return self.inner.predict(self._inputs(x))
                # one prediction gives both: the most probable class and the vector published with it
                self.last_probabilities = np.asarray(p, dtype=np.float64)
                return float(np.argmax(p)), None
            out = self.inner.begin_learn(zx, y)
            self.last_probabilities = self.inner.last_probabilities
            self._next, self._inner_pending = nxt, True
            return out
        if zx is None:  # the first samples only set the scales
            _, var = self.inner.predict(np.zeros_like(np.asarray(x, dtype=np.float64)))
            self._next, self._inner_pending = nxt, False
            return self._fallback(var is not None)
        mean, var = self.inner.begin_learn(zx, zy)
        self._next, self._inner_pending = nxt, True
        # mapped back with the scales of the past (a non-finite result: the past mean and variance instead)
        return self.scales.predict(x, lambda _: (mean, var))

    def end_learn(self) -> None:
        if self._next is None:
            return
        nxt, pending = self._next, self._inner_pending
        self._next, self._inner_pending = None, False
        if pending:
            self.inner.end_learn()
        self.scales = nxt
        self.targets_winsorised += self._winsorising
        self._winsorising = False

    def _winsorised(self, y: float) -> tuple[float, bool]:
        """`y` within the learned range `mean ± label_bound·scale` (the scales of the past), and whether it
        was outside."""
        assert self.label_bound is not None
        ys = self.scales.y
        mean, scale = float(ys.mean[0]), float(ys.scale[0])
        bound = self.label_bound * scale
        if abs(y - mean) <= bound:
            return y, False
        return mean + math.copysign(bound, y - mean), True

    def _inputs(self, x: np.ndarray) -> np.ndarray:
        """`x` in standard units (zeros until the scales are ready)."""
        x = np.asarray(x, dtype=np.float64)
        return self.scales.x.transform(x) if self.scales.ready else np.zeros_like(x)

    # -- the federated side is the inner learner's, unchanged -----------------------------------
    def warm_up(self, x: np.ndarray) -> None:
        self.inner.warm_up(x)
        copy.deepcopy(self.inner).learn(x, 0.0)  # the inner learning path too (the first samples skip it)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_next"], state["_inner_pending"] = None, False  # a snapshot is taken between samples
        return state
