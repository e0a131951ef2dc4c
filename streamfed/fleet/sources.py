"""Sample sources for agents: sensor JSON, CSV replay, JSON lines, River datasets, in-memory arrays.

A source yields :class:`Reading` (inputs, maybe with their label) and :class:`Label` (a label that
arrives later and names its reading: delayed labels). Parsing is strict and never raises on bad data:
it returns a :class:`Skip` with a reason, which the agent counts (`skipped samples by reason`) and
does not learn from.

:class:`ReadingParser` turns a raw mapping into a `Reading` with a fixed feature schema;
:class:`LabelJoin` keeps readings waiting for their label (bounded: the oldest is dropped and counted
when full).
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import io
import itertools
import json
import math
import numbers
import sys
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from streamfed.fleet.config import MAX_META_STR

__all__ = [
    "MAX_ID_LEN",
    "Label",
    "LabelJoin",
    "Reading",
    "ReadingParser",
    "Skip",
    "SkipReason",
    "array_source",
    "csv_source",
    "jsonl_source",
    "paced",
    "river_source",
]

# A reading id is echoed whole in its prediction's metadata (bounded by MAX_META_STR) and kept while it
# waits for its label: bounding it bounds the join buffer's memory too.
MAX_ID_LEN = MAX_META_STR

# CSV cells that mean "no value" (as in streamfed.evaluation.datasets.NA_VALUES; repeated to keep this module light).
_CSV_NA = frozenset({"", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", "?", "-"})


class SkipReason:
    """Why a sample was skipped (stable strings: they are metric labels).

    >>> SkipReason.NON_FINITE, SkipReason.DUPLICATE
    ('non_finite', 'duplicate')
    """

    MALFORMED = "malformed"  # not JSON / not an object / no inputs / bad or missing id / bad timestamp
    MISSING_FEATURE = "missing_feature"  # a feature absent, null, NA, or a list of the wrong length
    NON_NUMERIC = "non_numeric"
    NON_FINITE = "non_finite"  # NaN, ±inf, or a number too large for a float64
    OUT_OF_ORDER = "out_of_order"  # timestamp older than the last accepted reading's
    UNKNOWN_READING = "unknown_reading"  # a label for a reading we never saw (or already labelled)
    LABEL_EVICTED = "label_evicted"  # waited too long for its label: the join buffer was full
    DUPLICATE = "duplicate"  # a reading id seen before (QoS 1 delivers at least once)
    UNLEARNABLE = "unlearnable"  # well-formed, but the learner refused it (e.g. a target whose square overflows)


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


def _number(v: Any) -> float | None:
    """`v` as a float (maybe non-finite), or None when it is not a number.

    Real numbers of any kind (Python, NumPy, Fraction) and numeric strings count; booleans do not.
    An integer too large for a float64 becomes ±inf, so it is rejected as non-finite, not raised.
    """
    if isinstance(v, bool | np.bool_) or not isinstance(v, numbers.Real | str):
        return None
    try:
        return float(v)
    except ValueError:
        return None
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _id(v: Any) -> str | None:
    """A reading id as text: a non-empty string or an integer (not a boolean), at most MAX_ID_LEN long."""
    if isinstance(v, bool) or not isinstance(v, str | int):
        return None
    if isinstance(v, int) and abs(v) >= _ID_INT_LIMIT:  # str() of a huge int is slow (or refused)
        return None
    text = str(v)
    return text if 0 < len(text) <= MAX_ID_LEN else None


class ReadingParser:
    """Parses sensor messages against a fixed feature schema.

    Accepted JSON objects: `{"id": "r1", "ts": 1700000000.0, "x": {"temp": 3.2, ...}, "y": 0.4}` (`x` may
    also be a list in schema order; `ts` is optional, and so is `y`), or a delayed label
    `{"label_for": "r1", "y": 0.4}`. Ids are strings or integers (`5` and `"5"` are the same id), at
    most :data:`MAX_ID_LEN` characters. A reading without `y` must have an id (else its label could
    never name it); a labelled one may omit it and gets `r<n>`.

    A reading id seen among the last `dedup_window` accepted ones is skipped as a duplicate: MQTT QoS 1
    delivers at least once, and a redelivered reading must not be predicted or learned twice.

    >>> p = ReadingParser(["a", "b"])
    >>> p.parse(b'{"id": "r1", "x": {"b": 2, "a": 1}}').x.tolist()
    [1.0, 2.0]
    >>> p.parse(b'{"id": "r2", "x": {"a": "high", "b": 1}}').reason
    'non_numeric'
    >>> p.parse(b'{"id": "r1", "x": [1, 2]}').reason
    'duplicate'
    >>> p.parse(b'{"label_for": "r1", "y": 0.5}')
    Label(id='r1', y=0.5)
    """

    def __init__(self, features: Sequence[str], check_order: bool = True, dedup_window: int = 10_000) -> None:
        self.features = tuple(features)
        if not self.features:
            raise ValueError("a reading schema needs at least one feature")
        if len(set(self.features)) != len(self.features):
            raise ValueError(f"features are repeated: {list(self.features)}")
        if dedup_window < 0:
            raise ValueError(f"dedup_window must be >= 0, got {dedup_window}")
        self.check_order = check_order
        self.last_ts = -math.inf
        self.dedup_window = dedup_window
        self._recent: deque[str] = deque()
        self._recent_set: set[str] = set()
        self._seq = 0

    def parse(self, payload: bytes | bytearray | memoryview | str | Mapping[str, Any]) -> Reading | Label | Skip:
        """One sensor message: a `Reading`, a `Label`, or a `Skip` saying why not (never raises)."""
        if isinstance(payload, Mapping):
            obj: Any = payload
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
            return Label(rid, y)
        return self.reading(obj.get("x"), obj.get("y"), obj.get("id"), obj.get("ts"))

    def reading(self, x: Any, y: Any = None, rid: Any = None, ts: Any = None) -> Reading | Skip:
        """A `Reading` from inputs given as a mapping (by name) or a sequence (schema order)."""
        n = len(self.features)
        if isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "iuf":
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
            vals = [_number(v) for v in raw]
            bad = [f for f, v in zip(self.features, vals, strict=True) if v is None]
            if bad:
                return Skip(SkipReason.NON_NUMERIC, f"not numeric: {bad}")
            arr = np.array(vals, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            return Skip(SkipReason.NON_FINITE, "an input is NaN or infinite")
        label = None
        if y is not None:
            label = _number(y)
            if label is None:
                return Skip(SkipReason.NON_NUMERIC, "label is not a number")
            if not math.isfinite(label):
                return Skip(SkipReason.NON_FINITE, "label is not finite")
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
        defaults: dict[str, Any] = {"check_order": True, "last_ts": -math.inf, "dedup_window": 10_000, "_seq": 0}
        self.__dict__.update(defaults | state)
        if "_recent" not in state:
            self._recent, self._recent_set = deque(), set()

    def _remember(self, key: str) -> None:
        if self.dedup_window == 0:
            return
        self._recent.append(key)
        self._recent_set.add(key)
        if len(self._recent) > self.dedup_window:
            self._recent_set.discard(self._recent.popleft())


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


def _open_text(path: Path) -> TextIO:
    # newline="": the csv module's own line handling (quoted fields may contain newlines)
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")  # noqa: SIM115 - closed by the generator


def csv_source(path: str | Path, target: str, features: Sequence[str], rate_hz: float | None = None,
               id_column: str | None = None) -> AsyncIterator[Reading | Skip]:
    """Replay a CSV (optionally .gz) at `rate_hz`; bad rows come out as `Skip`.

    A missing column, a short row or an NA cell (empty, `NA`, `null`, ...) in a feature or the target
    is `missing_feature`; other text is `non_numeric`. Row ids are `row<i>` (0-based data rows) unless
    `id_column` names a column.
    """
    parser = ReadingParser(features, check_order=False)

    def gen() -> Iterator[Reading | Skip]:
        with _open_text(Path(path)) as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                cells = {c: row.get(c) for c in (*features, target)}
                # DictReader fills a short row with None; NA cells are missing values, not text
                absent = [c for c, v in cells.items() if v is None or v.strip() in _CSV_NA]
                if absent:
                    yield Skip(SkipReason.MISSING_FEATURE, f"row {i}: missing {absent}")
                    continue
                rid = (row.get(id_column) or None) if id_column else f"row{i}"
                yield parser.reading({f: cells[f] for f in features}, cells[target], rid, None)

    return paced(gen(), rate_hz)


async def jsonl_source(stream: TextIO | None = None, features: Sequence[str] = (),
                       parser: ReadingParser | None = None) -> AsyncIterator[Reading | Label | Skip]:
    """JSON lines (default: standard input), each a reading or a delayed label (see ReadingParser).
    Needs `features` (or a `parser`)."""
    parser = parser or ReadingParser(features)
    stream = stream or sys.stdin
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, stream.readline)  # stdin would block the event loop
        if not line:
            return
        if line.strip():
            yield parser.parse(line)


def river_source(dataset: Iterable[tuple[Mapping[str, Any], Any]], rate_hz: float | None = None,
                 features: Sequence[str] | None = None, n: int | None = None) -> AsyncIterator[Reading | Skip]:
    """Any River dataset (an iterable of `(x: dict, y)`); features default to the first x's sorted keys."""

    def gen() -> Iterator[Reading | Skip]:
        parser: ReadingParser | None = ReadingParser(features, check_order=False) if features else None
        for i, (x, y) in enumerate(itertools.islice(dataset, n)):
            if parser is None:
                parser = ReadingParser(sorted(x, key=str), check_order=False)
            yield parser.reading(x, y, f"r{i}")

    return paced(gen(), rate_hz)
