"""POF-MKL as a River regressor (docs/algorithms.md §3): a client and its server in one object."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from river import base

from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.core.features import KernelSpec, RFFBank, gaussian_dictionary, standardised_dictionary
from streamfed.core.standardise import StreamScales

__all__ = ["POFMKLRegressor"]


class POFMKLRegressor(base.Regressor):
    """POF-MKL as a River regressor: a client and its server in one object (a fleet of one).

    Features are read in sorted key order, so the frequencies never depend on the order in which
    features are first seen. The schema is fixed by the first `learn_one`; a feature missing later
    reads as 0 and an unseen one is ignored (both counted in `n_missing` / `n_unknown`).

    Parameters
    ----------
    n_kernels
        Size of the Gaussian bandwidth dictionary (ignored when `kernels` is given): with `standardise`,
        :func:`~streamfed.core.features.standardised_dictionary` (bandwidths around `√(2d)`, from the
        number of inputs `d`), else bandwidths over `[0.05, 5]` (the paper's normalised inputs).
    n_features
        Random features `D` per kernel (each kernel has `2D` parameters).
    kernels
        Explicit kernel specs such as `("gaussian:0.5", "laplacian:1.0")`.
    eta, lam, xi
        Learning rate, regularisation `λ` and exploration rate `ξ`.
    bin_size
        `M`, kernels updated (and uploaded) per step.
    seed
        Fleet seed: frequencies and bin draws derive from it.
    standardise
        Standardise every input and the target online, from past samples only
        (:class:`~streamfed.core.standardise.OnlineStandardiser`), and map predictions back. On by
        default: the kernels' bandwidths and `θ = 0` assume unit scales, which a user's stream rarely
        has. The first two samples only set the scales (the prediction is then the running mean).

    The step along a sample's features, `η/q_J`, is capped at 1/2 (docs/algorithms.md §3.5), so no `η`
    can make it diverge; below `ξ/(2B)` the cap never acts.

    Examples
    --------
    >>> from river import datasets, evaluate, metrics
    >>> model = POFMKLRegressor(n_kernels=4, n_features=20, seed=1)
    >>> evaluate.progressive_val_score(datasets.TrumpApproval(), model, metrics.MAE())
    MAE: ...
    """

    def __init__(
        self,
        n_kernels: int = 8,
        n_features: int = 50,
        kernels: tuple[str, ...] | None = None,
        eta: float = 0.005,
        lam: float = 1e-4,
        xi: float = 0.1,
        bin_size: int = 1,
        seed: int = 0,
        standardise: bool = True,
    ) -> None:
        self.n_kernels = n_kernels
        self.n_features = n_features
        self.kernels = kernels
        self.eta = eta
        self.lam = lam
        self.xi = xi
        self.bin_size = bin_size
        self.seed = seed
        self.standardise = standardise
        self._specs: list[KernelSpec] = (
            [KernelSpec.parse(k) for k in kernels] if kernels else gaussian_dictionary(n_kernels)
        )
        if not 1 <= bin_size <= len(self._specs):
            raise ValueError(f"bin_size must be in [1, {len(self._specs)}], got {bin_size}")
        self._keys: tuple = ()
        self._client: POFMKLClient | None = None
        self._server: POFMKLServer | None = None
        self._scales: StreamScales | None = None
        self.n_missing = 0
        self.n_unknown = 0

    @classmethod
    def _unit_test_params(cls) -> Iterable[dict]:
        yield {"n_kernels": 4, "n_features": 10}
        yield {"kernels": ("gaussian:0.5", "laplacian:2.0", "matern32:1.0"), "bin_size": 2, "xi": 1.0,
               "standardise": False}

    @property
    def _is_stochastic(self) -> bool:
        return True

    @property
    def client(self) -> POFMKLClient | None:
        return self._client

    def _vector(self, x: dict) -> np.ndarray:
        v = np.zeros(len(self._keys))
        seen = 0
        for i, k in enumerate(self._keys):
            if k in x:
                v[i] = _as_float(k, x[k])
                seen += 1
        self.n_missing += len(self._keys) - seen
        self.n_unknown += len(x) - seen
        return v

    def learn_one(self, x: dict, y: base.typing.RegTarget) -> None:
        y = _as_float("target", y)
        if self._client is None:
            self._keys = tuple(sorted(x, key=str))
            vals = [_as_float(k, x[k]) for k in self._keys]  # validate before creating state
            d = max(len(self._keys), 1)
            if self.standardise and not self.kernels:  # bandwidths for unit-variance inputs, from d alone
                self._specs = standardised_dictionary(self.n_kernels, d)
            bank = RFFBank(self._specs, self.n_features, d, seed=self.seed)
            rng = np.random.default_rng([self.seed, 0x50F])
            self._client = POFMKLClient(bank, self.eta, self.lam, self.xi, self.bin_size, rng)
            self._server = POFMKLServer(bank.n_kernels, bank.dim)
            if self.standardise:  # inputs winsorised at ±INPUT_CLIP (never the target)
                self._scales = StreamScales(bank.n_inputs)
            xv = np.array(vals) if vals else np.zeros(1)
        else:
            xv = self._vector(x) if self._keys else np.zeros(1)
        if self._scales is None:
            self._learn(xv, y)
        else:  # scales from the past only, folded on copies: a refused sample changes nothing
            self._scales.learn(xv, y, self._learn)

    def _learn(self, xv: np.ndarray, y: float) -> None:
        assert self._client is not None and self._server is not None
        _, update = self._client.step(xv, y)
        self._server.add(update)
        self._server.finish_round()
        self._client.set_global(self._server.theta, self._server.version)

    def predict_one(self, x: dict) -> float:
        if self._client is None:
            return 0.0
        missing, unknown = self.n_missing, self.n_unknown
        xv = self._vector(x) if self._keys else np.zeros(1)
        self.n_missing, self.n_unknown = missing, unknown  # predicting does not count
        client = self._client
        if self._scales is None:
            yhat = client.predict(xv)
            return yhat if math.isfinite(yhat) else 0.0  # never a NaN out: the prior's prediction instead
        return self._scales.predict(xv, lambda z: (client.predict(z), None))[0]



def _as_float(name: object, v: object) -> float:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"feature {name!r} is not numeric: {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"feature {name!r} is not finite: {v!r}")
    return f

