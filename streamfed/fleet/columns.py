"""Declared input columns: how a reading's raw values (numbers, booleans, categories, timestamps) become the
fleet's numeric input vector `x`.

A fleet's learners only see `x`, a vector of `fleet.n_inputs` floats, and every agent of a fleet must lay
it out the same way. A :class:`ColumnSpec` is that layout: the input columns in order, each with a *kind*,
and each kind a fixed number of outputs (its *width*):

============ ===================================================================== ===========================
kind         accepted values → numbers                                              width
============ ===================================================================== ===========================
`number`     a number or numeric text (the default kind)                            1
`boolean`    `true/false`, `yes/no`, `on/off`, `1/0` (any case); JSON `true/false`  1 (1.0 or 0.0)
`category`   one-hot over the declared `levels` (+ an "other" slot with `other`)    len(levels) (+1)
`category`   hashed into `buckets` (`buckets = N`; CLI `hash=N`)                    N
`timestamp`  ISO 8601 text, seconds since the epoch, or a `datetime`                4 (6 with `raw`)
============ ===================================================================== ===========================

`timestamp` gives the hour of day and the day of the week on circles, so that 23:00 is next to 00:00 and
Sunday next to Monday: `sin` and `cos` of `2π·h/24` (`h` the hour with its minutes and seconds as a
fraction: 06:30 is 6.5) and of `2π·d/7` (`d` = 0 for Monday … 6 for Sunday), in the order `hour_sin,
hour_cos, weekday_sin, weekday_cos`; `raw = true` adds `h` and `d` themselves.

**Time zones.** Hour and weekday are read on the wall clock of the column's `timezone` (an IANA name such
as `"Europe/Berlin"`, `"UTC"` — the default — or a fixed offset `"+08:00"`): a value with an offset
(`2024-05-06T06:00:00+02:00`, `…Z`) and a number of epoch seconds are moved to that zone first (daylight
saving included); a value without an offset (`2024-05-06 06:00`) is taken as already being that zone's
wall-clock time and is used as written. Named zones need the system's time-zone database (or the `tzdata`
package); a zone that cannot be found is refused when the spec is made.

**Bad values** are never raised: :meth:`Column.encode` returns an :class:`Invalid` with a reason — the
agent's skip reasons (`streamfed.fleet.sources.SkipReason`): `non_numeric`/`non_finite` (number),
`bad_boolean`, `bad_timestamp`, `unknown_level` (a level that is not declared, in a one-hot column without
an "other" slot). A bad *spec* (unknown kind, no levels, a bucket count out of range, options that do not
belong to the kind, an unknown time zone, a column named twice) raises `ValueError` with a one-line message
when it is made.

**What comes from River, and what does not.** The semantics are River's (`river.preprocessing`):

- one-hot is `OneHotEncoder(categories=…)` — categories given up front, one output named `column=level`
  per level; River sends an undeclared level to all zeros, we skip it instead (or, with `other = true`, put
  it in a slot of its own), so that a typo in a sensor's level is counted, not learned as "no category";
- hashing is `FeatureHasher(alternate_sign=False)`: the token `"column=level"`, its signed 32-bit
  MurmurHash3, the bucket `hash mod N` (floor modulo, as River), the value 1 (tests/test_columns.py
  checks the buckets against River's hasher).

What we do not take is River's *learning* of the layout: River's `OneHotEncoder()` grows a new output for
each level it meets, and its `FeatureHasher` draws its MurmurHash seed through NumPy's random state. A
fleet needs one fixed vector layout, declared, on every agent and the aggregator alike (the width is
`n_inputs`, a part of every message's shape), so levels and bucket counts are declared, never learned per
agent, and the hash is MurmurHash3 with seed 0 written out here: stable across processes, machines and
library versions (unlike Python's salted `hash`). Nor do we import `river.preprocessing` on a device: it
loads scikit-learn (about 70 MB more than an agent needs).

>>> spec = ColumnSpec.parse("temp, site:category=north|south|*, rain:boolean, t:timestamp")
>>> spec.width, spec.outputs[1:4]
(9, ('site=north', 'site=south', 'site=<other>'))
>>> np.round(spec.encode(["21.5", "east", "Yes", "2024-05-06T06:00:00Z"]), 3).tolist()
[21.5, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
>>> spec.encode(["21.5", "east", "maybe", "2024-05-06T06:00:00Z"]).reason
'bad_boolean'
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import numbers
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from streamfed.core.durable import durable

__all__ = [
    "BOOLEAN_FALSE",
    "BOOLEAN_TRUE",
    "KINDS",
    "MAX_BUCKETS",
    "Column",
    "ColumnSpec",
    "Invalid",
    "murmur3_32",
    "stable_bucket",
    "suggest_column",
    "to_number",
]

KINDS = ("number", "boolean", "category", "timestamp")
BOOLEAN_TRUE = frozenset({"true", "yes", "on", "1"})
BOOLEAN_FALSE = frozenset({"false", "no", "off", "0"})
MAX_BUCKETS = 65_536  # a larger count is a typo, not a feature vector anyone can learn on
OTHER = "<other>"  # the output name of a one-hot column's "other" slot (`site=<other>`)

# The reasons a value is refused (the same strings as streamfed.fleet.sources.SkipReason: metric labels).
NON_NUMERIC = "non_numeric"
NON_FINITE = "non_finite"
TOO_LARGE = "too_large"  # a finite number beyond the configured magnitude (its square may overflow)
BAD_BOOLEAN = "bad_boolean"
BAD_TIMESTAMP = "bad_timestamp"
UNKNOWN_LEVEL = "unknown_level"

_TAU = 2.0 * math.pi
_SUGGEST_MAX_LEVELS = 12  # a text column with at most this many levels is suggested as one-hot


@dataclass(frozen=True, slots=True)
class Invalid:
    """A value a column refused: the skip reason and a detail for the log.

    >>> Invalid("bad_boolean", "'rain': 'maybe' is not a boolean").reason
    'bad_boolean'
    """

    reason: str
    detail: str


def to_number(v: Any) -> float | None:
    """`v` as a float (maybe non-finite), or None when it is not a number.

    Real numbers of any kind (Python, NumPy, Fraction) and numeric strings count; booleans do not.
    An integer too large for a float64 becomes ±inf, so it is rejected as non-finite, not raised.

    >>> to_number("2.5"), to_number(True), to_number("high"), to_number(10**400)
    (2.5, None, None, inf)
    """
    if isinstance(v, bool | np.bool_) or not isinstance(v, numbers.Real | str):
        return None
    try:
        return float(v)
    except ValueError:
        return None
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 (x86, 32-bit) of `data`, unsigned: the hash River's and scikit-learn's hashers use.

    >>> hex(murmur3_32(b"")), hex(murmur3_32(b"", 1)), hex(murmur3_32(b"hello"))
    ('0x0', '0x514e28b7', '0x248bfa47')
    """
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF

    def mix(k: int) -> int:
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        return (k * c2) & mask

    h = seed & mask
    end = len(data) - len(data) % 4
    for i in range(0, end, 4):
        h ^= mix(int.from_bytes(data[i:i + 4], "little"))
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    if end < len(data):
        h ^= mix(int.from_bytes(data[end:], "little"))
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    return h ^ (h >> 16)


@functools.lru_cache(maxsize=4096)  # a stream repeats its few levels: hash each once
def stable_bucket(token: str, buckets: int) -> int:
    """The bucket of `token` among `buckets`: its signed MurmurHash3 (seed 0, UTF-8) modulo `buckets`, the
    same in every process (River's `FeatureHasher` rule, with the seed fixed).

    >>> stable_bucket("site=north", 16), stable_bucket("site=south", 16)
    (1, 13)
    """
    h = murmur3_32(token.encode("utf-8"))
    return (h - (1 << 32) if h >= 1 << 31 else h) % buckets


def _zone(name: str, where: str) -> dt.tzinfo:
    """A time zone by name: "UTC", a fixed offset "+08:00" / "-0530", or an IANA name."""
    text = name.strip()
    if text.upper() in ("UTC", "Z"):
        return dt.UTC
    if text[:1] in "+-" and text[1:].replace(":", "").isdigit():
        digits = text[1:].replace(":", "")
        if len(digits) in (2, 4):
            hours, minutes = int(digits[:2]), int(digits[2:] or 0)
            if hours < 24 and minutes < 60:
                sign = -1 if text[0] == "-" else 1
                return dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
    try:
        return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"{where}: unknown time zone {name!r} (an IANA name such as 'Europe/Berlin', 'UTC', or an "
                         f"offset such as '+08:00'; without the system's time-zone database install the tzdata "
                         f"package)") from None


def _level(v: Any) -> str | None:
    """A category value as its level text (None: not a scalar, so no level)."""
    if isinstance(v, str):
        return v.strip()
    if isinstance(v, bool | np.bool_):
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):  # 3.0 from a JSON number is the level "3", as the CSV cell "3" is
        f = float(v)
        return str(int(f)) if f.is_integer() else repr(f)
    return None


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


@durable("fleet.Column")
@dataclass(frozen=True)
class Column:
    """One input column: its name, kind and the kind's options (see the module docstring).

    `levels` and `other` (one-hot) or `buckets` (hashing) for a `category`; `timezone` and `raw` for a
    `timestamp`. Options of another kind are refused, so a misplaced key is not silently ignored.

    >>> c = Column("site", "category", levels=("north", "south"), other=True)
    >>> c.width, c.outputs
    (3, ('site=north', 'site=south', 'site=<other>'))
    >>> out = np.zeros(3); c.encode("west", out), out.tolist()
    (None, [0.0, 0.0, 1.0])
    >>> Column("t", "timestamp", timezone="Europe/Berlin").outputs[:2]
    ('t.hour_sin', 't.hour_cos')
    """

    name: str
    kind: str = "number"
    levels: tuple[str, ...] | None = None
    other: bool = False
    buckets: int | None = None
    timezone: str | None = None
    raw: bool = False

    def __post_init__(self) -> None:
        # derived, not options (so not fields: a configuration cannot set them): level → position, the zone
        object.__setattr__(self, "_index", {})
        object.__setattr__(self, "_tz", dt.UTC)
        name = self.name
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"an input column needs a name without surrounding spaces, got {name!r}")
        where = f"column {name!r}"
        if self.kind not in KINDS:
            hint = " (hashing is kind 'category' with buckets = N)" if self.kind == "hash" else ""
            raise ValueError(f"{where}: unknown kind {self.kind!r}; kinds are {', '.join(KINDS)}{hint}")
        misplaced = [opt for opt, given, kind in (
            ("levels", self.levels is not None, "category"), ("other", bool(self.other), "category"),
            ("buckets", self.buckets is not None, "category"), ("timezone", self.timezone is not None, "timestamp"),
            ("raw", bool(self.raw), "timestamp")) if given and self.kind != kind]
        if misplaced:
            raise ValueError(f"{where}: {', '.join(misplaced)} do(es) not apply to a {self.kind} column")
        if self.kind == "category":
            self._check_category(where)
        if self.kind == "timestamp":
            object.__setattr__(self, "_tz", _zone(self.timezone if self.timezone is not None else "UTC", where))

    def _check_category(self, where: str) -> None:
        if (self.levels is None) == (self.buckets is None):
            raise ValueError(f"{where}: a category column needs either levels (one-hot) or buckets (hashing)")
        if self.buckets is not None:
            if isinstance(self.buckets, bool) or not isinstance(self.buckets, int) \
                    or not 2 <= self.buckets <= MAX_BUCKETS:
                raise ValueError(f"{where}: buckets must be a whole number from 2 to {MAX_BUCKETS}, "
                                 f"got {self.buckets!r}")
            if self.other:
                raise ValueError(f"{where}: 'other' is for one-hot levels; every value has a bucket when hashing")
            return
        levels = tuple(self.levels or ())
        if isinstance(self.levels, str):  # a bare string would be read as its characters
            raise ValueError(f"{where}: levels must be a list of strings, got {self.levels!r}")
        if not levels:
            raise ValueError(f"{where}: the level list is empty (declare the levels, or buckets = N to hash)")
        bad = [lv for lv in levels if not isinstance(lv, str) or not lv.strip() or lv != lv.strip()]
        if bad:
            raise ValueError(f"{where}: levels must be non-empty strings without surrounding spaces, got {bad}")
        dup = sorted({lv for lv in levels if levels.count(lv) > 1})
        if dup:
            raise ValueError(f"{where}: levels are repeated: {dup}")
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "_index", {lv: i for i, lv in enumerate(levels)})

    # ------------------------------------------------------------------ layout
    @property
    def width(self) -> int:
        """How many numbers this column adds to `x`."""
        if self.kind == "category":
            return self.buckets if self.buckets is not None else len(self.levels or ()) + bool(self.other)
        if self.kind == "timestamp":
            return 6 if self.raw else 4
        return 1

    @property
    def outputs(self) -> tuple[str, ...]:
        """The names of this column's numbers, in order."""
        n = self.name
        if self.kind == "category":
            if self.buckets is not None:
                return tuple(f"{n}#{b}" for b in range(self.buckets))
            return tuple(f"{n}={lv}" for lv in self.levels or ()) + ((f"{n}={OTHER}",) if self.other else ())
        if self.kind == "timestamp":
            parts = ("hour_sin", "hour_cos", "weekday_sin", "weekday_cos") + (("hour", "weekday") if self.raw else ())
            return tuple(f"{n}.{p}" for p in parts)
        return (n,)

    @property
    def text(self) -> str:
        """This column in the `--columns` syntax (see :meth:`ColumnSpec.parse`).

        >>> Column("site", "category", levels=("a", "b"), other=True).text
        'site:category=a|b|*'
        """
        n = self.name
        if self.kind == "category":
            if self.buckets is not None:
                return f"{n}:hash={self.buckets}"
            return f"{n}:category=" + "|".join([*(self.levels or ()), *(["*"] if self.other else [])])
        if self.kind == "timestamp":
            opts = [o for o in (self.timezone, "raw" if self.raw else None) if o]
            return f"{n}:timestamp" + ("=" + "|".join(opts) if opts else "")
        return n if self.kind == "number" else f"{n}:{self.kind}"

    # ------------------------------------------------------------------ encoding
    def missing(self, cell: str, na_values: frozenset[str]) -> bool:
        """Whether a CSV cell means "no value" for this column: empty, or a missing-value marker that is not
        one of its declared levels (a category whose level is `None` has the level `None`).

        >>> Column("holiday", "category", levels=("None", "Xmas")).missing("None", frozenset({"None", "NA"}))
        False
        >>> Column("temp").missing("None", frozenset({"None"})), Column("temp").missing(" ", frozenset())
        (True, True)
        """
        text = cell.strip()
        if not text:
            return True
        return text in na_values and text not in self._index  # type: ignore[attr-defined]

    def encode(self, value: Any, out: np.ndarray, max_abs: float | None = None) -> Invalid | None:
        """Write this column's numbers for `value` into `out` (length `width`, zeros on entry); an
        :class:`Invalid` when the value cannot be encoded (then `out` means nothing). `value` is present:
        telling a missing value (absent, null, an NA cell) is the caller's, since sources differ there.
        `max_abs`: a number beyond it is refused as `too_large`."""
        if self.kind == "number":
            v = to_number(value)
            if v is None:
                return Invalid(NON_NUMERIC, f"{self.name!r}: {_show(value)} is not a number")
            if not math.isfinite(v):
                return Invalid(NON_FINITE, f"{self.name!r}: {_show(value)} is NaN or infinite")
            if max_abs is not None and abs(v) > max_abs:
                return Invalid(TOO_LARGE, f"{self.name!r}: {_show(value)} is beyond ±{max_abs:g}")
            out[0] = v
            return None
        if self.kind == "boolean":
            b = self._boolean(value)
            if b is None:
                return Invalid(BAD_BOOLEAN, f"{self.name!r}: {_show(value)} is not a boolean "
                                            f"(true/false, yes/no, on/off, 1/0)")
            out[0] = b
            return None
        if self.kind == "category":
            return self._category(value, out)
        return self._timestamp(value, out)

    @staticmethod
    def _boolean(value: Any) -> float | None:
        if isinstance(value, bool | np.bool_):
            return float(value)
        if isinstance(value, str):
            text = value.strip().lower()
            return 1.0 if text in BOOLEAN_TRUE else 0.0 if text in BOOLEAN_FALSE else None
        if isinstance(value, numbers.Real) and value in (0, 1):  # JSON 0 / 1
            return float(value)
        return None

    def _category(self, value: Any, out: np.ndarray) -> Invalid | None:
        level = _level(value)
        if level is None:
            return Invalid(UNKNOWN_LEVEL, f"{self.name!r}: {type(value).__name__} {_show(value)} is not a level")
        if self.buckets is not None:
            out[stable_bucket(f"{self.name}={level}", self.buckets)] = 1.0
            return None
        i = self._index.get(level)
        if i is None:
            if not self.other:
                shown = ", ".join(list(self._index)[:20]) + (", ..." if len(self._index) > 20 else "")
                return Invalid(UNKNOWN_LEVEL, f"{self.name!r}: {level!r} is not a declared level ({shown}; "
                                              f"declare it, or give the column an other slot: |* or other = true)")
            i = len(self._index)
        out[i] = 1.0
        return None

    def _timestamp(self, value: Any, out: np.ndarray) -> Invalid | None:
        when = self._instant(value)
        if isinstance(when, str):
            return Invalid(BAD_TIMESTAMP, f"{self.name!r}: {_show(value)} is not a time ({when})")
        hour = when.hour + when.minute / 60.0 + (when.second + when.microsecond / 1e6) / 3600.0
        day = when.weekday()  # Monday 0 … Sunday 6
        a, b = _TAU * hour / 24.0, _TAU * day / 7.0
        out[0], out[1], out[2], out[3] = math.sin(a), math.cos(a), math.sin(b), math.cos(b)
        if self.raw:
            out[4], out[5] = hour, day
        return None

    def _instant(self, value: Any) -> dt.datetime | str:
        """The wall-clock time of `value` in the column's zone, or why there is none."""
        expect = "ISO 8601 such as 2024-05-06T06:00:00+02:00, or seconds since the epoch"
        if isinstance(value, dt.datetime):
            when = value
        elif isinstance(value, dt.date):
            when = dt.datetime(value.year, value.month, value.day)
        else:
            seconds = to_number(value)
            if seconds is not None:
                if not math.isfinite(seconds):
                    return "not finite"
                try:
                    return dt.datetime.fromtimestamp(seconds, self._tz)
                except (OverflowError, OSError, ValueError):
                    return f"{expect}; out of range{' — epoch milliseconds?' if abs(seconds) > 1e11 else ''}"
            if not isinstance(value, str) or not value.strip():
                return expect
            try:
                when = dt.datetime.fromisoformat(value.strip())
            except ValueError:
                return expect
        if when.tzinfo is not None:
            try:
                when = when.astimezone(self._tz)
            except (OverflowError, ValueError):  # e.g. 0001-01-01T00:00+01:00 moved before year 1
                return f"{expect}; out of range"
        return when


@durable("fleet.ColumnSpec")
@dataclass(frozen=True)
class ColumnSpec:
    """The input columns of a fleet, in vector order: what each becomes, and how wide `x` is.

    Make one from a list of :class:`Column` (or mappings of their fields, as in a TOML `[[inputs.columns]]`
    table: :meth:`from_records`) or from the command-line syntax (:meth:`parse`). Column names must be
    distinct. :meth:`encode` turns the raw values of one reading (in column order) into `x`.

    >>> spec = ColumnSpec.from_records([{"name": "rain", "kind": "boolean"},
    ...                                 {"name": "zone", "kind": "category", "buckets": 4}])
    >>> spec.names, spec.width, spec.text
    (('rain', 'zone'), 5, 'rain:boolean,zone:hash=4')
    >>> spec.encode(["off", "z1"]).tolist()  # 'z1' hashes to bucket 2 of 4
    [0.0, 0.0, 0.0, 1.0, 0.0]
    """

    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        cols = tuple(self.columns)
        if not cols:
            raise ValueError("no input columns declared")
        if not all(isinstance(c, Column) for c in cols):
            raise ValueError("input columns must be Column objects (ColumnSpec.from_records takes mappings)")
        names = [c.name for c in cols]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"input columns are declared twice: {dup}")
        slices, start = [], 0
        for c in cols:
            slices.append(slice(start, start + c.width))
            start += c.width
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "_slices", tuple(slices))

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any] | Column]) -> ColumnSpec:
        """A spec from mappings of :class:`Column` fields (unknown keys are refused, naming the column)."""
        if isinstance(records, str | bytes) or not isinstance(records, Sequence):
            raise ValueError(f"input columns must be a list of tables, got {type(records).__name__}")
        allowed = {f.name for f in fields(Column) if f.init}
        cols = []
        for i, rec in enumerate(records):
            if isinstance(rec, Column):
                cols.append(rec)
                continue
            if not isinstance(rec, Mapping):
                raise ValueError(f"input column {i + 1} must be a table (name = ..., kind = ...), got {rec!r}")
            unknown = sorted(set(rec) - allowed)
            if unknown:
                raise ValueError(f"input column {rec.get('name', i + 1)!r}: unknown key(s) {unknown}; "
                                 f"keys are {', '.join(sorted(allowed))}")
            if "name" not in rec:
                raise ValueError(f"input column {i + 1} has no name")
            opts = dict(rec)
            if isinstance(opts.get("levels"), list):
                opts["levels"] = tuple(opts["levels"])
            cols.append(Column(**opts))
        return cls(tuple(cols))

    @classmethod
    def parse(cls, text: str) -> ColumnSpec:
        """The `--columns` syntax: comma-separated `NAME[:KIND[=OPTIONS]]`, options separated by `|`.

        ========================================== =====================================================
        `temp` or `temp:number`                    a number
        `rain:boolean`                             true/false, yes/no, on/off, 1/0
        `site:category=north|south`                one-hot; any other level is skipped (`unknown_level`)
        `site:category=north|south|*`              one-hot with an "other" slot (`*`) for any other level
        `zone:hash=16`                             a category hashed into 16 buckets
        `time:timestamp`                           hour and weekday (sin, cos) in UTC
        `time:timestamp=Europe/Berlin|raw`         … on Berlin's clock, plus the hour and weekday as such
        ========================================== =====================================================

        Names containing `,` `:` `=` or `|` cannot be written this way: declare them in a TOML file.

        >>> ColumnSpec.parse("temp,time:timestamp=+08:00|raw").outputs[-2:]
        ('time.hour', 'time.weekday')
        """
        items = [item.strip() for item in str(text).split(",")]
        if not any(items):
            raise ValueError("no input columns declared")
        cols = []
        for item in items:
            if not item:
                raise ValueError(f"an empty column in {text!r}")
            name, _, rest = item.partition(":")
            kind, eq, arg = rest.partition("=")
            name, kind, arg = name.strip(), kind.strip() or "number", arg.strip()
            opts = [o.strip() for o in arg.split("|")] if eq else []
            where = f"column {name!r}"
            if kind == "hash":
                try:
                    n = int(arg)
                except ValueError:
                    raise ValueError(f"{where}: hash=N needs a whole number of buckets, got {arg!r}") from None
                cols.append(Column(name, "category", buckets=n))
            elif kind == "category":
                if not eq or not arg:
                    raise ValueError(f"{where}: category needs its levels, e.g. {name}:category=a|b|c "
                                     f"(or {name}:hash=16)")
                other = "*" in opts
                cols.append(Column(name, "category", levels=tuple(o for o in opts if o != "*"), other=other))
            elif kind == "timestamp":
                raw = "raw" in opts
                zones = [o for o in opts if o and o != "raw"]
                if len(zones) > 1:
                    raise ValueError(f"{where}: one time zone at most, got {zones}")
                cols.append(Column(name, "timestamp", timezone=zones[0] if zones else None, raw=raw))
            elif eq:
                raise ValueError(f"{where}: a {kind} column takes no options, got {arg!r}"
                                 if kind in KINDS else f"{where}: unknown kind {kind!r}; kinds are "
                                 f"{', '.join(KINDS)} (and hash=N)")
            else:
                if kind not in KINDS:
                    raise ValueError(f"{where}: unknown kind {kind!r}; kinds are {', '.join(KINDS)} (and hash=N)")
                cols.append(Column(name, kind))
        return cls(tuple(cols))

    # ------------------------------------------------------------------ layout
    @property
    def names(self) -> tuple[str, ...]:
        """The input columns to read, in order."""
        return tuple(c.name for c in self.columns)

    @property
    def width(self) -> int:
        """The length of `x`: what `fleet.n_inputs` must be."""
        return sum(c.width for c in self.columns)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The name of each number of `x` (`temp`, `site=north`, `zone#3`, `time.hour_sin`, ...)."""
        return tuple(o for c in self.columns for o in c.outputs)

    @property
    def slices(self) -> tuple[slice, ...]:
        """Where each column's numbers are in `x`."""
        return self._slices

    @property
    def text(self) -> str:
        """The spec in the `--columns` syntax."""
        return ",".join(c.text for c in self.columns)

    def widths(self) -> str:
        """Each column's width, for a message: `temp 1, site 3, time 4`."""
        return ", ".join(f"{c.name} {c.width}" for c in self.columns)

    def check_width(self, n_inputs: int) -> None:
        """Refuse (one-line `ValueError`, naming the width) a spec whose width is not the fleet's `n_inputs`.

        >>> try:
        ...     ColumnSpec.parse("a,b:boolean").check_width(3)
        ... except ValueError as e:
        ...     print(str(e)[:73])
        the input columns make 2 numbers per reading (a 1, b 1) but the fleet has
        """
        if self.width != n_inputs:
            raise ValueError(f"the input columns make {self.width} numbers per reading ({self.widths()}) but the "
                             f"fleet has n_inputs={n_inputs}: set n_inputs = {self.width} in [fleet] (on every agent "
                             f"and the aggregator) or change the columns")

    # ------------------------------------------------------------------ encoding
    def encode(self, values: Sequence[Any], max_abs: float | None = None) -> np.ndarray | Invalid:
        """`x` from one reading's raw values in column order (all present), or the first column's
        :class:`Invalid` (its detail names the column); `max_abs` as in :meth:`Column.encode`."""
        if len(values) != len(self.columns):
            raise ValueError(f"{len(values)} values for {len(self.columns)} input columns")
        x = np.zeros(self.width)
        for col, where, value in zip(self.columns, self._slices, values, strict=True):
            bad = col.encode(value, x[where], max_abs)
            if bad is not None:
                return bad
        return x


def suggest_column(name: str, values: Sequence[str]) -> str | None:
    """A `--columns` item for a text column the replay left out, judged from its present values: `boolean`
    when they all are booleans, `timestamp` when most read as ISO 8601 times, one-hot over its levels when
    there are few, hashing when there are more; None for what looks like an id or free text (most values
    distinct) or a name the syntax cannot carry.

    >>> suggest_column("site", ["north", "south", "north"])
    'site:category=north|south'
    >>> suggest_column("t", ["2024-05-06 06:00", "2024-05-06 07:00", "?"]), suggest_column("id", list("abcdefghijklmn"))
    ('t:timestamp', None)
    """
    if any(ch in name for ch in ",:=|") or not values:
        return None
    texts = [v.strip() for v in values]
    if all(t.lower() in BOOLEAN_TRUE | BOOLEAN_FALSE for t in texts):
        return f"{name}:boolean"
    times = 0
    for t in texts:
        if any(ch in t for ch in "-:T") and len(t) >= 8:
            try:
                dt.datetime.fromisoformat(t)
                times += 1
            except ValueError:
                pass
    if times * 2 > len(texts):
        return f"{name}:timestamp"
    levels = list(dict.fromkeys(texts))
    if len(levels) == len(texts) > 3:
        return None  # every value differs: an id, a comment — no category to learn from
    if len(levels) <= _SUGGEST_MAX_LEVELS and not any(ch in t for t in levels for ch in ",|*") and all(levels):
        return f"{name}:category=" + "|".join(levels)
    if len(levels) * 2 > len(texts):
        return None  # most values differ: an id, a comment — no category to learn from
    buckets = 8
    while buckets < 2 * len(levels) and buckets < 1024:
        buckets *= 2
    return f"{name}:hash={buckets}"
