"""pFedGP as a River classifier: one client with a private server (a fleet of one — the network is refined by
the client's own local updates, each adopted at once).

Labels may be any hashables: each new label takes the next class index (no limit unless `max_classes` is
set). The probabilities are over the labels seen so far, each strictly inside (0, 1) once two are known.

Bounded cost on the defaults: the budget holds at most `max_budget` samples in all (`budget` per class while
they fit), and refreshes and local updates draw on a work credit of `work_per_sample` units per sample
(:mod:`.cost`), so predict + learn costs what the budget costs, however many classes or samples come.

>>> from river import datasets, evaluate, metrics
>>> model = PFedGPClassifier(widths=(8,), n_omega=8, budget=16, fit_every=50, fit_steps=2)
>>> evaluate.progressive_val_score(datasets.Phishing().take(150), model, metrics.Accuracy())
Accuracy: ...
>>> sorted(model.predict_proba_one({"empty_server_form_handler": 0.0, "popup_window": 0.5}))
[False, True]
"""

from __future__ import annotations

import copy
import math
from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np
from river import base

from streamfed.algorithms.pfedgp.client import PFedGPClient
from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of
from streamfed.algorithms.pfedgp.server import PFedGPServer
from streamfed.algorithms.pfedgp.wire import UPDATE, read_update
from streamfed.algorithms.urk.network import URKArch
from streamfed.core.river_inputs import dict_to_vector, sorted_keys
from streamfed.core.standardise import INPUT_CLIP, OnlineStandardiser
from streamfed.wire.message import Message

__all__ = ["PFedGPClassifier"]


class PFedGPClassifier(base.Classifier):
    """A streaming GP-Tree classifier on a learned deep kernel (local-only pFedGP; `inducing > 0`: FITC).

    Keys are mapped to an input vector in sorted order, fixed at the first `learn_one`; a missing key reads 0,
    an unknown one is ignored; a None, NaN or non-numeric value raises `ValueError` and changes nothing. Inputs
    are standardised online from past samples only (winsorised at ±5 σ) when `standardise`.

    The kernel is the RBF on the learned embedding plus, unless `linear` is None, a linear part on the
    (standardised) inputs with a bias, of initial scale `linear`, learned with the network (:mod:`.kernels`):
    a linear boundary is then in the prior, not left for the network to find."""

    def __init__(self, max_classes: int | None = None, widths: tuple[int, ...] = (16,), n_omega: int = 16,
                 lengthscale: float = 0.5, outputscale: float = 8.0, inducing: int = 0, budget: int = 256,
                 chains: int = 4, gibbs_steps: int = 2, burn_in: int = 10, refresh_every: int = 1,
                 learn_kernel: bool = True, objective: str = "predictive", fit_every: int = 64, fit_steps: int = 5,
                 learning_rate: float = 0.01, seed: int = 0, standardise: bool = True, max_budget: int | None = 512,
                 work_per_sample: float | None = 2.0**25, smoothing: float = 1e-6, linear: float | None = 1.0) -> None:
        self.max_classes = max_classes
        self.linear = linear
        self.max_budget = max_budget
        self.work_per_sample = work_per_sample
        self.smoothing = smoothing
        self.widths = widths
        self.n_omega = n_omega
        self.lengthscale = lengthscale
        self.outputscale = outputscale
        self.inducing = inducing
        self.budget = budget
        self.chains = chains
        self.gibbs_steps = gibbs_steps
        self.burn_in = burn_in
        self.refresh_every = refresh_every
        self.learn_kernel = learn_kernel
        self.objective = objective
        self.fit_every = fit_every
        self.fit_steps = fit_steps
        self.learning_rate = learning_rate
        self.seed = seed
        self.standardise = standardise
        if (max_classes is not None and int(max_classes) < 2) or objective not in ("predictive", "marginal"):
            raise ValueError("max_classes None or >= 2; objective 'predictive' or 'marginal'")
        if max_budget is not None and int(max_budget) < 1:
            raise ValueError(f"max_budget must be None or >= 1, got {max_budget!r}")
        if linear is not None and not (math.isfinite(float(linear)) and 1e-3 <= float(linear) <= 1e3):
            raise ValueError(f"linear must be None or within [1e-3, 1e3], got {linear!r}")
        if linear is not None and int(inducing) > 0:
            raise ValueError("the kernel's linear part is for the full GP: linear=None when inducing > 0")
        for name in ("lengthscale", "outputscale", "learning_rate"):
            v = float(getattr(self, name))
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be finite and > 0, got {v!r}")
        self._keys: list[Any] | None = None
        self._labels: list[Hashable] = []
        self.client: PFedGPClient | None = None
        self.server: PFedGPServer | None = None
        self._scales: OnlineStandardiser | None = None
        self._last: tuple[bytes, int, int, np.ndarray] | None = None  # the last prediction, for learn_one to reuse

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        yield {"widths": (4,), "n_omega": 4, "budget": 8, "fit_every": 400, "fit_steps": 1, "chains": 3,
               "refresh_every": 4}
        yield {"widths": (3,), "n_omega": 4, "budget": 8, "inducing": 4, "learn_kernel": False, "chains": 3,
               "refresh_every": 4, "standardise": False, "linear": None}

    @property
    def _multiclass(self) -> bool:
        return True

    def _build(self, keys: list[Any]) -> None:
        if not keys:
            raise ValueError("cannot build a model from an input with no features")
        layout = Layout(URKArch(len(keys), tuple(int(w) for w in self.widths), int(self.n_omega)), int(self.inducing),
                        linear=self.linear is not None)
        ls = math.sqrt(2.0 * layout.arch.latent)
        theta = initial_theta(layout, int(self.seed), lengthscale=ls,
                              linear_scale=1.0 if self.linear is None else float(self.linear))
        self.client = PFedGPClient(
            layout, theta, omega_of(layout, int(self.seed)), n_classes=max(2, len(self._labels)), client_id="local",
            budget=int(self.budget), lengthscale=float(self.lengthscale), outputscale=float(self.outputscale),
            chains=int(self.chains), gibbs_steps=int(self.gibbs_steps), burn_in=int(self.burn_in),
            refresh_every=int(self.refresh_every), learn_kernel=bool(self.learn_kernel), objective=self.objective,
            fit_every=int(self.fit_every), fit_steps=int(self.fit_steps), learning_rate=float(self.learning_rate),
            max_chunk_numbers=1 << 30, seed=int(self.seed), max_budget=self.max_budget,
            work_per_sample=self.work_per_sample, smoothing=float(self.smoothing))
        self.server = PFedGPServer(theta, min_proposal_weight=1e-9)  # one client: its proposal is the fleet's
        self._keys = keys
        self._scales = OnlineStandardiser(len(keys), clip=INPUT_CLIP) if self.standardise else None

    def _inputs(self, x: dict) -> np.ndarray:
        assert self._keys is not None
        v = dict_to_vector(self._keys, x)
        return v if self._scales is None else self._scales.transform(v)

    def learn_one(self, x: dict, y: Hashable) -> None:
        if self.client is None:
            keys = sorted_keys(x)
            dict_to_vector(keys, x)  # validate before building anything
            self._build(keys)
        assert self.client is not None and self.server is not None and self._keys is not None
        raw = dict_to_vector(self._keys, x)
        new = y not in self._labels
        if new and self.max_classes is not None and len(self._labels) >= int(self.max_classes):
            raise ValueError(f"more than max_classes = {self.max_classes} labels")
        scales = copy.deepcopy(self._scales)
        if scales is not None:
            scales.update(raw)  # raises before anything changes
        v = self._inputs(x)
        probs = None
        if self._last is not None and self._last[:3] == (v.tobytes(), self.client.n, self.client.refreshes):
            probs = self._last[3]  # predict_proba_one just computed it, on the same model
        c = len(self._labels) if new else self._labels.index(y)
        if c >= self.client.n_classes:
            self.client.grow(c + 1)
            probs = None
        self.client.learn(v, float(c), probs)
        if new:
            self._labels.append(y)
        self._scales = scales
        self._last = None
        while (up := self.client.take_update()) is not None:
            self.server.apply(read_update(Message("local", "local", UPDATE, int(up.seq or 0),
                                                  up.global_version, "", 0, 0.0, dict(up.arrays), epoch=up.epoch)))
            self.client.apply_global(self.server.publish())

    def predict_proba_one(self, x: dict) -> dict[Hashable, float]:
        if self.client is None or not self._labels:
            return {}
        v = self._inputs(x)
        p = self.client.predict(v)
        self._last = (v.tobytes(), self.client.n, self.client.refreshes, p)
        q = p[: len(self._labels)]
        q = q / q.sum()  # over the labels seen (a slot not yet named holds the smoothing's share)
        return {label: float(q[i]) for i, label in enumerate(self._labels)}
