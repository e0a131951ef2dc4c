"""pFedGP's shared parameters: the embedding network `g_θ` and (FITC) the `M` inducing inputs `X̄` in
embedding space, as one flat float64 vector — what FedAvg averages and the chunks carry. Numpy only.

The embedding network is URK's (:mod:`streamfed.algorithms.urk.network`, reused, not rebuilt): an MLP `f`
then a random-Fourier layer with learned lengthscales (and optionally a learned spectral shifter),
`g_θ(x) = s(x) = [cos u, sin u] / √(m − 1)`, `u = h(ω)ᵀ f(x)`, of dimension `D = 2m`. The GP kernel is the RBF
on `g_θ(x)` (the paper's deep kernel, §3). The vector is URK's flat vector (its `log σ, log λ` tail unused
here, kept so the layout is URK's — except `log λ`, which holds `log c`, the scale of the kernel's linear part
when `linear`, see :mod:`.kernels`), then `X̄` row by row, then (the softmax baseline only) a head's `n_head`
numbers. :func:`gp_inputs` are what the GP sees: the embedding, then (`linear`) `√(c / (d + 1)) · (1, x)`.

>>> from streamfed.algorithms.urk.network import URKArch
>>> layout = Layout(URKArch(n_inputs=3, widths=(4,), n_omega=5), n_inducing=2)
>>> layout.n_net, layout.embed_dim, layout.n_params
(22, 10, 42)
>>> theta = initial_theta(layout, seed=0)
>>> embed(layout, theta, omega_of(layout, 0), np.zeros((1, 3))).shape, inducing_of(layout, theta).shape
((1, 10), (2, 10))
>>> lin = Layout(URKArch(n_inputs=3, widths=(4,), n_omega=5), linear=True)
>>> theta = initial_theta(lin, seed=0, linear_scale=4.0)
>>> z = gp_inputs(lin, theta, omega_of(lin, 0), np.ones((1, 3)))[0, lin.embed_dim:]
>>> round(linear_scale_of(lin, theta), 6), z.round(6).tolist()
(4.0, [1.0, 1.0, 1.0, 1.0])
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from streamfed.algorithms.urk.network import URKArch, URKWeights, features, initial_weights, omega
from streamfed.core.durable import durable

__all__ = ["LINEAR_BOUNDS", "Layout", "embed", "gp_inputs", "inducing_of", "initial_theta", "linear_scale_of",
           "omega_of", "weights_of"]

#: `log c` (the linear part's scale) stays within these (a local update clamps it, as URK's lengthscales).
LINEAR_BOUNDS = (math.log(1e-3), math.log(1e3))

_IP_TAG = zlib.crc32(b"pfedgp-inducing")


@durable("pfedgp.Layout")
@dataclass(frozen=True)
class Layout:
    """The network's shapes, the number `M` of inducing inputs (0: the full GP, no inducing inputs), the
    numbers of a head after them (0 for pFedGP; the softmax baseline's weights and biases), and whether the GP's
    kernel has a linear part on the inputs (full GP only)."""

    arch: URKArch
    n_inducing: int = 0
    n_head: int = 0
    linear: bool = False

    def __post_init__(self) -> None:
        if self.linear and self.n_inducing:
            raise ValueError("the kernel's linear part is for the full GP (n_inducing = 0)")

    @property
    def gp_dim(self) -> int | None:
        """Where the embedding ends in a GP input (:mod:`.kernels`' `dim`); None without a linear part."""
        return self.embed_dim if self.linear else None

    @property
    def linear_index(self) -> int:
        """The index of `log c` in the flat vector (URK's `log λ` slot)."""
        return self.n_net - 1

    @property
    def n_net(self) -> int:
        return int(self.arch.n_params)

    @property
    def embed_dim(self) -> int:
        return int(self.arch.dim)

    @property
    def n_params(self) -> int:
        return self.n_net + self.n_inducing * self.embed_dim + self.n_head

    @property
    def head_start(self) -> int:
        return self.n_net + self.n_inducing * self.embed_dim


def omega_of(layout: Layout, seed: int) -> np.ndarray:
    """URK's `ω` draws from the fleet seed (never travel)."""
    return omega(layout.arch, seed)


def weights_of(layout: Layout, theta: np.ndarray) -> URKWeights:
    return URKWeights.from_vector(layout.arch, np.asarray(theta, dtype=np.float64)[: layout.n_net])


def inducing_of(layout: Layout, theta: np.ndarray) -> np.ndarray:
    """`X̄ (M, D)` (empty when `M = 0`)."""
    v = np.asarray(theta, dtype=np.float64)[layout.n_net:layout.head_start]
    return v.reshape(layout.n_inducing, layout.embed_dim).copy()


def embed(layout: Layout, theta: np.ndarray, om: np.ndarray, X: np.ndarray) -> np.ndarray:
    """`g_θ(X)`: `(T, d) → (T, D)`."""
    return features(weights_of(layout, theta), om, np.asarray(X, dtype=np.float64))


def linear_scale_of(layout: Layout, theta: np.ndarray) -> float:
    """`c`, the scale of the kernel's linear part."""
    return math.exp(float(np.asarray(theta, dtype=np.float64)[layout.linear_index]))


def gp_inputs(layout: Layout, theta: np.ndarray, om: np.ndarray, X: np.ndarray) -> np.ndarray:
    """What the GP sees of `X`: `g_θ(X)`, then (`layout.linear`) `√(c / (d + 1)) · (1, X)` → `(T, D [+ d + 1])`."""
    E = embed(layout, theta, om, X)
    if not layout.linear:
        return E
    X = np.asarray(X, dtype=np.float64)
    z = np.concatenate([np.ones((X.shape[0], 1)), X], axis=1)
    return np.concatenate([E, math.sqrt(linear_scale_of(layout, theta) / z.shape[1]) * z], axis=1)


def initial_theta(layout: Layout, seed: int, lengthscale: float = 1.0, linear_scale: float = 1.0) -> np.ndarray:
    """Version 0 from the fleet seed: URK's initial network; `X̄` = embeddings of `M` standard-normal inputs
    (standardised inputs' scale), so they start where data lands; a head starts at zero; `c = linear_scale`."""
    if not (math.isfinite(linear_scale) and LINEAR_BOUNDS[0] <= math.log(linear_scale) <= LINEAR_BOUNDS[1]):
        raise ValueError(f"linear_scale must be within [1e-3, 1e3], got {linear_scale!r}")
    w = initial_weights(layout.arch, seed, lengthscale=lengthscale, lam=linear_scale)
    rng = np.random.default_rng([int(seed), _IP_TAG])
    Xbar = features(w, omega(layout.arch, seed), rng.standard_normal((layout.n_inducing, layout.arch.n_inputs)))
    return np.concatenate([w.to_vector(), Xbar.ravel(), np.zeros(layout.n_head)])
