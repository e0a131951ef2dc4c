"""Robust combination of gradient-like updates, on stacked rows (pure numpy; docs/algorithms.md §10.1).

Aggregating the plain mean of `n` clients' updates lets one client move the result anywhere. These are the
two robust replacements a fleet may choose (`[fleet.robust] aggregation = "robust"`, with `trim` and
`clip_factor`), for any algorithm whose updates are vectors to be averaged (POF-MKL's `Δ_p`, network deltas):

* :func:`clip_rows` — each row scaled down to a norm of at most `τ` (direction kept);
* :func:`trimmed_mean` — per coordinate, the mean of the values left after dropping the `k = ⌊trim·n⌋`
  smallest and the `k` largest (`k` at most `⌊(n−1)/2⌋`, so something is always left: `trim = 0.5` is the
  coordinate-wise median, `trim = 0` the plain mean);
* :func:`clip_threshold` — `τ = clip_factor × median of the row norms`, the scale honest rows set.

>>> rows = np.array([[1.0, 0.0], [2.0, 1.0], [3.0, 2.0], [1e9, -1e9]])
>>> trimmed_mean(rows, 0.25).tolist(), trimmed_mean(rows, 0.5).tolist()
([2.5, 0.5], [2.5, 0.5])
>>> clip_rows(rows, 5.0)[3].round(3).tolist()
[3.536, -3.536]
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["clip_rows", "clip_threshold", "row_norms", "trim_count", "trimmed_mean"]


def row_norms(rows: np.ndarray) -> np.ndarray:
    """`‖r_i‖₂` of each row of a 2-D array (`inf` where the squares overflow: such a row is beyond any bound).

    >>> row_norms(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [5.0, 0.0]
    """
    with np.errstate(over="ignore"):
        return np.sqrt(np.einsum("ij,ij->i", rows, rows))


def trim_count(n: int, trim: float) -> int:
    """How many values :func:`trimmed_mean` drops off each side of `n`: `⌊trim·n⌋`, at most `⌊(n−1)/2⌋`.

    >>> [trim_count(n, 0.25) for n in (1, 3, 4, 12)], trim_count(12, 0.5)
    ([0, 0, 1, 3], 5)
    """
    if not 0.0 <= trim <= 0.5:
        raise ValueError(f"trim must be in [0, 0.5], got {trim!r}")
    return min(int(math.floor(trim * n)), (n - 1) // 2) if n > 0 else 0


def trimmed_mean(rows: np.ndarray, trim: float) -> np.ndarray:
    """Coordinate-wise trimmed mean of the rows of `rows` (`(n, d)` → `(d,)`), `trim` off each side.

    >>> trimmed_mean(np.array([[0.0], [1.0], [100.0]]), 0.5).tolist()
    [1.0]
    """
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise ValueError(f"trimmed_mean needs a non-empty (n, d) array, got shape {rows.shape}")
    n = rows.shape[0]
    k = trim_count(n, trim)
    if k == 0:
        return rows.mean(axis=0)
    return np.sort(rows, axis=0)[k : n - k].mean(axis=0)


def clip_threshold(norms: np.ndarray, clip_factor: float) -> float:
    """`clip_factor × median(norms)`: rows longer than that are clipped (:func:`clip_rows`).

    >>> clip_threshold(np.array([1.0, 2.0, 1e300]), 2.0)
    4.0
    """
    if not (clip_factor >= 1.0 and math.isfinite(clip_factor)):
        raise ValueError(f"clip_factor must be finite and >= 1, got {clip_factor!r}")
    if norms.size == 0:
        return 0.0
    return float(clip_factor * np.median(norms))


def clip_rows(rows: np.ndarray, tau: float, norms: np.ndarray | None = None) -> np.ndarray:
    """Rows scaled to a norm of at most `tau` (a new array; rows within it are unchanged, bit for bit).

    >>> clip_rows(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0).tolist()
    [[0.6000000000000001, 0.8], [0.3, 0.4]]
    """
    rows = np.array(rows, dtype=np.float64)
    norms = row_norms(rows) if norms is None else norms
    over = norms > tau
    if np.any(over):
        # a row whose norm overflowed (inf) is first brought to a finite scale, then clipped
        big = rows[over]
        scale = np.abs(big).max(axis=1, keepdims=True)
        unit = big / scale
        rows[over] = unit * (tau / row_norms(unit))[:, None]
    return rows
