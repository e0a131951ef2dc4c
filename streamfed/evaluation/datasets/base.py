"""Data types shared by every data source: one client's stream, and a fleet of them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

NORMALISATIONS: tuple[str, ...] = ("none", "paper", "online")


def _frozen(a: np.ndarray | None, dtype: type | str, ndim: int, what: str) -> np.ndarray | None:
    """A read-only contiguous copy-if-needed of `a`: streams are shared (cached), so nobody may edit them."""
    if a is None:
        return None
    out = np.ascontiguousarray(a, dtype=dtype)
    if out.ndim != ndim:
        raise ValueError(f"{what} must be {ndim}-dimensional, got shape {out.shape}")
    if out.flags.writeable:
        if out is a:  # never flip the flag on the caller's own array
            out = out.copy()
        out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class ClientStream:
    """One client's samples in arrival order: inputs `X` `(T, d)` and targets `y` `(T,)`.

    `y` is in the units of the fleet's normalisation; `y * y_scale + y_offset` gives the original
    units back (per sample, because online standardisation moves with time) — use
    :meth:`to_original` on predictions. `skipped` counts source rows dropped for a missing or
    non-numeric value in a used column; `skipped_by_column[c]` counts the skipped rows in which
    column `c` was missing, so a row missing several columns counts once in `skipped` and once
    under each of them. `warmup` counts rows consumed only to initialise online statistics.
    Optional per-sample provenance: `time` (`datetime64`), `source` (index into
    :attr:`Fleet.sources`) and `row` (0-based data-row index in that source).

    Arrays are stored read-only, so a stream can be shared safely.

    >>> s = ClientStream("a", np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.5, 1.0]), ("u", "v"),
    ...                  y_offset=np.array([10.0, 10.0]), y_scale=np.array([2.0, 2.0]))
    >>> len(s), s.n_inputs
    (2, 2)
    >>> s.to_original(np.array([0.0, 1.0])).tolist()
    [10.0, 12.0]
    >>> s.X.flags.writeable
    False
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    feature_names: tuple[str, ...]
    skipped: int = 0
    skipped_by_column: Mapping[str, int] = field(default_factory=dict)
    y_offset: np.ndarray | None = None
    y_scale: np.ndarray | None = None
    warmup: int = 0
    time: np.ndarray | None = None
    source: np.ndarray | None = None
    row: np.ndarray | None = None

    def __post_init__(self) -> None:
        X = _frozen(self.X, np.float64, 2, "X")
        y = _frozen(self.y, np.float64, 1, "y")
        assert X is not None and y is not None
        T = y.shape[0]
        if X.shape[0] != T:
            raise ValueError(f"X has {X.shape[0]} rows but y has {T}")
        names = tuple(str(n) for n in self.feature_names)
        if len(names) != X.shape[1]:
            raise ValueError(f"{len(names)} feature names for {X.shape[1]} columns")
        set_ = object.__setattr__  # frozen dataclass: normalise fields once, here
        set_(self, "X", X)
        set_(self, "y", y)
        set_(self, "feature_names", names)
        set_(self, "skipped", int(self.skipped))
        set_(self, "warmup", int(self.warmup))
        set_(self, "skipped_by_column",
             MappingProxyType({str(k): int(v) for k, v in self.skipped_by_column.items()}))
        offset = np.zeros(T) if self.y_offset is None else self.y_offset
        scale = np.ones(T) if self.y_scale is None else self.y_scale
        for attr, value, dtype in (("y_offset", offset, np.float64), ("y_scale", scale, np.float64),
                                   ("time", self.time, None), ("source", self.source, np.int64),
                                   ("row", self.row, np.int64)):
            if value is None:
                continue
            arr = _frozen(value, dtype or np.asarray(value).dtype, 1, attr)
            assert arr is not None
            if arr.shape[0] != T:
                raise ValueError(f"{attr} has {arr.shape[0]} entries for {T} samples")
            set_(self, attr, arr)

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def n_inputs(self) -> int:
        return int(self.X.shape[1])

    def to_original(self, values: np.ndarray, start: int = 0) -> np.ndarray:
        """Map normalised targets (e.g. predictions) for samples `start, start+1, ...` to original units."""
        v = np.asarray(values, dtype=np.float64)
        stop = start + v.shape[0]
        if start < 0 or stop > len(self):
            raise IndexError(f"samples {start}:{stop} out of range for a stream of {len(self)}")
        assert self.y_scale is not None and self.y_offset is not None
        return v * self.y_scale[start:stop] + self.y_offset[start:stop]

    def __repr__(self) -> str:
        return (f"ClientStream({self.name!r}, T={len(self)}, d={self.n_inputs}, "
                f"skipped={self.skipped}, warmup={self.warmup})")


@dataclass(frozen=True, eq=False)
class Fleet:
    """The clients of one experiment, with how their data was prepared.

    `dataset`, `normalisation` (one of :data:`NORMALISATIONS`) and `split` describe the fleet;
    `sources` names what :attr:`ClientStream.source` indexes (stations for Beijing); `scaling` holds
    the constants of the normalisation (e.g. `x_norm`, `y_min`, `y_max` for `"paper"`).

    >>> s = ClientStream("c0", np.zeros((3, 2)), np.zeros(3), ("a", "b"))
    >>> fleet = Fleet((s,), dataset="toy", normalisation="none", split="custom")
    >>> len(fleet), fleet.names, fleet["c0"] is s, fleet.n_inputs
    (1, ('c0',), True, 2)
    """

    streams: tuple[ClientStream, ...]
    dataset: str
    normalisation: str
    split: str
    seed: int | None = None
    target: str = "y"
    sources: tuple[str, ...] = ()
    scaling: Mapping[str, float | int | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        streams = tuple(self.streams)
        if not streams:
            raise ValueError("a fleet needs at least one client stream")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {self.normalisation!r}")
        names = [s.name for s in streams]
        if len(set(names)) != len(names):
            raise ValueError(f"client names must be unique, got {names}")
        if len({s.feature_names for s in streams}) != 1:
            raise ValueError("all client streams must have the same features")
        object.__setattr__(self, "streams", streams)
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "scaling", MappingProxyType(dict(self.scaling)))

    def __len__(self) -> int:
        return len(self.streams)

    def __iter__(self) -> Iterator[ClientStream]:
        return iter(self.streams)

    def __getitem__(self, key: int | str) -> ClientStream:
        if isinstance(key, str):
            for s in self.streams:
                if s.name == key:
                    return s
            raise KeyError(key)
        return self.streams[key]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.streams)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.streams[0].feature_names

    @property
    def n_inputs(self) -> int:
        return self.streams[0].n_inputs

    @property
    def n_clients(self) -> int:
        return len(self.streams)

    @property
    def total_samples(self) -> int:
        return sum(len(s) for s in self.streams)

    def __repr__(self) -> str:
        return (f"Fleet({self.dataset!r}, normalisation={self.normalisation!r}, split={self.split!r}, "
                f"clients={len(self)}, d={self.n_inputs}, samples={self.total_samples})")


def iter_dicts(stream: ClientStream) -> Iterator[tuple[dict[str, float], float]]:
    """`(x, y)` pairs with `x` a `{feature name: value}` dict, for River-style `learn_one` learners.

    >>> s = ClientStream("c", np.array([[1.0, 2.0]]), np.array([3.0]), ("a", "b"))
    >>> list(iter_dicts(s))
    [({'a': 1.0, 'b': 2.0}, 3.0)]
    """
    names = stream.feature_names
    for row, y in zip(stream.X.tolist(), stream.y.tolist(), strict=True):
        yield dict(zip(names, row, strict=True)), y
