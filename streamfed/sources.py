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
import json
import math
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

__all__ = [
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


class SkipReason:
    """Why a sample was skipped (stable strings: they are metric labels)."""

    MALFORMED = "malformed"  # not JSON / not an object / missing id
    MISSING_FEATURE = "missing_feature"
    NON_NUMERIC = "non_numeric"
    NON_FINITE = "non_finite"
    OUT_OF_ORDER = "out_of_order"  # timestamp older than the last accepted reading's
    UNKNOWN_READING = "unknown_reading"  # a label for a reading we never saw (or already labelled)
    LABEL_EVICTED = "label_evicted"  # waited too long for its label: the join buffer was full
    DUPLICATE = "duplicate"  # a reading id seen before


@dataclass(frozen=True, slots=True)
class Reading:
    """One sample's inputs (float64, schema order), its id and time; `y` when the label came with it."""

    id: str
    x: np.ndarray
    ts: float
    y: float | None = None


@dataclass(frozen=True, slots=True)
class Label:
    """A label arriving after its reading."""

    id: str
    y: float


@dataclass(frozen=True, slots=True)
class Skip:
    """A rejected input, with the reason and a human-readable detail for the log."""

    reason: str
    detail: str = ""


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return None
    try:
        return float(v)
    except ValueError:
        return None


class ReadingParser:
    """Parses sensor messages against a fixed feature schema.

    Accepted JSON objects: `{"id": "r1", "ts": 1700000000.0, "x": {"temp": 3.2, ...}, "y": 0.4}` (`x` may
    also be a list in schema order; `y` and `ts` are optional), or a delayed label
    `{"label_for": "r1", "y": 0.4}`.

    >>> p = ReadingParser(["a", "b"])
    >>> p.parse(b'{"id": "r1", "x": {"b": 2, "a": 1}}').x.tolist()
    [1.0, 2.0]
    >>> p.parse(b'{"id": "r2", "x": {"a": "high", "b": 1}}').reason
    'non_numeric'
    >>> p.parse(b'{"label_for": "r1", "y": 0.5}')
    Label(id='r1', y=0.5)
    """

    def __init__(self, features: Sequence[str], check_order: bool = True) -> None:
        self.features = tuple(features)
        self.check_order = check_order
        self.last_ts = -math.inf
        self._seq = 0

    def parse(self, payload: bytes | str | Mapping[str, Any]) -> Reading | Label | Skip:
        if isinstance(payload, Mapping):
            obj: Any = payload
        else:
            try:
                obj = json.loads(payload)
            except (ValueError, UnicodeDecodeError) as exc:
                return Skip(SkipReason.MALFORMED, f"not JSON: {exc}")
        if not isinstance(obj, Mapping):
            return Skip(SkipReason.MALFORMED, "not a JSON object")
        if "label_for" in obj:
            y = _number(obj.get("y"))
            if y is None:
                return Skip(SkipReason.NON_NUMERIC, "label is not a number")
            if not math.isfinite(y):
                return Skip(SkipReason.NON_FINITE, "label is not finite")
            return Label(str(obj["label_for"]), y)
        return self.reading(obj.get("x"), obj.get("y"), obj.get("id"), obj.get("ts"))

    def reading(self, x: Any, y: Any = None, rid: Any = None, ts: Any = None) -> Reading | Skip:
        """A `Reading` from inputs given as a mapping (by name) or a sequence (schema order)."""
        if isinstance(x, Mapping):
            missing = [f for f in self.features if f not in x]
            if missing:
                return Skip(SkipReason.MISSING_FEATURE, f"missing {missing}")
            raw = [x[f] for f in self.features]
        elif isinstance(x, list | tuple | np.ndarray):
            if len(x) != len(self.features):
                return Skip(SkipReason.MISSING_FEATURE, f"{len(x)} values for {len(self.features)} features")
            raw = list(x)
        else:
            return Skip(SkipReason.MALFORMED, "no inputs 'x'")
        vals = [_number(v) for v in raw]
        if any(v is None for v in vals):
            bad = [f for f, v in zip(self.features, vals, strict=True) if v is None]
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
        if self.check_order and ts is not None:
            if t < self.last_ts:
                return Skip(SkipReason.OUT_OF_ORDER, f"timestamp {t} < last {self.last_ts}")
            self.last_ts = t
        self._seq += 1
        return Reading(str(rid) if rid is not None else f"r{self._seq}", arr, t, label)


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
    """Yield items at `rate_hz` (None or 0: as fast as possible, still yielding to the event loop)."""
    period = 1.0 / rate_hz if rate_hz else 0.0
    loop = asyncio.get_running_loop()
    next_t = loop.time()
    for item in items:
        if period:
            delay = next_t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            next_t += period
        else:
            await asyncio.sleep(0)
        yield item


def array_source(
    X: np.ndarray, y: np.ndarray, rate_hz: float | None = None, prefix: str = "s"
) -> AsyncIterator[Reading]:
    """In-memory arrays (e.g. a `streamfed.datasets` stream) as labelled readings."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)

    def gen() -> Iterator[Reading]:
        for i in range(len(y)):
            yield Reading(f"{prefix}{i}", X[i], float(i), float(y[i]))

    return paced(gen(), rate_hz)


def _open_text(path: Path) -> TextIO:
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")  # noqa: SIM115 - closed by the generator


def csv_source(path: str | Path, target: str, features: Sequence[str], rate_hz: float | None = None,
               id_column: str | None = None) -> AsyncIterator[Reading | Skip]:
    """Replay a CSV (optionally .gz) at `rate_hz`; bad rows come out as `Skip`."""
    parser = ReadingParser(features, check_order=False)

    def gen() -> Iterator[Reading | Skip]:
        with _open_text(Path(path)) as fh:
            for i, row in enumerate(csv.DictReader(fh)):
                if any(f not in row for f in (*features, target)):
                    yield Skip(SkipReason.MISSING_FEATURE, f"row {i}: missing column")
                    continue
                x = {f: row[f] for f in features}
                rid = row.get(id_column) if id_column else f"row{i}"
                yield parser.reading(x, row[target], rid, None)

    return paced(gen(), rate_hz)


async def jsonl_source(stream: TextIO | None = None, features: Sequence[str] = (),
                       parser: ReadingParser | None = None) -> AsyncIterator[Reading | Label | Skip]:
    """JSON lines (default: standard input), each a reading or a delayed label (see ReadingParser)."""
    parser = parser or ReadingParser(features)
    stream = stream or sys.stdin
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, stream.readline)
        if not line:
            return
        if line.strip():
            yield parser.parse(line)


def river_source(dataset: Iterable[tuple[Mapping[str, Any], Any]], rate_hz: float | None = None,
                 features: Sequence[str] | None = None, n: int | None = None) -> AsyncIterator[Reading | Skip]:
    """Any River dataset (an iterable of `(x: dict, y)`); features default to the first x's sorted keys."""

    def gen() -> Iterator[Reading | Skip]:
        parser: ReadingParser | None = ReadingParser(features, check_order=False) if features else None
        for i, (x, y) in enumerate(dataset):
            if n is not None and i >= n:
                return
            if parser is None:
                parser = ReadingParser(sorted(x, key=str), check_order=False)
            yield parser.reading(x, y, f"r{i}")

    return paced(gen(), rate_hz)
