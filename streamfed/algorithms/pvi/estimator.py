"""PVI's River estimators, each one client with a private server (docs/algorithms.md, "PVI"): the regressor
(Gaussian likelihood) and the binary classifier (Bernoulli likelihood; its class label is never standardised:
it is the likelihood's `y ∈ {0, 1}`)."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from river import base

from streamfed.algorithms.pvi.client import PVIClient
from streamfed.algorithms.pvi.server import PVIServer
from streamfed.core.river_inputs import dict_to_vector, gaussian, learn_rows, sorted_keys
from streamfed.core.standardise import INPUT_CLIP, OnlineStandardiser, StreamScales

if TYPE_CHECKING:
    from river.proba import Gaussian


__all__ = ["PVIClassifier", "PVIRegressor"]


def _finite_target(y: Any) -> float:
    """`y` as a float; `ValueError` for a None, NaN, infinite or non-numeric target."""
    if y is None or isinstance(y, (str, bytes, bool)):
        raise ValueError(f"target {y!r} is not a finite number")
    try:
        v = float(y)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"target {y!r} is not a finite number") from exc
    if not math.isfinite(v):
        raise ValueError(f"target {y!r} is not a finite number")
    return v


def _fleet_of_one(p: Any, n_inputs: int, seed: int) -> tuple[PVIClient, PVIServer]:
    """A client and its private server for the settings `p`. The estimator refines (and syncs) the client itself
    every `refine_every` samples (:func:`_refine_and_sync`): the client never does on its own."""
    from streamfed.algorithms.pvi import initial_state_of, refine_settings

    client = PVIClient(initial_state_of(p, n_inputs, seed), refine_settings(p), client_id="local",
                       reservoir=p.reservoir, refine_every=sys.maxsize, predict_draws=p.predict_draws, seed=seed,
                       jitter=p.jitter, streaming=p.streaming, calibrate=p.calibrate)
    server = PVIServer(initial_state_of(p, n_inputs, seed), n_pseudo=p.n_pseudo,
                       parameterisation=p.parameterisation, asynchronous=True, max_factors=1)
    return client, server


def _refine_and_sync(client: PVIClient, server: PVIServer) -> bool:
    """Refine the client's factor on its reservoir and install the private server's new state; False when the
    refinement was skipped for want of torch (learning and predicting go on)."""
    try:
        refined = client.refine()
    except ImportError:
        return False
    f = client.take_factor() if refined else None
    if f is not None and server.receive(f):
        client.install(server.publish())
    return True


class PVIRegressor(base.Regressor):
    """A streaming PVI sparse-GP regressor (Gaussian likelihood): a fleet of one.

    Keys are mapped to an input vector in sorted order, fixed at the first `learn_one` (which builds the
    model: `M = n_inducing` inducing inputs from the data-free Gaussian design, the fleet's version 0;
    `lengthscale` None starts every `ℓ_d` at `√(2d)`); later a missing key reads 0 and an unknown one is
    ignored; a None, NaN or non-numeric value (input or target) raises `ValueError` and changes nothing.
    Every `refine_every` samples the client refines its factor (`steps` Adam steps on its reservoir) and
    it goes to the private server, whose new state comes back; in between (`streaming`, default) each
    sample is absorbed into its local factor exactly (the conjugate update, :mod:`.streaming`). The
    refinement needs torch: without it the regressor still learns (its reservoir, its scales and, with
    `streaming`, its local factor) and predicts from that, the refinement skipped and counted in `n_skipped`.
    With `calibrate` (default) the predictive variance is scaled online so that the 95% interval covers
    95% of the past residuals (:mod:`.calibration`). With `standardise` (default) inputs and target are standardised
    online from past samples only and predictions mapped back. `likelihood` is `"gaussian"`, its only one:
    another (`"bernoulli"`) is a `ValueError` that names :class:`PVIClassifier`.

    >>> from river import datasets, evaluate, metrics
    >>> model = PVIRegressor(n_inducing=8, n_pseudo=8, steps=10, predict_draws=2)
    >>> evaluate.progressive_val_score(datasets.TrumpApproval().take(200), model, metrics.MAE())
    MAE: ...
    >>> model.predict_one({"ordinal_date": 736389, "gallup": 43.8, "ipsos": 46.2, "morning_consult": 48.0,
    ...                    "rasmussen": 44.1, "you_gov": 43.2}, with_dist=True)
    𝒩(μ=..., σ=...)
    """

    def __init__(self, n_inducing: int = 16, n_pseudo: int = 16, kernel: str = "se", inducing: str = "hvm",
                 parameterisation: str = "dpo", learn_beta: bool = False, lengthscale: float | None = None,
                 amplitude: float = 1.0, sigma: float = 0.5, alpha: float = 0.1, reservoir: int = 256,
                 refine_every: int = 64, steps: int = 30, learning_rate: float = 0.01, mc_samples: int = 1,
                 predict_draws: int = 8, jitter: float = 1e-6, seed: int = 0, standardise: bool = True,
                 likelihood: str = "gaussian", streaming: bool = True, calibrate: bool = True) -> None:
        if likelihood != "gaussian":  # the one likelihood of a regressor; a binary label is PVIClassifier's
            raise ValueError(f"PVIRegressor's likelihood is 'gaussian', got {likelihood!r}: for a binary label "
                             "(Bernoulli likelihood) use PVIClassifier (streamfed.algorithms.pvi.estimator)")
        self.likelihood = likelihood
        self.n_inducing = n_inducing
        self.n_pseudo = n_pseudo
        self.kernel = kernel
        self.inducing = inducing
        self.parameterisation = parameterisation
        self.learn_beta = learn_beta
        self.lengthscale = lengthscale
        self.amplitude = amplitude
        self.sigma = sigma
        self.alpha = alpha
        self.reservoir = reservoir
        self.refine_every = refine_every
        self.steps = steps
        self.learning_rate = learning_rate
        self.mc_samples = mc_samples
        self.predict_draws = predict_draws
        self.jitter = jitter
        self.seed = seed
        self.standardise = standardise
        self.streaming = streaming
        self.calibrate = calibrate
        self._params()  # validated now (a pydantic ValidationError is a ValueError), not at the first sample
        self._keys: list[Any] | None = None
        self.client: PVIClient | None = None
        self.server: PVIServer | None = None
        self._scales: StreamScales | None = None
        self.n_skipped = 0  # refinements skipped for want of torch

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        yield {"n_inducing": 4, "n_pseudo": 4, "refine_every": 100, "steps": 3, "predict_draws": 2}
        yield {"n_inducing": 3, "n_pseudo": 3, "kernel": "matern32", "inducing": "fixed", "refine_every": 150,
               "steps": 2, "predict_draws": 0, "reservoir": 64, "standardise": False}

    # ------------------------------------------------------------------ plumbing
    def _params(self) -> Any:
        from streamfed.algorithms.pvi import PVIParams

        return PVIParams(likelihood="gaussian", kernel=self.kernel, inducing=self.inducing,
                         parameterisation=self.parameterisation, learn_beta=self.learn_beta,
                         n_inducing=self.n_inducing, n_pseudo=self.n_pseudo, amplitude=self.amplitude,
                         lengthscale=self.lengthscale, sigma=self.sigma, alpha=self.alpha, reservoir=self.reservoir,
                         refine_every=self.refine_every, steps=self.steps, learning_rate=self.learning_rate,
                         mc_samples=self.mc_samples, predict_draws=self.predict_draws, jitter=self.jitter,
                         max_factors=1, streaming=getattr(self, "streaming", True),
                         calibrate=getattr(self, "calibrate", True))

    def _build(self, keys: list[Any]) -> None:
        if not keys:
            raise ValueError("cannot build a model from an input with no features")
        self.client, self.server = _fleet_of_one(self._params(), len(keys), int(self.seed))
        self._keys = keys
        if self.standardise:  # inputs winsorised at ±INPUT_CLIP, as every default estimator (never the target)
            self._scales = StreamScales(len(keys))

    def _learn(self, x: np.ndarray, y: float) -> None:
        """The client learns one sample (standard units); refine and sync every `refine_every`."""
        assert self.client is not None and self.server is not None
        self.client.learn(x, y)
        if self.client.n % int(self.refine_every) == 0 and not _refine_and_sync(self.client, self.server):
            self.n_skipped += 1

    def _prior(self) -> tuple[float, float]:
        return 0.0, float(self.amplitude) ** 2 + float(self.sigma) ** 2

    # ------------------------------------------------------------------ River protocol
    def learn_one(self, x: dict, y: base.typing.RegTarget) -> None:
        if self.client is None:
            keys = sorted_keys(x)
            dict_to_vector(keys, x)  # validate before building anything
            _finite_target(y)
            self._build(keys)
        assert self.client is not None and self._keys is not None
        xv = dict_to_vector(self._keys, x)
        yv = _finite_target(y)
        if self._scales is None:
            self._learn(xv, yv)
        else:
            self._scales.learn(xv, yv, self._learn)

    def predict_one(self, x: dict, with_dist: bool = False) -> float | Gaussian:
        if self.client is None or self._keys is None:
            mu, var = self._prior()
        elif self._scales is None:
            mu, var = self.client.predict(dict_to_vector(self._keys, x))
        else:
            mu, var = self._scales.predict(dict_to_vector(self._keys, x), self.client.predict)  # type: ignore[assignment]
        if not with_dist:
            return float(mu)
        return gaussian(float(mu), float(var))

    # ------------------------------------------------------------------ array path
    def learn_many(self, xs: Any, ys: Any) -> None:
        """Learn the rows of a `(T, d)` array (columns in sorted-key order; a DataFrame is selected by key):
        the same as a loop of `learn_one`. Bad input changes nothing."""
        learn_rows(self, self._keys, xs, ys)

    def predict_dist_many(self, xs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Predictive means and variances of the rows of a `(T, d)` array."""
        arr = np.asarray(xs[self._keys].to_numpy() if hasattr(xs, "columns") else xs, dtype=np.float64)
        if self.client is None:
            m, v = self._prior()
            return np.full(arr.shape[0], m), np.full(arr.shape[0], v)
        if self._scales is None:
            return self.client.predict_many(arr)
        return self._scales.predict_many(arr, self.client.predict_many)

    def predict_many(self, xs: Any) -> np.ndarray:
        """Predictive means of the rows of a `(T, d)` array."""
        return self.predict_dist_many(xs)[0]


class PVIClassifier(base.Classifier):
    """A streaming PVI sparse-GP classifier (Bernoulli likelihood `p(y | f) = sigmoid((2y − 1) f)`): a fleet
    of one, for two classes.

    Keys are mapped to an input vector in sorted order, fixed at the first `learn_one`; later a missing key
    reads 0 and an unknown one is ignored; a None, NaN or non-numeric input raises `ValueError` and changes
    nothing. Labels are River's binary ones, `True`/`False` (or `1`/`0`); another label raises `ValueError`
    and changes nothing. Every `refine_every` samples
    the client refines its factor on its reservoir and the private server's new state comes back; in between
    (`streaming`, default) each sample is absorbed into its local factor by one Newton step. With
    `standardise` (default) the *inputs* are standardised online from past samples only (winsorised at
    ±5 σ) — never the label. `predict_proba_one` gives both classes' probabilities (the predictive mean
    `E[sigmoid(f)]` for `True`); before the first sample, ½ each.

    >>> from river import datasets, evaluate, metrics
    >>> model = PVIClassifier(n_inducing=8, n_pseudo=8, steps=10, refine_every=32, predict_draws=2)
    >>> evaluate.progressive_val_score(datasets.Phishing().take(200), model, metrics.Accuracy())
    Accuracy: ...
    >>> sorted(model.predict_proba_one({"empty_server_form_handler": 0.0, "popup_window": 0.5,
    ...                                 "https": 1.0}))
    [False, True]
    """

    def __init__(self, n_inducing: int = 16, n_pseudo: int = 16, kernel: str = "se", inducing: str = "hvm",
                 parameterisation: str = "dpo", lengthscale: float | None = None, amplitude: float = 1.0,
                 alpha: float = 0.1, reservoir: int = 256, refine_every: int = 64, steps: int = 30,
                 learning_rate: float = 0.01, mc_samples: int = 1, predict_draws: int = 8, jitter: float = 1e-6,
                 seed: int = 0, standardise: bool = True, streaming: bool = True) -> None:
        self.n_inducing = n_inducing
        self.n_pseudo = n_pseudo
        self.kernel = kernel
        self.inducing = inducing
        self.parameterisation = parameterisation
        self.lengthscale = lengthscale
        self.amplitude = amplitude
        self.alpha = alpha
        self.reservoir = reservoir
        self.refine_every = refine_every
        self.steps = steps
        self.learning_rate = learning_rate
        self.mc_samples = mc_samples
        self.predict_draws = predict_draws
        self.jitter = jitter
        self.seed = seed
        self.standardise = standardise
        self.streaming = streaming
        self._params()  # validated now (a pydantic ValidationError is a ValueError), not at the first sample
        self._keys: list[Any] | None = None
        self.client: PVIClient | None = None
        self.server: PVIServer | None = None
        self._scales: OnlineStandardiser | None = None
        self.n_skipped = 0  # refinements skipped for want of torch

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        yield {"n_inducing": 4, "n_pseudo": 4, "refine_every": 100, "steps": 3, "predict_draws": 2}
        yield {"n_inducing": 3, "n_pseudo": 3, "kernel": "matern32", "inducing": "fixed", "refine_every": 150,
               "steps": 2, "predict_draws": 0, "reservoir": 64, "standardise": False}

    @property
    def _multiclass(self) -> bool:
        return False

    # ------------------------------------------------------------------ plumbing
    def _params(self) -> Any:
        from streamfed.algorithms.pvi import PVIParams

        return PVIParams(likelihood="bernoulli", kernel=self.kernel, inducing=self.inducing,
                         parameterisation=self.parameterisation, n_inducing=self.n_inducing,
                         n_pseudo=self.n_pseudo, amplitude=self.amplitude, lengthscale=self.lengthscale,
                         alpha=self.alpha, reservoir=self.reservoir, refine_every=self.refine_every,
                         steps=self.steps, learning_rate=self.learning_rate, mc_samples=self.mc_samples,
                         predict_draws=self.predict_draws, jitter=self.jitter, max_factors=1,
                         streaming=getattr(self, "streaming", True))

    def _build(self, keys: list[Any]) -> None:
        if not keys:
            raise ValueError("cannot build a model from an input with no features")
        self.client, self.server = _fleet_of_one(self._params(), len(keys), int(self.seed))
        self._keys = keys
        if self.standardise:
            self._scales = OnlineStandardiser(len(keys), clip=INPUT_CLIP)

    @staticmethod
    def _label(y: Any) -> float:
        """`y` as the likelihood's 0 or 1: `True`/`1` positive, `False`/`0` negative (River's binary labels);
        anything else is `ValueError`."""
        if isinstance(y, bool | np.bool_) or (isinstance(y, int | float | np.integer | np.floating) and y in (0, 1)):
            return 1.0 if y else 0.0
        raise ValueError(f"PVIClassifier is binary: labels are True/False or 1/0, got {y!r}")

    def _z(self, x: np.ndarray, fold: bool) -> np.ndarray | None:
        """`x` in standard units from the past (None before the scales are ready); `fold` folds it in."""
        if self._scales is None:
            return x
        z = self._scales.transform(x) if self._scales.ready else None
        if fold:
            self._scales.update(x)
        return z

    def _p_positive(self, x: np.ndarray) -> float:
        assert self.client is not None
        z = self._z(x, fold=False)
        if z is None:
            return 0.5
        return float(np.clip(self.client.predict(z)[0], 0.0, 1.0))

    # ------------------------------------------------------------------ River protocol
    def learn_one(self, x: dict, y: base.typing.ClfTarget) -> None:
        yv = self._label(y)
        if self.client is None:
            keys = sorted_keys(x)
            dict_to_vector(keys, x)  # validate before building anything
            self._build(keys)
        assert self.client is not None and self.server is not None and self._keys is not None
        xv = dict_to_vector(self._keys, x)
        scales = None if self._scales is None else self._scales.copy()
        try:
            z = self._z(xv, fold=True)
            if z is not None:
                self.client.learn(z, yv)
        except ValueError:
            self._scales = scales  # a refused sample changes nothing
            raise
        if z is not None and self.client.n % int(self.refine_every) == 0 \
                and not _refine_and_sync(self.client, self.server):
            self.n_skipped += 1

    def predict_proba_one(self, x: dict) -> dict[bool, float]:
        if self.client is None or self._keys is None:
            return {False: 0.5, True: 0.5}
        p = self._p_positive(dict_to_vector(self._keys, x))
        return {False: 1.0 - p, True: p}
