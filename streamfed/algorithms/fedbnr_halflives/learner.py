"""The :class:`~streamfed.algorithms.base.Learner` of FedBNR over half-lives (docs/algorithms.md §4.15): one FedBNR
:class:`StatsLearner` per half-life, all learning every sample at one time, and the fixed-share mixture of their
predictives (:mod:`.client`). Uploads are the components' uploads stacked (they fall due together: the same
samples, the same privacy floor); a global is split into one FedBNR global per component.

The mixture's weights are the learner's `kernel_weights` (names `half_life=…`), exported by the agents as
`streamfed_agent_kernel_weight`, and its diagnostics `mixture_weight_<half-life>`
(`streamfed_agent_learner_value`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.base import BaseLearner, Regret, Update, UploadSensitivity
from streamfed.algorithms.fedbnr.learner import StatsLearner
from streamfed.algorithms.fedbnr_halflives.client import HalfLifeMixture
from streamfed.algorithms.fedbnr_halflives.wire import split_global, stack_updates
from streamfed.core.durable import durable
from streamfed.wire.message import Message

__all__ = ["HalfLifeLearner"]


@durable("fedbnr-halflives.HalfLifeLearner")
class HalfLifeLearner(BaseLearner):
    """FedBNR components, one per half-life, mixed by fixed share (module docstring).

    >>> from streamfed.algorithms.fedbnr.client import FedBNRClient
    >>> parts = [StatsLearner(FedBNRClient(n_inputs=1, n_features=4, min_upload=2, half_life_s=h))
    ...          for h in (None, 3600.0)]
    >>> lr = HalfLifeLearner(parts, (None, 3600.0))
    >>> lr.observe_time(1.7e9); _ = lr.learn(np.array([0.1]), 1.0)
    >>> lr.observe_time(1.7e9 + 3600); _ = lr.learn(np.array([0.2]), 1.0)
    >>> up = lr.take_update()
    >>> up.n_samples, up.arrays["n"].round(12).tolist(), up.arrays["time"].tolist()  # the first at half weight
    (2, [2.0, 1.5], [0.0, 1700003600.0])
    >>> lr.kernel_names, round(float(lr.kernel_weights.sum()), 12)
    (('half_life=none', 'half_life=1h'), 1.0)
    """

    sample_sensitivity = True  # upload_sensitivity: √J times one FedBNR upload's per-sample bound
    noise_aware = True  # noise_variance: the components' through the mixture's weights

    def __init__(self, components: Sequence[StatsLearner], half_lives: Sequence[float | None], *,
                 switch_rate: float = 0.01) -> None:
        if len(components) != len(half_lives) or not components:
            raise ValueError(f"{len(components)} components for {len(half_lives)} half-lives")
        self.components = list(components)
        self.mixture = HalfLifeMixture(half_lives, switch_rate)
        self._staged: tuple[np.ndarray, float, float] | None = None  # (log densities, y, mixture mean)
        self._observed: float | None = None
        self.n, self.loss = 0, 0.0  # samples learned and the mixture's squared loss (the regret's)

    @property
    def half_lives(self) -> tuple[float | None, ...]:
        return self.mixture.half_lives

    @property
    def global_version(self) -> int:
        return min(c.global_version for c in self.components)

    @property
    def kernel_names(self) -> Sequence[str]:
        return tuple(f"half_life={label}" for label in self.mixture.labels)

    @property
    def kernel_weights(self) -> np.ndarray:
        return self.mixture.weights

    @property
    def pending_samples(self) -> int:
        return int(self.components[0].pending_samples)

    def diagnostics(self) -> dict[str, float]:
        """The mixture's weights, and the best log evidence of any component's working posterior (O(J·K·F³): read
        it per upload)."""
        out = {f"mixture_weight_{label}": float(w) for label, w in zip(self.mixture.labels, self.mixture.weights,
                                                                       strict=True)}
        out["log_evidence"] = max(float(c.diagnostics()["log_evidence"]) for c in self.components)
        return out

    def regret(self) -> Regret:
        """The mixture's squared loss against the best fixed ridge predictor on this client's own samples (the
        components' comparators see the same raw samples; the best of their `σ, λ`)."""
        best = [c.regret() for c in self.components]
        k = int(np.argmin([r.best_loss for r in best]))
        return Regret(float(self.n), float(self.loss), float(best[k].best_loss), best[k].best)

    # ---------------------------------------------------------------- prediction and learning
    def observe_time(self, ts: float) -> None:
        ts = float(ts)
        if not math.isfinite(ts):
            raise ValueError(f"time must be finite, got {ts!r}")
        self._observed = ts

    def _predictions(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        preds = np.array([c.predict(x) for c in self.components], dtype=np.float64)
        return preds[:, 0], preds[:, 1]

    def predict(self, x: np.ndarray) -> tuple[float, float | None]:
        return self.mixture.predict(*self._predictions(x))

    def begin_learn(self, x: np.ndarray, y: float) -> tuple[float, float | None]:
        # one time for every component (this process's clock read once when the agent gave none), so their
        # statistics are discounted to the same instant and their uploads carry one time
        t = time.time() if self._observed is None else self._observed
        preds = []
        for c in self.components:
            c.observe_time(t)
            preds.append(c.begin_learn(x, y))
        means, variances = (np.array(v, dtype=np.float64) for v in zip(*preds, strict=True))
        mean, var = self.mixture.predict(means, variances)
        self._staged = (self.mixture.log_densities(y, means, variances), float(y), mean)
        return mean, var

    def end_learn(self) -> None:
        if self._staged is None:
            return
        lp, y, mean = self._staged
        self._staged = None
        for c in self.components:  # the same features and label: a refusal comes from the first, before any change
            c.end_learn()
        self.mixture.update_log_densities(lp)
        self.n += 1
        self.loss += (y - mean) ** 2

    # ---------------------------------------------------------------- federation
    def take_update(self) -> Update | None:
        ups = [c.take_update() for c in self.components]
        if all(u is None for u in ups):
            return None
        if any(u is None for u in ups) or len({(u.seq, u.n_samples, u.epoch) for u in ups if u}) != 1:
            raise RuntimeError("the half-life components fell out of step: their uploads differ in seq or count")
        first = ups[0]
        assert first is not None
        arrays = stack_updates([u.arrays for u in ups if u is not None], self.half_lives)
        return Update(arrays, first.n_samples, self.global_version, seq=first.seq, epoch=first.epoch)

    def install_global(self, msg: Message) -> bool:
        parts = split_global(msg, self.half_lives)
        return any([c.install_global(m) for c, m in zip(self.components, parts, strict=True)])

    def upload_sensitivity(self, label_bound: float) -> UploadSensitivity:
        """One sample moves each component's `(S_upper, b, q)` by at most FedBNR's bound `Δ` (its weight in a
        discounted component is ≤ 1), so the stacked arrays by at most `√J·Δ` in L2 (docs/privacy.md)."""
        one = self.components[0].upload_sensitivity(label_bound)
        assert one.l2 is not None
        return UploadSensitivity(one.arrays, math.sqrt(len(self.components)) * one.l2, one.scatter, one.count)

    def noise_variance(self, x: np.ndarray, noise_std: float) -> float:
        """The components' noises are independent: `Σ_j w_j² v_j` at the mixture's weights."""
        w = self.mixture.weights
        return float(sum(w[j] ** 2 * c.noise_variance(x, noise_std) for j, c in enumerate(self.components)))

    def warm_up(self, x: np.ndarray) -> None:
        for c in self.components:
            c.warm_up(x)
