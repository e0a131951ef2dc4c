"""Online FedBNR as a River regressor (docs/algorithms.md §4.10): one client with a private server — local-only
FedBNR, the "fleet of one"; the federated runtime uses the two halves directly."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from river import base

from streamfed.algorithms.calibration import PrequentialCalibration
from streamfed.algorithms.fedbnr.checks import all_finite_squares, check_positive, check_target
from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.evidence import SEARCHES
from streamfed.algorithms.fedbnr.server import FedBNRServer
from streamfed.core.features import standardised_dictionary
from streamfed.core.river_inputs import dict_to_vector, gaussian, sorted_keys
from streamfed.core.standardise import StreamScales

if TYPE_CHECKING:
    from river.proba import Gaussian

__all__ = ["EVIDENCE_SEARCH", "LAZY_GAP", "REFIT_GROWTH", "FedBNRRegressor"]

# σ, λ refitted whenever the samples have grown by half (at 32, 48, 96, 160, 256, … samples: O(log n) evidence
# fits over a stream, each an eigendecomposition per kernel); MAE within 0.5% of a refit every 32 samples on every
# stream of benchmarks/bench_progressive.py (g = 1 moved one Friedman stream by 1.07%; fedbnr_refit.md)
REFIT_GROWTH = 0.5

# nats: a kernel whose evidence may be this far below the best one's (a weight below e⁻⁵⁰ ≈ 2·10⁻²², under the
# rounding of the mixture) is left out of it and not updated per sample (FedBNRClient's lazy kernels)
LAZY_GAP = 50.0

# how a refit maximises the evidence (evidence.fit_hyperparameters): the 1-d profile search over log(λ/σ) after a
# tridiagonal reduction, ~5× cheaper than the 2-d grid after an eigendecomposition and at least its evidence up
# to the zoom's resolution (issue 29; fedbnr_refit.md)
EVIDENCE_SEARCH = "profile"


class FedBNRRegressor(base.Regressor):
    """Online FedBNR as a River regressor: one client with a private server (local-only FedBNR).

    Dict keys are mapped to an input vector in sorted key order, fixed at the first `learn_one`
    (which also builds the feature map, so the number of inputs is known). Later, a missing key reads
    as 0 and an unknown key is ignored. A `None`, NaN or non-numeric value raises `ValueError` and
    leaves the model unchanged. The pending statistics are uploaded to the private server, which refits `σ, λ`
    by evidence and sends back a global, once at least `sync_every` samples are pending and the server's sample
    count has grown by the fraction `refit_growth = g` since the last fit (`g = 0.5`, the default: whenever the
    samples have grown by half; `g = 0`: every `sync_every` samples; never without `fit_hyperparameters`). A global
    without a refit would hold exactly the statistics the working posterior already has, so the model is the
    one a sync every `sync_every` samples gives.

    Parameters: `n_features` (`D`; `F = 2D + 1` with the bias), `bandwidth` (float, or a tuple of
    floats for a Gaussian bandwidth dictionary; by default `None`: a dictionary of `n_kernels`
    bandwidths for standardised inputs, :func:`~streamfed.core.features.standardised_dictionary`, whose
    predictions are mixed by evidence), `sigma`, `lam` (initial noise and prior scales),
    `forgetting` (`γ ∈ (0, 1]`), `seed` (random features), `standardise` (default on: every input and
    the target standardised online from past samples only,
    :class:`~streamfed.core.standardise.OnlineStandardiser`, predictions mapped back — mean
    `m + s·μ`, variance `s²·v`; the first two samples only set the scales and the prediction is then
    the running mean and variance), `calibrate` (default on: the predictive variance scaled by a conformal factor of
    the past prequential residuals — those of each `predict_one` followed by `learn_one` of the same input —,
    :mod:`streamfed.algorithms.calibration`; the mean is unchanged), `lazy_gap` (nats, default
    :data:`LAZY_GAP`; 0 = off: a kernel whose evidence is this far below the best one's is left out of the
    mixture — its weight is below `e^-lazy_gap` — and is not updated per sample until it may matter again,
    :class:`~streamfed.algorithms.fedbnr.client.FedBNRClient`), `evidence_search` (how a refit maximises the
    evidence, :func:`~streamfed.algorithms.fedbnr.evidence.fit_hyperparameters`: `"profile"`, the default, or
    `"grid"`, the fleet server's).

    >>> from river import datasets, evaluate, metrics
    >>> model = FedBNRRegressor(n_features=20)
    >>> evaluate.progressive_val_score(datasets.TrumpApproval().take(300), model, metrics.MAE())
    MAE: ...
    >>> x = {"a": 0.5, "b": -1.0}
    >>> model = FedBNRRegressor(n_features=8)
    >>> model.learn_one(x, 1.0)
    >>> model.predict_one(x, with_dist=True)
    𝒩(μ=..., σ=...)
    """

    def __init__(
        self,
        n_features: int = 50,
        bandwidth: float | tuple[float, ...] | None = None,
        sigma: float = 1.0,
        lam: float = 1.0,
        fit_hyperparameters: bool = True,
        sync_every: int = 32,
        forgetting: float = 1.0,
        seed: int = 0,
        n_kernels: int = 8,
        standardise: bool = True,
        refit_growth: float = REFIT_GROWTH,
        calibrate: bool = True,
        lazy_gap: float = LAZY_GAP,
        evidence_search: str = EVIDENCE_SEARCH,
    ) -> None:
        self.n_features = n_features
        self.bandwidth = bandwidth
        self.n_kernels = n_kernels
        self.standardise = standardise
        self.sigma = sigma
        self.lam = lam
        self.fit_hyperparameters = fit_hyperparameters
        self.sync_every = sync_every
        self.forgetting = forgetting
        self.seed = seed
        self.refit_growth = refit_growth
        self.calibrate = calibrate
        self.lazy_gap = lazy_gap
        self.evidence_search = evidence_search
        # Validate now so a bad parameter fails at construction, not at the first sample.
        if int(n_features) < 1 or int(sync_every) < 1 or int(n_kernels) < 1:
            raise ValueError("n_features, sync_every and n_kernels must be >= 1")
        check_positive("sigma", sigma)
        check_positive("lam", lam)
        if not (0.0 <= float(lazy_gap) < math.inf):
            raise ValueError(f"lazy_gap must be a finite number of nats >= 0, got {lazy_gap!r}")
        if evidence_search not in SEARCHES:
            raise ValueError(f"evidence_search must be one of {SEARCHES}, got {evidence_search!r}")
        if not float(refit_growth) >= 0.0:
            raise ValueError(f"refit_growth must be >= 0, got {refit_growth!r}")
        if not (0.0 < float(forgetting) <= 1.0):
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        for bw in (bandwidth if isinstance(bandwidth, tuple) else () if bandwidth is None else (bandwidth,)):
            check_positive("bandwidth", bw)
        self._keys: list[Any] | None = None
        self._client: FedBNRClient | None = None
        # A learned sample not yet given to the client, `(z_x, z_y)`: z_x is the input of the client's last predict,
        # so the next predict_one learns it and predicts in one pass over each factor (learn_then_predict).
        self._deferred: tuple[np.ndarray, float] | None = None
        self.server: FedBNRServer | None = None
        self._scales: StreamScales | None = None
        self._calibration = PrequentialCalibration() if calibrate else None
        self._last_x: tuple[dict, np.ndarray] | None = None  # (x, its vector) of the last predict_one

    @classmethod
    def _unit_test_params(cls) -> Iterator[dict[str, Any]]:
        yield {"n_features": 8}
        yield {"n_features": 6, "bandwidth": (0.5, 5.0), "forgetting": 0.99, "sync_every": 40, "standardise": False}

    # ------------------------------------------------------------------ plumbing
    _deferred: tuple[np.ndarray, float] | None = None  # (class default: an estimator pickled before it existed)

    @property
    def client(self) -> FedBNRClient | None:
        """The local FedBNR client (`None` before the first `learn_one`), every learned sample in it."""
        self._settle()
        return self._client

    def _settle(self) -> None:
        """Give the client the deferred sample, if any."""
        deferred = self._deferred
        if deferred is not None:
            self._deferred = None
            assert self._client is not None
            self._client.learn(*deferred)

    def __getstate__(self) -> dict[str, Any]:
        self._settle()
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "client" in state:  # pickled before the client became a property
            state["_client"] = state.pop("client")
        self.__dict__.update(state)

    def _build(self, keys: list[Any]) -> None:
        if not keys:
            raise ValueError("cannot build a feature map from an input with no features")
        bandwidth = self.bandwidth
        if bandwidth is None:
            bandwidth = tuple(s.bandwidth for s in standardised_dictionary(int(self.n_kernels), len(keys)))
        client = FedBNRClient(n_inputs=len(keys), n_features=int(self.n_features), bandwidth=bandwidth,
                              seed=int(self.seed), sigma=self.sigma, lam=self.lam,
                              min_upload=int(self.sync_every), forgetting=self.forgetting, client_id="local",
                              lazy_gap=float(getattr(self, "lazy_gap", 0.0)))
        self.server = FedBNRServer.for_client(client, fit_hyperparameters=bool(self.fit_hyperparameters),
                                              refit_growth=float(getattr(self, "refit_growth", 0.0)),
                                              search=getattr(self, "evidence_search", "grid"))
        self._client = client
        self._deferred = None
        self._keys = keys
        self._sync_at: float | None = None
        if self.standardise:  # inputs winsorised at ±INPUT_CLIP (never the target)
            self._scales = StreamScales(len(keys))

    def _sync(self) -> None:
        client = self.client  # (settled)
        assert client is not None and self.server is not None
        up = client.make_upload()
        if up is not None:
            self.server.apply(up)
            client.apply_global(self.server.publish())
        self._sync_at = None

    def _until_sync(self) -> float:
        """Samples still to learn before the next sync: at least `sync_every` pending, and a refit due.

        In a fleet of one a global holds exactly the client's own samples, which its working posterior already
        has: installing one changes the model only through refitted `σ, λ`. A sync without a refit would
        refactorise the same posterior (and have the server evaluate its evidence), so the pending samples wait,
        summed exactly, until the server would refit; the model is the one syncing every `sync_every` gives."""
        assert self._client is not None and self.server is not None
        at = getattr(self, "_sync_at", None)  # the pending count of the next sync (the server changes only at one)
        if at is None:
            every = int(self.sync_every)
            until = self.server.samples_until_refit()  # (inf: never)
            # the first of the syncs every `sync_every` samples since the last one at which a refit is due
            at = self._sync_at = max(1, math.ceil(until / every)) * every if math.isfinite(until) else math.inf
        return at - self._client.n_pending - (self._deferred is not None)

    def _vector(self, x: dict, keep: bool = False) -> np.ndarray:
        """`x` as a vector in key order; with `keep`, remembered for a `learn_one` of an equal `x` next
        (progressive validation reads each sample twice)."""
        assert self._keys is not None
        last = getattr(self, "_last_x", None)
        self._last_x = None
        if last is not None and last[0] == x:
            return last[1]
        xv = dict_to_vector(self._keys, x)
        if keep:
            self._last_x = (dict(x), xv)
        return xv

    # ------------------------------------------------------------------ River protocol
    def _learn_z(self, z: np.ndarray, zy: float) -> None:
        """Learn `(z, zy)` (inputs standardised, if on): deferred to the next `predict_one` when `z` is the input the
        client last predicted and no sync is due at this sample; else now."""
        assert self._client is not None
        self._settle()
        if z is getattr(self, "_predicted", None) and self._until_sync() > 1:
            self._deferred = (z, check_target(zy))
        else:
            self._client.learn(z, zy)
        self._predicted = None

    def _predict_z(self, z: np.ndarray) -> tuple[float, float]:
        """The client's predictive at `z`, after learning the deferred sample (in the same pass)."""
        assert self._client is not None
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            out = self._client.predict(z)
        else:
            out = self._client.learn_then_predict(deferred[0], deferred[1], z)
        self._predicted = z
        return out

    def learn_one(self, x: dict, y: base.typing.RegTarget) -> None:
        if self._client is None:
            keys = sorted_keys(x)
            dict_to_vector(keys, x)  # validate before building anything
            check_target(y)
            self._build(keys)
        assert self._client is not None and self._keys is not None
        xv = self._vector(x)
        if self._scales is None:
            self._learn_z(xv, check_target(y))
        else:
            check_target(y)
            self._scales.learn(xv, float(y), self._learn_z)
        if self._until_sync() <= 0:
            self._sync()
        calibration = getattr(self, "_calibration", None)  # (None in an estimator pickled before it existed)
        if calibration is not None:
            calibration.learned(x, float(y))  # type: ignore[arg-type]

    def predict_one(self, x: dict, with_dist: bool = False) -> float | Gaussian:
        if self._client is None:
            # Prior predictive: φᵀφ = ‖z‖² + 1 = 2 for RFF + bias, so the variance is σ² + 2λ².
            mu, var = 0.0, float(self.sigma) ** 2 + 2.0 * float(self.lam) ** 2
        elif self._scales is None:
            mu, var = self._predict_z(self._vector(x, keep=True))
        else:
            mu, var = self._scales.predict(self._vector(x, keep=True), self._predict_z)  # type: ignore[assignment]
        calibration = getattr(self, "_calibration", None)
        if calibration is not None:
            var = calibration.predicted(x, float(mu), float(var))
        if not with_dist:
            return float(mu)
        return gaussian(float(mu), float(var))

    # ------------------------------------------------------------------ array path
    def _matrix(self, xs: Any) -> np.ndarray:
        if hasattr(xs, "columns"):  # a DataFrame: select columns by key
            assert self._keys is not None
            xs = xs[self._keys].to_numpy()
        return np.asarray(xs, dtype=np.float64)

    def learn_many(self, xs: Any, ys: Any) -> None:
        """Learn rows of a `(T, d)` array (columns in sorted-key order; a DataFrame is selected by key).
        Same result as a loop of `learn_one`, without the dict overhead; bad input changes nothing."""
        if self.client is None:
            if hasattr(xs, "columns"):
                keys = sorted_keys({c: None for c in xs.columns})
            else:
                keys = list(range(np.asarray(xs).shape[1] if np.ndim(xs) == 2 else 0))
            arr = np.asarray(xs[keys].to_numpy() if hasattr(xs, "columns") else xs, dtype=np.float64)
            ys_arr = np.asarray(ys, dtype=np.float64)
            if arr.ndim != 2 or ys_arr.shape != (arr.shape[0],) or not np.all(np.isfinite(arr)) \
                    or not all_finite_squares(ys_arr):
                raise ValueError(f"expected finite xs (T, d) and ys (T,), got {arr.shape} and {ys_arr.shape}")
            self._build(keys)
        assert self.client is not None
        arr = self._matrix(xs)
        ys_arr = np.asarray(ys, dtype=np.float64)
        phis = self.client.features_many(arr)  # validates everything before any state changes
        if ys_arr.shape != (arr.shape[0],) or not all_finite_squares(ys_arr):
            raise ValueError(f"expected finite targets of shape ({arr.shape[0]},), got {ys_arr.shape}")
        if self._scales is not None:
            # as a loop of learn_one: past-only scales; rows before the scales are usable only set them
            nxt = copy.deepcopy(self._scales)
            zx, ready = nxt.x.transform_many(arr)
            zy, _ = nxt.y.transform_many(ys_arr[:, None])
            phis = self.client.features_many(zx[ready])
            ys_arr = zy[ready, 0]
            self._scales = nxt
        start = 0
        while start < ys_arr.shape[0]:
            room = self._until_sync()
            stop = ys_arr.shape[0] if room >= ys_arr.shape[0] - start else start + max(math.ceil(room), 1)
            self.client.learn_features_many(phis[start:stop], ys_arr[start:stop])
            if self._until_sync() <= 0:
                self._sync()
            start = stop

    def predict_many(self, xs: Any) -> np.ndarray:
        """Predictive means of the rows of a `(T, d)` array."""
        return self.predict_dist_many(xs)[0]

    def predict_dist_many(self, xs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Predictive means and variances of the rows of a `(T, d)` array (the variances calibrated, if on)."""
        if self.client is None:
            t = np.asarray(xs).shape[0]
            mean, var = np.zeros(t), np.full(t, float(self.sigma) ** 2 + 2.0 * float(self.lam) ** 2)
        elif self._scales is None:
            mean, var = self.client.predict_many(self._matrix(xs))
        else:
            mean, var = self._scales.predict_many(self._matrix(xs), self.client.predict_many)
        calibration = getattr(self, "_calibration", None)
        scale = 1.0 if calibration is None else calibration.calibration.scale
        return mean, var * scale
