"""What every streamfed River estimator shares: a dict of features read as a vector in a fixed key order,
and River's Gaussian for `predict_one(x, with_dist=True)`.

The key order is fixed at the first `learn_one` (sorted, so it never depends on the order in which
features arrive); later a missing key reads 0 and an unknown key is ignored. A None, NaN or
non-numeric value is a `ValueError`, raised before anything changes.

>>> keys = sorted_keys({"b": 2.0, "a": 1.0})
>>> keys, dict_to_vector(keys, {"a": 1.0, "c": 9.0}).tolist()
(['a', 'b'], [1.0, 0.0])
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from river.proba import Gaussian

__all__ = ["dict_to_vector", "gaussian", "learn_rows", "require_positive", "sorted_keys"]


def sorted_keys(x: dict) -> list[Any]:
    """The keys of `x` sorted; mixed key types by (type name, repr): still a deterministic order."""
    try:
        return sorted(x)
    except TypeError:
        return sorted(x, key=lambda k: (type(k).__name__, repr(k)))


def dict_to_vector(keys: Sequence[Any], x: dict) -> np.ndarray:
    """`x` read in `keys` order (a missing key reads 0); `ValueError` for a None/NaN/non-numeric value."""
    try:  # the common case: every key there, real numbers (a C array of doubles refuses None, str and bytes)
        packed = array("d", map(x.__getitem__, keys))
    except (KeyError, TypeError, OverflowError):
        packed = None  # a missing key, or a value to look at one by one below
    if packed is not None:
        try:
            finite = math.isfinite(math.fsum(packed))  # inf or NaN anywhere makes the exact sum inf or NaN
        except OverflowError:  # finite values whose sum overflows: one by one below
            finite = False
        if finite:
            return np.frombuffer(packed, dtype=np.float64)  # (its own buffer: no copy)
    values = []
    for k in keys:
        v = x.get(k, 0.0)
        if v is None or isinstance(v, (str, bytes)):
            raise ValueError(f"feature {k!r} has the non-numeric value {v!r}")
        try:
            f = float(v)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"feature {k!r} has the non-numeric value {v!r}") from exc
        if not math.isfinite(f):
            raise ValueError("input contains a non-finite value")
        values.append(f)
    return np.array(values, dtype=np.float64)


def learn_rows(estimator: Any, keys: Sequence[Any] | None, xs: Any, ys: Any, *, square_finite: bool = False) -> None:
    """`estimator.learn_one` over the rows of a `(T, d)` array (columns in `keys` order; a DataFrame is
    selected by key; `keys` None: the array's columns, or the DataFrame's sorted) — all or nothing: a shape
    mismatch or a non-finite value (with `square_finite`, a target whose square overflows) is a `ValueError`
    before anything is learned, and a row the estimator refuses restores its state as it was.

    >>> class Est:
    ...     def __init__(self): self.seen = []
    ...     def learn_one(self, x, y):
    ...         if y < 0: raise ValueError("negative")
    ...         self.seen.append((x, y))
    >>> e = Est()
    >>> learn_rows(e, None, np.array([[1.0, 2.0]]), np.array([3.0])); e.seen
    [({0: 1.0, 1: 2.0}, 3.0)]
    >>> learn_rows(e, None, np.array([[1.0, 2.0], [0.0, 0.0]]), np.array([1.0, -1.0]))
    Traceback (most recent call last):
    ...
    ValueError: negative
    >>> len(e.seen)
    1
    """
    import copy

    if hasattr(xs, "columns"):
        keys = list(keys) if keys else sorted_keys({c: None for c in xs.columns})
        arr = np.asarray(xs[keys].to_numpy(), dtype=np.float64)
    else:
        arr = np.asarray(xs, dtype=np.float64)
        keys = list(keys) if keys else list(range(arr.shape[1] if arr.ndim == 2 else 0))
    yarr = np.asarray(ys, dtype=np.float64)
    with np.errstate(over="ignore"):
        finite_y = np.all(np.isfinite(yarr * yarr if square_finite else yarr))
    if arr.ndim != 2 or arr.shape[1] != len(keys) or yarr.shape != (arr.shape[0],) \
            or not np.all(np.isfinite(arr)) or not finite_y:
        raise ValueError(f"expected finite xs (T, {len(keys)}) and ys (T,), got {arr.shape} and {yarr.shape}")
    before = copy.deepcopy(estimator.__dict__)
    try:
        for row, target in zip(arr, yarr, strict=True):
            estimator.learn_one(dict(zip(keys, row.tolist(), strict=True)), float(target))
    except ValueError:
        estimator.__dict__.update(before)
        raise


def require_positive(estimator: Any, names: Sequence[str]) -> None:
    """`ValueError` naming the first of an estimator's parameters `names` that is set (not None) and not a finite
    positive number: what every River estimator here checks of its scales and rates at construction.

    >>> from types import SimpleNamespace
    >>> require_positive(SimpleNamespace(a=1.0, b=None), ["a", "b"])
    >>> require_positive(SimpleNamespace(a=0.0), ["a"])
    Traceback (most recent call last):
    ...
    ValueError: a must be finite and > 0, got 0.0
    """
    for name in names:
        if getattr(estimator, name) is None:
            continue
        v = float(getattr(estimator, name))
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be finite and > 0, got {v!r}")


def gaussian(mean: float, var: float) -> Gaussian:
    """`river.proba.Gaussian(mean, var)`. Imported on use, not at module level: `river.proba` imports
    scipy.stats (~70 MiB resident, ~0.7 s), which an agent, predicting through the array path, never needs."""
    gauss, var_cls, mean_cls = _RIVER or _river_classes()
    # What Gaussian._from_state(n=1, m=mean, var=var, ddof=0) builds, without its `random.Random(None)`: a fresh
    # generator seeded from the OS per distribution (10–30 µs, more than a whole FedBNR step at F = 101), and
    # without the `Mean` that `Var.__init__` makes only for `_from_state` to replace. Samples drawn from the
    # returned distributions come from one generator per process, itself seeded from the OS.
    m = mean_cls.__new__(mean_cls)
    m.n = 1  # noqa: SLF001 (River's own attributes, as its constructors and _from_state set them)
    m._mean = mean  # noqa: SLF001
    v = var_cls.__new__(var_cls)
    v.ddof = 0
    v.mean = m
    v._S = var  # noqa: SLF001 ((n - ddof)·var with n = 1, ddof = 0)
    g = gauss.__new__(gauss)
    g.seed = None
    g._rng = _shared_rng()  # noqa: SLF001
    g._var = v  # noqa: SLF001
    return g


_RIVER: tuple[Any, Any, Any] | None = None  # (Gaussian, Var, Mean), imported at the first gaussian()


def _river_classes() -> tuple[Any, Any, Any]:
    global _RIVER
    from river import stats
    from river.proba import Gaussian

    _RIVER = (Gaussian, stats.Var, stats.Mean)
    return _RIVER


_RNG: random.Random | None = None


def _shared_rng() -> random.Random:
    global _RNG
    if _RNG is None:
        _RNG = random.Random()
    return _RNG
