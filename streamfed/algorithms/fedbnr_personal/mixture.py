"""Personalised FedBNR over a fixed grid of personal scales `τ_j` (docs/algorithms.md §5.7): one hierarchical
model per `τ_j`, both halves.

**τ by prequential evidence.** Under drift the static evidence of the time-weighted window measures how alike
the clients are *within* the window, not how fast each drifts; on the Beijing streams it picks a nearly pooled
model (`τ ≪ λ`). The mixture runs one model per `τ` of a fixed grid (each with `σ, λ` by the exact evidence at
that `τ`) and averages them per client with weights from each model's discounted prequential log predictive
density — the marginal likelihood of the sequential model (dynamic model averaging).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from streamfed.algorithms.fedbnr.metrics import PrequentialMetrics
from streamfed.algorithms.fedbnr_personal.client import FedBNRHierClient
from streamfed.algorithms.fedbnr_personal.messages import HierGlobal, HierUpload
from streamfed.algorithms.fedbnr_personal.server import FedBNRHierServer
from streamfed.core.durable import durable
from streamfed.core.stats import SufficientStats

__all__ = ["FedBNRHierMixClient", "FedBNRHierMixServer"]


@durable("fedbnr-personal.FedBNRHierMixServer")
class FedBNRHierMixServer:
    """One hierarchical model per personal scale `τ_j` of a fixed grid (each with its own `σ_j, λ_j`
    fitted by the exact evidence at that `τ_j`), all fed the same uploads. `publish` returns one
    :class:`HierGlobal` per `τ_j` (for :class:`FedBNRHierMixClient`)."""

    def __init__(self, dim: int, kernel_version: str | None = "", epoch: int = 0, *,
                 tau_grid: Sequence[float], **kwargs: Any) -> None:
        if not tau_grid:
            raise ValueError("tau_grid needs at least one value")
        self.tau_grid = tuple(float(t) for t in tau_grid)
        kwargs.pop("tau", None)
        self.servers = [FedBNRHierServer(dim, kernel_version, epoch, tau=t, fit_tau=False, **kwargs)
                        for t in self.tau_grid]

    @classmethod
    def for_client(cls, client: FedBNRHierMixClient, **kwargs: Any) -> FedBNRHierMixServer:
        sub = client.models[0]
        kwargs.setdefault("min_samples", sub.min_upload)
        kwargs.setdefault("forgetting", sub.forgetting)
        kwargs.setdefault("sigma", sub.sigma)
        kwargs.setdefault("lam", sub.lam)
        return cls(sub.dim, sub.kernel_version, sub.epoch, tau_grid=client.tau_grid, **kwargs)

    @property
    def included(self) -> dict[str, int]:
        return self.servers[0].included

    @included.setter
    def included(self, value: dict[str, int]) -> None:
        for s in self.servers:
            s.included = dict(value)

    @property
    def clients(self) -> dict[str, tuple[SufficientStats, float]]:
        return self.servers[0].clients

    @property
    def version(self) -> int:
        return self.servers[0].version

    @property
    def forgetting(self) -> float:
        return self.servers[0].forgetting

    @property
    def kernel_version(self) -> str | None:
        return self.servers[0].kernel_version

    @property
    def epoch(self) -> int:
        return self.servers[0].epoch

    @property
    def max_buffered(self) -> int:
        return self.servers[0].max_buffered

    def waiting(self) -> dict[str, list[int]]:
        return self.servers[0].waiting()

    def validate(self, up: HierUpload) -> None:
        self.servers[0].validate(up)

    def apply(self, up: HierUpload) -> bool:
        out = [s.apply(up) for s in self.servers]
        return out[0]

    def add_statistics(self, up: HierUpload) -> None:
        for s in self.servers:
            s.add_statistics(up)

    def publish(self, time: float | None = None) -> list[HierGlobal]:
        return [s.publish(time) for s in self.servers]

    def last_global(self) -> list[HierGlobal]:
        return [s.last_global() for s in self.servers]


@durable("fedbnr-personal.FedBNRHierMixClient")
class FedBNRHierMixClient:
    """Hierarchical FedBNR over a fixed grid of personal scales `τ_j`, combined by Bayesian model
    averaging with weights from each model's *prequential* evidence on this client's own stream,
    `log p_j(y_1..y_t) = Σ_s log p_j(y_s | y_<s)` (the marginal likelihood of a sequential model is the
    product of its one-step-ahead predictive densities), discounted by the same forgetting `γ` per time
    unit as the statistics (dynamic model averaging) — so the personal/shared balance is chosen by
    evidence of the drifting model, not by the static-window evidence. The prediction is the moment-
    matched mixture. Every sample enters each model once; one upload serves all models.
    """

    def __init__(self, tau_grid: Sequence[float], **kwargs: Any) -> None:
        if not tau_grid:
            raise ValueError("tau_grid needs at least one value")
        self.tau_grid = tuple(float(t) for t in tau_grid)
        kwargs.pop("tau", None)
        self.models = [FedBNRHierClient(tau=t, **kwargs) for t in self.tau_grid]
        self.log_score = np.zeros(len(self.models))  # discounted prequential log evidence per model
        self.metrics = PrequentialMetrics()

    @property
    def client_id(self) -> str:
        return self.models[0].client_id

    @property
    def kernel_version(self) -> str:
        return self.models[0].kernel_version

    @property
    def n_pending(self) -> int:
        return self.models[0].n_pending

    @property
    def time(self) -> float:
        """The models' clock (every model learns every sample at one time)."""
        return self.models[0].time

    def weights(self) -> np.ndarray:
        w = np.exp(self.log_score - self.log_score.max())
        return w / w.sum()

    def predict(self, x: np.ndarray) -> tuple[float, float]:
        """The moment-matched mixture of the models' predictive distributions, at the current weights."""
        preds = [m.predict(x) for m in self.models]
        mu = np.array([p[0] for p in preds])
        var = np.array([p[1] for p in preds])
        w = self.weights()
        mean = float(w @ mu)
        return mean, max(float(w @ (var + mu**2)) - mean**2, 1e-300)

    def learn(self, x: np.ndarray, y: float, time: float | None = None) -> tuple[float, float]:
        """One prequential step; returns the mixture's prediction made before learning."""
        m, v = self.learn_many(np.atleast_2d(np.asarray(x, dtype=np.float64)), np.array([float(y)]),
                               None if time is None else np.array([float(time)]))
        return float(m[0]), float(v[0])

    def own_stats(self, time: float | None = None) -> SufficientStats:
        return self.models[0].own_stats(time)

    def learn_many(self, xs: np.ndarray, ys: np.ndarray, times: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        ys = np.asarray(ys, dtype=np.float64)
        t_before = self.models[0].time
        preds = [m.learn_many(xs, ys, times) for m in self.models]
        mu = np.stack([p[0] for p in preds])  # (J, T)
        var = np.stack([p[1] for p in preds])
        lp = -0.5 * (np.log(2 * np.pi * var) + (ys - mu) ** 2 / var)
        if times is None:
            start = t_before if math.isfinite(t_before) else 0.0
            times = start + np.arange(1, ys.shape[0] + 1, dtype=np.float64)
        times = np.asarray(times, dtype=np.float64)
        g = self.models[0].forgetting
        means, variances = np.empty(ys.shape[0]), np.empty(ys.shape[0])
        prev = t_before
        for t in range(ys.shape[0]):
            if g != 1.0 and math.isfinite(prev) and times[t] > prev:
                self.log_score *= g ** (times[t] - prev)
            prev = times[t]
            w = self.weights()
            means[t] = w @ mu[:, t]
            variances[t] = w @ (var[:, t] + mu[:, t] ** 2) - means[t] ** 2
            self.log_score += lp[:, t]
        variances = np.maximum(variances, 1e-300)
        self.metrics.update_many(means, variances, ys)
        return means, variances

    def make_upload(self) -> HierUpload | None:
        ups = [m.make_upload() for m in self.models]  # identical statistics; each model tracks its own
        return ups[0]

    def apply_global(self, gs: Sequence[HierGlobal | None]) -> bool:
        """Install one global per model (`None`: that model keeps what it has)."""
        if len(gs) != len(self.models):
            raise ValueError(f"expected {len(self.models)} globals, one per τ, got {len(gs)}")
        out = [m.apply_global(g) for m, g in zip(self.models, gs, strict=True) if g is not None]
        return bool(out) and out[0]
