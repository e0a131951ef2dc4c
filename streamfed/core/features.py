"""Random Fourier feature maps (docs/algorithms.md §2).

A :class:`RFFBank` holds a dictionary of `N` shift-invariant kernels with `D` frequency vectors each
and maps one input `x` (length `d`) to an `(N, 2D)` array whose row `p` is

    z_p(x) = D^{-1/2} [sin(V_p x), cos(V_p x)]

so that `z_p(x)·z_p(x')` estimates `k_p(x, x')` and `‖z_p(x)‖ = 1` exactly.

Frequencies are a pure function of (fleet seed, kernel spec, D, d): every agent and the aggregator
derive the same ones and nothing is transmitted. A bank can also be built from explicit frequency
arrays, to interoperate with other implementations.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from streamfed.core.compiled import features as _kern
from streamfed.core.durable import durable

KernelKind = Literal["gaussian", "laplacian", "matern32", "matern52"]
KERNEL_KINDS: tuple[str, ...] = ("gaussian", "laplacian", "matern32", "matern52")
_DERIVATION_TAG = "streamfed/rff/v1"


@durable("core.KernelSpec")
@dataclass(frozen=True)
class KernelSpec:
    """One shift-invariant kernel with `k(0) = 1`.

    `gaussian`: `exp(-‖r‖²/(2σ²))`; `laplacian`: `exp(-‖r‖₁/σ)`; `matern32`/`matern52`: Matérn-ν
    with length scale σ (the `√(2ν)‖r‖/σ` parameterisation).

    >>> spec = KernelSpec("gaussian", 0.5)
    >>> spec.key
    'gaussian:0.5'
    >>> round(spec.exact(np.zeros(2), np.array([0.5, 0.0])), 6)
    0.606531
    """

    kind: KernelKind
    bandwidth: float

    def __post_init__(self) -> None:
        if self.kind not in KERNEL_KINDS:
            raise ValueError(f"unknown kernel kind {self.kind!r}; expected one of {KERNEL_KINDS}")
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(f"kernel bandwidth must be finite and > 0, got {self.bandwidth!r}")

    @property
    def key(self) -> str:
        """Canonical text form; part of the frequency derivation, so it must never change."""
        return f"{self.kind}:{float(self.bandwidth)!r}"

    @classmethod
    def parse(cls, text: str) -> KernelSpec:
        """Inverse of :attr:`key` (`"gaussian:0.5"`)."""
        kind, _, bw = text.partition(":")
        return cls(kind, float(bw))  # type: ignore[arg-type]

    def sample_frequencies(self, rng: np.random.Generator, n_features: int, n_inputs: int) -> np.ndarray:
        """Draw `(D, d)` frequencies from this kernel's spectral density."""
        shape = (n_features, n_inputs)
        s = 1.0 / self.bandwidth
        if self.kind == "gaussian":
            return rng.standard_normal(shape) * s
        if self.kind == "laplacian":
            return rng.standard_cauchy(shape) * s
        # Matérn-ν: multivariate Student-t with 2ν degrees of freedom and scale 1/σ.
        nu = 1.5 if self.kind == "matern32" else 2.5
        g = rng.standard_normal(shape)
        u = rng.chisquare(2.0 * nu, size=(n_features, 1))
        return g * np.sqrt(2.0 * nu / u) * s

    def exact(self, x: np.ndarray, x2: np.ndarray) -> float:
        """The kernel value itself (what the features approximate)."""
        r = np.asarray(x, dtype=np.float64) - np.asarray(x2, dtype=np.float64)
        s = self.bandwidth
        if self.kind == "gaussian":
            return float(np.exp(-(r @ r) / (2.0 * s * s)))
        if self.kind == "laplacian":
            return float(np.exp(-np.abs(r).sum() / s))
        d = float(np.sqrt(r @ r)) / s
        if self.kind == "matern32":
            a = math.sqrt(3.0) * d
            return (1.0 + a) * math.exp(-a)
        a = math.sqrt(5.0) * d
        return (1.0 + a + a * a / 3.0) * math.exp(-a)


def derive_frequencies(spec: KernelSpec, n_features: int, n_inputs: int, seed: int) -> np.ndarray:
    """The `(D, d)` frequencies of `spec`, a pure function of its arguments.

    The generator is seeded from a SHA-256 of a canonical string, so the result does not depend on
    Python's hash randomisation, on the order kernels are listed in, or on the platform.
    """
    text = f"{_DERIVATION_TAG}|seed={int(seed)}|{spec.key}|D={int(n_features)}|d={int(n_inputs)}"
    digest = hashlib.sha256(text.encode()).digest()
    entropy = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4)]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
    return spec.sample_frequencies(rng, n_features, n_inputs)


@runtime_checkable
class FeatureMap(Protocol):
    """What a learner needs from a feature map: a fixed output size and a per-sample transform."""

    @property
    def dim(self) -> int: ...

    @property
    def version(self) -> str: ...

    def transform_one(self, x: np.ndarray) -> np.ndarray: ...


@durable("core.RFFBank")
class RFFBank:
    """A dictionary of random-Fourier-feature kernels evaluated together.

    >>> bank = RFFBank([KernelSpec("gaussian", 1.0), KernelSpec("laplacian", 2.0)],
    ...                n_features=8, n_inputs=3, seed=7)
    >>> z = bank.transform_one(np.array([0.1, -0.2, 0.3]))
    >>> z.shape
    (2, 16)
    >>> np.allclose(np.linalg.norm(z, axis=1), 1.0)
    True
    >>> same = RFFBank.from_frequencies(bank.frequencies)
    >>> bool(np.array_equal(same.transform_one(np.ones(3)), bank.transform_one(np.ones(3))))
    True
    """

    def __init__(
        self,
        specs: Sequence[KernelSpec | str],
        n_features: int,
        n_inputs: int,
        seed: int = 0,
    ) -> None:
        specs = tuple(KernelSpec.parse(s) if isinstance(s, str) else s for s in specs)
        if not specs:
            raise ValueError("a feature bank needs at least one kernel")
        if n_features < 1 or n_inputs < 1:
            raise ValueError(f"n_features and n_inputs must be >= 1, got {n_features}, {n_inputs}")
        freqs = np.stack([derive_frequencies(s, n_features, n_inputs, seed) for s in specs])
        self._init(freqs, specs, seed)

    @classmethod
    def from_frequencies(
        cls, frequencies: np.ndarray | Sequence[np.ndarray], specs: Sequence[KernelSpec] | None = None
    ) -> RFFBank:
        """A bank with explicit `(N, D, d)` frequencies (or a list of `(D, d)` arrays)."""
        freqs = np.array(frequencies, dtype=np.float64)
        if freqs.ndim == 2:
            freqs = freqs[None]
        if freqs.ndim != 3 or 0 in freqs.shape:
            raise ValueError(f"frequencies must have shape (N, D, d), got {freqs.shape}")
        if not np.all(np.isfinite(freqs)):
            raise ValueError("frequencies must be finite")
        if specs is not None and len(specs) != freqs.shape[0]:
            raise ValueError(f"{len(specs)} specs for {freqs.shape[0]} frequency arrays")
        bank = cls.__new__(cls)
        bank._init(freqs, tuple(specs) if specs is not None else None, None)  # noqa: SLF001 (its own class)
        return bank

    def _init(self, freqs: np.ndarray, specs: tuple[KernelSpec, ...] | None, seed: int | None) -> None:
        self.frequencies = freqs
        self.frequencies.setflags(write=False)
        self.specs = specs
        self.seed = seed
        n, dd, d = freqs.shape
        self.n_kernels, self.n_features, self.n_inputs = n, dd, d
        self._wt = np.ascontiguousarray(freqs.reshape(n * dd, d).T)
        self._angles = np.empty(2 * n * dd)  # angles, then cosines (see rff_transform_into)
        # max_j Σ_k |V_jk|: with max|x| it bounds every angle (see rff_sincos_flat)
        self.angle_bound = float(np.abs(self._wt).sum(axis=0).max())
        self.version = hashlib.sha256(freqs.tobytes()).hexdigest()[:16]

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "angle_bound" not in state:  # pickled before the bound existed
            self.angle_bound = float(np.abs(self._wt).sum(axis=0).max())

    @property
    def dim(self) -> int:
        """Features per kernel, `2D`."""
        return 2 * self.n_features

    @property
    def frequency_matrix(self) -> np.ndarray:
        """`Vᵀ (d, N·D)`: every kernel's frequencies side by side, the layout the compiled kernels read."""
        return self._wt

    @property
    def scratch(self) -> np.ndarray:
        """A `2·N·D` work buffer for the compiled feature kernels (angles, then cosines); one per bank, so
        a bank is not to be shared between threads."""
        return self._angles

    @property
    def kernel_names(self) -> list[str]:
        if self.specs is None:
            return [f"k{p}" for p in range(self.n_kernels)]
        return [s.key for s in self.specs]

    def check_input(self, x: np.ndarray) -> np.ndarray:
        """`x` as a contiguous float64 vector of the right length, or a `ValueError` saying why not."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.shape != (self.n_inputs,):
            raise ValueError(f"expected an input of shape ({self.n_inputs},), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("input contains a non-finite value")
        return x

    def transform_into(self, x: np.ndarray, out: np.ndarray) -> None:
        """Fast path: `x` must be a float64 vector of length `d`, `out` a float64 `(N, 2D)` array."""
        _kern.rff_transform_into(self._wt, x, self._angles, out)

    def transform_one(self, x: np.ndarray) -> np.ndarray:
        """All kernels' features of one sample, shape `(N, 2D)`."""
        out = np.empty((self.n_kernels, self.dim))
        self.transform_into(self.check_input(x), out)
        return out

    def transform_many(self, xs: np.ndarray) -> np.ndarray:
        """Features of each row of `xs`, shape `(T, N, 2D)`."""
        xs = np.ascontiguousarray(xs, dtype=np.float64)
        if xs.ndim != 2 or xs.shape[1] != self.n_inputs:
            raise ValueError(f"expected inputs of shape (T, {self.n_inputs}), got {xs.shape}")
        out = np.empty((xs.shape[0], self.n_kernels, self.dim))
        _kern.rff_transform_many(self._wt, xs, out)
        return out

    def kernel(self, p: int) -> RFFMap:
        """Kernel `p` alone as a flat :class:`FeatureMap`."""
        return RFFMap(RFFBank.from_frequencies(self.frequencies[p : p + 1],
                                               None if self.specs is None else self.specs[p : p + 1]))

    def __repr__(self) -> str:
        return (f"RFFBank(N={self.n_kernels}, D={self.n_features}, d={self.n_inputs}, "
                f"version={self.version})")


@durable("core.RFFMap")
class RFFMap:
    """One kernel's random features as a flat vector, optionally with a constant bias feature.

    >>> fm = RFFMap(RFFBank(["gaussian:1.0"], n_features=4, n_inputs=2, seed=1), bias=True)
    >>> fm.dim
    9
    >>> float(fm.transform_one(np.zeros(2))[-1])
    1.0
    """

    def __init__(self, bank: RFFBank, bias: bool = False) -> None:
        if bank.n_kernels != 1:
            raise ValueError("RFFMap wraps a bank of exactly one kernel; use RFFBank.kernel(p)")
        self.bank = bank
        self.bias = bias
        self._buf = np.empty((1, bank.dim))

    @property
    def dim(self) -> int:
        return self.bank.dim + (1 if self.bias else 0)

    @property
    def n_inputs(self) -> int:
        return self.bank.n_inputs

    @property
    def version(self) -> str:
        return self.bank.version + ("+b" if self.bias else "")

    def transform_one(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(self.dim)
        self.bank.transform_into(self.bank.check_input(x), self._buf)
        out[: self.bank.dim] = self._buf[0]
        if self.bias:
            out[-1] = 1.0
        return out

    def transform_many(self, xs: np.ndarray) -> np.ndarray:
        z = self.bank.transform_many(xs)[:, 0, :]
        if self.bias:
            z = np.concatenate([z, np.ones((z.shape[0], 1))], axis=1)
        return z


def gaussian_dictionary(n_kernels: int, low: float = 0.05, high: float = 5.0) -> list[KernelSpec]:
    """`n_kernels` Gaussian kernels with bandwidths spaced geometrically over `[low, high]`.

    >>> [s.key for s in gaussian_dictionary(3, 0.1, 10.0)]
    ['gaussian:0.1', 'gaussian:1.0', 'gaussian:10.0']
    """
    if n_kernels == 1:
        return [KernelSpec("gaussian", float(np.sqrt(low * high)))]
    bws = np.geomspace(low, high, n_kernels)
    return [KernelSpec("gaussian", float(round(b, 12))) for b in bws]


def standardised_dictionary(n_kernels: int, n_inputs: int) -> list[KernelSpec]:
    """Gaussian bandwidths for inputs standardised to unit variance per column (the learners' default).

    Two such points lie `√(2d)` apart on average (`d` inputs), the median heuristic's bandwidth; the
    dictionary spans `[√(2d)/8, 4√(2d)]` geometrically, so evidence (FedBNR) or the kernel weights
    (POF-MKL) can choose a rougher or a smoother fit. It depends on `d` only, never on the data.

    >>> [s.key for s in standardised_dictionary(3, 2)]
    ['gaussian:0.25', 'gaussian:1.414213562373', 'gaussian:8.0']
    """
    mid = float(np.sqrt(2.0 * max(int(n_inputs), 1)))
    return gaussian_dictionary(n_kernels, mid / 8.0, 4.0 * mid)

