"""URK-FedBNR as a River regressor: one client with a private server (a fleet of one)."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from river import base

from streamfed.algorithms.calibration import PrequentialCalibration
from streamfed.algorithms.urk.client import URKClient
from streamfed.algorithms.urk.network import URKArch, initial_weights, omega
from streamfed.algorithms.urk.server import URKServer
from streamfed.core.river_inputs import dict_to_vector, gaussian, require_positive, sorted_keys
from streamfed.core.standardise import StreamScales

if TYPE_CHECKING:
    from river.proba import Gaussian

__all__ = ["URKRegressor"]


def _finite_target(y: Any) -> float:
    try:
        v = float(y)
    except (TypeError, ValueError) as e:
        raise ValueError(f"target {y!r} is not a number") from e
    with np.errstate(over="ignore"):
        if not (math.isfinite(v) and math.isfinite(v * v)):
            raise ValueError(f"target {y!r} (or its square) is not finite")
    return v


class URKRegressor(base.Regressor):
    """A streaming Bayesian regressor on a learned URK kernel: the local-only URK-FedBNR.

    Keys are mapped to an input vector in sorted order, fixed at the first `learn_one` (which builds the
    network from `seed`; `widths=None`: the identity extractor, plain RFF with a learned lengthscale per input —
    None, not `()`, because River's cloning reads a tuple parameter's first item); later a missing key reads 0
    and an unknown one is ignored; a None, NaN or non-numeric value raises `ValueError` and changes nothing.
    Every `sync_every` samples the pending statistics (and, where torch is installed and `learn_kernel`, the
    chunks of a local fit) go to the private server, whose global comes back — a new kernel version when a
    fit was proposed, into which the reservoir is re-embedded. With `standardise` (default) inputs and target
    are standardised online from past samples only and predictions mapped back. With `calibrate` (default) the
    predictive variance is scaled by a conformal factor of the past prequential residuals (each `predict_one`
    followed by `learn_one` of the same input, :mod:`streamfed.algorithms.calibration`); the mean never is.

    >>> from river import datasets, evaluate, metrics
    >>> model = URKRegressor(n_omega=8, widths=(4,), fit_every=64)
    >>> evaluate.progressive_val_score(datasets.TrumpApproval().take(200), model, metrics.MAE())
    MAE: ...
    >>> model.predict_one({"ordinal_date": 736389, "gallup": 43.8, "ipsos": 46.2, "morning_consult": 48.0,
    ...                    "rasmussen": 44.1, "you_gov": 43.2}, with_dist=True)
    𝒩(μ=..., σ=...)
    """

    def __init__(self, widths: tuple[int, ...] | None = (16, 4), n_omega: int = 16, shifter_width: int = 0,
                 lengthscale: float | None = None, sigma: float = 0.5, lam: float = 1.0, learn_kernel: bool = True,
                 sync_every: int = 32, reservoir: int = 256, fit_every: int = 128, fit_steps: int = 10,
                 learning_rate: float = 0.01, seed: int = 0, standardise: bool = True,
                 calibrate: bool = True) -> None:
        self.widths = widths
        self.n_omega = n_omega
        self.shifter_width = shifter_width
        self.lengthscale = lengthscale
        self.sigma = sigma
        self.lam = lam
        self.learn_kernel = learn_kernel
        self.sync_every = sync_every
        self.reservoir = reservoir
        self.fit_every = fit_every
        self.fit_steps = fit_steps
        self.learning_rate = learning_rate
        self.seed = seed
        self.standardise = standardise
        self.calibrate = calibrate
        if int(n_omega) < 2 or int(sync_every) < 1 or int(reservoir) < 2 or any(int(w) < 1 for w in widths or ()):
            raise ValueError("n_omega must be >= 2, sync_every >= 1, reservoir >= 2, widths >= 1")
        require_positive(self, ["lengthscale", "sigma", "lam", "learning_rate"])
        self._keys: list[Any] | None = None
        self.client: URKClient | None = None
        self.server: URKServer | None = None
        self._scales: StreamScales | None = None
        self._calibration = PrequentialCalibration() if calibrate else None

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        yield {"n_omega": 6, "widths": (3,)}
        yield {"n_omega": 4, "widths": None, "sync_every": 8, "fit_every": 16, "fit_steps": 2, "standardise": False}

    # ------------------------------------------------------------------ plumbing
    def _build(self, keys: list[Any]) -> None:
        if not keys:
            raise ValueError("cannot build a model from an input with no features")
        arch = URKArch(len(keys), tuple(int(w) for w in self.widths or ()), int(self.n_omega), int(self.shifter_width))
        ls = self.lengthscale if self.lengthscale is not None else math.sqrt(2.0 * arch.latent)
        w = initial_weights(arch, int(self.seed), lengthscale=float(ls), sigma=float(self.sigma), lam=float(self.lam))
        om = omega(arch, int(self.seed))
        self.client = URKClient(w, om, "local", client_id="local", min_upload=int(self.sync_every),
                                learn_kernel=bool(self.learn_kernel), reservoir=int(self.reservoir),
                                fit_every=int(self.fit_every), fit_steps=int(self.fit_steps),
                                learning_rate=float(self.learning_rate), seed=int(self.seed))
        # one client: every proposal is the whole fleet's, so a single one moves the version
        self.server = URKServer(w, om, "local", min_samples=int(self.sync_every), learn_kernel=bool(self.learn_kernel),
                                min_proposal_weight=1.0, proposal_quorum=1.0, max_proposal_weight=float(self.reservoir))
        self._keys = keys
        if self.standardise:
            self._scales = StreamScales(len(keys))

    def _sync(self) -> None:
        assert self.client is not None and self.server is not None
        sent = False
        while (up := self.client.take_update()) is not None:
            from streamfed.algorithms.urk.wire import UPDATE, read_update
            from streamfed.wire.message import Message

            msg = Message("local", "local", UPDATE, int(up.seq or 0), up.global_version, "local", up.n_samples, 0.0,
                          dict(up.arrays), epoch=up.epoch)
            self.server.apply(read_update(msg, self.client.weights.arch, "local"))
            sent = True
        if sent:
            self.client.apply_global(self.server.publish())

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
            self.client.learn(xv, yv)
        else:
            self._scales.learn(xv, yv, self.client.learn)
        if self.client.n_pending >= int(self.sync_every) or self.client.queue:
            self._sync()
        calibration = getattr(self, "_calibration", None)
        if calibration is not None:
            calibration.learned(x, yv)

    def predict_one(self, x: dict, with_dist: bool = False) -> float | Gaussian:
        if self.client is None or self._keys is None:
            # the prior predictive: σ² + λ²‖s‖², ‖s‖² = m/(m−1)
            m = int(self.n_omega)
            mu, var = 0.0, float(self.sigma) ** 2 + float(self.lam) ** 2 * m / (m - 1)
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

    def learn_many(self, xs: Any, ys: Any) -> None:
        """Learn the rows of a `(T, d)` array (columns in sorted-key order): the same as a loop of `learn_one`.
        Bad input changes nothing."""
        arr = np.asarray(xs, dtype=np.float64)
        keys = self._keys or list(range(arr.shape[1] if arr.ndim == 2 else 0))
        yarr = np.asarray(ys, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != len(keys) or yarr.shape != (arr.shape[0],) \
                or not np.all(np.isfinite(arr)) or not np.all(np.isfinite(yarr * yarr)):
            raise ValueError(f"expected finite xs (T, {len(keys)}) and ys (T,), got {arr.shape} and {yarr.shape}")
        before = copy.deepcopy(self.__dict__)
        try:
            for row, target in zip(arr, yarr, strict=True):
                self.learn_one(dict(zip(keys, row.tolist(), strict=True)), float(target))
        except ValueError:
            self.__dict__.update(before)
            raise
