"""The URK feature map in numpy: the kernel network's shapes, its weights as plain arrays, and the features
(the thesis §3.1, eq. 3.2; docs/algorithms.md §8).

`f_θ(x)`: an MLP `d → widths[0] → … → widths[-1]` (tanh between layers, the last layer linear); no widths:
the identity. `h_ψ(ω) = ω ⊘ ℓ + W₂ tanh(W₁ω + c₁)`: a per-dimension scaling by lengthscales `ℓ = exp(log_ls)`,
plus (with `shifter_width > 0`) a learned residual, zero at initialisation. `ω_1..ω_m ~ N(0, I)` are drawn
once from the fleet seed and never travel. The features, with `u_i = h(ω_i)ᵀ f(x)`:

    s(x) = [cos u_1, …, cos u_m, sin u_1, …, sin u_m] / √(m − 1)      (F = 2m numbers)

the thesis's normalisation (eq. 3.2), so `s(x)ᵀs(x') = m/(m−1) · (the RFF estimate of k(x, x'))` (the
thesis's `s^m_ω` interleaves `(cos u_i, sin u_i)`; all cosines first is a fixed permutation of it, which
changes neither the kernel nor the posterior under the isotropic prior). `normalisation="rff"` instead gives
docs/algorithms.md §2 exactly — `m^{-1/2}`, all sines first — so that plain RFF of a Gaussian kernel of
bandwidth `ℓ` (`widths = ()`, no shifter, `log_ls = log ℓ`) is the special case bit for bit.

Nothing here imports torch: an agent that only predicts and contributes statistics runs this.

>>> arch = URKArch(n_inputs=2, widths=(), n_omega=3)
>>> w = initial_weights(arch, seed=0, lengthscale=1.0)
>>> phi = features(w, omega(arch, 0), np.zeros((1, 2)))
>>> phi.shape, bool(np.allclose(phi[0], [2 ** -0.5] * 3 + [0.0] * 3))
((1, 6), True)
"""

from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass

import numpy as np

from streamfed.core.durable import durable

__all__ = ["URKArch", "URKFeatureMap", "URKWeights", "features", "initial_weights", "omega"]

_OMEGA_TAG = zlib.crc32(b"urk-omega")  # the ω draw's own stream of the fleet seed
_INIT_TAG = zlib.crc32(b"urk-init")


@durable("urk.URKArch")
@dataclass(frozen=True)
class URKArch:
    """The shapes of a kernel network: `n_inputs` (d), the MLP `widths` (empty: identity extractor),
    `n_omega` (m ≥ 2, as √(m − 1) divides), `shifter_width` (0: `h` is the scaling alone), and the features'
    `normalisation`: "thesis" (`[cos; sin]/√(m−1)`) or "rff" (`[sin; cos]/√m`, docs/algorithms.md §2).

    >>> a = URKArch(n_inputs=3, widths=(4, 2), n_omega=8, shifter_width=5)
    >>> a.latent, a.dim, a.n_params
    (2, 16, 55)
    """

    n_inputs: int
    widths: tuple[int, ...] = (32, 8)
    n_omega: int = 32
    shifter_width: int = 0
    normalisation: str = "thesis"

    def __post_init__(self) -> None:
        if (self.n_inputs < 1 or self.n_omega < 2 or any(w < 1 for w in self.widths) or self.shifter_width < 0
                or self.normalisation not in ("thesis", "rff")):
            raise ValueError(f"bad architecture {self}")

    @property
    def scale(self) -> float:
        """The features' factor: `1/√(m−1)` (thesis) or `1/√m` (rff)."""
        return 1.0 / math.sqrt(self.n_omega - (1 if self.normalisation == "thesis" else 0))

    @property
    def sines_first(self) -> bool:
        return self.normalisation == "rff"

    @property
    def phi_sq(self) -> float:
        """`‖s(x)‖²`, the same for every `x` and every network: `m·scale²`."""
        return self.n_omega * self.scale**2

    @property
    def latent(self) -> int:
        """k: the output size of `f` (and of `h`)."""
        return int(self.widths[-1]) if self.widths else int(self.n_inputs)

    @property
    def dim(self) -> int:
        """F = 2m features."""
        return 2 * int(self.n_omega)

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Every learned array of the network, in the order of the flat vector (σ, λ come after)."""
        out: list[tuple[str, tuple[int, ...]]] = []
        sizes = (self.n_inputs, *self.widths)
        for i in range(len(self.widths)):
            out += [(f"W{i}", (sizes[i + 1], sizes[i])), (f"c{i}", (sizes[i + 1],))]
        out.append(("log_ls", (self.latent,)))
        if self.shifter_width:
            k, s = self.latent, self.shifter_width
            out += [("H1", (s, k)), ("h1", (s,)), ("H2", (k, s))]
        return out

    @property
    def n_params(self) -> int:
        """Numbers of the flat vector: the network's, then `log σ`, `log λ`."""
        return sum(math.prod(s) for _, s in self.shapes()) + 2


@durable("urk.URKWeights")
@dataclass
class URKWeights:
    """A network's weights (`arrays`, float64, by name) and the noise `σ` and prior scale `λ` of the
    Bayesian last layer, as logs.

    >>> a = URKArch(n_inputs=1, widths=(), n_omega=2)
    >>> w = URKWeights.from_vector(a, np.array([0.0, -1.0, 2.0]))
    >>> w.arrays["log_ls"].tolist(), round(w.sigma, 6), round(w.lam, 6)
    ([0.0], 0.367879, 7.389056)
    """

    arch: URKArch
    arrays: dict[str, np.ndarray]
    log_sigma: float
    log_lam: float

    @property
    def sigma(self) -> float:
        return math.exp(self.log_sigma)

    @property
    def lam(self) -> float:
        return math.exp(self.log_lam)

    def to_vector(self) -> np.ndarray:
        """The flat float64 vector (a copy): arrays in `arch.shapes()` order, then `log σ`, `log λ`."""
        parts = [np.asarray(self.arrays[n], dtype=np.float64).ravel() for n, _ in self.arch.shapes()]
        return np.concatenate([*parts, [self.log_sigma, self.log_lam]])

    @classmethod
    def from_vector(cls, arch: URKArch, v: np.ndarray) -> URKWeights:
        v = np.asarray(v, dtype=np.float64).ravel()
        if v.shape != (arch.n_params,):
            raise ValueError(f"expected {arch.n_params} numbers, got {v.shape}")
        if not np.all(np.isfinite(v)):
            raise ValueError("weights contain a non-finite value")
        arrays, i = {}, 0
        for name, shape in arch.shapes():
            size = math.prod(shape)
            arrays[name] = v[i:i + size].reshape(shape).copy()
            i += size
        return cls(arch, arrays, float(v[i]), float(v[i + 1]))

    def fingerprint(self) -> str:
        """A short hash of the exact bytes of the weights (two equal fingerprints: the same kernel)."""
        return hashlib.sha256(self.to_vector().tobytes()).hexdigest()[:12]


def omega(arch: URKArch, seed: int) -> np.ndarray:
    """`(m, k)` draws of `N(0, I)` from the fleet seed: every agent and the aggregator derive the same."""
    rng = np.random.default_rng([int(seed), _OMEGA_TAG, arch.n_omega, arch.latent])
    return rng.standard_normal((arch.n_omega, arch.latent))


def initial_weights(arch: URKArch, seed: int, *, lengthscale: float = 1.0, sigma: float = 0.5,
                    lam: float = 1.0) -> URKWeights:
    """Version 0, from the fleet seed: MLP weights `N(0, 1/fan_in)` (so `f(x)` keeps the scale of standardised
    inputs), zero biases, every `ℓ = lengthscale`, the shifter's residual zero (`h` starts as the scaling)."""
    if not all(math.isfinite(v) and v > 0 for v in (lengthscale, sigma, lam)):
        raise ValueError("lengthscale, sigma and lam must be finite and > 0")
    rng = np.random.default_rng([int(seed), _INIT_TAG])
    arrays: dict[str, np.ndarray] = {}
    for name, shape in arch.shapes():
        if name.startswith("W") or name == "H1":
            arrays[name] = rng.standard_normal(shape) / math.sqrt(shape[1])
        elif name == "log_ls":
            arrays[name] = np.full(shape, math.log(lengthscale))
        else:
            arrays[name] = np.zeros(shape)
    return URKWeights(arch, arrays, math.log(sigma), math.log(lam))


def extract(w: URKWeights, X: np.ndarray) -> np.ndarray:
    """`f(X)`: `(T, d) → (T, k)`."""
    h = np.asarray(X, dtype=np.float64)
    n = len(w.arch.widths)
    for i in range(n):
        h = h @ w.arrays[f"W{i}"].T + w.arrays[f"c{i}"]
        if i < n - 1:
            h = np.tanh(h)
    return h


def shift(w: URKWeights, om: np.ndarray) -> np.ndarray:
    """`h(ω)`: `(m, k) → (m, k)`."""
    out = om * np.exp(-w.arrays["log_ls"])
    if w.arch.shifter_width:
        out = out + np.tanh(om @ w.arrays["H1"].T + w.arrays["h1"]) @ w.arrays["H2"].T
    return out


def features(w: URKWeights, om: np.ndarray, X: np.ndarray) -> np.ndarray:
    """The URK features `(T, 2m)` of the rows of `X` (eq. 3.2's normalisation, see the module docstring)."""
    return _trig(extract(w, X) @ shift(w, om).T, w.arch)


def _trig(u: np.ndarray, arch: URKArch) -> np.ndarray:
    parts = [np.sin(u), np.cos(u)] if arch.sines_first else [np.cos(u), np.sin(u)]
    return np.concatenate(parts, axis=1) * arch.scale


@durable("urk.URKFeatureMap")
class URKFeatureMap:
    """A frozen URK network as a :class:`~streamfed.core.features.FeatureMap` (what FedBNR's client sums
    statistics of). `h(ω)` is computed once: per sample the cost is the MLP and one `(m, k)` product.

    >>> arch = URKArch(n_inputs=2, widths=(3,), n_omega=4)
    >>> fm = URKFeatureMap(initial_weights(arch, 0), omega(arch, 0), "v")
    >>> fm.dim, fm.transform_one(np.ones(2)).shape, bool(np.allclose(np.sum(fm.transform_one(np.ones(2)) ** 2), 4 / 3))
    (8, (8,), True)
    """

    def __init__(self, weights: URKWeights, om: np.ndarray, version: str) -> None:
        self.weights = weights
        self.omega = np.asarray(om, dtype=np.float64)
        self._shifted = shift(weights, self.omega)
        self._version = str(version)
        self._last: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def dim(self) -> int:
        return self.weights.arch.dim

    @property
    def version(self) -> str:
        return self._version

    def transform_many(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.weights.arch.n_inputs or not np.all(np.isfinite(X)):
            raise ValueError(f"expected finite inputs of shape (T, {self.weights.arch.n_inputs}), got {X.shape}")
        return _trig(extract(self.weights, X) @ self._shifted.T, self.weights.arch)

    def transform_one(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        # the last input's features are kept: an agent asks for the same x up to three times per sample
        # (the prediction, the update, the regret's comparator), and the MLP is most of a sample's cost
        last = self._last
        if last is not None and np.array_equal(last[0], x):
            return last[1].copy()
        phi = self.transform_many(x.reshape(1, -1))[0]
        self._last = (x.copy(), phi.copy())
        return phi
