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
:data:`streamfed.fleet.config.WIRE_DTYPES`. Which arrays a kind carries, and their shapes, come from the
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
from typing import Any, NamedTuple

import msgpack
import numpy as np

from streamfed.fleet.config import (
    MAX_KERNEL_VERSION_LEN,
    MAX_META_ITEMS,
    MAX_META_STR,
    SIMPLEX_TOL,
    WIRE_DTYPES,
    ArraySpec,
    FleetConfig,
    MessageSchema,
    ProtocolSchema,
)
from streamfed.fleet.topics import name_problem

__all__ = [
    "SCHEMA_VERSION",
    "Reason",
    "ProtocolError",
    "Message",
    "encode",
    "decode",
    "SeqCheck",
    "SeqTracker",
    "status_message",
    "ack_message",
    "prediction_message",
    "writable_copy",
]

SCHEMA_VERSION = 1
_INT64_MAX = 2**63 - 1
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


def _fail(reason: Reason, detail: str) -> ProtocolError:
    return ProtocolError(reason, detail)


# =========================================================================== the message


@dataclass(frozen=True, eq=False)
class Message:
    """One envelope. Equality compares every field and the arrays' dtype, shape and bytes.

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
        raise _fail(Reason.WRONG_DTYPE, f"array {name!r}: dtype {a.dtype} cannot travel")
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
        raise _fail(Reason.BAD_SCHEMA, f"cannot encode: {e}") from None
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
    return expect.protocol_schema if isinstance(expect, FleetConfig) else expect


def _is_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass; it is never a counter


def _counter(env: Mapping[str, Any], key: str, reason: Reason) -> int:
    v = env[key]
    if type(v) is not int or not 0 <= v <= _INT64_MAX:
        raise _fail(reason, f"{key} must be an integer in [0, 2^63), got {v!r}")
    return v


class _ArrayPlan:
    """One :class:`ArraySpec`, resolved for checking: numpy dtype, axes with their bounds."""

    __slots__ = ("spec", "name", "dtype", "np_dtype", "itemsize", "axes", "fixed_shape", "fixed_nbytes",
                 "finite", "value_checks")

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
        raise _fail(Reason.NOT_MSGPACK, f"{type(e).__name__}: {e}"[:200]) from None


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

    >>> cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=1, n_kernels=1, n_features=1)
    >>> decode(b"\\xc1", cfg)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamfed.fleet.protocol.ProtocolError: not_msgpack: ...
    """
    schema = _schema_of(expect)
    plan = _plan_of(schema)
    if type(payload) is bytes:
        size = len(payload)
    elif isinstance(payload, bytes | bytearray | memoryview):
        size = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
    else:
        raise _fail(Reason.NOT_MSGPACK, f"payload is {type(payload).__name__}, not bytes")
    if size > plan.max_bytes:
        raise _fail(Reason.TOO_LARGE, f"{size} bytes > limit {plan.max_bytes}")
    # bytes(): a copy of a bytearray or memoryview (the decoded arrays are views of it, and nobody
    # else may change them); the same object when it is bytes already
    env = _unpack(bytes(payload), plan)

    if type(env) is not dict:
        raise _fail(Reason.BAD_SCHEMA, f"envelope is a {type(env).__name__}, not a map")
    if env.keys() != _ENVELOPE_KEYS:
        keys = set(env)
        missing, extra = sorted(_ENVELOPE_KEYS - keys), sorted(map(str, keys - _ENVELOPE_KEYS))
        raise _fail(Reason.BAD_SCHEMA, f"envelope keys: missing {missing}, unexpected {extra}")
    if env["schema"] != SCHEMA_VERSION or not _is_int(env["schema"]):
        raise _fail(Reason.BAD_SCHEMA, f"schema version {env['schema']!r}, expected {SCHEMA_VERSION}")

    fleet = env["fleet"]
    if fleet != schema.fleet:
        raise _fail(Reason.WRONG_FLEET, f"fleet {fleet!r}, expected {schema.fleet!r}")

    kind = env["kind"]
    kp = plan.kinds.get(kind) if type(kind) is str else None
    if kp is None:
        raise _fail(Reason.UNKNOWN_KIND, f"kind {kind!r} is not exchanged by fleet {schema.fleet!r}")
    if kinds is not None:
        if not isinstance(kinds, tuple | list | set | frozenset):
            kinds = set(kinds)
        if kind not in kinds:
            raise _fail(Reason.UNKNOWN_KIND, f"kind {kind!r} is not accepted on this topic")
    if size > kp.max_bytes:
        raise _fail(Reason.TOO_LARGE, f"{size} bytes > limit {kp.max_bytes} of kind {kind!r}")

    sender = env["client"]
    problem = _name_problem(sender)
    if problem is not None:
        raise _fail(Reason.BAD_CLIENT, f"client name {problem}")
    if client is not None and sender != client:
        raise _fail(Reason.BAD_CLIENT, f"envelope says client {sender!r}, topic says {client!r}")

    seq = _counter(env, "seq", Reason.BAD_SEQ)
    global_version = _counter(env, "global_version", Reason.BAD_SCHEMA)
    epoch = _counter(env, "epoch", Reason.BAD_SCHEMA)
    n_samples = _counter(env, "n_samples", Reason.BAD_SCHEMA)
    created = env["created"]
    if type(created) is not float or not math.isfinite(created) or created < 0:
        raise _fail(Reason.BAD_SCHEMA, f"created must be a finite float >= 0, got {created!r}")

    kv = env["kernel_version"]
    if not isinstance(kv, str) or len(kv) > MAX_KERNEL_VERSION_LEN or not (kv.isascii() and kv.isprintable()):
        raise _fail(Reason.BAD_SCHEMA, f"kernel_version must be printable ASCII of at most "
                                       f"{MAX_KERNEL_VERSION_LEN} characters, got {kv!r:.80}")
    if kernel_version is not None and kv != kernel_version:
        raise _fail(Reason.WRONG_KERNEL_VERSION, f"kernel version {kv!r}, expected {kernel_version!r}")

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
        raise _fail(Reason.BAD_SCHEMA, "meta must be a map")
    if len(meta) > MAX_META_ITEMS:
        raise _fail(Reason.BAD_SCHEMA, f"meta has {len(meta)} entries > {MAX_META_ITEMS}")
    for k, v in meta.items():
        if not isinstance(k, str) or not 1 <= len(k) <= _MAX_META_KEY:
            raise _fail(Reason.BAD_SCHEMA, f"meta key {k!r:.40} must be a string of 1..{_MAX_META_KEY} chars")
        if v is None or isinstance(v, bool):
            continue
        if _is_int(v):
            if not -(2**63) <= v <= _INT64_MAX:
                raise _fail(Reason.BAD_SCHEMA, f"meta {k!r}: integer out of 64-bit range")
        elif type(v) is float:
            if not math.isfinite(v):
                raise _fail(Reason.NON_FINITE, f"meta {k!r} is {v!r}")
        elif isinstance(v, str):
            if len(v) > MAX_META_STR:
                raise _fail(Reason.BAD_SCHEMA, f"meta {k!r}: string longer than {MAX_META_STR}")
        else:
            raise _fail(Reason.BAD_SCHEMA, f"meta {k!r}: {type(v).__name__} is not a scalar")
    for spec in ks.meta:
        if spec.name not in meta:
            raise _fail(Reason.BAD_SCHEMA, f"kind {ks.kind!r} requires meta {spec.name!r}")
        if spec.choices is not None and meta[spec.name] not in spec.choices:
            raise _fail(Reason.BAD_SCHEMA, f"meta {spec.name!r} = {meta[spec.name]!r:.40}, "
                                           f"expected one of {list(spec.choices)}")
    return meta


def _check_included(included: Any, ks: MessageSchema) -> dict[str, int]:
    if not isinstance(included, dict):
        raise _fail(Reason.BAD_SCHEMA, "included must be a map")
    if len(included) > ks.max_included:
        raise _fail(Reason.BAD_SCHEMA, f"included has {len(included)} entries, kind {ks.kind!r} "
                                       f"allows {ks.max_included}")
    for c, s in included.items():
        problem = name_problem(c)
        if problem is not None:
            raise _fail(Reason.BAD_CLIENT, f"included client name {problem}")
        if not _is_int(s) or not 0 <= s <= _INT64_MAX:
            raise _fail(Reason.BAD_SEQ, f"included[{c!r}] must be an integer in [0, 2^63), got {s!r}")
    return included


def _check_arrays(arrays: Any, kp: _KindPlan) -> dict[str, np.ndarray]:
    if not isinstance(arrays, dict):
        raise _fail(Reason.BAD_ARRAY, "arrays must be a map")
    if arrays.keys() != kp.array_names:
        names, got = kp.array_names, set(arrays)
        missing, extra = sorted(names - got), sorted(map(str, got - names))
        raise _fail(Reason.BAD_ARRAY, f"kind {kp.ks.kind!r}: missing arrays {missing}, unexpected {extra}")
    dims: dict[str, int] = {}
    return {ap.name: _check_array(arrays[ap.name], ap, dims) for ap in kp.arrays}  # schema order


def _check_array(entry: Any, ap: _ArrayPlan, dims: dict[str, int]) -> np.ndarray:
    name = ap.name
    if not isinstance(entry, dict) or entry.keys() != _ARRAY_KEYS:
        raise _fail(Reason.BAD_ARRAY, f"array {name!r} must be a map with keys {sorted(_ARRAY_KEYS)}")
    if entry["dtype"] != ap.dtype:
        raise _fail(Reason.WRONG_DTYPE, f"array {name!r} has dtype {entry['dtype']!r:.40}, expected {ap.dtype!r}")
    shape = entry["shape"]
    if type(shape) is not list:
        raise _fail(Reason.WRONG_SHAPE, f"array {name!r}: shape must be a list of non-negative integers")
    for d in shape:
        if type(d) is not int or d < 0:
            raise _fail(Reason.WRONG_SHAPE, f"array {name!r}: shape must be a list of non-negative integers")
    if len(shape) != len(ap.axes):
        raise _fail(Reason.WRONG_SHAPE, f"array {name!r} has {len(shape)} axes, expected {len(ap.axes)}")
    if shape != ap.fixed_shape:  # (a fixed shape that matches needs no walk)
        for axis, (got, want) in enumerate(zip(shape, ap.axes, strict=True)):
            if type(want) is int:
                if got != want:
                    raise _fail(Reason.WRONG_SHAPE, f"array {name!r} has shape {tuple(shape)}, expected "
                                                    f"{ap.spec.shape} (axis {axis})")
                continue
            dim, lo, hi = want
            if not lo <= got <= hi:
                raise _fail(Reason.WRONG_SHAPE, f"array {name!r}: axis {axis} ({dim}) has length {got}, "
                                                f"allowed {lo}..{hi}")
            if dims.setdefault(dim, got) != got:
                raise _fail(Reason.WRONG_SHAPE, f"array {name!r}: {dim} = {got} disagrees with {dims[dim]} "
                                                "of an earlier array")
        expected = math.prod(shape) * ap.itemsize
    else:
        expected = ap.fixed_nbytes
    data = entry["data"]
    if not isinstance(data, bytes):
        raise _fail(Reason.BAD_ARRAY, f"array {name!r}: data must be binary")
    if len(data) != expected:
        raise _fail(Reason.BAD_ARRAY, f"array {name!r}: {len(data)} data bytes, shape needs {expected}")
    arr = np.frombuffer(data, dtype=ap.np_dtype).reshape(shape)  # read-only view
    if ap.finite and not np.isfinite(arr).all():
        raise _fail(Reason.NON_FINITE, f"array {name!r} contains a non-finite value")
    if ap.value_checks and arr.size:
        _check_constraints(arr, ap.spec)
    return arr


def _check_values(arr: np.ndarray, spec: ArraySpec) -> None:
    if arr.dtype.kind == "f" and spec.finite and not np.isfinite(arr).all():
        raise _fail(Reason.NON_FINITE, f"array {spec.name!r} contains a non-finite value")
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
                raise _fail(Reason.BAD_INDEX, f"array {name!r}: index out of range [0, {spec.index_bound})")
        if spec.distinct:
            n_distinct = len(set(values)) if values is not None else np.unique(arr).size
            if n_distinct != arr.size:
                raise _fail(Reason.BAD_INDEX, f"array {name!r}: repeated values")
    if spec.nonnegative and arr.min() < 0:
        raise _fail(Reason.BAD_ARRAY, f"array {name!r}: negative value")
    if spec.positive and not (arr > 0).all():
        raise _fail(Reason.BAD_ARRAY, f"array {name!r}: value <= 0")
    if spec.simplex:
        # finite already checked: a NaN never gets here
        if arr.min() < 0 or arr.max() > 1:
            raise _fail(Reason.BAD_ARRAY, f"array {name!r}: a probability outside [0, 1]")
        if arr.ndim and not (np.abs(arr.sum(axis=-1) - 1.0) <= SIMPLEX_TOL).all():
            raise _fail(Reason.BAD_ARRAY, f"array {name!r}: probabilities do not sum to 1 (within {SIMPLEX_TOL:g})")


# =========================================================================== sequence numbers


class SeqCheck(NamedTuple):
    """What accepting a sequence number means.

    `in_order`: it is the next one (`mark + 1`); `fills_gap`: it is one of the missing seqs below the
    highest seen (arrived late);
    `new_gap`: the inclusive range it skips over (seqs never seen yet), or `None`; `dropped`: the
    inclusive range given up because the client ran more than `window` ahead, or `None`.

    >>> SeqCheck(True, False, None, None).in_order
    True
    """

    in_order: bool
    fills_gap: bool
    new_gap: tuple[int, int] | None
    dropped: tuple[int, int] | None


class SeqTracker:
    """Per-client monotonic sequence numbers: duplicates and replays are rejected, gaps reported.

    Per client it keeps `mark` (every seq `<= mark` is applied, or was given up) and the set of seqs
    applied above it (out of order, at most `window` ahead). Pure, deterministic, and serialisable with
    :meth:`to_dict` / :meth:`from_dict` for persistence. :meth:`check` only looks; :meth:`record` also
    remembers — so a caller can validate and apply an update between the two.

    >>> t = SeqTracker()
    >>> t.record("a", 1).in_order, t.record("a", 4).new_gap, t.gaps("a")
    (True, (2, 3), [(2, 3)])
    >>> t.record("a", 2).fills_gap, t.mark("a"), t.missing("a")
    (True, 2, [3])
    >>> t.check("a", 2)
    Traceback (most recent call last):
    ...
    streamfed.fleet.protocol.ProtocolError: stale_seq: client 'a' seq 2 already applied (all <= 2 are)
    >>> SeqTracker.from_dict(t.to_dict()).to_dict() == t.to_dict()
    True
    """

    def __init__(self, window: int = 1024, first_seq: int = 1) -> None:
        if window < 1 or first_seq < 0:
            raise ValueError(f"window must be >= 1 and first_seq >= 0, got {window}, {first_seq}")
        self.window = int(window)
        self.first_seq = int(first_seq)
        self._mark: dict[str, int] = {}
        self._above: dict[str, set[int]] = {}

    def mark(self, client: str) -> int:
        """Every seq up to this one is applied (or given up); `first_seq - 1` for an unknown client."""
        return self._mark.get(client, self.first_seq - 1)

    def highest(self, client: str) -> int:
        """The highest seq applied (`mark` when nothing arrived out of order)."""
        above = self._above.get(client)
        return max(above) if above else self.mark(client)

    def missing(self, client: str) -> list[int]:
        """Seqs between `mark` and `highest` not received yet, ascending."""
        above = self._above.get(client, set())
        return [s for s in range(self.mark(client) + 1, self.highest(client)) if s not in above]

    def gaps(self, client: str) -> list[tuple[int, int]]:
        """:meth:`missing` as inclusive ranges."""
        out: list[tuple[int, int]] = []
        for s in self.missing(client):
            if out and out[-1][1] == s - 1:
                out[-1] = (out[-1][0], s)
            else:
                out.append((s, s))
        return out

    @property
    def clients(self) -> list[str]:
        return sorted(self._mark)

    def has(self, client: str, seq: int) -> bool:
        """Whether `seq` is applied (at or below the mark, or recorded above it): :meth:`check` would
        refuse it as `stale_seq`. No exception, no validation: for seqs already known to be integers."""
        if seq <= self._mark.get(client, self.first_seq - 1):
            return True
        above = self._above.get(client)
        return above is not None and seq in above

    def adopt(self, client: str, mark: int) -> None:
        """Start a client not known yet at `mark` (everything up to it given up): a server that lost its state
        takes each client from where it is instead of waiting for seqs the client no longer holds.

        >>> t = SeqTracker()
        >>> t.adopt("a", 5000); t.record("a", 5001).in_order
        True
        """
        if client in self._mark or client in self._above:
            raise ValueError(f"client {client!r} is already known")
        self._mark[client] = int(mark)

    def check(self, client: str, seq: int) -> SeqCheck:
        """What :meth:`record` would report, without changing anything; `ProtocolError` (`stale_seq`)
        for a seq already applied or below the mark, (`bad_seq`) for a non-integer."""
        if not _is_int(seq) or not 0 <= seq <= _INT64_MAX:
            raise _fail(Reason.BAD_SEQ, f"seq must be an integer in [0, 2^63), got {seq!r}")
        mark = self.mark(client)
        above = self._above.get(client, set())
        if seq <= mark:
            raise _fail(Reason.STALE_SEQ, f"client {client!r} seq {seq} already applied (all <= {mark} are)")
        if seq in above:
            raise _fail(Reason.STALE_SEQ, f"client {client!r} seq {seq} is a duplicate")
        highest = max(above) if above else mark
        new_gap = (highest + 1, seq - 1) if seq > highest + 1 else None
        fills_gap = seq < highest  # it was one of the missing seqs
        dropped = None
        if seq - mark > self.window:
            dropped = (mark + 1, seq - self.window)
            if new_gap is not None:  # the part of the new gap that is dropped at once is not a gap
                lo = max(new_gap[0], seq - self.window + 1)
                new_gap = (lo, new_gap[1]) if lo <= new_gap[1] else None
        return SeqCheck(seq == mark + 1, fills_gap, new_gap, dropped)

    def record(self, client: str, seq: int) -> SeqCheck:
        """Check `seq` and remember it as applied."""
        return self.commit(client, seq, self.check(client, seq))

    def commit(self, client: str, seq: int, result: SeqCheck) -> SeqCheck:
        """Remember `seq` as applied, `result` being what :meth:`check` said of it just now (nothing
        recorded for `client` since): :meth:`record` without checking twice."""
        if result.in_order and client not in self._above:  # the common case: the next one, no gaps
            self._mark[client] = seq
            return result
        mark = self.mark(client)
        above = self._above.setdefault(client, set())
        if result.dropped is not None:
            mark = result.dropped[1]
            above.difference_update([s for s in above if s <= mark])
        above.add(seq)
        while mark + 1 in above:
            mark += 1
            above.discard(mark)
        self._mark[client] = mark
        if not above:
            del self._above[client]
        return result

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/msgpack-able state."""
        return {
            "window": self.window,
            "first_seq": self.first_seq,
            "clients": {c: {"mark": m, "above": sorted(self._above.get(c, ()))}
                        for c, m in sorted(self._mark.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeqTracker:
        """Inverse of :meth:`to_dict` (`ValueError` for inconsistent state)."""
        t = cls(int(data["window"]), int(data["first_seq"]))
        for c, st in dict(data["clients"]).items():
            mark, above = int(st["mark"]), {int(s) for s in st["above"]}
            if any(s <= mark + 1 or s > mark + t.window for s in above):
                raise ValueError(f"inconsistent tracker state for client {c!r}")
            t._mark[str(c)] = mark
            if above:
                t._above[str(c)] = above
        return t


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

    >>> t = SeqTracker(); _ = t.record("a1", 1); _ = t.record("a1", 3)
    >>> ack_message("f", "a1", t.mark("a1"), t.missing("a1"), seq=1, created=0.0).included
    {'a1': 1}
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
