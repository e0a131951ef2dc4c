"""The strict decoder as it was before the ingest fast path (commit 024897b), kept verbatim as the oracle the
optimised :func:`streamfed.wire.message.decode` is compared against (tests/test_ingest_fast_path.py): same
message, or the same reason and detail, for every payload. Only the bookkeeping it shares (plans, the name cache,
the value constraints) comes from the module."""

# ruff: noqa
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from streamfed.wire.message import (
    INT64_MAX,
    SCHEMA_VERSION,
    Message,
    ProtocolError,
    Reason,
    _ARRAY_KEYS,
    _ENVELOPE_KEYS,
    _MAX_META_KEY,
    _check_constraints,
    _message,
    _name_problem,
    _plan_of,
    _schema_of,
    _unpack,
    fail,
    is_int,
)
from streamfed.wire.schema import MAX_KERNEL_VERSION_LEN, MAX_META_ITEMS, MAX_META_STR, MessageSchema
from streamfed.wire.topics import name_problem


def _counter(env: Mapping[str, Any], key: str, reason: Reason) -> int:
    v = env[key]
    if type(v) is not int or not 0 <= v <= INT64_MAX:
        raise fail(reason, f"{key} must be an integer in [0, 2^63), got {v!r}")
    return v


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
    if env["schema"] != SCHEMA_VERSION or not is_int(env["schema"]):
        raise fail(Reason.BAD_SCHEMA, f"schema version {env['schema']!r}, expected {SCHEMA_VERSION}")

    fleet = env["fleet"]
    if fleet != schema.fleet:
        raise fail(Reason.WRONG_FLEET, f"fleet {fleet!r}, expected {schema.fleet!r}")

    kind = env["kind"]
    kp = plan.kinds.get(kind) if type(kind) is str else None
    if kp is None:
        raise fail(Reason.UNKNOWN_KIND, f"kind {kind!r} is not exchanged by fleet {schema.fleet!r}")
    if kinds is not None:
        if not isinstance(kinds, tuple | list | set | frozenset):
            kinds = set(kinds)
        if kind not in kinds:
            raise fail(Reason.UNKNOWN_KIND, f"kind {kind!r} is not accepted on this topic")
    if size > kp.max_bytes:
        raise fail(Reason.TOO_LARGE, f"{size} bytes > limit {kp.max_bytes} of kind {kind!r}")

    sender = env["client"]
    problem = _name_problem(sender)
    if problem is not None:
        raise fail(Reason.BAD_CLIENT, f"client name {problem}")
    if client is not None and sender != client:
        raise fail(Reason.BAD_CLIENT, f"envelope says client {sender!r}, topic says {client!r}")

    seq = _counter(env, "seq", Reason.BAD_SEQ)
    global_version = _counter(env, "global_version", Reason.BAD_SCHEMA)
    epoch = _counter(env, "epoch", Reason.BAD_SCHEMA)
    n_samples = _counter(env, "n_samples", Reason.BAD_SCHEMA)
    created = env["created"]
    if type(created) is not float or not math.isfinite(created) or created < 0:
        raise fail(Reason.BAD_SCHEMA, f"created must be a finite float >= 0, got {created!r}")

    kv = env["kernel_version"]
    if not isinstance(kv, str) or len(kv) > MAX_KERNEL_VERSION_LEN or not (kv.isascii() and kv.isprintable()):
        raise fail(Reason.BAD_SCHEMA, f"kernel_version must be printable ASCII of at most "
                                       f"{MAX_KERNEL_VERSION_LEN} characters, got {kv!r:.80}")
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
    if not isinstance(arrays, dict):
        raise fail(Reason.BAD_ARRAY, "arrays must be a map")
    if arrays.keys() != kp.array_names:
        names, got = kp.array_names, set(arrays)
        missing, extra = sorted(names - got), sorted(map(str, got - names))
        raise fail(Reason.BAD_ARRAY, f"kind {kp.ks.kind!r}: missing arrays {missing}, unexpected {extra}")
    dims: dict[str, int] = {}
    return {ap.name: _check_array(arrays[ap.name], ap, dims) for ap in kp.arrays}  # schema order


def _check_array(entry: Any, ap: _ArrayPlan, dims: dict[str, int]) -> np.ndarray:
    name = ap.name
    if not isinstance(entry, dict) or entry.keys() != _ARRAY_KEYS:
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
    if shape != ap.fixed_shape:  # (a fixed shape that matches needs no walk)
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
    else:
        expected = ap.fixed_nbytes
    data = entry["data"]
    if not isinstance(data, bytes):
        raise fail(Reason.BAD_ARRAY, f"array {name!r}: data must be binary")
    if len(data) != expected:
        raise fail(Reason.BAD_ARRAY, f"array {name!r}: {len(data)} data bytes, shape needs {expected}")
    arr = np.frombuffer(data, dtype=ap.np_dtype).reshape(shape)  # read-only view
    if ap.finite and not np.isfinite(arr).all():
        raise fail(Reason.NON_FINITE, f"array {name!r} contains a non-finite value")
    if ap.value_checks and arr.size:
        _check_constraints(arr, ap.spec)
    return arr
