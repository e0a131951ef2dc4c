"""Sample sources for agents: sensor JSON, CSV replay, JSON lines, River datasets, in-memory arrays.

A source yields :class:`Reading` (inputs, maybe with their label) and :class:`Label` (a label that
arrives later and names its reading: delayed labels). Parsing is strict and never raises on bad data:
it returns a :class:`Skip` with a reason, which the agent counts (`skipped samples by reason`) and
does not learn from. A file that cannot be used at all (missing, undecodable, empty, header only, no such
target or feature column) is refused when the source is made, before anything runs: :class:`SourceError`, a
`ValueError` with a one-line message that starts with the path.

:class:`SkipWatch` logs the first skips of each reason and warns when more than a given share of the
recent items were skipped.

:class:`ReadingParser` turns a raw mapping into a `Reading` with a fixed feature schema — plain numbers, or
declared input columns (booleans, categories, timestamps: :mod:`streamfed.fleet.columns`) encoded into the
fleet's numeric vector, so every source (sensor JSON, CSV, JSON lines, River) lays `x` out the same way;
:class:`LabelJoin` keeps readings waiting for their label (bounded: the oldest is dropped and counted
when full).
"""

from __future__ import annotations

import asyncio
import codecs
import copy
import csv
import difflib
import gzip
import io
import itertools
import json
import logging
import math
import sys
import time
import zlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

import numpy as np

from streamfed.core.durable import durable
from streamfed.fleet.columns import ColumnSpec, Invalid
from streamfed.fleet.columns import to_number as _number
from streamfed.wire.schema import MAX_META_STR

__all__ = [
    "FUTURE_TOLERANCE",
    "MAX_ABS",
    "MAX_ID_LEN",
    "NA_VALUES",
    "MAX_MESSAGE_BYTES",
    "Label",
    "LabelJoin",
    "Reading",
    "ReadingParser",
    "Skip",
    "columns_hint",
    "open_binary",
    "parse_na_values",
    "unknown_columns",
    "SkipReason",
    "SkipWatch",
    "SourceError",
    "array_source",
    "check_encoding",
    "csv_source",
    "jsonl_source",
    "paced",
    "river_source",
]

# A reading id is echoed whole in its prediction's metadata (bounded by MAX_META_STR) and kept while it
# waits for its label: bounding it bounds the join buffer's memory too.
MAX_ID_LEN = MAX_META_STR

# The largest sensor message (or JSON line) parsed. A reading is a few numbers, an id and a timestamp — a
# few hundred bytes; declared columns with long category names stay far below this. Larger ones are
# refused unparsed (`malformed`), so one message cannot make the parser (json.loads) or a queue of waiting
# messages hold megabytes: the production broker lets 16 MiB through.
MAX_MESSAGE_BYTES = 64 * 1024

log = logging.getLogger(__name__)

# CSV cells that mean "no value" by default (as streamfed.evaluation.datasets.NA_VALUES; repeated to keep this module
# light); `--na-values` / `[inputs] na_values` replace them. An empty cell always means "no value".
NA_VALUES = frozenset({"", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", "?", "-"})

# The largest magnitude a reading's number may have by default: every square and every sum of squares of up
# to 1e8 such numbers stays finite in float64, so no standardiser's or learner's statistics can overflow.
MAX_ABS = 1e150


FUTURE_TOLERANCE = 300.0  # seconds a reading's timestamp may be ahead of this clock (clock skew)


class SkipReason:
    """Why a sample was skipped (stable strings: they are metric labels).

    >>> SkipReason.NON_FINITE, SkipReason.DUPLICATE
    ('non_finite', 'duplicate')
    """

    MALFORMED = "malformed"  # not JSON / not an object / no inputs / bad or missing id / bad timestamp
    MISSING_FEATURE = "missing_feature"  # a feature absent, null, NA, or a list of the wrong length
    NON_NUMERIC = "non_numeric"
    NON_FINITE = "non_finite"  # NaN, ±inf, or a number too large for a float64
    TOO_LARGE = "too_large"  # finite, but beyond ±max_abs (default MAX_ABS = 1e150: its square could overflow)
    OUT_OF_ORDER = "out_of_order"  # timestamp older than the last accepted reading's
    FUTURE_TIMESTAMP = "future_timestamp"  # timestamp beyond now + tolerance (never stored: see ReadingParser)
    UNKNOWN_READING = "unknown_reading"  # a label for a reading we never saw (or already labelled)
    LABEL_EVICTED = "label_evicted"  # waited too long for its label: the join buffer was full
    DUPLICATE = "duplicate"  # a reading id seen before (QoS 1 delivers at least once)
    UNLEARNABLE = "unlearnable"  # well-formed, but the learner refused it (e.g. a target whose square overflows)
    # declared input columns (streamfed.fleet.columns) that refuse a value
    BAD_BOOLEAN = "bad_boolean"  # a boolean column's value is not true/false, yes/no, on/off or 1/0
    BAD_TIMESTAMP = "bad_timestamp"  # a timestamp column's value is neither ISO 8601 nor epoch seconds
    UNKNOWN_LEVEL = "unknown_level"  # a one-hot column without an "other" slot got a level it does not declare


@durable("fleet.Reading")
@dataclass(frozen=True, slots=True)
class Reading:
    """One sample's inputs (float64, schema order), its id and time; `y` when the label came with it.

    >>> Reading("r1", np.array([1.0, 2.0]), 0.0).y is None
    True
    """

    id: str
    x: np.ndarray
    ts: float
    y: float | None = None


@durable("fleet.Label")
@dataclass(frozen=True, slots=True)
class Label:
    """A label arriving after its reading.

    >>> Label("r1", 0.5)
    Label(id='r1', y=0.5)
    """

    id: str
    y: float


@dataclass(frozen=True, slots=True)
class Skip:
    """A rejected input, with the reason and a human-readable detail for the log.

    >>> Skip(SkipReason.MALFORMED, "not JSON").reason
    'malformed'
    """

    reason: str
    detail: str = ""


_ID_INT_LIMIT = 10**MAX_ID_LEN
_MISSING = object()  # a feature with no value (absent, JSON null, an NA cell)


def _id(v: Any) -> str | None:
    """A reading id as text: a non-empty string or an integer (not a boolean), at most MAX_ID_LEN long."""
    if isinstance(v, bool) or not isinstance(v, str | int):
        return None
    if isinstance(v, int) and abs(v) >= _ID_INT_LIMIT:  # str() of a huge int is slow (or refused)
        return None
    text = str(v)
    return text if 0 < len(text) <= MAX_ID_LEN else None


@durable("fleet.ReadingParser")
class ReadingParser:
    """Parses sensor messages against a fixed feature schema.

    Accepted JSON objects: `{"id": "r1", "ts": 1700000000.0, "x": {"temp": 3.2, ...}, "y": 0.4}` (`x` may
    also be a list in schema order; `ts` is optional, and so is `y`), or a delayed label
    `{"label_for": "r1", "y": 0.4}`. Ids are strings or integers (`5` and `"5"` are the same id), at
    most :data:`MAX_ID_LEN` characters. A reading without `y` must have an id (else its label could
    never name it); a labelled one may omit it and gets `r<n>`.

    A reading id seen among the last `dedup_window` accepted ones is skipped as a duplicate: MQTT QoS 1
    delivers at least once, and a redelivered reading must not be predicted or learned twice.

    With `columns` (a :class:`~streamfed.fleet.columns.ColumnSpec`) the schema is its input columns: `x` names
    them (or lists their raw values in that order), and each value is encoded by its column's kind; a value
    the kind refuses is a skip with its reason (`bad_boolean`, `bad_timestamp`, `unknown_level`, ...).

    >>> p = ReadingParser(["a", "b"])
    >>> p.parse(b'{"id": "r1", "x": {"b": 2, "a": 1}}').x.tolist()
    [1.0, 2.0]
    >>> p.parse(b'{"id": "r2", "x": {"a": "high", "b": 1}}').reason
    'non_numeric'
    >>> p.parse(b'{"id": "r1", "x": [1, 2]}').reason
    'duplicate'
    >>> p.parse(b'{"label_for": "r1", "y": 0.5}')
    Label(id='r1', y=0.5)
    >>> q = ReadingParser(columns=ColumnSpec.parse("site:category=a|b,rain:boolean"))
    >>> q.parse(b'{"id": 1, "x": {"site": "b", "rain": "yes"}}').x.tolist()
    [0.0, 1.0, 1.0]
    >>> q.parse(b'{"id": 2, "x": {"site": "c", "rain": "no"}}').reason
    'unknown_level'
    """

    def __init__(self, features: Sequence[str] = (), check_order: bool = True, dedup_window: int = 10_000, *,
                 columns: ColumnSpec | None = None, future_tolerance: float = FUTURE_TOLERANCE,
                 max_abs: float = MAX_ABS) -> None:
        if columns is not None:
            if features and tuple(features) != columns.names:
                raise ValueError(f"features {list(features)} are not the declared input columns {list(columns.names)}")
            features = columns.names
        self.features = tuple(features)
        self.columns = columns
        if not self.features:
            raise ValueError("a reading schema needs at least one feature")
        if len(set(self.features)) != len(self.features):
            raise ValueError(f"features are repeated: {list(self.features)}")
        if dedup_window < 0:
            raise ValueError(f"dedup_window must be >= 0, got {dedup_window}")
        self.check_order = check_order
        if not future_tolerance >= 0:
            raise ValueError(f"future_tolerance must be >= 0, got {future_tolerance!r}")
        self.future_tolerance = float(future_tolerance)
        if not max_abs > 0:
            raise ValueError(f"max_abs must be > 0, got {max_abs!r}")
        self.max_abs = float(max_abs)
        self.last_ts = -math.inf
        self.dedup_window = dedup_window
        self._recent: deque[str] = deque()
        self._recent_set: set[str] = set()
        self._seq = 0

    def parse(self, payload: bytes | bytearray | memoryview | str | Mapping[str, Any]) -> Reading | Label | Skip:
        """One sensor message: a `Reading`, a `Label`, or a `Skip` saying why not (never raises)."""
        if isinstance(payload, Mapping):
            obj: Any = payload
        elif len(payload) > MAX_MESSAGE_BYTES:  # str: characters, at least as many bytes
            return Skip(SkipReason.MALFORMED, f"a message of {len(payload)} bytes (at most {MAX_MESSAGE_BYTES})")
        else:
            try:
                obj = json.loads(bytes(payload) if isinstance(payload, bytearray | memoryview) else payload)
            except (ValueError, TypeError) as exc:  # includes UnicodeDecodeError
                return Skip(SkipReason.MALFORMED, f"not JSON: {exc}")
            except RecursionError:  # deeply nested arrays: json recurses per level
                return Skip(SkipReason.MALFORMED, "not JSON: nested too deeply")
        if not isinstance(obj, Mapping):
            return Skip(SkipReason.MALFORMED, "not a JSON object")
        if "label_for" in obj:
            rid = _id(obj["label_for"])
            if rid is None:
                return Skip(SkipReason.MALFORMED, "label_for is not a valid id")
            if obj.get("y") is None:
                return Skip(SkipReason.MALFORMED, "a label without 'y'")
            y = _number(obj["y"])
            if y is None:
                return Skip(SkipReason.NON_NUMERIC, "label is not a number")
            if not math.isfinite(y):
                return Skip(SkipReason.NON_FINITE, "label is not finite")
            if abs(y) > self.max_abs:
                return Skip(SkipReason.TOO_LARGE, f"label {y:g} is beyond ±{self.max_abs:g}")
            return Label(rid, y)
        return self.reading(obj.get("x"), obj.get("y"), obj.get("id"), obj.get("ts"))

    def reading(self, x: Any, y: Any = None, rid: Any = None, ts: Any = None) -> Reading | Skip:
        """A `Reading` from inputs given as a mapping (by name) or a sequence (schema order)."""
        n = len(self.features)
        if self.columns is None and isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "iuf":
            if x.shape[0] != n:
                return Skip(SkipReason.MISSING_FEATURE, f"{x.shape[0]} values for {n} features")
            arr = x.astype(np.float64)  # a copy: the caller may reuse its buffer
        else:
            if isinstance(x, Mapping):
                raw = [x.get(f, _MISSING) for f in self.features]
            elif isinstance(x, list | tuple) or (isinstance(x, np.ndarray) and x.ndim == 1):
                if len(x) != n:
                    return Skip(SkipReason.MISSING_FEATURE, f"{len(x)} values for {n} features")
                raw = list(x)
            else:
                return Skip(SkipReason.MALFORMED, "no inputs 'x'")
            absent = [f for f, v in zip(self.features, raw, strict=True) if v is _MISSING or v is None]
            if absent:
                return Skip(SkipReason.MISSING_FEATURE, f"missing {absent}")
            if self.columns is not None:
                encoded = self.columns.encode(raw)
                if isinstance(encoded, Invalid):
                    return Skip(encoded.reason, encoded.detail)
                arr = encoded
            else:
                vals = [_number(v) for v in raw]
                bad = [f for f, v in zip(self.features, vals, strict=True) if v is None]
                if bad:
                    return Skip(SkipReason.NON_NUMERIC, f"not numeric: {bad}")
                arr = np.array(vals, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            return Skip(SkipReason.NON_FINITE, "an input is NaN or infinite")
        if np.abs(arr).max(initial=0.0) > self.max_abs:
            return Skip(SkipReason.TOO_LARGE, f"an input is beyond ±{self.max_abs:g}")
        label = None
        if y is not None:
            label = _number(y)
            if label is None:
                return Skip(SkipReason.NON_NUMERIC, "label is not a number")
            if not math.isfinite(label):
                return Skip(SkipReason.NON_FINITE, "label is not finite")
            if abs(label) > self.max_abs:
                return Skip(SkipReason.TOO_LARGE, f"label {label:g} is beyond ±{self.max_abs:g}")
        t = _number(ts) if ts is not None else time.time()
        if t is None or not math.isfinite(t):
            return Skip(SkipReason.MALFORMED, "bad timestamp")
        if rid is None:
            if label is None:
                return Skip(SkipReason.MALFORMED, "an unlabelled reading needs an 'id' for its label to name")
            key = None
        else:
            key = _id(rid)
            if key is None:
                return Skip(SkipReason.MALFORMED, f"bad id (a string or integer of 1..{MAX_ID_LEN} characters)")
            if key in self._recent_set:
                return Skip(SkipReason.DUPLICATE, f"reading {key!r} seen before")
        if ts is not None and t > time.time() + self.future_tolerance:
            # one clock far ahead (or a unit error: epoch milliseconds) would otherwise become the order mark
            # and make every later reading "out of order" — refused and counted, never stored
            return Skip(SkipReason.FUTURE_TIMESTAMP, f"timestamp {t} is more than {self.future_tolerance:g} s "
                                                     "ahead of this clock (epoch seconds expected)")
        if self.check_order and ts is not None:
            if t < self.last_ts:
                return Skip(SkipReason.OUT_OF_ORDER, f"timestamp {t} < last {self.last_ts}")
            self.last_ts = t
        self._seq += 1
        if key is None:
            key = f"r{self._seq}"  # never remembered: a self-labelled reading is learned at once
        else:
            self._remember(key)
        return Reading(key, arr, t, label)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Agents pickle their parser into their state file (streamfed.fleet.persistence): a file written before
        # a field existed still loads, with that field's default.
        defaults: dict[str, Any] = {"check_order": True, "last_ts": -math.inf, "dedup_window": 10_000, "_seq": 0,
                                    "columns": None, "future_tolerance": FUTURE_TOLERANCE, "max_abs": MAX_ABS}
        self.__dict__.update(defaults | state)
        if self.last_ts > time.time() + self.future_tolerance:
            self.last_ts = -math.inf  # a future mark stored before the check existed would block the stream
        if "_recent" not in state:
            self._recent, self._recent_set = deque(), set()

    def with_schema(self, features: Sequence[str] = (), *, columns: ColumnSpec | None = None) -> ReadingParser:
        """This parser under another schema, keeping its order and duplicate-detection state: a restarted
        agent's parser, restored from its state file, reads with the schema it is restarted with.

        >>> p = ReadingParser(["a"]); _ = p.parse(b'{"id": "r1", "x": [1]}')
        >>> p.with_schema(columns=ColumnSpec.parse("on:boolean")).parse(b'{"id": "r1", "x": ["on"]}').reason
        'duplicate'
        """
        schema = ReadingParser(features, columns=columns, max_abs=self.max_abs)  # checks it
        new = copy.deepcopy(self)  # its own copy of the remembered ids
        new.features, new.columns = schema.features, schema.columns
        return new

    def _remember(self, key: str) -> None:
        if self.dedup_window == 0:
            return
        self._recent.append(key)
        self._recent_set.add(key)
        if len(self._recent) > self.dedup_window:
            self._recent_set.discard(self._recent.popleft())


@durable("fleet.LabelJoin")
class LabelJoin:
    """Readings waiting for their label, bounded: when full the oldest is dropped (and reported).

    >>> j = LabelJoin(capacity=1)
    >>> j.add(Reading("a", np.zeros(1), 0.0))
    >>> j.add(Reading("b", np.zeros(1), 1.0)).id  # 'a' is evicted
    'a'
    >>> j.match(Label("b", 2.0)).id
    'b'
    >>> j.match(Label("b", 2.0)) is None
    True
    """

    def __init__(self, capacity: int = 10_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._waiting: OrderedDict[str, Reading] = OrderedDict()

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, rid: str) -> bool:
        return rid in self._waiting

    def add(self, reading: Reading) -> Reading | None:
        """Keep a reading until its label comes; returns the evicted oldest reading, if any."""
        self._waiting[reading.id] = reading
        if len(self._waiting) > self.capacity:
            return self._waiting.popitem(last=False)[1]
        return None

    def match(self, label: Label) -> Reading | None:
        """The reading a label names (removed from the buffer), or None if unknown."""
        return self._waiting.pop(label.id, None)


class SkipWatch:
    """Says in the log what an agent skips: the first few skips of each reason (and every 1000th) with their
    detail, and a warning when more than `max_share` of the last `window` items were skipped.

    `observe(item)` takes every item a source or the sensor topic delivers (a `Skip` or anything else);
    the warning comes once per crossing, and an info line when the share is back at or below `max_share`.
    A stream shorter than `window` is judged on what it had when it ends (`close()`). `max_share=None`
    (or 1) turns the warning off. `above` says whether the recent share is over the limit now; the skips
    themselves are counted, by reason, by the agent (`streamfed_agent_samples_skipped_total`).

    >>> w = SkipWatch(max_share=0.5, window=4, log=logging.getLogger("doctest.quiet"))
    >>> for item in (None, Skip("malformed"), Skip("malformed"), Skip("non_numeric")):
    ...     w.observe(item)
    >>> w.above, w.share, w.skipped, w.seen
    (True, 0.75, 3, 4)
    """

    FIRST_LOGGED = 3  # skips of each reason logged with their detail; then every 1000th

    def __init__(self, max_share: float | None = 0.5, window: int = 100, name: str = "agent",
                 log: logging.Logger | None = None) -> None:
        if max_share is not None and not (0.0 <= max_share <= 1.0):  # also NaN
            raise ValueError(f"max_share must be between 0 and 1, got {max_share}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.max_share = max_share
        self.window = int(window)
        self.name = name
        self.log = log if log is not None else logging.getLogger(__name__)
        self._ring: list[str | None] = [None] * self.window  # the reason of each recent item (None: not skipped)
        self._pos = 0
        self._recent: dict[str, int] = {}  # reason -> skips among the recent items
        self._count = 0  # skips among the recent items
        self.seen = 0
        self.skipped = 0
        self.by_reason: dict[str, int] = {}
        self.last: Skip | None = None
        self.above = False

    @property
    def share(self) -> float:
        """The share of skips among the last `window` items (or all of them, fewer)."""
        n = min(self.seen, self.window)
        return self._count / n if n else 0.0

    def observe(self, item: Any) -> None:
        old = self._ring[self._pos]
        if old is not None:
            self._count -= 1
            self._recent[old] -= 1
        if isinstance(item, Skip):
            reason = item.reason
            self._ring[self._pos] = reason
            self._count += 1
            self._recent[reason] = self._recent.get(reason, 0) + 1
            self.skipped += 1
            k = self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
            self.last = item
            if k <= self.FIRST_LOGGED or k % 1000 == 0:
                self.log.warning("%s: item skipped (%s, %d so far)%s", self.name, reason, k,
                                 f": {item.detail[:200]}" if item.detail else "")
        else:
            self._ring[self._pos] = None
        self._pos = (self._pos + 1) % self.window
        self.seen += 1
        if self.seen >= self.window:
            self._judge()

    def close(self) -> None:
        """The stream ended: judge a stream shorter than the window on what it had."""
        if 0 < self.seen < self.window:
            self._judge()

    def _judge(self) -> None:
        if self.max_share is None:
            return
        n = min(self.seen, self.window)
        over = self._count > self.max_share * n
        if over and not self.above:
            why = ", ".join(f"{r} {k}" for r, k in sorted(self._recent.items(), key=lambda rk: -rk[1]) if k)
            eg = f"; last: {self.last.detail[:200]}" if self.last is not None and self.last.detail else ""
            self.log.warning("%s: %d of the last %d items skipped (%.0f%% > max %.0f%%): %s%s", self.name,
                             self._count, n, 100 * self._count / n, 100 * self.max_share, why, eg)
        elif self.above and not over:
            self.log.info("%s: skips back to %d of the last %d items (max %.0f%%)", self.name, self._count, n,
                          100 * self.max_share)
        self.above = over


async def paced(items: Iterable[Any], rate_hz: float | None) -> AsyncIterator[Any]:
    """Yield items at `rate_hz` (None, 0 or less: as fast as possible); always yields to the event loop
    between items, also when catching up after a slow consumer, so other tasks are never starved."""
    period = 1.0 / rate_hz if rate_hz is not None and rate_hz > 0 else 0.0
    loop = asyncio.get_running_loop()
    next_t = loop.time()
    for item in items:
        delay = next_t - loop.time() if period else 0.0
        await asyncio.sleep(max(delay, 0.0))
        next_t += period
        yield item


def array_source(
    X: np.ndarray, y: np.ndarray, rate_hz: float | None = None, prefix: str = "s"
) -> AsyncIterator[Reading]:
    """In-memory arrays (e.g. a `streamfed.evaluation.datasets` stream) as labelled readings."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)

    def gen() -> Iterator[Reading]:
        for i in range(len(y)):
            yield Reading(f"{prefix}{i}", X[i], float(i), float(y[i]))

    return paced(gen(), rate_hz)


class SourceError(ValueError):
    """A source that cannot be used at all, found when it is made (before an agent connects): a one-line
    message that starts with the file's path.

    >>> str(SourceError("d.csv: empty file, expected a header row and data rows"))
    'd.csv: empty file, expected a header row and data rows'
    """


# The checks and messages below are those of the replay's CSV reader
# (streamfed.evaluation.datasets.csv_fleet), which cannot be imported here: its package loads numba, which
# an agent running ahead-of-time-built kernels must not. tests/test_bad_inputs.py compares the messages.
_MAX_LISTED = 40  # columns named in an error message before "... (N more)"
_READ_ERRORS = (OSError, EOFError, zlib.error)  # gzip.BadGzipFile is an OSError


def columns_hint(columns: Sequence[str]) -> str:
    """The columns that exist, for an error message (at most 40 named).

    >>> columns_hint(["a", "b"])
    "columns are: 'a', 'b'"
    """
    shown = ", ".join(repr(c) for c in columns[:_MAX_LISTED])
    more = len(columns) - _MAX_LISTED
    return f"columns are: {shown}" + (f" ... ({more} more)" if more > 0 else "")


def unknown_columns(where: str, what: str, names: Sequence[str], columns: Sequence[str]) -> SourceError:
    """The error for column `names` not among `columns`: a close match suggested, the existing ones listed."""
    hints = []
    for name in names:
        close = difflib.get_close_matches(name, columns, n=1) or [c for c in columns if c.lower() == name.lower()]
        if close:
            hints.append(f"{close[0]!r}" + (f" for {name!r}" if len(names) > 1 else ""))
    did = f" (did you mean {', '.join(hints)}?)" if hints else ""
    label = ", ".join(repr(n) for n in names)
    return SourceError(f"{where}: {what} {label} not found{did}; {columns_hint(columns)}")


def parse_na_values(text: str) -> frozenset[str]:
    """`--na-values` text as the set of missing-value markers: comma-separated cells (surrounding spaces
    dropped); the empty cell is always one, so `''` means "only empty cells are missing".

    >>> sorted(parse_na_values("NA, -")), sorted(parse_na_values(""))
    (['', '-', 'NA'], [''])
    """
    return frozenset({"", *(v.strip() for v in text.split(","))})


def check_encoding(encoding: str, where: str = "") -> str:
    """The codec name of `encoding` (UTF-8 as `utf-8-sig`: a byte-order mark is dropped), or SourceError.

    >>> check_encoding("UTF8"), check_encoding("latin-1")
    ('utf-8-sig', 'iso8859-1')
    """
    try:
        codec = codecs.lookup(encoding).name
    except (LookupError, TypeError, ValueError):
        raise SourceError(f"{where + ': ' if where else ''}unknown encoding {encoding!r}") from None
    return "utf-8-sig" if codec == "utf-8" else codec


def open_binary(path: Path) -> IO[bytes]:
    """A file's bytes, gunzipped when its name ends in `.gz`."""
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")  # noqa: SIM115


def _open_text(path: Path, codec: str = "utf-8-sig") -> TextIO:
    # newline="": the csv module's own line handling (quoted fields may contain newlines)
    return io.TextIOWrapper(open_binary(path), encoding=codec, newline="")


def _decode_error(path: Path, codec: str, head: bytes) -> str:
    """Where the file stops being valid `codec`: `line N: reason (bytes xx)`, and what to do."""
    decoder = codecs.getincrementaldecoder(codec)()
    lineno = 0
    where = "undecodable text"
    try:
        with open_binary(path) as f:
            for lineno, line in enumerate(f, 1):  # noqa: B007 (used after the loop)
                decoder.decode(line)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        bad = e.object[e.start:e.end].hex(" ")
        where = f"line {lineno}: {e.reason} (byte{'s' if e.end - e.start > 1 else ''} 0x{bad})"
    except _READ_ERRORS:  # pragma: no cover - it was readable a moment ago
        pass
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) and "16" not in codec:
        return f"{where}; the file starts with a UTF-16 byte-order mark: pass --encoding utf-16"
    return f"{where}; pass the file's encoding, e.g. --encoding latin-1 or cp1252"


@dataclass(frozen=True, slots=True)
class _CsvLayout:
    codec: str
    width: int  # header fields
    cols: tuple[int, ...]  # positions of the features, then the target
    id_col: int | None


def _check_csv(path: Path, target: str, features: Sequence[str], id_column: str | None, encoding: str,
               delimiter: str, what: str = "feature") -> _CsvLayout:
    """Read the whole file once (decoding and CSV syntax), check its header against the columns asked for
    (`what`: "feature", or "input" for declared input columns)."""
    where = str(path)
    if not path.exists():
        raise SourceError(f"{where}: no such file")
    if not path.is_file():
        raise SourceError(f"{where}: not a regular file")
    codec = check_encoding(encoding, where)
    names = [str(f) for f in features]
    if not names:
        raise SourceError(f"{where}: no feature columns given")
    if any(not n.strip() for n in names):
        raise SourceError(f"{where}: a feature column has an empty name: {names}")
    if len(set(names)) != len(names):
        raise SourceError(f"{where}: features are repeated: {names}")
    if not str(target).strip():
        raise SourceError(f"{where}: no target column given")
    if target in names:
        raise SourceError(f"{where}: {what} {'column ' if what == 'input' else ''}{target!r} is also the target")
    try:
        with open_binary(path) as fb:
            head = fb.read(4)
    except _READ_ERRORS as e:
        raise SourceError(f"{where}: cannot read: {e}") from None
    header: list[str] | None = None
    rows = 0
    reader = None
    try:
        with _open_text(path, codec) as text:
            reader = csv.reader(text, delimiter=delimiter)
            for rec in reader:
                if not rec:
                    continue  # blank line
                if header is None:
                    header = [h.strip() for h in rec]
                else:
                    rows += 1
    except UnicodeDecodeError:
        raise SourceError(f"{where}: cannot decode as {encoding}: {_decode_error(path, codec, head)}") from None
    except csv.Error as e:
        line = reader.line_num if reader is not None else 0
        raise SourceError(f"{where}: malformed CSV at line {line}: {e}") from None
    except _READ_ERRORS as e:
        raise SourceError(f"{where}: cannot read: {e}") from None
    if header is None or header == [""]:
        raise SourceError(f"{where}: empty file, expected a header row and data rows")
    if not rows:
        raise SourceError(f"{where}: header only, no data rows; {columns_hint(header)}")
    index: dict[str, int] = {}
    duplicated: set[str] = set()
    for j, h in enumerate(header):
        if h in index:
            duplicated.add(h)
        else:
            index[h] = j

    def check(what: str, wanted: Sequence[str]) -> None:
        unknown = [n for n in wanted if n not in index]
        if unknown:
            raise unknown_columns(where, what, unknown, header)
        dup = [n for n in wanted if n in duplicated]
        if dup:
            raise SourceError(f"{where}: {what} {dup} appear more than once in the header; {columns_hint(header)}")

    check("target column", [target])
    check(f"{what} column(s)", names)
    if id_column is not None:
        check("id column", [id_column])
    return _CsvLayout(codec, len(header), tuple(index[c] for c in (*names, target)),
                      index[id_column] if id_column is not None else None)


def csv_source(path: str | Path, target: str, features: Sequence[str] = (), rate_hz: float | None = None,
               id_column: str | None = None, *, encoding: str = "utf-8", delimiter: str = ",",
               columns: ColumnSpec | None = None, na_values: Iterable[str] = NA_VALUES,
               max_abs: float = MAX_ABS) -> AsyncIterator[Reading | Skip]:
    """Replay a CSV (optionally .gz) at `rate_hz`; bad rows come out as `Skip`.

    The inputs are the numeric `features`, or the declared input `columns` (a
    :class:`~streamfed.fleet.columns.ColumnSpec`: booleans, categories, timestamps encoded by their kind; a
    cell its kind refuses is skipped as `bad_boolean`, `bad_timestamp` or `unknown_level`).

    Checked when called — before anything runs — by reading the whole file once: a missing or unreadable
    file, text that is not `encoding` (UTF-8 by default; a byte-order mark is dropped), malformed CSV,
    an empty or header-only file, a target, feature or `id_column` that is not a header column (or is one
    twice), repeated features or the target among them raise :class:`SourceError` (one line, naming the
    columns there are). Header names are stripped of surrounding spaces; blank lines are ignored.

    Rows: a row with more fields than the header is `malformed` (its values may be misaligned); a short
    row whose features or target are absent, or an NA cell (empty, or one of `na_values`: by default `NA`,
    `null`, `None`, ...; a declared category level is a level, not missing) there, is `missing_feature`;
    other text is `non_numeric`; a number beyond `±max_abs` is `too_large`. Every skip's detail names its
    file line (1-based, the header is line 1: as an editor and the decode errors count). Row ids are
    `row<i>` (0-based data rows) unless `id_column` names a column. Should the file become unreadable
    while it is replayed, a `malformed` skip says so and the stream ends (logged as an error).
    """
    if not str(path).strip():
        raise SourceError("a CSV source needs a file path (csv:PATH)")
    path = Path(path)
    if columns is not None:
        if features and tuple(features) != columns.names:
            raise SourceError(f"{path}: give features or declared input columns, not both")
        features = columns.names
    layout = _check_csv(path, target, features, id_column, encoding, delimiter,
                        "input" if columns is not None else "feature")
    parser = ReadingParser(features, check_order=False, columns=columns, max_abs=max_abs)
    names = [*features, target]
    n = len(features)
    na = frozenset(na_values)
    # a declared category level is a level even when it is also a missing-value marker (`None`, `NA`)
    kept = [c.missing for c in columns.columns] if columns is not None else []
    missing = [*kept, *([None] * (len(names) - len(kept)))]

    def absent_cell(v: str | None, is_missing: Any) -> bool:
        if v is None:
            return True
        return bool(is_missing(v, na)) if is_missing is not None else (not v.strip() or v.strip() in na)

    def gen() -> Iterator[Reading | Skip]:
        i = -1
        reader = None
        try:
            with _open_text(path, layout.codec) as fh:
                reader = csv.reader(fh, delimiter=delimiter)
                for rec in reader:
                    if not rec:
                        continue
                    i += 1
                    if i == 0:
                        continue  # the header (checked already)
                    row, line = i - 1, reader.line_num
                    if len(rec) > layout.width:
                        yield Skip(SkipReason.MALFORMED, f"line {line}: {len(rec)} fields for a header of "
                                                         f"{layout.width}")
                        continue
                    cells = [rec[j] if j < len(rec) else None for j in layout.cols]
                    absent = [c for c, v, m in zip(names, cells, missing, strict=True) if absent_cell(v, m)]
                    if absent:
                        yield Skip(SkipReason.MISSING_FEATURE, f"line {line}: missing {absent}")
                        continue
                    if layout.id_col is None:
                        rid: str | None = f"row{row}"
                    else:
                        rid = (rec[layout.id_col] if layout.id_col < len(rec) else "") or None
                    out = parser.reading(cells[:n], cells[n], rid, None)
                    yield out if isinstance(out, Reading) else Skip(out.reason, f"line {line}: {out.detail}")
        except (UnicodeDecodeError, csv.Error, *_READ_ERRORS) as e:  # the file changed since it was checked
            line = reader.line_num if reader is not None else 0
            log.error("%s: reading stopped at line %d: %s", path, line, e)
            yield Skip(SkipReason.MALFORMED, f"{path}: reading stopped at line {line}: {e}")

    return paced(gen(), rate_hz)


def _read_line(stream: IO[Any], limit: int = MAX_MESSAGE_BYTES) -> tuple[Any, int]:
    """`(line, 0)` for a line of at most `limit` bytes (characters for a text stream) besides its newline;
    `(None, length)` for a longer one, which is read to its end in pieces and thrown away — so one endless
    line (a binary file piped in by mistake) never sits in memory whole. `line` is empty at the end.

    >>> _read_line(io.BytesIO(b"ab\\n"), 4), _read_line(io.BytesIO(b"abcdefgh\\nz"), 4)
    ((b'ab\\n', 0), (None, 9))
    """
    line = stream.readline(limit + 1)
    newline = b"\n" if isinstance(line, bytes | bytearray) else "\n"
    if len(line) <= limit or line.endswith(newline):
        return line, 0
    n = len(line)
    while True:
        rest = stream.readline(limit + 1)
        n += len(rest)
        if not rest or rest.endswith(newline):
            return None, n


async def jsonl_source(stream: IO[Any] | None = None, features: Sequence[str] = (),
                       parser: ReadingParser | None = None, *,
                       encoding: str = "utf-8") -> AsyncIterator[Reading | Label | Skip]:
    """JSON lines (default: standard input, read as bytes), each a reading or a delayed label (see
    ReadingParser). Needs `features` (or a `parser`).

    A binary stream's lines are decoded with `encoding` (UTF-8 by default; a byte-order mark is dropped):
    a line that is not valid text is a `malformed` skip naming the line, and so is a line longer than
    :data:`MAX_MESSAGE_BYTES` (read in pieces and thrown away, never held whole). A text stream that fails to decode
    or read ends with such a skip (logged as an error). Input without a single non-blank line is logged (a
    warning), so an empty pipe is not mistaken for a quiet sensor."""
    parser = parser or ReadingParser(features)
    codec = check_encoding(encoding)
    if stream is None:
        stream = getattr(sys.stdin, "buffer", sys.stdin)
    loop = asyncio.get_running_loop()
    lineno = used = 0
    while True:
        try:
            line, too_long = await loop.run_in_executor(None, _read_line, stream)  # stdin would block the loop
        except (UnicodeDecodeError, OSError, ValueError) as e:
            log.error("JSON lines input: reading stopped at line %d: %s", lineno + 1, e)
            yield Skip(SkipReason.MALFORMED, f"line {lineno + 1}: reading stopped: {e}")
            return
        if line is None:
            lineno += 1
            used += 1
            yield Skip(SkipReason.MALFORMED, f"line {lineno}: {too_long} bytes, longer than {MAX_MESSAGE_BYTES}")
            continue
        if not line:
            break
        lineno += 1
        if isinstance(line, bytes | bytearray):
            try:
                line = bytes(line).decode(codec)
            except UnicodeDecodeError as e:
                used += 1
                yield Skip(SkipReason.MALFORMED, f"line {lineno}: not valid {encoding}: {e.reason} "
                                                 f"(byte 0x{e.object[e.start:e.start + 1].hex()})")
                continue
        line = line.lstrip("\ufeff") if lineno == 1 else line
        if line.strip():
            used += 1
            yield parser.parse(line)
    if not used:
        log.warning("JSON lines input: no input (%d blank lines): nothing to learn", lineno)


def river_source(dataset: Iterable[tuple[Mapping[str, Any], Any]], rate_hz: float | None = None,
                 features: Sequence[str] | None = None, n: int | None = None, *,
                 columns: ColumnSpec | None = None) -> AsyncIterator[Reading | Skip]:
    """Any River dataset (an iterable of `(x: dict, y)`); features default to the first x's sorted keys.
    With declared input `columns`, those are read and encoded (River's datetimes and text included)."""

    def gen() -> Iterator[Reading | Skip]:
        parser: ReadingParser | None = None
        if features or columns is not None:
            parser = ReadingParser(features or (), check_order=False, columns=columns)
        for i, (x, y) in enumerate(itertools.islice(dataset, n)):
            if parser is None:
                parser = ReadingParser(sorted(x, key=str), check_order=False)
            yield parser.reading(x, y, f"r{i}")

    return paced(gen(), rate_hz)
