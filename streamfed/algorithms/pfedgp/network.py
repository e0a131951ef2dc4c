"""pFedGP's shared parameters: the embedding network `g_θ` and (FITC) the `M` inducing inputs `X̄` in
embedding space, as one flat float64 vector — what FedAvg averages and the chunks carry. Numpy only.

The embedding network is URK's (:mod:`streamfed.algorithms.urk.network`, reused, not rebuilt): an MLP `f`
then a random-Fourier layer with learned lengthscales (and optionally a learned spectral shifter),
`g_θ(x) = s(x) = [cos u, sin u] / √(m − 1)`, `u = h(ω)ᵀ f(x)`, of dimension `D = 2m`. The GP kernel is the RBF
on `g_θ(x)` (the paper's deep kernel, §3). The vector is URK's flat vector (its `log σ, log λ` tail unused
here, kept so the layout is URK's), then `X̄` row by row, then (the softmax baseline only) a head's `n_head` numbers.

>>> from streamfed.algorithms.urk.network import URKArch
>>> layout = Layout(URKArch(n_inputs=3, widths=(4,), n_omega=5), n_inducing=2)
>>> layout.n_net, layout.embed_dim, layout.n_params
(22, 10, 42)
>>> theta = initial_theta(layout, seed=0)
>>> embed(layout, theta, omega_of(layout, 0), np.zeros((1, 3))).shape, inducing_of(layout, theta).shape
((1, 10), (2, 10))
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from streamfed.algorithms.urk.network import URKArch, URKWeights, features, initial_weights, omega
from streamfed.core.durable import durable

__all__ = ["Layout", "embed", "inducing_of", "initial_theta", "omega_of", "weights_of"]

_IP_TAG = zlib.crc32(b"pfedgp-inducing")


@durable("pfedgp.Layout")
@dataclass(frozen=True)
class Layout:
    """The network's shapes, the number `M` of inducing inputs (0: the full GP, no inducing inputs) and the
    numbers of a head after them (0 for pFedGP; the softmax baseline's weights and biases)."""

    arch: URKArch
    n_inducing: int = 0
    n_head: int = 0

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


def initial_theta(layout: Layout, seed: int, lengthscale: float = 1.0) -> np.ndarray:
    """Version 0 from the fleet seed: URK's initial network; `X̄` = embeddings of `M` standard-normal inputs
    (standardised inputs' scale), so they start where data lands; a head starts at zero."""
    w = initial_weights(layout.arch, seed, lengthscale=lengthscale)
    rng = np.random.default_rng([int(seed), _IP_TAG])
    Xbar = features(w, omega(layout.arch, seed), rng.standard_normal((layout.n_inducing, layout.arch.n_inputs)))
    return np.concatenate([w.to_vector(), Xbar.ravel(), np.zeros(layout.n_head)])
