"""The normalisations of docs/algorithms.md §11.

- `"paper"`: inputs divided by the largest row norm `max_t ‖x_t‖` over the *whole dataset* (every
  client, every time step) and the target min-max scaled to `[0, 1]` over the whole dataset. This is
  what the POF-MKL authors did; it looks at the future, so it is only for paper-faithful replay.
- `"online"`: each client standardises every column (inputs and target) with the running mean and
  standard deviation of *its own past samples only* (Welford's update), as a deployed agent would.
  Sample `t` is transformed with the statistics of samples `0..t-1` and only then folded in, so no
  sample ever sees its own value. The first `warmup` samples (default 2, the fewest with a defined
  sample standard deviation) have no usable history: they only initialise the statistics and are
  not emitted (counted in :attr:`ClientStream.warmup`). When the past of a column has zero spread
  (all past values equal, e.g. no rain yet), its scale falls back to `|mean|` — a relative change,
  unit-free like a z-score — or to 1 if the mean is 0 too. The target's per-sample mean and scale
  are kept (`y_offset`, `y_scale`) to map predictions back to original units.
- `"none"`: raw values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from streamfed.evaluation.datasets.base import NORMALISATIONS, ClientStream, Fleet

DEFAULT_WARMUP = 2
# the skip reason of a row whose statistics would overflow (its square is beyond float64)
TOO_LARGE = "too_large"


def online_standardise(values: np.ndarray, warmup: int = DEFAULT_WARMUP
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standardise each column with the mean and sample std of the *previous* rows only.

    Returns `(z, offset, scale)`, each shaped like `values` (`(T,)` or `(T, d)`), with
    `values = z * scale + offset`; rows before `warmup` are NaN (no usable history), and so is a row
    refused because its statistics would overflow (see :func:`online_standardise_rows`). `z[t]` depends
    on `values[:t + 1]` only.

    >>> z, offset, scale = online_standardise(np.array([1.0, 3.0, 2.0, 10.0]))
    >>> z.tolist()[2:], offset.tolist()[2:]
    ([0.0, 8.0], [2.0, 2.0])
    """
    z, offset, scale, _ = online_standardise_rows(values, warmup)
    return z, offset, scale


def online_standardise_rows(values: np.ndarray, warmup: int = DEFAULT_WARMUP
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`online_standardise` and, per row, whether it was refused: a row (all its columns together)
    whose square would overflow the statistics is not folded in and is NaN, so the rows after it are
    standardised as if it had never come — the rule of the agents' :class:`~streamfed.core.standardise.
    OnlineStandardiser`.

    >>> z, _, _, refused = online_standardise_rows(np.array([1.0, 3.0, 1e300, 2.0]))
    >>> refused.tolist(), z.tolist()[3]
    ([False, False, True, False], 0.0)
    """
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 (the first sample has no past), got {warmup}")
    v = np.asarray(values, dtype=np.float64)
    if v.ndim not in (1, 2):
        raise ValueError(f"values must be (T,) or (T, d), got shape {v.shape}")
    v2 = np.ascontiguousarray(v.reshape(v.shape[0], -1))
    z, offset, scale = (np.empty_like(v2) for _ in range(3))
    refused = np.zeros(v2.shape[0], dtype=np.bool_)
    from streamfed.evaluation.datasets._past_scale import past_standardise  # numba only when it is needed

    past_standardise(v2, int(warmup), z, offset, scale, refused)
    return z.reshape(v.shape), offset.reshape(v.shape), scale.reshape(v.shape), refused


def paper_constants(streams: Sequence[ClientStream]) -> dict[str, float]:
    """`x_norm` (largest input row norm) and `y_min`, `y_max` over all samples of `streams`."""
    x_norm = max(float(np.sqrt(np.einsum("ij,ij->i", s.X, s.X)).max(initial=0.0)) for s in streams)
    y_min = min(float(s.y.min(initial=np.inf)) for s in streams)
    y_max = max(float(s.y.max(initial=-np.inf)) for s in streams)
    return {"x_norm": x_norm, "y_min": y_min, "y_max": y_max}


def _paper(stream: ClientStream, c: dict[str, float], target: bool = True) -> ClientStream:
    x_norm = c["x_norm"] if c["x_norm"] > 0 else 1.0
    if not target:  # a class label: never scaled
        return replace(stream, X=stream.X / x_norm)
    span = c["y_max"] - c["y_min"]
    span = span if span > 0 else 1.0
    T = len(stream)
    return replace(stream, X=stream.X / x_norm, y=(stream.y - c["y_min"]) / span,
                   y_offset=np.full(T, c["y_min"]), y_scale=np.full(T, span))


def _online(stream: ClientStream, warmup: int, target: bool = True) -> ClientStream:
    """`stream` standardised from its past: inputs and target together, so that a row refused for one of
    them (its statistics would overflow) is dropped whole and counted in `skipped`, under
    `skipped_by_column[TOO_LARGE]`."""
    both = np.concatenate([stream.X, stream.y[:, None]], axis=1)
    z, offset, scale, refused = online_standardise_rows(both, warmup)
    if not target:  # a class label: checked for overflow with the row, but kept as it is
        z[:, -1], offset[:, -1], scale[:, -1] = stream.y, 0.0, 1.0
    warm = np.cumsum(~refused) <= warmup  # the first `warmup` rows folded in only initialise the statistics
    emitted = ~refused & ~warm
    n_refused = int(refused.sum())

    def cut(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[emitted]

    by_column = dict(stream.skipped_by_column)
    if n_refused:
        by_column[TOO_LARGE] = by_column.get(TOO_LARGE, 0) + n_refused
    return replace(stream, X=z[emitted, :-1], y=z[emitted, -1], y_offset=offset[emitted, -1],
                   y_scale=scale[emitted, -1], warmup=stream.warmup + int((warm & ~refused).sum()),
                   skipped=stream.skipped + n_refused, skipped_by_column=by_column,
                   time=cut(stream.time), source=cut(stream.source), row=cut(stream.row))


def normalise_streams(streams: Sequence[ClientStream], normalisation: str, *,
                      warmup: int = DEFAULT_WARMUP, constants: dict[str, float] | None = None,
                      target: bool = True) -> tuple[list[ClientStream], dict[str, float | int | str]]:
    """Apply a normalisation to raw streams; returns the streams and the constants used.

    For `"paper"`, `constants` (see :func:`paper_constants`) default to those of `streams` together.
    `target=False`: the target is a class label, never scaled (inputs only).
    """
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    if normalisation == "none":
        return list(streams), {"method": "none"}
    label = {} if target else {"target": "class label, not normalised"}
    if normalisation == "online":
        return [_online(s, warmup, target) for s in streams], {"method": "online", "warmup": int(warmup), **label}
    c = paper_constants(streams) if constants is None else constants
    return [_paper(s, c, target) for s in streams], {"method": "paper", **c, **label}


def normalise(fleet: Fleet, normalisation: str, *, warmup: int = DEFAULT_WARMUP) -> Fleet:
    """A raw (`"none"`) fleet normalised; `"paper"` constants come from all its streams together.

    >>> from streamfed.evaluation.datasets import synthetic_fleet
    >>> f = normalise(synthetic_fleet(2, 50, 3, seed=0), "paper")
    >>> float(max(s.y.max() for s in f)), float(min(s.y.min() for s in f))
    (1.0, 0.0)
    """
    if fleet.normalisation != "none":
        raise ValueError(f"fleet is already normalised ({fleet.normalisation!r})")
    streams, scaling = normalise_streams(fleet.streams, normalisation, warmup=warmup)
    return replace(fleet, streams=tuple(streams), normalisation=normalisation, scaling=scaling)
