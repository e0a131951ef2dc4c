"""Durable state files: versioned, checksummed, written atomically, readable after any code move.

A state file is one record::

    magic        16 bytes  b"STREAMFED-STATE\\n"
    format       u32 LE    FORMAT_VERSION = 2 (1 is still read; a reader refuses any other)
    length       u64 LE    length of the body
    sha256       32 bytes  of the body
    body         a dict with at least "kind" (e.g. "agent", "aggregator"), encoded as the format says:
                 2: msgpack by :mod:`streamfed.core.durable` (class-independent: objects by registered name
                    and schema version, arrays as dtype/shape/bytes, generators as their state)
                 1: pickle (protocol 5), written up to the durable format; read through the move maps below

Writing (:func:`atomic_write`): the bytes go to a temporary file in the same directory, are flushed and
fsync'ed, then `os.replace`d over the old file, and the directory is fsync'ed — so at every instant the
path names either the complete old state or the complete new one. A crash mid-write leaves a stray
``.<name>.tmp-*`` file next to an intact old state; it is ignored when loading and removed by the next
:class:`StateStore` on that path. Every write is format 2: an object whose class is not registered with
:func:`~streamfed.core.durable.durable` is refused there (:class:`~streamfed.core.durable.DurableError`),
before anything is written.

Reading (:func:`loads`): a wrong magic, an unknown format, a short file, trailing bytes or a checksum
mismatch raise :class:`StateError` — a damaged file is never decoded. A format-2 body that names an
unknown type or a schema version this build cannot migrate is a :class:`StateError` too.

Trust: the checksum detects corruption, not tampering. A format-2 body rebuilds only registered classes (no
code is named by the file); a format-1 body is a pickle, so the state directory must be writable only by the
service that owns it (as its code is).

A :class:`StateStore` also holds an exclusive `flock` on ``<path>.lock`` while open, so two processes
can never write the same state (the lock dies with its process, also on SIGKILL).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import io
import logging
import os
import pickle
import pkgutil
import struct
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streamfed.algorithms import MOVED_MODULES as ALGORITHM_MOVED_MODULES
from streamfed.algorithms import MOVED_NAMES as ALGORITHM_MOVED_NAMES
from streamfed.core import durable

__all__ = ["FORMAT_VERSION", "MAGIC", "PICKLE_FORMAT", "READABLE", "StateError", "StateStore", "atomic_write", "dumps",
           "loads", "read_state"]

log = logging.getLogger(__name__)

MAGIC = b"STREAMFED-STATE\n"
FORMAT_VERSION = 2  # what every write is: msgpack by streamfed.core.durable
PICKLE_FORMAT = 1  # what the project wrote before: read, never written
READABLE = (PICKLE_FORMAT, FORMAT_VERSION)
_HEADER = struct.Struct("<IQ")
_DIGEST = 32
_PREFIX = len(MAGIC) + _HEADER.size + _DIGEST


class StateError(RuntimeError):
    """A state file cannot be used: `path` and a `reason` saying exactly why.

    >>> str(StateError("/x/agent.state", "checksum mismatch"))
    'state file /x/agent.state: checksum mismatch'
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"state file {self.path}: {reason}")


# Format 1 only (format 2 names no module): where classes went when their modules moved, so a pickle written
# before a move still loads (it names the old module). Whole modules, then single names that left a module that
# still exists.
MOVED_MODULES = {
    "streamfed.fleet.protocol": "streamfed.wire.message",
    "streamfed.fleet.topics": "streamfed.wire.topics",
    "streamfed.privacy.learner": "streamfed.fleet.private_learner",
    "streamfed.privacy.fleet": "streamfed.fleet.secure_aggregation",
    **ALGORITHM_MOVED_MODULES,
}
MOVED_NAMES = {
    ("streamfed.fleet.protocol", "SeqCheck"): "streamfed.fleet.sequences",
    ("streamfed.fleet.protocol", "SeqTracker"): "streamfed.fleet.sequences",
    **{("streamfed.fleet.config", n): "streamfed.wire.schema"
       for n in ("ArraySpec", "MetaSpec", "MessageSchema", "ProtocolSchema")},
    **ALGORITHM_MOVED_NAMES,  # the families' own moves, named where the families are (this module names none)
}


# Format 2: the packages whose modules register durable classes, by the first part of the registered names
# ("pofmkl.POFMKLClient" → the pofmkl family). A name seen before its module was imported (a state read before
# the core that uses it was built) imports that package's modules; a name in none of them (a class that moved
# elsewhere in the project) imports all of them, once.
_DURABLE_AREAS = ("streamfed.core", "streamfed.wire", "streamfed.privacy", "streamfed.algorithms", "streamfed.fleet")
_walked: set[tuple[str, bool]] = set()


def _import_package(package: str, recursive: bool = True) -> None:
    if (package, recursive) in _walked:
        return
    _walked.add((package, recursive))
    try:
        root = importlib.import_module(package)
    except ImportError as e:  # an optional family without its dependencies (torch): its names stay unknown
        log.debug("durable names: %s not importable: %s", package, e)
        return
    walk = pkgutil.walk_packages if recursive else pkgutil.iter_modules
    for info in walk(getattr(root, "__path__", []), package + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as e:
            log.debug("durable names: %s not importable: %s", info.name, e)


def _import_registrations(name: str) -> None:
    area = name.partition(".")[0]
    if f"streamfed.{area}" in _DURABLE_AREAS:
        _import_package(f"streamfed.{area}", recursive=area != "algorithms")  # (the families: below)
    else:
        _import_package(f"streamfed.algorithms.{area.replace('-', '_')}")
    if name not in durable.registered():
        for package in _DURABLE_AREAS:
            _import_package(package)


durable.add_resolver(_import_registrations)


class _Unpickler(pickle.Unpickler):
    """`pickle.loads`, following :data:`MOVED_MODULES` and :data:`MOVED_NAMES` (checksummed bodies written by
    this program only: see the module doc)."""

    def find_class(self, module: str, name: str) -> Any:
        moved = MOVED_NAMES.get((module, name)) or MOVED_MODULES.get(module)
        if moved is not None:
            return getattr(importlib.import_module(moved), name)
        return super().find_class(module, name)


def dumps(state: Mapping[str, Any]) -> bytes:
    """The file bytes of `state` (a mapping with a string "kind").

    >>> loads(dumps({"kind": "demo", "x": 1}))
    {'kind': 'demo', 'x': 1}
    """
    if not isinstance(state.get("kind"), str):
        raise ValueError("a state needs a string 'kind'")
    body = durable.encode(dict(state))
    return MAGIC + _HEADER.pack(FORMAT_VERSION, len(body)) + hashlib.sha256(body).digest() + body


def loads(data: bytes, path: str | os.PathLike[str] = "<bytes>", kind: str | None = None) -> dict[str, Any]:
    """Check and decode file bytes (inverse of :func:`dumps`); :class:`StateError` if anything is off.

    >>> loads(dumps({"kind": "a"})[:-1])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamfed.fleet.persistence.StateError: state file <bytes>: truncated: body has ... bytes
    """
    if len(data) < _PREFIX or not data.startswith(MAGIC):
        what = "truncated header" if MAGIC.startswith(data[: len(MAGIC)]) and len(data) < _PREFIX else "bad magic"
        raise StateError(path, f"{what} (not a streamfed state file, or damaged)")
    version, length = _HEADER.unpack_from(data, len(MAGIC))
    if version not in READABLE:
        raise StateError(path, f"format version {version}, this build reads {' and '.join(map(str, READABLE))}")
    body = data[_PREFIX:]
    if len(body) != length:
        problem = "truncated" if len(body) < length else "trailing bytes"
        raise StateError(path, f"{problem}: body has {len(body)} of {length} bytes")
    if hashlib.sha256(body).digest() != data[len(MAGIC) + _HEADER.size : _PREFIX]:
        raise StateError(path, "checksum mismatch (the file is corrupt)")
    try:
        state = durable.decode(body) if version == FORMAT_VERSION else _Unpickler(io.BytesIO(body)).load()
    except Exception as e:  # an intact checksum over an unreadable body: written by incompatible code
        raise StateError(path, f"cannot decode the body: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or not isinstance(state.get("kind"), str):
        raise StateError(path, "the body is not a state record")
    if kind is not None and state["kind"] != kind:
        raise StateError(path, f"holds a {state['kind']!r} state, expected {kind!r}")
    return state


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace `path` by `data` atomically and durably (temp file, fsync, rename, fsync of the directory)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.tmp-", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself must survive a power cut
    finally:
        os.close(dfd)


def read_state(path: str | os.PathLike[str], kind: str | None = None) -> dict[str, Any] | None:
    """The state at `path` (None if there is none), without taking the lock: for observers and tests."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    return loads(data, path, kind)


class StateStore:
    """One state file, owned by one process (exclusive lock until :meth:`close`).

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> with StateStore(f"{d}/agg.state", kind="aggregator") as s:
    ...     s.load() is None, s.save({"version": 3}) > 0, s.load()["version"]
    (True, True, 3)
    """

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        self.path = Path(path)
        self.kind = kind
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StateError(self.path, "in use by another process (lock held)") from None
        for stray in self.path.parent.glob(f".{self.path.name}.tmp-*"):  # left by a crash mid-write
            with contextlib.suppress(OSError):
                stray.unlink()
        self.saves = 0
        self.bytes_written = 0

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when there is none yet; :class:`StateError` when it is damaged."""
        return read_state(self.path, self.kind)

    def resume(self, restore: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
        """Load the saved state and hand it to `restore`; returns it (None when there is none yet). A damaged
        state, or one `restore` refuses (`ValueError`, `KeyError`, `TypeError`), is a :class:`StateError`,
        and the store is closed then (the lock released), so a failed start leaves nothing held."""
        try:
            state = self.load()
            if state is not None:
                restore(state)
            return state
        except StateError:
            self.close()
            raise
        except (ValueError, KeyError, TypeError) as e:
            self.close()
            raise StateError(self.path, f"cannot resume from it: {e}") from None

    def save(self, state: Mapping[str, Any]) -> int:
        """Write `state` (its "kind" is set to the store's) atomically; returns the bytes written."""
        data = dumps({**state, "kind": self.kind})
        atomic_write(self.path, data)
        self.saves += 1
        self.bytes_written += len(data)
        return len(data)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
