"""A FedBNR client's feature maps, stacked to `(K, F)`: one row per kernel of the dictionary.

Either the default — Gaussian RFF of one or more bandwidths plus a bias feature, all kernels in one bank pass
and one compiled call per sample (:class:`_DefaultFeatures`) — or the user's maps of equal size
(:class:`_MapList`); :func:`client_features` picks one from the client's arguments. Both expose `bank`: an
:class:`~streamfed.core.features.RFFBank` whose rows plus a bias feature are the features (`None` when they are
not), which the client's compiled step evaluates itself. A list of RFF maps with the bias feature (what a fleet's
dictionary is) gets one, stacked from their frequencies: each feature is the same sum in the same order, so
bit for bit the same as the maps one by one.

>>> fm = client_features(None, n_inputs=2, n_features=3, bandwidth=(0.5, 2.0), seed=0)
>>> fm.n_kernels, fm.dim, fm.transform(np.zeros(2)).shape
(2, 7, (2, 7))
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from streamfed.algorithms.fedbnr._compiled import kern
from streamfed.core.durable import durable
from streamfed.core.features import FeatureMap, KernelSpec, RFFBank, RFFMap

__all__ = ["client_features"]


@durable("fedbnr.DefaultFeatures")
class _DefaultFeatures:
    """Gaussian RFF (one kernel per bandwidth) plus a bias feature, all kernels in one bank pass."""

    def __init__(self, n_inputs: int, n_features: int, bandwidths: Sequence[float], seed: int) -> None:
        specs = [KernelSpec("gaussian", float(bw)) for bw in bandwidths]
        self.bank = RFFBank(specs, n_features, n_inputs, seed)
        # Same string as RFFMap(bank, bias=True).version, so a hand-built single-kernel map agrees.
        self.version = self.bank.version + "+b"
        self.names = [f"{name}+b" for name in self.bank.kernel_names]
        self._z = np.empty((self.bank.n_kernels, self.bank.dim))

    @property
    def n_kernels(self) -> int:
        return self.bank.n_kernels

    @property
    def dim(self) -> int:
        return self.bank.dim + 1

    def transform(self, x: np.ndarray) -> np.ndarray:
        """`(K, F)` features of a contiguous float64 vector; `ValueError` for a wrong length or a
        non-finite value (one numba call: this is the per-sample hot path)."""
        if x.shape[0] != self.bank.n_inputs:
            raise ValueError(f"expected an input of shape ({self.bank.n_inputs},), got {x.shape}")
        out = np.empty((self.bank.n_kernels, self.dim))
        if not kern.rff_bias_features(self.bank.frequency_matrix, x, self.bank.scratch, out):
            raise ValueError("input contains a non-finite value")
        return out

    def transform_many(self, xs: np.ndarray) -> np.ndarray:
        z = self.bank.transform_many(xs)
        return np.concatenate([z, np.ones(z.shape[:2] + (1,))], axis=2)


@durable("fedbnr.MapList")
class _MapList:
    """A user's feature map(s), stacked to `(K, F)`."""

    bank: RFFBank | None = None  # (a class default: a list pickled before it existed has none)

    def __init__(self, maps: Sequence[FeatureMap]) -> None:
        self.maps = list(maps)
        dims = {int(m.dim) for m in self.maps}
        if len(dims) != 1:
            raise ValueError(f"all feature maps of a dictionary must have the same dim, got {sorted(dims)}")
        self.dim = dims.pop()
        self.n_kernels = len(self.maps)
        versions = [str(m.version) for m in self.maps]
        self.version = versions[0] if len(versions) == 1 else hashlib.sha256(
            "|".join(versions).encode()).hexdigest()[:16]
        self.names = [str(getattr(m, "name", None) or v) for m, v in zip(self.maps, versions, strict=True)]
        if all(type(m) is RFFMap and m.bias for m in self.maps) and len(
                {(m.bank.n_features, m.bank.n_inputs) for m in self.maps}) == 1:
            self.bank = RFFBank.from_frequencies(np.concatenate([m.bank.frequencies for m in self.maps]))

    def transform(self, x: np.ndarray) -> np.ndarray:
        out = np.empty((self.n_kernels, self.dim))
        if self.bank is not None:  # one compiled call for every kernel
            x = self.bank.check_input(x)
            if not kern.rff_bias_features(self.bank.frequency_matrix, x, self.bank.scratch, out):
                raise ValueError("a feature is not finite")
            return out
        for k, m in enumerate(self.maps):
            out[k] = m.transform_one(x)
        return out

    def transform_many(self, xs: np.ndarray) -> np.ndarray:
        out = np.empty((xs.shape[0], self.n_kernels, self.dim))
        for k, m in enumerate(self.maps):
            many = getattr(m, "transform_many", None)
            out[:, k] = many(xs) if many is not None else np.stack([m.transform_one(x) for x in xs])
        return out


def client_features(feature_map: FeatureMap | Sequence[FeatureMap] | None, *, n_inputs: int | None, n_features: int,
                    bandwidth: float | Sequence[float], seed: int) -> _DefaultFeatures | _MapList:
    """The maps a :class:`~.client.FedBNRClient` is given (one, or a list of equal size for a dictionary), or
    else the default Gaussian RFF + bias map of `n_inputs`, `n_features` (`D`, so `F = 2D + 1`), `bandwidth`
    (a float, or a sequence of floats for a bandwidth dictionary) and `seed`."""
    if feature_map is None:
        if n_inputs is None:
            raise ValueError("give a feature_map or n_inputs to build the default RFF map")
        bws = [float(bandwidth)] if np.isscalar(bandwidth) else [float(b) for b in bandwidth]  # type: ignore[union-attr]
        if not bws:
            raise ValueError("a bandwidth dictionary needs at least one bandwidth")
        return _DefaultFeatures(int(n_inputs), int(n_features), bws, int(seed))
    maps = [feature_map] if isinstance(feature_map, FeatureMap) else list(feature_map)
    if not maps:
        raise ValueError("a kernel dictionary needs at least one feature map")
    return _MapList(maps)
