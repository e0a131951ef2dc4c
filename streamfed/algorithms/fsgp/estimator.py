"""FSGP as a River regressor: one client with a private server (docs/algorithms.md, "FSGP")."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from river import base

from streamfed.algorithms.calibration import PrequentialCalibration
from streamfed.algorithms.fsgp.client import FSGPClient, finite_target
from streamfed.algorithms.fsgp.design import gaussian_design
from streamfed.algorithms.fsgp.kernels import KINDS, Hyper
from streamfed.algorithms.fsgp.server import FSGPServer
from streamfed.core.river_inputs import dict_to_vector, gaussian, learn_rows, require_positive, sorted_keys
from streamfed.core.standardise import StreamScales

if TYPE_CHECKING:
    from river.proba import Gaussian

__all__ = ["FSGPRegressor"]


class FSGPRegressor(base.Regressor):
    """A streaming sparse GP regressor: a fleet of one (the local-only FSGP).

    Keys are mapped to an input vector in sorted order, fixed at the first `learn_one` (which builds the
    model: `M = n_inducing` inducing inputs from the data-free Gaussian design; `lengthscale` None starts
    every `ℓ_d` at `√(2d)`); later a missing key reads 0 and an unknown one is ignored; a None, NaN or
    non-numeric value raises `ValueError` and changes nothing. Every `sync_every` samples the pending
    statistics (and a local fit of `θ, σ, Z` on the reservoir, when `learn_hyperparameters`) go to the
    private server, whose global comes back — carried to new hyperparameters by the Bui projection when
    they moved. With `standardise` (default) inputs and target are standardised online from past samples
    only and predictions mapped back. With `calibrate` (default) the predictive variance is scaled by a conformal
    factor of the past prequential residuals (each `predict_one` followed by `learn_one` of the same input,
    :mod:`streamfed.algorithms.calibration`); the mean never is.

    >>> from river import datasets, evaluate, metrics
    >>> model = FSGPRegressor(n_inducing=8)
    >>> evaluate.progressive_val_score(datasets.TrumpApproval().take(200), model, metrics.MAE())
    MAE: ...
    >>> model.predict_one({"ordinal_date": 736389, "gallup": 43.8, "ipsos": 46.2, "morning_consult": 48.0,
    ...                    "rasmussen": 44.1, "you_gov": 43.2}, with_dist=True)
    𝒩(μ=..., σ=...)
    """

    def __init__(self, n_inducing: int = 16, kernel: str = "se", lengthscale: float | None = None,
                 amplitude: float = 1.0, sigma: float = 0.5, learn_hyperparameters: bool = True,
                 sync_every: int = 32, reservoir: int = 256, fit_every: int = 64, fit_steps: int = 10,
                 learning_rate: float = 0.05, jitter: float = 1e-6, seed: int = 0, standardise: bool = True,
                 calibrate: bool = True) -> None:
        self.n_inducing = n_inducing
        self.kernel = kernel
        self.lengthscale = lengthscale
        self.amplitude = amplitude
        self.sigma = sigma
        self.learn_hyperparameters = learn_hyperparameters
        self.sync_every = sync_every
        self.reservoir = reservoir
        self.fit_every = fit_every
        self.fit_steps = fit_steps
        self.learning_rate = learning_rate
        self.jitter = jitter
        self.seed = seed
        self.standardise = standardise
        self.calibrate = calibrate
        if int(n_inducing) < 1 or int(sync_every) < 1 or int(reservoir) < 2:
            raise ValueError("n_inducing and sync_every must be >= 1, reservoir >= 2")
        if kernel not in KINDS:
            raise ValueError(f"kernel must be one of {KINDS}, got {kernel!r}")
        require_positive(self, ["lengthscale", "amplitude", "sigma", "jitter", "learning_rate"])
        self._keys: list[Any] | None = None
        self.client: FSGPClient | None = None
        self.server: FSGPServer | None = None
        self._scales: StreamScales | None = None
        self._calibration = PrequentialCalibration() if calibrate else None

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        yield {"n_inducing": 6}
        yield {"n_inducing": 5, "kernel": "matern32", "sync_every": 8, "fit_every": 16, "fit_steps": 3,
               "standardise": False}

    # ------------------------------------------------------------------ plumbing
    def _build(self, keys: list[Any]) -> None:
        if not keys:
            raise ValueError("cannot build a model from an input with no features")
        Z = gaussian_design(int(self.n_inducing), len(keys), seed=int(self.seed))
        ls = self.lengthscale if self.lengthscale is not None else math.sqrt(2.0 * len(keys))
        hyper = Hyper.initial(self.kernel, Z, amplitude=self.amplitude, lengthscale=ls, sigma=self.sigma)
        self.client = FSGPClient(hyper, jitter=self.jitter, min_upload=int(self.sync_every), client_id="local",
                                 learn_hyperparameters=bool(self.learn_hyperparameters),
                                 reservoir=int(self.reservoir), fit_every=int(self.fit_every),
                                 fit_steps=int(self.fit_steps), learning_rate=float(self.learning_rate),
                                 seed=int(self.seed))
        # one client: every proposal is the whole fleet's, so a single one moves the version
        self.server = FSGPServer(hyper, jitter=self.jitter, min_samples=int(self.sync_every),
                                 learn_hyperparameters=bool(self.learn_hyperparameters), min_proposal_weight=1.0)
        self._keys = keys
        if self.standardise:  # inputs winsorised at ±INPUT_CLIP, as every default estimator (never the target)
            self._scales = StreamScales(len(keys))

    def _sync(self) -> None:
        assert self.client is not None and self.server is not None
        up = self.client.make_upload()
        if up is not None:
            self.server.apply(up)
            self.client.apply_global(self.server.publish())

    # ------------------------------------------------------------------ River protocol
    def learn_one(self, x: dict, y: base.typing.RegTarget) -> None:
        if self.client is None:
            keys = sorted_keys(x)
            dict_to_vector(keys, x)  # validate before building anything
            finite_target(y)  # type: ignore[arg-type]
            self._build(keys)
        assert self.client is not None and self._keys is not None
        xv = dict_to_vector(self._keys, x)
        yv = finite_target(y)  # type: ignore[arg-type]
        if self._scales is None:
            self.client.learn(xv, yv)
        else:
            self._scales.learn(xv, yv, self.client.learn)
        if self.client.n_pending >= int(self.sync_every):
            self._sync()
        calibration = getattr(self, "_calibration", None)
        if calibration is not None:
            calibration.learned(x, yv)

    def predict_one(self, x: dict, with_dist: bool = False) -> float | Gaussian:
        if self.client is None or self._keys is None:
            mu, var = 0.0, float(self.amplitude) ** 2 + float(self.sigma) ** 2  # the prior predictive
        elif self._scales is None:
            mu, var = self.client.predict(dict_to_vector(self._keys, x))
        else:
            mu, var = self._scales.predict(dict_to_vector(self._keys, x), self.client.predict)  # type: ignore[assignment]
        calibration = getattr(self, "_calibration", None)  # (None in an estimator pickled before it existed)
        if calibration is not None:
            var = calibration.predicted(x, float(mu), float(var))
        if not with_dist:
            return float(mu)
        return gaussian(float(mu), float(var))

    # ------------------------------------------------------------------ array path
    def learn_many(self, xs: Any, ys: Any) -> None:
        """Learn the rows of a `(T, d)` array (columns in sorted-key order; a DataFrame is selected by key):
        the same as a loop of `learn_one`. Bad input changes nothing."""
        learn_rows(self, self._keys, xs, ys, square_finite=True)

    def predict_dist_many(self, xs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Predictive means and variances of the rows of a `(T, d)` array (the variances calibrated, if on)."""
        arr = np.asarray(xs[self._keys].to_numpy() if hasattr(xs, "columns") else xs, dtype=np.float64)
        if self.client is None:
            mean, var = (np.zeros(arr.shape[0]),
                         np.full(arr.shape[0], float(self.amplitude) ** 2 + float(self.sigma) ** 2))
        elif self._scales is None:
            mean, var = self.client.predict_many(arr)
        else:
            mean, var = self._scales.predict_many(arr, self.client.predict_many)
        calibration = getattr(self, "_calibration", None)
        return mean, var * (1.0 if calibration is None else calibration.calibration.scale)

    def predict_many(self, xs: Any) -> np.ndarray:
        """Predictive means of the rows of a `(T, d)` array."""
        return self.predict_dist_many(xs)[0]
