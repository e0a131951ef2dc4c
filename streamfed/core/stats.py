"""Additive sufficient statistics of a linear-Gaussian model (docs/algorithms.md §4).

For features `φ(x) ∈ R^F` and targets `y` a set of samples is summarised by

    S = Σ φφᵀ  (F×F),   b = Σ φ y  (F,),   n = Σ 1,   q = Σ y²

These sums are additive across samples and clients, which is all federated Bayesian linear regression
(FedBNR) and the federated sparse GP (FSGP, features `c(Z, x)`) need. The container is deliberately
permissive about *values*: `n` is a float and `S` need not be positive semi-definite, so that
differential-privacy noise or secure-aggregation masks can be added to a delta and cancelled or
tolerated downstream. It is strict about *compatibility*: statistics computed under different feature
maps (kernel version) or epochs can never be added.

Leading batch axes are allowed (`S` of shape `(..., F, F)`, `b` of shape `(..., F)`), e.g. a kernel
dictionary keeps `K` feature maps' statistics of the same samples side by side: `(K, F, F)`, while
`n` and `q` are shared because they do not depend on the features.

On the wire only the upper triangle of `S` travels (`to_packed`), row-major, i.e. in the order of
`numpy.triu_indices(F)`: `F(F+1)/2` numbers instead of `F²`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamfed.core.durable import durable

__all__ = ["SufficientStats", "check_labelled_scatter", "pack_upper", "unpack_upper", "packed_size", "packed_dim"]


_SLACK = 1e-9  # relative slack of the inequalities below: far above rounding of honest sums, far below any attack


def check_labelled_scatter(S: np.ndarray, b: np.ndarray, q: float, n: float, label_bound: float | None = None, *,
                           names: tuple[str, str, str] = ("S", "b", "φ")) -> None:
    """`ValueError` unless `[[S, b], [bᵀ, q]]` (leading axes: one per kernel) could be `Σ [φ; y][φ; y]ᵀ` over
    `n` samples, with `|y| <= label_bound` when one is given: `q <= n·B²`; Cauchy–Schwarz over the samples,
    `b_i² <= S_ii·q` and `‖b‖² <= tr S·q` (implied by positive semi-definiteness up to its jitter; explicit,
    exact); and the augmented matrix, plus `1e-9·max(tr S + |q|, 1)` on its diagonal, Cholesky-factorisable
    (`LinAlgError`, a `ValueError`, when it is not). `names`: the scatter, the cross term and the feature, as the
    algorithm calls them (in the messages). The one rule the aggregations of summed statistics share.

    >>> phi, y = np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([1.0, -1.0])
    >>> check_labelled_scatter(phi.T @ phi, phi.T @ y, float(y @ y), 2.0, label_bound=1.0)
    >>> check_labelled_scatter(phi.T @ phi, 3 * phi.T @ y, float(y @ y), 2.0, label_bound=1.0)
    Traceback (most recent call last):
    ...
    ValueError: |b_i| exceeds √(S_ii·q): b is not Σ φ_i y of these samples
    """
    s_name, b_name, f_name = names
    S, b = np.asarray(S, dtype=np.float64), np.asarray(b, dtype=np.float64)
    trace = np.trace(S, axis1=-2, axis2=-1)
    if label_bound is not None:
        # B·B, not B**2: a float power overflowing raises OverflowError, a product becomes inf (no bound)
        bound2 = float(n) * (float(label_bound) * float(label_bound))
        if q > bound2 * (1.0 + _SLACK) + _SLACK:
            raise ValueError(f"q = {q:g} exceeds n·B² = {bound2:g}: labels beyond the label bound "
                             f"±{label_bound:g}")
        qq = max(q, 0.0)
        b2 = b * b
        # max(S_ii, 0)·q·(1 + slack) + slack, in that order (the same rounding as ever), in place: this runs per upload
        room = np.maximum(np.diagonal(S, axis1=-2, axis2=-1), 0.0)
        room *= qq
        room *= 1.0 + _SLACK
        room += _SLACK
        if (b2 > room).any():
            raise ValueError(f"|{b_name}_i| exceeds √({s_name}_ii·q): {b_name} is not Σ {f_name}_i y of these samples")
        if np.any(np.sum(b2, axis=-1) > np.maximum(trace, 0.0) * qq * (1.0 + _SLACK) + _SLACK):
            raise ValueError(f"‖{b_name}‖² exceeds tr {s_name} · q: {b_name} is not Σ {f_name} y of these samples")
    f = S.shape[-1]
    aug = np.empty(S.shape[:-2] + (f + 1, f + 1))
    aug[..., :f, :f] = S
    aug[..., :f, f] = b
    aug[..., f, :f] = b
    aug[..., f, f] = q
    jitter = 1e-9 * np.maximum(trace + abs(q), 1.0)
    diagonal = aug.reshape(aug.shape[:-2] + ((f + 1) ** 2,))[..., :: f + 2]  # a view of each diagonal
    diagonal += np.asarray(jitter)[..., None]
    # (LAPACK's dpotrf called directly through scipy was measured: ~4 µs of ~45 less CPU per F = 101 upload, not
    # worth a dependency that takes a second to import; the factorisation itself is the cost)
    np.linalg.cholesky(aug)


def packed_size(dim: int) -> int:
    """Length of the packed upper triangle of a `dim × dim` matrix."""
    return dim * (dim + 1) // 2


def packed_dim(size: int) -> int:
    """Inverse of :func:`packed_size` (`ValueError` if `size` is not a triangular number)."""
    dim = (math.isqrt(8 * size + 1) - 1) // 2
    if packed_size(dim) != size:
        raise ValueError(f"{size} is not the length of a packed upper triangle")
    return dim


def pack_upper(mat: np.ndarray) -> np.ndarray:
    """Upper triangle (diagonal included) of the last two axes, row-major: `(..., F, F)` → `(..., P)`.

    >>> pack_upper(np.array([[1.0, 2.0], [2.0, 3.0]]))
    array([1., 2., 3.])
    """
    mat = np.asarray(mat, dtype=np.float64)
    if mat.ndim < 2 or mat.shape[-1] != mat.shape[-2]:
        raise ValueError(f"expected (..., F, F) matrices, got shape {mat.shape}")
    dim = mat.shape[-1]
    out = np.empty(mat.shape[:-2] + (packed_size(dim),))
    pos = 0
    for i in range(dim):  # row by row: contiguous slices (fancy indexing with triu_indices is ~2x slower)
        out[..., pos:pos + dim - i] = mat[..., i, i:]
        pos += dim - i
    return out


def unpack_upper(packed: np.ndarray, dim: int | None = None) -> np.ndarray:
    """Symmetric matrices from packed upper triangles: `(..., P)` → `(..., F, F)`.

    >>> unpack_upper(np.array([1.0, 2.0, 3.0]))
    array([[1., 2.],
           [2., 3.]])
    """
    packed = np.asarray(packed, dtype=np.float64)
    if packed.ndim < 1:
        raise ValueError("a packed triangle needs at least one axis")
    if dim is None:
        dim = packed_dim(packed.shape[-1])
    elif packed.shape[-1] != packed_size(dim):
        raise ValueError(f"packed length {packed.shape[-1]} does not match F={dim}")
    if dim <= _GATHER_MAX_DIM:
        # one gather through a cached index (entry (i, j) of the matrix ← its packed position): ~10x faster than
        # two slice copies per row at F ≈ 100, and the same numbers (a copy)
        return np.take(packed, _symmetric_index(dim), axis=-1).reshape(packed.shape[:-1] + (dim, dim))
    out = np.empty(packed.shape[:-1] + (dim, dim))
    pos = 0
    for i in range(dim):  # row i of the triangle is row i and (mirrored) column i: slices, not fancy indexing
        row = packed[..., pos:pos + dim - i]
        out[..., i, i:] = row
        out[..., i + 1:, i] = row[..., 1:]
        pos += dim - i
    return out


_GATHER_MAX_DIM = 512  # an index of dim² intp (2 MiB at 512); beyond, the slice copies cost little per entry


_SYMMETRIC_INDEX: dict[int, np.ndarray] = {}


def _symmetric_index(dim: int) -> np.ndarray:
    """`idx[i·dim + j]` = the position of `(min(i, j), max(i, j))` in the packed upper triangle (row-major)."""
    idx = _SYMMETRIC_INDEX.get(dim)
    if idx is None:
        rows, cols = np.triu_indices(dim)
        full = np.empty((dim, dim), dtype=np.intp)
        full[rows, cols] = np.arange(rows.size)
        full[cols, rows] = np.arange(rows.size)
        idx = full.ravel()
        idx.flags.writeable = False
        if len(_SYMMETRIC_INDEX) < 64:  # a process sees a handful of feature dimensions
            _SYMMETRIC_INDEX[dim] = idx
    return idx


@durable("core.SufficientStats")
@dataclass(eq=False)
class SufficientStats:
    """`(S, b, n, q)` of a set of samples, in float64, tagged with the feature map that produced them.

    >>> phi = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    >>> y = np.array([1.0, 2.0, 3.0])
    >>> a = SufficientStats.from_samples(phi[:2], y[:2], kernel_version="k1")
    >>> c = SufficientStats.from_samples(phi[2:], y[2:], kernel_version="k1")
    >>> total = a + c
    >>> total.n, total.q
    (3.0, 14.0)
    >>> bool(np.allclose(total.S, phi.T @ phi))
    True
    >>> wire = total.to_packed()
    >>> wire["S_upper"].tolist()
    [1.25, 0.25, 1.25]
    >>> back = SufficientStats.from_packed(wire)
    >>> bool(np.array_equal(back.S, total.S)) and back == total
    True
    >>> (total - c) == a
    True
    """

    S: np.ndarray
    b: np.ndarray
    n: float
    q: float
    kernel_version: str = ""
    epoch: int = 0

    def __post_init__(self) -> None:
        self.S = np.array(self.S, dtype=np.float64)  # copies: statistics never alias a caller's array
        self.b = np.array(self.b, dtype=np.float64)
        self.n = float(self.n)
        self.q = float(self.q)
        self.epoch = int(self.epoch)
        self.kernel_version = str(self.kernel_version)
        if self.S.ndim < 2 or self.S.shape[-1] != self.S.shape[-2]:
            raise ValueError(f"S must have shape (..., F, F), got {self.S.shape}")
        if self.b.shape != self.S.shape[:-1]:
            raise ValueError(f"b has shape {self.b.shape}, expected {self.S.shape[:-1]} to match S")

    # ---------------------------------------------------------------- construction
    @classmethod
    def zeros(
        cls, dim: int, batch: tuple[int, ...] = (), kernel_version: str = "", epoch: int = 0
    ) -> SufficientStats:
        """Statistics of no samples, for `F = dim` features (and leading `batch` axes)."""
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        batch = tuple(int(k) for k in batch)
        return cls(np.zeros(batch + (dim, dim)), np.zeros(batch + (dim,)), 0.0, 0.0, kernel_version, epoch)

    @classmethod
    def from_samples(
        cls, phi: np.ndarray, y: np.ndarray, kernel_version: str = "", epoch: int = 0
    ) -> SufficientStats:
        """Statistics of `T` samples: `phi` of shape `(T, ..., F)`, `y` of shape `(T,)`."""
        phi = np.asarray(phi, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if phi.ndim < 2 or y.ndim != 1 or phi.shape[0] != y.shape[0]:
            raise ValueError(f"expected phi (T, ..., F) and y (T,), got {phi.shape} and {y.shape}")
        s = np.einsum("t...i,t...j->...ij", phi, phi)
        b = np.einsum("t...i,t->...i", phi, y)
        return cls(s, b, float(y.shape[0]), float(y @ y), kernel_version, epoch)

    @classmethod
    def from_packed(cls, data: dict[str, Any]) -> SufficientStats:
        """Inverse of :meth:`to_packed`."""
        s_upper = np.asarray(data["S_upper"], dtype=np.float64)
        b = np.asarray(data["b"], dtype=np.float64)
        dim = b.shape[-1] if b.ndim else 0
        return cls(
            unpack_upper(s_upper, dim),
            b,
            float(data["n"]),
            float(data["q"]),
            str(data.get("kernel_version", "")),
            int(data.get("epoch", 0)),
        )

    def to_packed(self) -> dict[str, Any]:
        """Plain arrays and scalars for a codec: `S_upper (..., F(F+1)/2)`, `b (..., F)`, `n`, `q`, tags."""
        return {
            "S_upper": pack_upper(self.S),
            "b": self.b.copy(),
            "n": self.n,
            "q": self.q,
            "kernel_version": self.kernel_version,
            "epoch": self.epoch,
        }

    # ---------------------------------------------------------------- shape
    @property
    def dim(self) -> int:
        """Number of features `F`."""
        return int(self.S.shape[-1])

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading axes (e.g. `(K,)` for a kernel dictionary); `()` for one feature map."""
        return tuple(self.S.shape[:-2])

    @property
    def tag(self) -> tuple[str, int]:
        """What must agree for two statistics to be combined."""
        return (self.kernel_version, self.epoch)

    # ---------------------------------------------------------------- algebra
    def _check_compatible(self, other: SufficientStats) -> None:
        if not isinstance(other, SufficientStats):
            raise TypeError(f"cannot combine SufficientStats with {type(other).__name__}")
        if other.tag != self.tag:
            raise ValueError(
                "statistics of different kernel versions/epochs cannot be combined: "
                f"{self.tag} vs {other.tag}"
            )
        if other.S.shape != self.S.shape:
            raise ValueError(f"statistics shapes differ: {self.S.shape} vs {other.S.shape}")

    def __add__(self, other: SufficientStats) -> SufficientStats:
        self._check_compatible(other)
        return SufficientStats(self.S + other.S, self.b + other.b, self.n + other.n, self.q + other.q,
                               self.kernel_version, self.epoch)

    def __sub__(self, other: SufficientStats) -> SufficientStats:
        self._check_compatible(other)
        return SufficientStats(self.S - other.S, self.b - other.b, self.n - other.n, self.q - other.q,
                               self.kernel_version, self.epoch)

    def __iadd__(self, other: SufficientStats) -> SufficientStats:
        self._check_compatible(other)
        self.S += other.S
        self.b += other.b
        self.n += other.n
        self.q += other.q
        return self

    def __isub__(self, other: SufficientStats) -> SufficientStats:
        self._check_compatible(other)
        self.S -= other.S
        self.b -= other.b
        self.n -= other.n
        self.q -= other.q
        return self

    def scaled(self, factor: float) -> SufficientStats:
        """All statistics times `factor` (e.g. exponential forgetting of a whole summary)."""
        f = float(factor)
        return SufficientStats(self.S * f, self.b * f, self.n * f, self.q * f,
                               self.kernel_version, self.epoch)

    def copy(self) -> SufficientStats:
        return SufficientStats(self.S, self.b, self.n, self.q, self.kernel_version, self.epoch)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SufficientStats):
            return NotImplemented
        return (
            self.tag == other.tag
            and self.S.shape == other.S.shape
            and bool(np.array_equal(self.S, other.S))
            and bool(np.array_equal(self.b, other.b))
            and self.n == other.n
            and self.q == other.q
        )

    # ---------------------------------------------------------------- checks
    def is_finite(self) -> bool:
        """True when every number is finite (never publish statistics for which this is False)."""
        return bool(
            np.isfinite(self.S).all() and np.isfinite(self.b).all() and math.isfinite(self.n)
            and math.isfinite(self.q)
        )

    def check_finite(self) -> SufficientStats:
        """`self`, or a `ValueError` if any number is not finite."""
        if not self.is_finite():
            raise ValueError("sufficient statistics contain a non-finite value")
        return self

    def __repr__(self) -> str:
        return (f"SufficientStats(F={self.dim}, batch={self.batch_shape}, n={self.n:g}, q={self.q:g}, "
                f"kernel_version={self.kernel_version!r}, epoch={self.epoch})")
