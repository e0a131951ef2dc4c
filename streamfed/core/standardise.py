"""Online standardisation from the past only: the defaults' answer to "my stream is not on a unit scale".

A learner on random Fourier features sees `x` through kernels of bandwidth ~1 and starts from a prior
(FedBNR) or from `θ = 0` (POF-MKL) whose natural output scale is ~1. A user's stream is neither: air
pressure is ~1000, an approval rating ~40. :class:`OnlineStandardiser` maps each column to
`z = (v - mean) / scale` using the running mean and sample standard deviation of the values seen
*before* `v` (Welford's update), so no value ever informs its own transform, and maps predictions back
(`mean + scale·m`, variance `scale²·v`).

It is the same rule as the replay's `"online"` normalisation (docs/algorithms.md §11), one sample at a
time: the first `warmup` samples (default 2, the fewest with a defined sample standard deviation) only
initialise the statistics; a column whose past has zero spread falls back to `|mean|` (a relative
change) or to 1.

Inputs may also be winsorised: with `clip`, a standardised value is kept within `±clip`. The learners'
defaults clip inputs at :data:`INPUT_CLIP` = 5 standard deviations (never the target): a random-feature
model has no sensible answer far outside the data it has seen (`cos(ωᵀx)` does not decay), and one
reading 75 σ out (heavy rain) made FedBNR predict CO 12 times the truth; clipped, the same reading is
treated as "very rainy", which is what it is.

A value that would make the statistics non-finite (say `1e300`, whose square overflows) is refused
with a `ValueError` and changes nothing: one absurd reading must not wreck the scale of every later one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from streamfed.core.durable import durable

if TYPE_CHECKING:
    from types import SimpleNamespace

__all__ = ["DEFAULT_WARMUP", "INPUT_CLIP", "DeclaredScales", "OnlineStandardiser", "StreamScales"]

DEFAULT_WARMUP = 2
INPUT_CLIP = 5.0  # standard deviations: where the defaults winsorise a standardised input

_KERNELS: SimpleNamespace | None = None


def _kernels() -> SimpleNamespace:
    """The compiled row kernels (:mod:`._scale_kernels`), loaded at first use: reading a configuration that
    names a standardiser needs no compiled code."""
    global _KERNELS
    if _KERNELS is None:
        from streamfed.core.compiled import features

        _KERNELS = features
    return _KERNELS


@durable("core.OnlineStandardiser")
class OnlineStandardiser:
    """Running per-column standardisation of a stream, transform-then-fold.

    >>> s = OnlineStandardiser(1)
    >>> for v in (10.0, 12.0):
    ...     s.update(np.array([v]))
    >>> s.ready, s.mean.tolist(), s.scale.tolist()
    (True, [11.0], [1.4142135623730951])
    >>> z = s.transform(np.array([13.0]))
    >>> float(z[0]), s.inverse_mean(float(z[0]))
    (1.414213562373095, 13.0)
    """

    def __init__(self, n_columns: int, warmup: int = DEFAULT_WARMUP, clip: float | None = None) -> None:
        if n_columns < 1:
            raise ValueError(f"n_columns must be >= 1, got {n_columns}")
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        if clip is not None and not clip > 0:
            raise ValueError(f"clip must be > 0 or None, got {clip!r}")
        self.n_columns = int(n_columns)
        self.warmup = int(warmup)
        self.clip = None if clip is None else float(clip)
        self.count = 0
        self.mean = np.zeros(self.n_columns)
        self.m2 = np.zeros(self.n_columns)

    def copy(self) -> OnlineStandardiser:
        """An independent copy (the arrays are replaced, never written in place, so sharing them is safe):
        a per-sample `copy.deepcopy` cost more than the standardisation itself."""
        twin = object.__new__(OnlineStandardiser)
        twin.__dict__.update(self.__dict__)
        return twin

    @property
    def ready(self) -> bool:
        """Whether enough samples have been seen for :meth:`transform` to be used."""
        return self.count >= self.warmup

    @property
    def scale(self) -> np.ndarray:
        """Per-column scale: the past sample standard deviation, or `|mean|`, or 1 (module doc)."""
        if self.count >= 2:
            s = np.sqrt(self.m2 / (self.count - 1))
            if (s > 0.0).all():  # the common case, without the masks below
                return s
        s = np.sqrt(self.m2 / (self.count - 1)) if self.count >= 2 else np.zeros(self.n_columns)
        flat = ~(s > 0.0)
        if flat.any():
            s = s.copy()
            s[flat] = np.where(self.mean[flat] != 0.0, np.abs(self.mean[flat]), 1.0)
        return s

    def transform(self, v: np.ndarray) -> np.ndarray:
        """`(v - mean) / scale` with the statistics of the past (before :meth:`update` folds `v` in),
        within `±clip` if set."""
        v = np.asarray(v, dtype=np.float64)
        if v.shape == (self.n_columns,):  # one row: one compiled call, the same arithmetic
            z = np.empty(self.n_columns)
            _kernels().standardise_row(self.mean, self.m2, self.count, 0.0 if self.clip is None else self.clip,
                                       np.ascontiguousarray(v), z)
            return z
        z = (v - self.mean) / self.scale
        if self.clip is None:
            return z
        return np.minimum(np.maximum(z, -self.clip, out=z), self.clip, out=z)  # np.clip, at half its cost

    def update(self, v: np.ndarray) -> None:
        """Fold `v` into the statistics (Welford). Refused with `ValueError`, nothing changed, if the
        result would not be finite."""
        v = np.asarray(v, dtype=np.float64)
        if v.shape != (self.n_columns,):
            raise ValueError(f"expected {self.n_columns} values, got shape {v.shape}")
        self.mean, self.m2 = self.folded(v)
        self.count += 1

    def folded(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(mean, m2)` with the row `v` folded in (Welford), new arrays; this standardiser unchanged.
        `ValueError` if the result would not be finite."""
        # delta = v - mean; mean += delta / (count + 1); m2 += delta * (v - mean), compiled (._scale_kernels)
        mean, m2 = np.empty(self.n_columns), np.empty(self.n_columns)
        if not _kernels().welford_row(self.mean, self.m2, self.count, np.ascontiguousarray(v), mean, m2):
            raise ValueError("value too large to standardise (its square overflows)")
        return mean, m2

    # -- one-column standardisers (the target), in Python floats: the operations of the compiled row kernels in the
    # same order, so the same numbers, without an array per value
    def transform_value(self, v: float) -> float:
        """:meth:`transform` of one value of a one-column standardiser without clip."""
        return (v - float(self.mean[0])) / self._scale0()

    def folded_value(self, v: float) -> tuple[float, float]:
        """:meth:`folded` of one value of a one-column standardiser: `(mean, m2)` as floats."""
        mean = float(self.mean[0])
        delta = v - mean
        mu = mean + delta / (self.count + 1)
        m2 = float(self.m2[0]) + delta * (v - mu)
        if not (math.isfinite(mu) and math.isfinite(m2)):
            raise ValueError("value too large to standardise (its square overflows)")
        return mu, m2

    def transform_many(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row by row, as :meth:`transform` then :meth:`update` would: returns `(z, ready)` with `z[t]`
        the transform of `rows[t]` from the statistics of everything before it and `ready[t]` whether
        they were usable then (`z[t]` is NaN where not). All or nothing: if a row is refused, nothing is
        folded in and the `ValueError` says which row.

        >>> s = OnlineStandardiser(1)
        >>> z, ready = s.transform_many(np.array([[1.0], [3.0], [5.0]]))
        >>> ready.tolist(), float(z[2, 0]), s.count
        ([False, False, True], 2.1213203435596424, 3)
        """
        rows = np.asarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.n_columns:
            raise ValueError(f"expected rows of {self.n_columns} values, got shape {rows.shape}")
        work = OnlineStandardiser(self.n_columns, self.warmup, self.clip)
        work.count, work.mean, work.m2 = self.count, self.mean.copy(), self.m2.copy()
        z = np.full(rows.shape, np.nan)
        ready = np.zeros(rows.shape[0], dtype=bool)
        for t in range(rows.shape[0]):
            if work.ready:
                z[t] = work.transform(rows[t])
                ready[t] = True
            try:
                work.update(rows[t])
            except ValueError as e:
                raise ValueError(f"row {t}: {e}") from None
        self.count, self.mean, self.m2 = work.count, work.mean, work.m2
        return z, ready

    # -- mapping predictions back (one-column standardisers: the target) ----------------------
    def _scale0(self) -> float:
        """`scale[0]` in Python floats (the same operations: the same number, without a dozen numpy calls)."""
        var = self.m2[0] / (self.count - 1) if self.count >= 2 else 0.0
        s = math.sqrt(var) if var > 0.0 else 0.0  # (numpy's sqrt of a rounding-negative m2 is NaN: not > 0 either)
        if not s > 0.0:
            s = abs(float(self.mean[0])) if self.mean[0] != 0.0 else 1.0
        return float(s)

    def inverse_mean(self, m: float) -> float:
        """A prediction in standard units back to the stream's units: `mean + scale·m`."""
        return float(self.mean[0] + self._scale0() * m)

    def inverse(self, m: float, v: float | None) -> tuple[float, float | None]:
        """`(inverse_mean(m), inverse_var(v))` (`None` for `v = None`), the scale read once."""
        s = self._scale0()
        return float(self.mean[0] + s * m), (None if v is None else s * s * float(v))

    def inverse_var(self, v: float) -> float:
        """A predictive variance back to the stream's units: `scale²·v`."""
        s = self._scale0()
        return s * s * float(v)

    def fallback(self) -> tuple[float, float]:
        """The prediction before the learner has seen a sample: the past mean, and the past variance
        (or `scale²`, the module's fallback, when fewer than two values are known)."""
        if self.count == 0:
            return 0.0, 1.0
        s = float(self.scale[0])
        return float(self.mean[0]), s * s

    def state(self) -> dict[str, object]:
        """Plain values for a snapshot (see :meth:`from_state`)."""
        return {"count": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist(), "warmup": self.warmup,
                "clip": self.clip}

    @classmethod
    def from_state(cls, state: dict[str, object]) -> OnlineStandardiser:
        """Rebuild from :meth:`state`, checking it."""
        mean = np.asarray(state["mean"], dtype=np.float64)
        m2 = np.asarray(state["m2"], dtype=np.float64)
        count = int(state["count"])  # type: ignore[call-overload]
        if mean.ndim != 1 or m2.shape != mean.shape or count < 0 or not (
                np.all(np.isfinite(mean)) and np.all(np.isfinite(m2)) and np.all(m2 >= 0)):
            raise ValueError("corrupt standardiser state")
        clip = state.get("clip")
        out = cls(mean.shape[0], int(state.get("warmup", DEFAULT_WARMUP)),  # type: ignore[call-overload]
                  None if clip is None else float(clip))  # type: ignore[arg-type]
        out.count, out.mean, out.m2 = count, mean, m2
        return out



@durable("core.StreamScales")
class StreamScales:
    """A stream's input and target standardisers, used the way every default learner uses them: learn in
    standard units from the scales of the past, fold the sample in on copies (a refused sample changes
    nothing), map predictions back to the stream's units. Inputs are winsorised at `±INPUT_CLIP`.

    >>> scales, seen = StreamScales(1), []
    >>> for v in (10.0, 12.0, 14.0):
    ...     scales.learn(np.array([v]), v / 2, lambda z, zy: seen.append(round(zy, 6)))
    >>> seen  # the third target, 7, in standard units of the first two (mean 5.5, scale 1/√2)
    [2.12132]
    >>> scales.predict(np.array([12.0]), lambda z: (0.0, 1.0))  # μ = 0, v = 1 mapped back: mean, variance
    (6.0, 1.0)
    """

    def __init__(self, n_inputs: int, clip: float | None = INPUT_CLIP) -> None:
        self.x = OnlineStandardiser(n_inputs, clip=clip)
        self.y = OnlineStandardiser(1)

    @property
    def ready(self) -> bool:
        return self.y.ready

    def step(self, x: np.ndarray, y: float) -> tuple[np.ndarray | None, float, StreamScales]:
        """`(z_x, z_y, the scales with the sample folded in)`; `z_x` is None while the scales are not ready.
        `ValueError` (nothing changed) if the sample cannot be folded in."""
        nxt = object.__new__(StreamScales)
        nxt.x, nxt.y = self.x.copy(), self.y.copy()
        nxt.x.update(x)
        nxt.y.update(np.array([y]))
        if not self.ready:
            return None, 0.0, nxt
        return self.x.transform(x), float(self.y.transform(np.array([y]))[0]), nxt

    # The last predict's `(input bytes, input count, z_x)`: a learn of the same input next (progressive validation)
    # takes its `z_x` instead of standardising it again (class default: a state saved before it restores without).
    _last: tuple[bytes, int, np.ndarray] | None = None

    def learn(self, x: np.ndarray, y: float, learn: Callable[[np.ndarray, float], object]) -> None:
        """Call `learn(z_x, z_y)` once the scales are ready, then fold `(x, y)` in. `ValueError` (nothing changed)
        if the sample cannot be folded in or `learn` raises.

        The same numbers as :meth:`step` (same operations, same order), without its copies of the standardisers:
        the folded statistics are new arrays, assigned only once `learn` has returned."""
        x = np.asarray(x, dtype=np.float64)
        sx, sy = self.x, self.y
        if x.shape != (sx.n_columns,):
            raise ValueError(f"expected {sx.n_columns} values, got shape {x.shape}")
        y = float(y)
        zx = None
        if sy.ready:
            last = self._last
            if last is not None and last[1] == sx.count and last[0] == x.tobytes():
                zx = last[2]  # the scales have not moved since that predict: the same transform
            else:
                zx = sx.transform(x)
            zy = sy.transform_value(y)
        self._last = None
        mean_y, m2_y = sy.folded_value(y)  # ValueError: nothing changed
        mean_x, m2_x = sx.folded(x)
        if zx is not None:
            learn(zx, zy)
        sx.mean, sx.m2 = mean_x, m2_x
        sx.count += 1
        sy.mean, sy.m2 = np.array([mean_y]), np.array([m2_y])
        sy.count += 1

    def predict(self, x: np.ndarray, predict: Callable[[np.ndarray], tuple[float, float | None]]
                ) -> tuple[float, float | None]:
        """`predict(z_x)` mapped back (mean `m_y + s_y·μ`, variance `s_y²·v`); the past mean and variance
        (:meth:`OnlineStandardiser.fallback`) before the scales are ready or if the result is not finite."""
        if not self.ready:
            return self.y.fallback()
        x = np.asarray(x, dtype=np.float64)
        zx = self.x.transform(x)
        self._last = (x.tobytes(), self.x.count, zx)
        m, v = predict(zx)
        mean, var = self.y.inverse(m, v)
        if not math.isfinite(mean) or (var is not None and not (math.isfinite(var) and var > 0)):
            fm, fv = self.y.fallback()
            return fm, (None if v is None else fv)
        return mean, var

    def predict_many(self, x: np.ndarray, predict: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`predict` for the rows of `x` (`predict` returns means and variances of standard units)."""
        x = np.asarray(x, dtype=np.float64)
        if not self.ready:
            m, v = self.y.fallback()
            return np.full(x.shape[0], m), np.full(x.shape[0], v)
        mean, var = predict(self.x.transform(x))
        s = float(self.y.scale[0])
        return float(self.y.mean[0]) + s * mean, s * s * var



@durable("core.DeclaredScales")
class DeclaredScales(StreamScales):
    """Fixed, declared scales with the interface of :class:`StreamScales`: every sample is standardised with the
    same public `(mean, scale)` per input and for the target, nothing is learned from the stream. Under
    differential privacy the transform of one sample must not depend on the others (docs/privacy.md): the
    running scales would carry one sample into every later upload, declared ones carry nothing.

    >>> s = DeclaredScales([1000.0], [10.0], 40.0, 5.0)
    >>> zx, zy, nxt = s.step(np.array([1020.0]), 45.0)
    >>> zx.tolist(), zy, nxt is s, s.ready
    ([2.0], 1.0, True, True)
    >>> s.predict(np.array([1000.0]), lambda z: (0.5, 1.0))  # mapped back: 40 + 5·0.5, 5²·1
    (42.5, 25.0)
    """

    def __init__(self, x_mean: object, x_scale: object, y_mean: float = 0.0, y_scale: float = 1.0,
                 clip: float | None = INPUT_CLIP) -> None:
        xm = np.asarray(x_mean, dtype=np.float64).reshape(-1)
        xs = np.asarray(x_scale, dtype=np.float64).reshape(-1)
        if xm.shape != xs.shape or xm.size < 1:
            raise ValueError(f"declared scales: {xm.size} input means for {xs.size} scales")
        values = np.concatenate([xm, xs, [float(y_mean), float(y_scale)]])
        if not (np.isfinite(values).all() and (xs > 0).all() and float(y_scale) > 0):
            raise ValueError("declared scales must be finite, with every scale > 0")
        # standardisers frozen at the declared values: two "past samples" whose mean and sample deviation they are
        # (scale = sqrt(m2 / (count − 1)) with count 2), never updated
        self.x = OnlineStandardiser.from_state({"count": 2, "mean": xm.tolist(), "m2": (xs * xs).tolist(),
                                                "warmup": 0, "clip": clip})
        self.y = OnlineStandardiser.from_state({"count": 2, "mean": [float(y_mean)],
                                                "m2": [float(y_scale) ** 2], "warmup": 0, "clip": None})

    def step(self, x: np.ndarray, y: float) -> tuple[np.ndarray | None, float, StreamScales]:
        """`(z_x, z_y, self)`: the declared transform of this sample alone. `ValueError` for a value that is not
        finite or of the wrong width."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.x.n_columns,):
            raise ValueError(f"expected {self.x.n_columns} values, got shape {x.shape}")
        if not (np.isfinite(x).all() and math.isfinite(float(y))):
            raise ValueError("a value is not finite")
        return self.x.transform(x), float(self.y.transform(np.array([float(y)]))[0]), self

    def learn(self, x: np.ndarray, y: float, learn: Callable[[np.ndarray, float], object]) -> None:
        """Call `learn(z_x, z_y)` with the declared transform (nothing is folded in)."""
        zx, zy, _ = self.step(x, y)
        assert zx is not None  # the declared transform always has one (no warm-up)
        learn(zx, zy)
