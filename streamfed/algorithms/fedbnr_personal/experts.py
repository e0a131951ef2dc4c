"""Personalisation that never costs (docs/algorithms.md §5.9): a client of personalised FedBNR that predicts with a
fixed-share mixture (:mod:`.fixed_share`) of three experts on the same features, weighted by each one's
prequential log predictive density on this client's own stream.

* **local** — Bayesian linear regression on the client's own samples only (prior `N(0, λ_l²I)`, `σ_l, λ_l` by the
  evidence of its own statistics at each of its uploads: a private one-client server); the fleet never reaches it.
* **pooled** — the fleet's shared posterior as the prior of this client's weights with a negligible personal
  scale (`prior_tau`): the client treated as a typical member of the fleet, updated with its own samples.
* **personal** — the exact personalised posterior (:class:`~.client.FedBNRHierClient`: shared posterior widened by
  the fitted `τ`, plus all its own samples). It alone uploads: the fleet's statistics are those of personalised
  FedBNR without the mixture.

Why: a joining station gains from the fleet over its first day (the personalised posterior wins), but from a few
days on a fresh local model wins because a year-old shared posterior is a confident prior for last season
(docs/results.md, cold start). Fixed share follows whichever expert is best *now*: its cumulative log loss is
within `log 3 + T·log(1/(1 − α))` of the best expert's and within `m·log(3/α)` more of the best sequence of
experts with `m` switches. The prediction is the mixture's: its mean and exact variance (within-expert variance
plus the spread of the experts' means). Cost: three `O(F²)` rank-one updates per sample instead of one, and one
`O(F³)` local evidence fit per upload.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamfed.algorithms.fedbnr.metrics import PrequentialMetrics
from streamfed.algorithms.fedbnr_personal.client import FedBNRHierClient
from streamfed.algorithms.fedbnr_personal.messages import HierGlobal, HierUpload
from streamfed.algorithms.fedbnr_personal.server import FedBNRHierServer
from streamfed.algorithms.fixed_share import FixedShare, gaussian_log_density, mixture_moments
from streamfed.core.durable import durable
from streamfed.core.features import FeatureMap
from streamfed.core.stats import SufficientStats

__all__ = ["EXPERTS", "FedBNRExpertsClient"]

#: The experts, in the order of their weights.
EXPERTS: tuple[str, ...] = ("local", "pooled", "personal")


@durable("fedbnr-personal.FedBNRExpertsClient")
class FedBNRExpertsClient:
    """A personalised FedBNR client predicting with the fixed-share mixture of its local, pooled and personal
    experts (module docstring). Arguments other than `switch_rate` (fixed share's `α`), `prior` (its initial
    weights, default uniform), `pooled_tau` (the pooled expert's personal scale) and `trace` (keep every expert's
    predictions, for evaluation) are :class:`~.client.FedBNRHierClient`'s.

    >>> rng = np.random.default_rng(0)
    >>> c = FedBNRExpertsClient(n_inputs=1, n_features=8, min_upload=16, switch_rate=0.01)
    >>> x = rng.uniform(-2, 2, (128, 1)); y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(128)
    >>> _ = c.learn_many(x[:64], y[:64])
    >>> up = c.make_upload()                      # the personal expert's upload: what the fleet sees
    >>> up.count, round(float(c.weights().sum()), 12)
    (64, 1.0)
    >>> _ = c.learn_many(x[64:], y[64:])
    >>> bool(c.weights()[0] > 0.9)  # no fleet: the local expert (σ, λ fitted to its own data at the upload) leads
    True
    """

    def __init__(self, feature_map: FeatureMap | None = None, *, switch_rate: float = 0.01,
                 prior: tuple[float, float, float] | None = None, pooled_tau: float = 1e-4, trace: bool = False,
                 **kwargs: Any) -> None:
        if not (math.isfinite(float(pooled_tau)) and float(pooled_tau) > 0):
            raise ValueError(f"pooled_tau must be finite and > 0, got {pooled_tau!r}")
        self.personal = FedBNRHierClient(feature_map, **kwargs)
        self.pooled = FedBNRHierClient(feature_map, prior_tau=float(pooled_tau), **kwargs)
        self.local = FedBNRHierClient(feature_map, **kwargs)
        # the local expert's own evidence fit: a server of one client (λ, τ are not separately identifiable with
        # one client, so τ is held negligible and the prior scale is λ, fitted with σ)
        self._private = FedBNRHierServer.for_client(self.local, tau=float(pooled_tau), fit_tau=False)
        # one feature map for all three (same arguments): each row's features are computed once and shared
        if len({e.kernel_version for e in (self.personal, self.pooled, self.local)}) != 1:
            raise ValueError("the experts' feature maps differ")
        self.share = FixedShare(len(EXPERTS), switch_rate, None if prior is None else np.asarray(prior))
        self.metrics = PrequentialMetrics()
        # evaluation only (it grows with the stream): every expert's prediction of every learned sample
        self._trace: list[np.ndarray] | None = [] if trace else None

    # ------------------------------------------------------------------ what the federation sees: the personal expert
    @property
    def experts(self) -> tuple[FedBNRHierClient, FedBNRHierClient, FedBNRHierClient]:
        return self.local, self.pooled, self.personal

    @property
    def client_id(self) -> str:
        return self.personal.client_id

    @property
    def kernel_version(self) -> str:
        return self.personal.kernel_version

    @property
    def n_pending(self) -> int:
        return self.personal.n_pending

    @property
    def time(self) -> float:
        """The clients' clock (the experts learn every sample at one time)."""
        return self.personal.time

    @property
    def installed_global(self) -> HierGlobal | None:
        return self.personal.installed_global

    def own_stats(self, time: float | None = None) -> SufficientStats:
        return self.personal.own_stats(time)

    def features_many(self, xs: np.ndarray) -> np.ndarray:
        """The experts' shared features of inputs `xs (T, d)` (the personalised client's map)."""
        return self.personal.features_many(xs)

    def weights(self) -> np.ndarray:
        """The mixture weights of :data:`EXPERTS` for the next prediction."""
        return self.share.weights

    # ------------------------------------------------------------------ prediction and learning
    def predict(self, x: np.ndarray) -> tuple[float, float]:
        """The mixture's mean and variance at the current weights."""
        preds = np.array([e.predict(x) for e in self.experts])
        return mixture_moments(self.share.weights, preds[:, 0], preds[:, 1])

    def learn(self, x: np.ndarray, y: float, time: float | None = None) -> tuple[float, float]:
        """One prequential step; returns the mixture's prediction made before learning."""
        m, v = self.learn_many(np.atleast_2d(np.asarray(x, dtype=np.float64)), np.array([float(y)]),
                               None if time is None else np.array([float(time)]))
        return float(m[0]), float(v[0])

    def learn_many(self, xs: np.ndarray, ys: np.ndarray, times: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Prequential pass: each expert predicts then learns every row; the mixture predicts each row with the
        weights before it and then folds the experts' log densities of it (fixed share)."""
        ys = np.asarray(ys, dtype=np.float64)
        # the features once, for all three experts (one map); the personal expert learns first: it validates
        # the targets and times before any other expert has learned anything
        phis = self.personal.features_many(xs)
        preds = [self.personal.learn_many(xs, ys, times, phis=phis)]
        preds = [e.learn_many(xs, ys, times, phis=phis) for e in (self.local, self.pooled)] + preds
        mu = np.stack([p[0] for p in preds])  # (3, T), in the order of EXPERTS
        var = np.stack([p[1] for p in preds])
        if self._trace is not None:
            self._trace.append(np.stack([mu, var]))
        lp = gaussian_log_density(ys, mu, var)
        means, variances = np.empty(ys.shape[0]), np.empty(ys.shape[0])
        for t in range(ys.shape[0]):
            means[t], variances[t] = mixture_moments(self.share.weights, mu[:, t], var[:, t])
            self.share.update(lp[:, t])
        self.metrics.update_many(means, variances, ys)
        return means, variances

    def expert_predictions(self) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
        """With `trace=True`: each expert's predictive means and variances of every sample learned so far, in
        order (what each expert alone would have predicted: the mixture never feeds back into them)."""
        if self._trace is None:
            return None
        both = np.concatenate(self._trace, axis=2) if self._trace else np.zeros((2, len(EXPERTS), 0))
        return {name: (both[0, i].copy(), both[1, i].copy()) for i, name in enumerate(EXPERTS)}

    # ------------------------------------------------------------------ federation
    def make_upload(self) -> HierUpload | None:
        """The personal expert's upload (once `min_upload` samples wait). The pooled expert takes the same one
        (identical statistics and sequence numbers: the globals' `included` applies to both); the local expert
        sends its own to its private server and installs what that publishes."""
        up = self.personal.make_upload()
        if up is None:
            return None
        self.pooled.make_upload()
        own = self.local.make_upload()
        if own is not None and self._private.apply(own):
            self.local.apply_global(self._private.publish(self.local.time))
        return up

    def apply_global(self, g: HierGlobal) -> bool:
        """Install the fleet's global in the personal and the pooled expert."""
        installed = self.personal.apply_global(g)
        if installed:
            self.pooled.apply_global(g)
        return installed
