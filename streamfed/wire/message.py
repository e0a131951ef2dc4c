"""The streamfed wire protocol: a msgpack envelope, its codec, strict validation, sequence tracking.

Envelope (schema version 1), a msgpack map with exactly these keys::

    schema          int   = 1
    fleet           str   fleet name (must equal the receiver's)
    client          str   the client named by the topic it travels on (the aggregator's id on `global`)
    kind            str   e.g. "pofmkl.update", "fedbnr.global", "ack", "status", "prediction"
    seq             int   per-(client, kind) sequence number, >= 0
    global_version  int   the global this message was computed against (a global: its own version)
    kernel_version  str   feature-map version the arrays belong to ("" when irrelevant)
    epoch           int   the version of learned kernel parameters (URK network, FSGP (θ, σ, Z); FedBNR: a
                          new kernel version) the arrays or the prediction belong to, else 0
    n_samples       int   samples the message summarises
    created         float unix time at the sender
    arrays          {name: {"dtype": "float64" | "int64" | ..., "shape": [int, ...], "data": bin}}
    meta            {str: None | bool | int | float | str}   small, at most 16 entries
    included        {client: seq}  (globals and acks only: every seq up to it is applied)

Array data is raw little-endian bytes (C order); dtype names are those of
:data:`streamfed.wire.schema.WIRE_DTYPES`. Which arrays a kind carries, and their shapes, come from the
receiver's :class:`~streamfed.fleet.config.FleetConfig` — never from the message.

**Decoded arrays are read-only, zero-copy views** of the payload's bytes (`np.frombuffer`): cheap, and
nobody can mutate a message another consumer still holds. An algorithm's conversion helpers (its
`wire` module) that feed learner state take :func:`writable_copy` of them.

Every rejection raises :class:`ProtocolError` with a stable :class:`Reason` code (for metrics and logs)
and a human-readable detail. Pure and deterministic: no I/O; the only clock read is the default
`created` of the message-building helpers.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

if TYPE_CHECKING:
    from streamfed.fleet.config import FleetConfig

from streamfed.wire.schema import (
    MAX_KERNEL_VERSION_LEN,
    MAX_META_ITEMS,
    MAX_META_STR,
    SIMPLEX_TOL,
    WIRE_DTYPES,
    ArraySpec,
    MessageSchema,
    ProtocolSchema,
)
from streamfed.wire.topics import name_problem

__all__ = [
    "SCHEMA_VERSION",
    "Reason",
    "ProtocolError",
    "Message",
    "encode",
    "decode",
    "status_message",
    "ack_message",
    "prediction_message",
    "writable_copy",
    "fail",
    "is_int",
    "INT64_MAX",
]

SCHEMA_VERSION = 1
INT64_MAX = 2**63 - 1
_ENVELOPE_KEYS = frozenset({"schema", "fleet", "client", "kind", "seq", "global_version", "kernel_version",
                            "epoch", "n_samples", "created", "arrays", "meta", "included"})
_ARRAY_KEYS = frozenset({"dtype", "shape", "data"})
_MAX_META_KEY = 32
_MAX_NDIM = 8
# (numpy kind, itemsize) → wire dtype name: how `encode` names an array it is given
_NAME_OF = {(np.dtype(w).kind, np.dtype(w).itemsize): n for n, w in WIRE_DTYPES.items()}

MetaValue = None | bool | int | float | str


class Reason(StrEnum):
    """Stable reason codes of :class:`ProtocolError` (safe to use as a metrics label).

    >>> Reason.STALE_SEQ.value
    'stale_seq'
    """

    TOO_LARGE = "too_large"  # payload above the configuration's byte limit
    NOT_MSGPACK = "not_msgpack"  # not one well-formed msgpack object within the unpacker limits
    BAD_SCHEMA = "bad_schema"  # wrong envelope keys/types, schema version, meta or counters
    UNKNOWN_KIND = "unknown_kind"  # kind not exchanged by this fleet (or not accepted here)
    WRONG_FLEET = "wrong_fleet"
    BAD_CLIENT = "bad_client"  # invalid client name, or not the client the topic names
    BAD_ARRAY = "bad_array"  # missing/extra array, malformed array entry, value constraint broken
    WRONG_SHAPE = "wrong_shape"
    WRONG_DTYPE = "wrong_dtype"
    NON_FINITE = "non_finite"
    BAD_INDEX = "bad_index"  # index out of range or repeated
    BAD_SEQ = "bad_seq"  # not a non-negative 64-bit integer
    STALE_SEQ = "stale_seq"  # duplicate or replay (SeqTracker)
    WRONG_KERNEL_VERSION = "wrong_kernel_version"


class ProtocolError(ValueError):
    """A message was rejected: `reason` is a :class:`Reason`, `detail` says what exactly.

    >>> e = ProtocolError(Reason.WRONG_FLEET, "fleet 'x', expected 'f'")
    >>> e.reason, str(e)
    (<Reason.WRONG_FLEET: 'wrong_fleet'>, "wrong_fleet: fleet 'x', expected 'f'")
    """

    def __init__(self, reason: Reason, detail: str = "") -> None:
        self.reason = Reason(reason)
        self.detail = detail
        super().__init__(f"{self.reason.value}: {detail}" if detail else self.reason.value)


def fail(reason: Reason, detail: str) -> ProtocolError:
    return ProtocolError(reason, detail)


# =========================================================================== the message


@dataclass(frozen=True, eq=False)
class Message:
    """One envelope. Equality compares every field and the arrays' dtype, shape and bytes.

    >>> from streamfed.fleet.config import FleetConfig

    >>> cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=4, n_features=3,
    ...                   bin_size=2)
    >>> msg = Message("f", "a1", "pofmkl.update", seq=1, kernel_version="k1", n_samples=1,
    ...               arrays={"kernels": np.array([2, 0]), "delta": np.ones((2, 6))})
    >>> back = decode(encode(msg), cfg, kernel_version="k1")
    >>> back == msg, back.arrays["delta"].flags.writeable
    (True, False)
    """

    fleet: str
    client: str
    kind: str
    seq: int
    global_version: int = 0
    kernel_version: str = ""
    n_samples: int = 0
    created: float = 0.0
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    meta: Mapping[str, MetaValue] = field(default_factory=dict)
    included: Mapping[str, int] = field(default_factory=dict)
    epoch: int = 0
    schema: int = SCHEMA_VERSION

    def _scalars(self) -> tuple[Any, ...]:
        return (self.schema, self.fleet, self.client, self.kind, self.seq, self.global_version,
                self.kernel_version, self.epoch, self.n_samples, self.created, dict(self.meta),
                dict(self.included))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        if self._scalars() != other._scalars() or set(self.arrays) != set(other.arrays):
            return False
        for name, a in self.arrays.items():
            a, b = np.asarray(a), np.asarray(other.arrays[name])
            if (a.dtype.kind, a.dtype.itemsize, a.shape) != (b.dtype.kind, b.dtype.itemsize, b.shape):
                return False
            if not np.array_equal(a, b):
                return False
        return True

    __hash__ = None  # type: ignore[assignment]


# =========================================================================== encoding


def _wire_array(name: str, a: Any) -> dict[str, Any]:
    a = np.asarray(a)
    dname = _NAME_OF.get((a.dtype.kind, a.dtype.itemsize))
    if dname is None:
        raise fail(Reason.WRONG_DTYPE, f"array {name!r}: dtype {a.dtype} cannot travel")
    # tobytes() of a C-contiguous little-endian array: one memcpy, no per-element work.
    data = np.ascontiguousarray(a, dtype=WIRE_DTYPES[dname]).tobytes()
    return {"dtype": dname, "shape": list(a.shape), "data": data}


def _envelope(msg: Message) -> dict[str, Any]:
    return {
        "schema": int(msg.schema),
        "fleet": msg.fleet,
        "client": msg.client,
        "kind": msg.kind,
        "seq": int(msg.seq),
        "global_version": int(msg.global_version),
        "kernel_version": msg.kernel_version,
        "epoch": int(msg.epoch),
        "n_samples": int(msg.n_samples),
        "created": float(msg.created),
        "arrays": {str(k): _wire_array(k, v) for k, v in msg.arrays.items()},
        "meta": dict(msg.meta),
        "included": {str(k): int(v) for k, v in msg.included.items()},
    }


def encode(msg: Message, expect: FleetConfig | ProtocolSchema | None = None, *,
           kernel_version: str | None = None) -> bytes:
    """The msgpack bytes of `msg`.

    With `expect`, the result is also checked exactly as a receiver would (:func:`decode`), so a sender
    finds its own mistakes before the broker carries them; `ProtocolError` if it would be rejected.
    """
    env = _envelope(msg)
    try:
        payload = msgpack.packb(env, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:  # unpackable meta, ints beyond 64 bits, ...
        raise fail(Reason.BAD_SCHEMA, f"cannot encode: {e}") from None
    if expect is not None:
        decode(payload, expect, kernel_version=kernel_version)
    return payload


# =========================================================================== decoding
#
# Decoding runs for every payload an aggregator takes in, so what can be worked out once per schema is:
# a plan per ProtocolSchema (per kind: array checks with their numpy dtypes, fixed shapes and dimension
# bounds resolved) replaces walking the schema's dataclasses per message. The checks themselves, their
# order and their reasons are those the module docstring states; only their bookkeeping is cached.


def _schema_of(expect: FleetConfig | ProtocolSchema) -> ProtocolSchema:
    return expect if isinstance(expect, ProtocolSchema) else expect.protocol_schema


def is_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass; it is never a counter


class _ArrayPlan:
    """One :class:`ArraySpec`, resolved for checking: numpy dtype, axes with their bounds."""

    __slots__ = ("spec", "name", "dtype", "np_dtype", "itemsize", "axes", "fixed_shape", "fixed_nbytes",
                 "finite", "value_checks", "known")

    def __init__(self, spec: ArraySpec, ks: MessageSchema) -> None:
        self.spec = spec
        self.name = spec.name
        self.dtype = spec.dtype
        self.np_dtype = np.dtype(WIRE_DTYPES[spec.dtype])
        self.itemsize = spec.itemsize
        # an int: that length exactly; (dim name, lo, hi): a variable axis within its bounds
        self.axes: tuple[int | tuple[str, int, int], ...] = tuple(
            d if isinstance(d, int) else (d, *ks.dims[d]) for d in spec.shape)
        fixed = all(isinstance(d, int) for d in spec.shape)
        self.fixed_shape = list(spec.shape) if fixed else None
        self.fixed_nbytes = math.prod(spec.shape) * self.itemsize if fixed else -1
        self.finite = spec.finite and self.np_dtype.kind == "f"
        self.value_checks = (spec.index_bound is not None or spec.distinct or spec.nonnegative
                             or spec.positive or spec.simplex)
        # shapes found valid → (their byte length, the (dim name, length) of each variable axis in order): a
        # fleet's updates come in a few shapes; only the agreement with earlier arrays is checked again
        self.known: dict[tuple[int, ...], tuple[int, tuple[tuple[str, int], ...]]] = {}


class _KindPlan:
    __slots__ = ("ks", "max_bytes", "arrays", "array_names")

    def __init__(self, ks: MessageSchema) -> None:
        self.ks = ks
        self.max_bytes = ks.max_bytes
        self.arrays = tuple(_ArrayPlan(a, ks) for a in ks.arrays)  # schema order: deterministic first error
        self.array_names = frozenset(ks.array_names)


class _SchemaPlan:
    __slots__ = ("max_bytes", "kinds", "max_map_len")

    def __init__(self, schema: ProtocolSchema) -> None:
        self.max_bytes = schema.max_bytes
        self.kinds = {k: _KindPlan(s) for k, s in schema.kinds.items()}
        max_included = max((s.max_included for s in schema.kinds.values()), default=0)
        self.max_map_len = max(max_included, MAX_META_ITEMS, 64) + 16


_PLANS: weakref.WeakKeyDictionary[ProtocolSchema, _SchemaPlan] = weakref.WeakKeyDictionary()


def _plan_of(schema: ProtocolSchema) -> _SchemaPlan:
    plan = _PLANS.get(schema)
    if plan is None:
        plan = _PLANS[schema] = _SchemaPlan(schema)
    return plan


# Names already found valid (name_problem is pure): a fleet's few hundred client names are checked once,
# not per message. Bounded: cleared when full.
_VALID_NAMES: dict[str, None] = {}
_VALID_NAMES_MAX = 8192
_VALID_KERNEL_VERSIONS: dict[str, None] = {}  # likewise: kernel versions found printable ASCII within the limit


def _name_problem(name: object) -> str | None:
    if type(name) is str and name in _VALID_NAMES:
        return None
    problem = name_problem(name)
    if problem is None:
        if len(_VALID_NAMES) >= _VALID_NAMES_MAX:
            _VALID_NAMES.clear()
        _VALID_NAMES[name] = None  # type: ignore[index]
    return problem


def _unpack(payload: bytes, plan: _SchemaPlan) -> Any:
    try:
        # Explicit limits: a hostile payload cannot make the unpacker allocate beyond the payload's
        # own size; ext types (incl. msgpack timestamps) are refused by max_ext_len=0.
        return msgpack.unpackb(
            payload, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=len(payload), max_str_len=4096, max_array_len=_MAX_NDIM + 8,
            max_map_len=plan.max_map_len, max_ext_len=0,
        )
    except Exception as e:  # the C unpacker raises several unrelated types (ValueError, UnicodeError, ...)
        raise fail(Reason.NOT_MSGPACK, f"{type(e).__name__}: {e}"[:200]) from None


_new = object.__new__


def _message(fleet: str, client: str, kind: str, seq: int, global_version: int, kernel_version: str,
             n_samples: int, created: float, arrays: dict[str, np.ndarray], meta: dict[str, MetaValue],
             included: dict[str, int], epoch: int) -> Message:
    """A :class:`Message` from values `decode` has checked: the frozen dataclass's `__init__` sets its 13
    fields one `object.__setattr__` at a time; this fills the same `__dict__` in one go."""
    m = _new(Message)
    m.__dict__.update(fleet=fleet, client=client, kind=kind, seq=seq, global_version=global_version,
                      kernel_version=kernel_version, n_samples=n_samples, created=created, arrays=arrays,
                      meta=meta, included=included, epoch=epoch, schema=SCHEMA_VERSION)
    return m


def decode(
    payload: bytes | bytearray | memoryview,
    expect: FleetConfig | ProtocolSchema,
    *,
    kernel_version: str | None = None,
    client: str | None = None,
    kinds: Iterable[str] | None = None,
) -> Message:
    """Strictly decode one payload for the fleet `expect` describes.

    Optional expectations of the receiver: `kernel_version` (the version its learner is at),
    `client` (the client named by the topic: the envelope must agree, else `bad_client`), `kinds`
    (the kinds accepted on this topic, else `unknown_kind`). Raises :class:`ProtocolError`, and only it.

    >>> from streamfed.fleet.config import FleetConfig

    >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=1, n_kernels=1, n_features=1)
    >>> decode(b"\\xc1", cfg)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamfed.wire.message.ProtocolError: not_msgpack: ...
    """
    schema = _schema_of(expect)
    plan = _plan_of(schema)
    if type(payload) is bytes:
        size = len(payload)
    elif isinstance(payload, bytes | bytearray | memoryview):
        size = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
    else:
        raise fail(Reason.NOT_MSGPACK, f"payload is {type(payload).__name__}, not bytes")
    if size > plan.max_bytes:
        raise fail(Reason.TOO_LARGE, f"{size} bytes > limit {plan.max_bytes}")
    # bytes(): a copy of a bytearray or memoryview (the decoded arrays are views of it, and nobody
    # else may change them); the same object when it is bytes already
    env = _unpack(bytes(payload), plan)

    if type(env) is not dict:
        raise fail(Reason.BAD_SCHEMA, f"envelope is a {type(env).__name__}, not a map")
    if env.keys() != _ENVELOPE_KEYS:
        keys = set(env)
        missing, extra = sorted(_ENVELOPE_KEYS - keys), sorted(map(str, keys - _ENVELOPE_KEYS))
        raise fail(Reason.BAD_SCHEMA, f"envelope keys: missing {missing}, unexpected {extra}")
    version = env["schema"]
    if type(version) is not int or version != SCHEMA_VERSION:
        raise fail(Reason.BAD_SCHEMA, f"schema version {version!r}, expected {SCHEMA_VERSION}")

    fleet = env["fleet"]
    if fleet != schema.fleet:
        raise fail(Reason.WRONG_FLEET, f"fleet {fleet!r}, expected {schema.fleet!r}")

    kind = env["kind"]
    kp = plan.kinds.get(kind) if type(kind) is str else None
    if kp is None:
        raise fail(Reason.UNKNOWN_KIND, f"kind {kind!r} is not exchanged by fleet {schema.fleet!r}")
    if kinds is not None:
        if type(kinds) is not tuple and not isinstance(kinds, tuple | list | set | frozenset):
            kinds = set(kinds)
        if kind not in kinds:
            raise fail(Reason.UNKNOWN_KIND, f"kind {kind!r} is not accepted on this topic")
    if size > kp.max_bytes:
        raise fail(Reason.TOO_LARGE, f"{size} bytes > limit {kp.max_bytes} of kind {kind!r}")

    sender = env["client"]
    if type(sender) is not str or sender not in _VALID_NAMES:
        problem = _name_problem(sender)
        if problem is not None:
            raise fail(Reason.BAD_CLIENT, f"client name {problem}")
    if client is not None and sender != client:
        raise fail(Reason.BAD_CLIENT, f"envelope says client {sender!r}, topic says {client!r}")

    # the four counters, inline (this runs for every payload): integers in [0, 2^63), bool refused
    seq = env["seq"]
    if type(seq) is not int or not 0 <= seq <= INT64_MAX:
        raise fail(Reason.BAD_SEQ, f"seq must be an integer in [0, 2^63), got {seq!r}")
    global_version = env["global_version"]
    if type(global_version) is not int or not 0 <= global_version <= INT64_MAX:
        raise fail(Reason.BAD_SCHEMA, f"global_version must be an integer in [0, 2^63), got {global_version!r}")
    epoch = env["epoch"]
    if type(epoch) is not int or not 0 <= epoch <= INT64_MAX:
        raise fail(Reason.BAD_SCHEMA, f"epoch must be an integer in [0, 2^63), got {epoch!r}")
    n_samples = env["n_samples"]
    if type(n_samples) is not int or not 0 <= n_samples <= INT64_MAX:
        raise fail(Reason.BAD_SCHEMA, f"n_samples must be an integer in [0, 2^63), got {n_samples!r}")
    created = env["created"]
    if type(created) is not float or not 0.0 <= created < math.inf:  # NaN compares False
        raise fail(Reason.BAD_SCHEMA, f"created must be a finite float >= 0, got {created!r}")

    kv = env["kernel_version"]
    if type(kv) is not str or kv not in _VALID_KERNEL_VERSIONS:
        if not isinstance(kv, str) or len(kv) > MAX_KERNEL_VERSION_LEN or not (kv.isascii() and kv.isprintable()):
            raise fail(Reason.BAD_SCHEMA, f"kernel_version must be printable ASCII of at most "
                                           f"{MAX_KERNEL_VERSION_LEN} characters, got {kv!r:.80}")
        if len(_VALID_KERNEL_VERSIONS) >= _VALID_NAMES_MAX:
            _VALID_KERNEL_VERSIONS.clear()
        _VALID_KERNEL_VERSIONS[kv] = None
    if kernel_version is not None and kv != kernel_version:
        raise fail(Reason.WRONG_KERNEL_VERSION, f"kernel version {kv!r}, expected {kernel_version!r}")

    ks = kp.ks
    meta = env["meta"]
    if meta or ks.meta or type(meta) is not dict:
        meta = _check_meta(meta, ks)
    included = env["included"]
    if included or type(included) is not dict:
        included = _check_included(included, ks)
    arrays = _check_arrays(env["arrays"], kp)
    return _message(fleet, sender, kind, seq, global_version, kv, n_samples, created, arrays, meta,
                    included, epoch)


def _check_meta(meta: Any, ks: MessageSchema) -> dict[str, MetaValue]:
    if not isinstance(meta, dict):
        raise fail(Reason.BAD_SCHEMA, "meta must be a map")
    if len(meta) > MAX_META_ITEMS:
        raise fail(Reason.BAD_SCHEMA, f"meta has {len(meta)} entries > {MAX_META_ITEMS}")
    for k, v in meta.items():
        if not isinstance(k, str) or not 1 <= len(k) <= _MAX_META_KEY:
            raise fail(Reason.BAD_SCHEMA, f"meta key {k!r:.40} must be a string of 1..{_MAX_META_KEY} chars")
        if v is None or isinstance(v, bool):
            continue
        if is_int(v):
            if not -(2**63) <= v <= INT64_MAX:
                raise fail(Reason.BAD_SCHEMA, f"meta {k!r}: integer out of 64-bit range")
        elif type(v) is float:
            if not math.isfinite(v):
                raise fail(Reason.NON_FINITE, f"meta {k!r} is {v!r}")
        elif isinstance(v, str):
            if len(v) > MAX_META_STR:
                raise fail(Reason.BAD_SCHEMA, f"meta {k!r}: string longer than {MAX_META_STR}")
        else:
            raise fail(Reason.BAD_SCHEMA, f"meta {k!r}: {type(v).__name__} is not a scalar")
    for spec in ks.meta:
        if spec.name not in meta:
            raise fail(Reason.BAD_SCHEMA, f"kind {ks.kind!r} requires meta {spec.name!r}")
        if spec.choices is not None and meta[spec.name] not in spec.choices:
            raise fail(Reason.BAD_SCHEMA, f"meta {spec.name!r} = {meta[spec.name]!r:.40}, "
                                           f"expected one of {list(spec.choices)}")
    return meta


def _check_included(included: Any, ks: MessageSchema) -> dict[str, int]:
    if not isinstance(included, dict):
        raise fail(Reason.BAD_SCHEMA, "included must be a map")
    if len(included) > ks.max_included:
        raise fail(Reason.BAD_SCHEMA, f"included has {len(included)} entries, kind {ks.kind!r} "
                                       f"allows {ks.max_included}")
    for c, s in included.items():
        problem = name_problem(c)
        if problem is not None:
            raise fail(Reason.BAD_CLIENT, f"included client name {problem}")
        if not is_int(s) or not 0 <= s <= INT64_MAX:
            raise fail(Reason.BAD_SEQ, f"included[{c!r}] must be an integer in [0, 2^63), got {s!r}")
    return included


def _check_arrays(arrays: Any, kp: _KindPlan) -> dict[str, np.ndarray]:
    if type(arrays) is not dict:
        raise fail(Reason.BAD_ARRAY, "arrays must be a map")
    if arrays.keys() != kp.array_names:
        names, got = kp.array_names, set(arrays)
        missing, extra = sorted(names - got), sorted(map(str, got - names))
        raise fail(Reason.BAD_ARRAY, f"kind {kp.ks.kind!r}: missing arrays {missing}, unexpected {extra}")
    dims: dict[str, int] = {}
    return {ap.name: _check_array(arrays[ap.name], ap, dims) for ap in kp.arrays}  # schema order


def _check_array(entry: Any, ap: _ArrayPlan, dims: dict[str, int]) -> np.ndarray:
    name = ap.name
    if type(entry) is not dict or entry.keys() != _ARRAY_KEYS:
        raise fail(Reason.BAD_ARRAY, f"array {name!r} must be a map with keys {sorted(_ARRAY_KEYS)}")
    if entry["dtype"] != ap.dtype:
        raise fail(Reason.WRONG_DTYPE, f"array {name!r} has dtype {entry['dtype']!r:.40}, expected {ap.dtype!r}")
    shape = entry["shape"]
    if type(shape) is not list:
        raise fail(Reason.WRONG_SHAPE, f"array {name!r}: shape must be a list of non-negative integers")
    for d in shape:
        if type(d) is not int or d < 0:
            raise fail(Reason.WRONG_SHAPE, f"array {name!r}: shape must be a list of non-negative integers")
    if len(shape) != len(ap.axes):
        raise fail(Reason.WRONG_SHAPE, f"array {name!r} has {len(shape)} axes, expected {len(ap.axes)}")
    known = ap.known.get(tuple(shape))  # (the loop above refused bools, which would hash as 0 and 1)
    if known is not None:
        expected, binds = known
        for dim, got in binds:  # in axis order, as the walk below checks them
            if dims.setdefault(dim, got) != got:
                raise fail(Reason.WRONG_SHAPE, f"array {name!r}: {dim} = {got} disagrees with {dims[dim]} "
                                                "of an earlier array")
    elif shape != ap.fixed_shape:  # (a fixed shape that matches needs no walk)
        for axis, (got, want) in enumerate(zip(shape, ap.axes, strict=True)):
            if type(want) is int:
                if got != want:
                    raise fail(Reason.WRONG_SHAPE, f"array {name!r} has shape {tuple(shape)}, expected "
                                                    f"{ap.spec.shape} (axis {axis})")
                continue
            dim, lo, hi = want
            if not lo <= got <= hi:
                raise fail(Reason.WRONG_SHAPE, f"array {name!r}: axis {axis} ({dim}) has length {got}, "
                                                f"allowed {lo}..{hi}")
            if dims.setdefault(dim, got) != got:
                raise fail(Reason.WRONG_SHAPE, f"array {name!r}: {dim} = {got} disagrees with {dims[dim]} "
                                                "of an earlier array")
        expected = math.prod(shape) * ap.itemsize
        if len(ap.known) < 256:
            ap.known[tuple(shape)] = (expected, tuple((w[0], g) for g, w in zip(shape, ap.axes, strict=True)
                                                      if type(w) is not int))
    else:
        expected = ap.fixed_nbytes
    data = entry["data"]
    if type(data) is not bytes:
        raise fail(Reason.BAD_ARRAY, f"array {name!r}: data must be binary")
    if len(data) != expected:
        raise fail(Reason.BAD_ARRAY, f"array {name!r}: {len(data)} data bytes, shape needs {expected}")
    arr = np.ndarray(shape, ap.np_dtype, data)  # a read-only view of the bytes (as frombuffer + reshape, one call)
    if ap.finite and not np.isfinite(arr).all():
        raise fail(Reason.NON_FINITE, f"array {name!r} contains a non-finite value")
    if ap.value_checks and arr.size:
        _check_constraints(arr, ap.spec)
    return arr


def _check_values(arr: np.ndarray, spec: ArraySpec) -> None:
    if arr.dtype.kind == "f" and spec.finite and not np.isfinite(arr).all():
        raise fail(Reason.NON_FINITE, f"array {spec.name!r} contains a non-finite value")
    if arr.size:
        _check_constraints(arr, spec)


def _check_constraints(arr: np.ndarray, spec: ArraySpec) -> None:
    """Index range, distinctness, sign (`arr` is not empty)."""
    name = spec.name
    if spec.index_bound is not None or spec.distinct:
        # index arrays are short (at most M kernels): plain Python beats numpy's per-call overhead
        values = arr.ravel().tolist() if arr.size <= 256 else None
        if spec.index_bound is not None:
            lo, hi = (min(values), max(values)) if values is not None else (arr.min(), arr.max())
            if lo < 0 or hi >= spec.index_bound:
                raise fail(Reason.BAD_INDEX, f"array {name!r}: index out of range [0, {spec.index_bound})")
        if spec.distinct:
            n_distinct = len(set(values)) if values is not None else np.unique(arr).size
            if n_distinct != arr.size:
                raise fail(Reason.BAD_INDEX, f"array {name!r}: repeated values")
    if spec.nonnegative and arr.min() < 0:
        raise fail(Reason.BAD_ARRAY, f"array {name!r}: negative value")
    if spec.positive and not (arr > 0).all():
        raise fail(Reason.BAD_ARRAY, f"array {name!r}: value <= 0")
    if spec.simplex:
        # finite already checked: a NaN never gets here
        if arr.min() < 0 or arr.max() > 1:
            raise fail(Reason.BAD_ARRAY, f"array {name!r}: a probability outside [0, 1]")
        if arr.ndim and not (np.abs(arr.sum(axis=-1) - 1.0) <= SIMPLEX_TOL).all():
            raise fail(Reason.BAD_ARRAY, f"array {name!r}: probabilities do not sum to 1 (within {SIMPLEX_TOL:g})")


# =========================================================================== builders / converters


def _now(created: float | None) -> float:
    return time.time() if created is None else float(created)


def writable_copy(a: np.ndarray, dtype: str) -> np.ndarray:
    """Writable, C-contiguous, native-endian copy."""
    return np.array(a, dtype=np.dtype(dtype).newbyteorder("="), copy=True, order="C")


def status_message(fleet: str, client: str, state: str, *, seq: int = 0, created: float | None = None,
                   meta: Mapping[str, MetaValue] | None = None) -> Message:
    """A `status` (`state` = `"online"` / `"offline"`); its encoding also serves as the last will. `meta` adds
    what the agent says about itself (e.g. `prior_version`: the global it joined the fleet with).

    >>> status_message("f", "a1", "offline", created=0.0).meta
    {'state': 'offline'}
    >>> status_message("f", "a1", "online", created=0.0, meta={"prior_version": 7}).meta
    {'prior_version': 7, 'state': 'online'}
    """
    return Message(fleet, client, "status", seq, created=_now(created), meta={**(meta or {}), "state": state})


def ack_message(fleet: str, client: str, included_seq: int, missing: Iterable[int] = (), *, seq: int,
                global_version: int = 0, created: float | None = None) -> Message:
    """An `ack` to `client`: every seq `<= included_seq` is applied; `missing` seqs above it are not.

    >>> m = ack_message("f", "a1", 1, [3], seq=1, created=0.0)
    >>> m.included, m.arrays["missing"].tolist()
    ({'a1': 1}, [3])
    """
    return Message(fleet, client, "ack", seq, global_version, created=_now(created),
                   arrays={"missing": np.asarray(list(missing), dtype=np.int64)},
                   included={client: int(included_seq)})


def prediction_message(fleet: str, client: str, seq: int, mean: np.ndarray, var: np.ndarray | None = None,
                       *, global_version: int = 0, kernel_version: str = "", epoch: int = 0,
                       created: float | None = None, meta: Mapping[str, MetaValue] | None = None,
                       proba: np.ndarray | None = None) -> Message:
    """A `prediction` of one or more samples (`var` only for Bayesian learners, `proba` — a row of class
    probabilities per sample — only for classifiers), made under the global `global_version` of epoch `epoch`."""
    arrays = {"mean": np.atleast_1d(np.asarray(mean, dtype=np.float64))}
    if var is not None:
        arrays["var"] = np.atleast_1d(np.asarray(var, dtype=np.float64))
    if proba is not None:
        arrays["proba"] = np.atleast_2d(np.asarray(proba, dtype=np.float64))
    return Message(fleet, client, "prediction", seq, global_version, kernel_version,
                   int(arrays["mean"].shape[0]), _now(created), arrays, dict(meta or {}), epoch=int(epoch))
