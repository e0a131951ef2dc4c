"""A class-independent, versioned encoding of state trees (msgpack), for files that outlive the code's layout.

A tree is plain values (None, bool, int of any size, float, str, bytes, list, dict) and:

* NumPy arrays, as (dtype, shape, order, raw bytes): exact, bit for bit (NaN payloads, −0.0);
* NumPy scalars (dtype, bytes), tuples, sets, frozensets, bytearrays, slices, complex numbers, ordered dicts,
  deques (with their bound), defaultdicts whose factory is a builtin (list, dict, set, int, float), and time zones
  (a fixed offset, or an IANA zone by name);
* torch tensors, as their array (dtype, values), grad flag and whether a `Parameter` (no state holds one today);
* NumPy random generators, as their bit generator's name and state (the stream continues exactly);
* objects of **registered** classes, as ``(type name, schema version, fields)``.

The type name is the one the class was registered under with :func:`durable` — never its module path, so a
class can move between modules (or be renamed) and every file written before still loads. The fields are what
`__getstate__` returns when the class defines one (then `__setstate__` rebuilds it, if defined), else its
`__dict__` and `__slots__` values; a class is rebuilt without calling `__init__`. A name met before its class's
module was imported is looked up by the resolvers of :func:`add_resolver` (the state-file reader adds one that
imports the project's modules). An object of a class that is
not registered is refused (:class:`DurableError`) — nothing falls back to pickle.

Schema versions: a class registered at ``version=n`` whose file says ``m < n`` is upgraded by the migrations
registered with :func:`migration` for ``(name, m)``, ``(name, m + 1)``, … each turning a field dict of one
version into the next. A version above the class's, an unknown name or a missing migration is a
:class:`DurableError`.

Identity: an object or array met twice in one tree is written once and comes back shared (as pickle does), so
a learner and the wrapper that holds it keep pointing at one object; plain lists and dicts are copied.

msgpack layout: a two-element array ``[tree, buffers]``. `tree` (bin) is the msgpack of the value: plain
values are msgpack's own, the rest extension values (codes in :data:`EXT`) whose payload is itself msgpack
(arrays: ``[dtype, shape, order, buffer index]``; objects: name, version, fields written one after the other so
the object exists before its fields are read; back-references: the index of the first occurrence, counting
objects and arrays in the order they are written). `buffers` (an array of bin) holds each array's raw bytes in
`order`, beside the tree rather than inside it, so a large array is copied once, not once per nesting level.

>>> import numpy as np
>>> @durable("doc.point", version=1)
... class Point:
...     def __init__(self, xy): self.xy = xy
>>> p = decode(encode({"p": Point(np.array([1.5, -0.0])), "n": 2**70}))
>>> type(p["p"]).__name__, p["p"].xy.tolist(), p["n"]
('Point', [1.5, -0.0], 1180591620717411303424)
>>> encode(object())
Traceback (most recent call last):
...
streamfed.core.durable.DurableError: cannot store a builtins.object: its class is not registered (@durable)
"""

from __future__ import annotations

import collections
import datetime as dt
import sys
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import numpy as np

__all__ = ["EXT", "DurableError", "add_resolver", "durable", "decode", "encode", "migration", "registered"]

T = TypeVar("T", bound=type)

EXT = {"array": 1, "object": 2, "ref": 3, "tuple": 4, "set": 5, "frozenset": 6, "bigint": 7, "scalar": 8,
       "generator": 9, "bytearray": 10, "complex": 11, "tensor": 12, "ordereddict": 13, "deque": 14,
       "defaultdict": 15, "tzinfo": 16, "slice": 17}
# the factories a stored defaultdict may name (a factory is code: only these builtins are stored by name)
_FACTORIES: dict[str, Callable[[], Any]] = {f.__name__: f for f in (list, dict, set, int, float)}
_CODE = {v: k for k, v in EXT.items()}


class DurableError(ValueError):
    """A value that cannot be stored, or stored bytes that cannot be rebuilt (the message says which and why)."""


@dataclass(frozen=True)
class _Entry:
    cls: type
    name: str
    version: int


_NAME_MAX = 200
_HEAD_MAX = _NAME_MAX + 16  # an object's name and version fit in its payload's first bytes
_BY_NAME: dict[str, _Entry] = {}
_BY_CLASS: dict[type, _Entry] = {}
_MIGRATIONS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}
_RESOLVERS: list[Callable[[str], None]] = []


def durable(name: str, version: int = 1) -> Callable[[T], T]:
    """Class decorator: store objects of this class under the stable `name` at schema `version` (raise it
    when the fields change, and register a :func:`migration` from the old one). A name belongs to one class."""
    if not 0 < len(name.encode()) <= _NAME_MAX or version < 1:
        raise ValueError(f"a durable class needs a name of 1 to {_NAME_MAX} bytes and a version >= 1")

    def register(cls: T) -> T:
        old = _BY_NAME.get(name)
        # a module imported again (reloaded) registers its class again: the newer one wins; another class never
        if old is not None and (old.cls.__module__, old.cls.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"durable name {name!r} is taken by {old.cls.__module__}.{old.cls.__qualname__}")
        entry = _Entry(cls, name, version)
        if old is not None:
            _BY_CLASS.pop(old.cls, None)
        _BY_NAME[name] = entry
        _BY_CLASS[cls] = entry
        return cls

    return register


def migration(name: str, from_version: int) -> Callable[[Callable[[dict[str, Any]], dict[str, Any]]],
                                                         Callable[[dict[str, Any]], dict[str, Any]]]:
    """Decorator: the function upgrades the fields of a `name` object written at `from_version` to the next."""
    def register(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
        _MIGRATIONS[(name, from_version)] = fn
        return fn

    return register


def add_resolver(resolve: Callable[[str], None]) -> None:
    """Call `resolve(name)` for a name no class has registered yet, before giving up on it: it may import the
    module whose class registers it (classes register when their module is imported, and a file can be read
    before anything imported them). Resolvers are asked in the order they were added."""
    if resolve not in _RESOLVERS:
        _RESOLVERS.append(resolve)


def registered() -> dict[str, tuple[type, int]]:
    """Every registered name → (class, version) (for tests and docs)."""
    return {n: (e.cls, e.version) for n, e in sorted(_BY_NAME.items())}


def _custom(cls: type, method: str) -> Callable[..., Any] | None:
    """`cls`'s own `method` (`__getstate__`/`__setstate__`), None when only `object`'s default exists."""
    fn = getattr(cls, method, None)
    return None if fn is None or fn is getattr(object, method, None) else fn


def _slots(cls: type) -> list[str]:
    out: list[str] = []
    for k in cls.__mro__:
        s = k.__dict__.get("__slots__", ())
        out.extend([s] if isinstance(s, str) else [n for n in s if n not in ("__dict__", "__weakref__")])
    return out


class _Encoder:
    def __init__(self) -> None:
        self.buffers: list[Any] = []  # the arrays' raw bytes, in the order the tree names them
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []  # the objects memoised, alive until the end (ids stay unique)

    def pack(self, value: Any) -> bytes:
        return msgpack.packb(value, default=self.default, use_bin_type=True, strict_types=True)

    def _remember(self, o: Any) -> msgpack.ExtType | None:
        at = self.memo.get(id(o))
        if at is not None:
            return msgpack.ExtType(EXT["ref"], msgpack.packb(at))
        self.memo[id(o)] = len(self.memo)
        self.keep.append(o)
        return None

    def default(self, o: Any) -> Any:  # noqa: C901 (one branch per kind of value, in one place)
        t = type(o)
        if t is np.ndarray:
            ref = self._remember(o)
            if ref is not None:
                return ref
            if o.dtype.hasobject:
                raise DurableError(f"cannot store an array of dtype {o.dtype} (Python objects)")
            order = "F" if o.flags.f_contiguous and not o.flags.c_contiguous else "C"
            # the bytes go beside the tree, not inside it: nested payloads are copied once per level
            raw = o.reshape(-1, order=order) if o.flags.c_contiguous or o.flags.f_contiguous else o.ravel()
            self.buffers.append(raw.view(np.uint8).data if raw.size else b"")
            return msgpack.ExtType(EXT["array"], self.pack([o.dtype.str if o.dtype.names is None else
                                                            o.dtype.descr, list(o.shape), order,
                                                            len(self.buffers) - 1]))
        if t is int:  # only those msgpack cannot hold (beyond 64 bits) come here
            return msgpack.ExtType(EXT["bigint"], str(o).encode())
        if t is tuple:
            return msgpack.ExtType(EXT["tuple"], self.pack(list(o)))
        if t is set or t is frozenset:
            return msgpack.ExtType(EXT[t.__name__], self.pack(list(o)))
        if t is bytearray:
            return msgpack.ExtType(EXT["bytearray"], bytes(o))
        if t is collections.OrderedDict:
            return msgpack.ExtType(EXT["ordereddict"], self.pack(list(o.items())))
        if t is collections.deque:
            return msgpack.ExtType(EXT["deque"], self.pack([list(o), o.maxlen]))
        if t is collections.defaultdict:
            factory = getattr(o.default_factory, "__name__", None)
            if _FACTORIES.get(factory) is not o.default_factory:  # type: ignore[arg-type]
                raise DurableError(f"cannot store a defaultdict whose factory is {o.default_factory!r}")
            return msgpack.ExtType(EXT["defaultdict"], self.pack([factory, dict(o)]))
        if t is slice:
            return msgpack.ExtType(EXT["slice"], self.pack([o.start, o.stop, o.step]))
        if t is complex:
            return msgpack.ExtType(EXT["complex"], self.pack([o.real, o.imag]))
        if isinstance(o, np.generic):
            return msgpack.ExtType(EXT["scalar"], self.pack([o.dtype.str, o.tobytes()]))
        if t is np.random.Generator:
            return msgpack.ExtType(EXT["generator"], self.pack(o.bit_generator.state))
        torch = sys.modules.get("torch")  # (a state can hold a tensor only when torch is loaded)
        if torch is not None and isinstance(o, torch.Tensor):
            what = "Parameter" if isinstance(o, torch.nn.Parameter) else "Tensor"
            return msgpack.ExtType(EXT["tensor"], self.pack([o.detach().cpu().numpy(), bool(o.requires_grad), what]))
        if t is dt.timezone:  # time zones are values: a fixed offset, or an IANA zone by its key
            return msgpack.ExtType(EXT["tzinfo"], self.pack(["offset", o.utcoffset(None).total_seconds(),
                                                             o.tzname(None)]))
        if t is zoneinfo.ZoneInfo:
            return msgpack.ExtType(EXT["tzinfo"], self.pack(["iana", o.key]))
        entry = _BY_CLASS.get(t)
        if entry is None:
            raise DurableError(f"cannot store a {t.__module__}.{t.__qualname__}: its class is not registered "
                               "(@durable)")
        ref = self._remember(o)
        if ref is not None:
            return ref
        get = _custom(t, "__getstate__")
        if get is not None:
            fields = get(o)
            if not isinstance(fields, dict):
                fields = {"__state__": fields}
        else:
            fields = dict(getattr(o, "__dict__", {}))
            for s in _slots(t):
                if hasattr(o, s):
                    fields[s] = getattr(o, s)
        if isinstance(o, tuple | list | dict):  # a container subclass (a NamedTuple, a dict of sums): its items too
            fields["__items__"] = list(o.items()) if isinstance(o, dict) else list(o)
        try:
            body = self.pack(fields)
        except DurableError as e:
            raise DurableError(f"{e} (in a {entry.name})") from None
        return msgpack.ExtType(EXT["object"], self.pack(entry.name) + self.pack(entry.version) + body)


class _Decoder:
    def __init__(self, buffers: list[bytes]) -> None:
        self.buffers = buffers
        self.memo: list[Any] = []

    def unpack(self, data: bytes | memoryview) -> Any:
        return msgpack.unpackb(data, ext_hook=self.ext, raw=False, strict_map_key=False, use_list=True)

    def ext(self, code: int, data: bytes) -> Any:  # noqa: C901 (the inverse of _Encoder.default)
        kind = _CODE.get(code)
        if kind == "array":
            at = len(self.memo)
            self.memo.append(None)
            dtype, shape, order, index = self.unpack(data)
            kind_of = np.dtype(dtype if isinstance(dtype, str) else [tuple(f) for f in dtype])
            flat = np.frombuffer(self.buffers[index], dtype=kind_of).copy()  # its own writable memory
            a = flat.reshape(shape, order=order)
            self.memo[at] = a
            return a
        if kind == "ref":
            return self.memo[msgpack.unpackb(data)]
        if kind == "tuple":
            return tuple(self.unpack(data))
        if kind == "set":
            return set(self.unpack(data))
        if kind == "frozenset":
            return frozenset(self.unpack(data))
        if kind == "bigint":
            return int(data.decode())
        if kind == "bytearray":
            return bytearray(data)
        if kind == "ordereddict":
            return collections.OrderedDict(self.unpack(data))
        if kind == "deque":
            items, maxlen = self.unpack(data)
            return collections.deque(items, maxlen)
        if kind == "defaultdict":
            factory, items = self.unpack(data)
            return collections.defaultdict(_FACTORIES[factory], items)
        if kind == "slice":
            return slice(*self.unpack(data))
        if kind == "complex":
            re, im = self.unpack(data)
            return complex(re, im)
        if kind == "scalar":
            dtype, raw = self.unpack(data)
            return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
        if kind == "generator":
            state = self.unpack(data)
            bit_generator = getattr(np.random, state["bit_generator"])()
            bit_generator.state = state
            return np.random.Generator(bit_generator)
        if kind == "tensor":
            torch = sys.modules.get("torch") or __import__("torch")  # only a state that holds tensors needs torch
            a, grad, what = self.unpack(data)
            t = torch.from_numpy(a)
            return torch.nn.Parameter(t, requires_grad=grad) if what == "Parameter" else t.requires_grad_(grad)
        if kind == "tzinfo":
            how, *args = self.unpack(data)
            if how == "iana":
                return zoneinfo.ZoneInfo(args[0])
            offset = dt.timedelta(seconds=args[0])
            return dt.UTC if offset == dt.timedelta(0) and args[1] == "UTC" else dt.timezone(offset, args[1])
        if kind == "object":
            return self._object(data)
        raise DurableError(f"unknown extension code {code}")

    def _object(self, data: bytes) -> Any:
        head = msgpack.Unpacker(raw=False)  # only the short name and version: the fields are read in place below
        head.feed(data[:_HEAD_MAX])
        name, version = next(head), next(head)
        offset = head.tell()
        entry = _BY_NAME.get(name)
        for resolve in _RESOLVERS if entry is None else ():
            resolve(name)
            if (entry := _BY_NAME.get(name)) is not None:
                break
        if entry is None:
            raise DurableError(f"no class is registered as {name!r} (written by another build, or a plug-in "
                               f"that is not loaded)")
        if version > entry.version:
            raise DurableError(f"{name} is at schema version {version}, this build knows up to {entry.version}")
        cls = entry.cls
        at = len(self.memo)
        # made before its fields are read, so an object inside may point back at it (a tuple cannot be)
        obj = None if issubclass(cls, tuple) else cls.__new__(cls)
        self.memo.append(obj)
        fields = self.unpack(memoryview(data)[offset:])
        for v in range(version, entry.version):
            step = _MIGRATIONS.get((name, v))
            if step is None:
                raise DurableError(f"no migration of {name} from schema version {v} to {v + 1}")
            fields = step(fields)
        items = fields.pop("__items__", None)
        if issubclass(cls, tuple):
            obj = self.memo[at] = tuple.__new__(cls, items)
        elif issubclass(cls, dict):
            dict.update(obj, items)
        elif issubclass(cls, list):
            list.extend(obj, items)
        put = _custom(cls, "__setstate__")
        if put is not None:
            put(obj, fields["__state__"] if set(fields) == {"__state__"} else fields)
            return obj
        slots = set(_slots(cls))
        for k, val in fields.items():
            if k in slots:
                object.__setattr__(obj, k, val)
            else:
                obj.__dict__[k] = val
        return obj


def encode(tree: Any) -> bytes:
    """The msgpack bytes of `tree` (see the module doc); :class:`DurableError` for a value it cannot hold."""
    enc = _Encoder()
    body = enc.pack(tree)
    return msgpack.packb([body, enc.buffers], use_bin_type=True)


def decode(data: bytes) -> Any:
    """The tree :func:`encode` wrote; :class:`DurableError` (or msgpack's own errors) for bytes it cannot read."""
    outer = msgpack.unpackb(data, raw=False)
    if not (isinstance(outer, list) and len(outer) == 2 and isinstance(outer[0], bytes)
            and isinstance(outer[1], list) and all(isinstance(b, bytes) for b in outer[1])):
        raise DurableError("not a durable record: expected [tree bytes, list of array buffers]")
    return _Decoder(outer[1]).unpack(outer[0])
