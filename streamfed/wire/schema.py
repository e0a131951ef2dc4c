"""The wire's schema data: which message kinds exist, which arrays each carries (name, dtype, shape, value
constraints), the limits of names, metadata and sizes — plain frozen dataclasses the codec
(:mod:`streamfed.wire.message`) enforces without ever branching on a learner's name. Each algorithm builds its
kinds from these (its `wire` module); the fleet configuration adds the kinds every fleet has.

>>> MessageSchema("status", Channel.STATUS).array_names
()
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from streamfed.core.durable import durable
from streamfed.wire.topics import Channel

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

__all__ = [
    "WIRE_DTYPES",
    "MAX_META_ITEMS",
    "MAX_META_KEY",
    "MAX_META_STR",
    "MAX_KERNEL_VERSION_LEN",
    "SIMPLEX_TOL",
    "MAX_CLASSES",
    "ArraySpec",
    "MetaSpec",
    "MessageSchema",
    "ProtocolSchema",
    "contributor_arrays",
    "contributor_dims",
    "prediction_schema",
]

# dtype name on the wire → numpy dtype string. Always little-endian on the wire, whatever the host.
WIRE_DTYPES: dict[str, str] = {
    "float64": "<f8",
    "float32": "<f4",
    "int64": "<i8",
    "int32": "<i4",
    "uint64": "<u8",  # e.g. secure-aggregation masks in a ring Z_2^64
    "uint8": "|u1",
}
MAX_META_ITEMS = 16
MAX_META_KEY = 32
MAX_META_STR = 256
MAX_KERNEL_VERSION_LEN = 128
SIMPLEX_TOL = 1e-9  # how far from 1 a published probability vector may sum (float64 rounding is ~1e-15)
MAX_CLASSES = 1000  # the most classes a classifier's `proba` may carry (pFedGP's `n_classes` bound)
# Bytes a message may need besides its array data: field names, names, kernel version and a full meta
# dict, generously rounded (see MessageSchema.max_bytes).
_ENVELOPE_OVERHEAD = 1024 + MAX_META_ITEMS * (MAX_META_KEY + MAX_META_STR + 16)
_ARRAY_OVERHEAD = 128  # per array: its name, dtype string, shape list, map headers
_INCLUDED_ENTRY = 64 + 16  # a client name plus a uint64 and headers


# =========================================================================== schema data


@durable("wire.ArraySpec")  # a private learner keeps its upload kind's sign constraints in its state
@dataclass(frozen=True)
class ArraySpec:
    """One array of a message kind.

    `shape` holds ints (fixed axes) and strings naming a variable dimension whose bounds the
    :class:`MessageSchema` gives in `dims` (several arrays sharing a name must agree on its length).
    Value constraints: `finite` (floating arrays), `index_bound` (integer arrays: every value in
    `[0, index_bound)`), `distinct`, `nonnegative`, `positive`, `simplex` (floating arrays: every row along
    the last axis is a probability vector — values in `[0, 1]` summing to 1 within `SIMPLEX_TOL`).

    >>> a = ArraySpec("delta", "float64", ("m", 20))
    >>> a.max_shape({"m": (1, 4)}), a.max_nbytes({"m": (1, 4)})
    ((4, 20), 640)
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    finite: bool = True
    index_bound: int | None = None
    distinct: bool = False
    nonnegative: bool = False
    positive: bool = False
    simplex: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in WIRE_DTYPES:
            raise ValueError(f"array {self.name!r}: unsupported dtype {self.dtype!r}; one of {list(WIRE_DTYPES)}")
        if (self.index_bound is not None or self.distinct) and not self.dtype.startswith(("int", "uint")):
            raise ValueError(f"array {self.name!r}: index/distinct constraints need an integer dtype")
        if self.simplex and not self.dtype.startswith("float"):
            raise ValueError(f"array {self.name!r}: a simplex constraint needs a floating dtype")

    @property
    def itemsize(self) -> int:
        return int(WIRE_DTYPES[self.dtype][-1])

    def max_shape(self, dims: Mapping[str, tuple[int, int]]) -> tuple[int, ...]:
        """The largest shape allowed (variable axes at their upper bound)."""
        return tuple(d if isinstance(d, int) else dims[d][1] for d in self.shape)

    def max_nbytes(self, dims: Mapping[str, tuple[int, int]]) -> int:
        return math.prod(self.max_shape(dims)) * self.itemsize


@dataclass(frozen=True)
class MetaSpec:
    """A `meta` entry a kind requires (`choices`: the allowed values, or `None` for any scalar).

    >>> MetaSpec("state", ("online", "offline")).choices
    ('online', 'offline')
    """

    name: str
    choices: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class MessageSchema:
    """What one message kind carries.

    `channel` is the topic channel it travels on; `dims` bounds the variable axes (inclusive);
    `meta` lists required meta entries (others are allowed, within the global meta limits);
    `max_included` is how many `client → seq` entries the `included` map may hold (0: must be empty).

    >>> s = MessageSchema("demo", "updates", (ArraySpec("x", "float64", ("m",)),), {"m": (1, 8)})
    >>> s.array_names, s.max_bytes > 64
    (('x',), True)
    """

    kind: str
    channel: str
    arrays: tuple[ArraySpec, ...] = ()
    dims: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    meta: tuple[MetaSpec, ...] = ()
    max_included: int = 0

    def __post_init__(self) -> None:
        Channel(self.channel)  # raises for an unknown channel
        names = [a.name for a in self.arrays]
        if len(set(names)) != len(names):
            raise ValueError(f"kind {self.kind!r}: duplicate array names {names}")
        for a in self.arrays:
            for d in a.shape:
                if isinstance(d, str) and d not in self.dims:
                    raise ValueError(f"kind {self.kind!r}: array {a.name!r} uses undeclared dim {d!r}")
                if isinstance(d, int) and d < 0:
                    raise ValueError(f"kind {self.kind!r}: array {a.name!r} has a negative axis")
        for d, (lo, hi) in self.dims.items():
            if not 0 <= lo <= hi:
                raise ValueError(f"kind {self.kind!r}: dim {d!r} has bounds ({lo}, {hi})")

    @property
    def array_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arrays)

    @cached_property  # read for every decoded payload; the schema is immutable
    def max_bytes(self) -> int:
        """Upper bound of an encoded message of this kind, with 10 % + 1 KiB headroom."""
        data = sum(a.max_nbytes(self.dims) + _ARRAY_OVERHEAD + 8 * len(a.shape) for a in self.arrays)
        raw = data + _ENVELOPE_OVERHEAD + self.max_included * _INCLUDED_ENTRY
        return int(raw * 1.1) + 1024


@dataclass(frozen=True, eq=False)
class ProtocolSchema:
    """Every kind a fleet exchanges, plus the fleet name and the byte limit of any message.

    >>> from streamfed.fleet.config import FleetConfig

    >>> ps = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=4, n_features=10,
    ...                  bin_size=2).protocol_schema
    >>> sorted(ps.kinds)
    ['ack', 'partial.ack', 'pofmkl.global', 'pofmkl.partial', 'pofmkl.round', 'pofmkl.update', 'prediction', 'status']
    >>> ps.kinds_on("updates")
    ('pofmkl.update',)
    """

    fleet: str
    kinds: Mapping[str, MessageSchema]
    seq_window: int = 1024

    @cached_property
    def max_bytes(self) -> int:
        """The byte limit checked before a payload is even parsed: the largest kind's limit."""
        return max(s.max_bytes for s in self.kinds.values())

    def kinds_on(self, channel: Channel | str) -> tuple[str, ...]:
        """The kinds that travel on `channel` (what a subscriber to that channel should accept)."""
        ch = Channel(channel)
        return tuple(k for k, s in self.kinds.items() if s.channel == ch)


# =========================================================================== schema builders


def contributor_arrays() -> tuple[ArraySpec, ...]:
    """The `(client, seq)` pairs summed into a partial: `owner[i]` indexes the sorted names of `included`."""
    return (ArraySpec("owner", "int64", ("c",), nonnegative=True),
            ArraySpec("seqs", "int64", ("c",), nonnegative=True))


def contributor_dims(cfg: FleetConfig, lower: int = 1) -> dict[str, tuple[int, int]]:
    """Bounds of the contributor lists' length."""
    return {"c": (lower, cfg.max_clients * 4)}


def prediction_schema(bayesian: bool, max_batch: int = 256, n_classes: int | None = None) -> MessageSchema:
    """The `prediction` kind: `mean`, and `var` for Bayesian learners, of up to `max_batch` samples; a
    classifier's (`n_classes` given) also carries `proba (b, k)`, each row its class probabilities
    (`k ≤ n_classes`, values in [0, 1] summing to 1).

    >>> prediction_schema(True).array_names, prediction_schema(False, n_classes=3).array_names
    (('mean', 'var'), ('mean', 'proba'))
    """
    pred = [ArraySpec("mean", "float64", ("b",))]
    dims = {"b": (1, max_batch)}
    if bayesian:
        pred.append(ArraySpec("var", "float64", ("b",), nonnegative=True))
    if n_classes is not None:
        pred.append(ArraySpec("proba", "float64", ("b", "k"), simplex=True))
        dims["k"] = (1, int(n_classes))
    return MessageSchema("prediction", Channel.PREDICTIONS, tuple(pred), dims)
