"""Sample sources: the sensor-message parser, the label join, CSV / JSON-lines / River / array replay, pacing."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import math
import pickle
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfed.fleet.sources import (
    MAX_ABS,
    MAX_ID_LEN,
    Label,
    LabelJoin,
    Reading,
    ReadingParser,
    Skip,
    SkipReason,
    SourceError,
    array_source,
    csv_source,
    jsonl_source,
    paced,
    river_source,
)
from streamfed.wire.schema import MAX_META_STR

FEATURES = ["temp", "hum", "co2"]
X = {"temp": 21.5, "hum": 40, "co2": "415.5"}


def parse(obj, parser=None):
    p = parser or ReadingParser(FEATURES)
    return p.parse(obj if isinstance(obj, bytes | str) else json.dumps(obj))


def reason(obj, parser=None):
    out = parse(obj, parser)
    assert isinstance(out, Skip), out
    return out.reason


async def collect(aiter):
    return [item async for item in aiter]


def run(coro, timeout=20.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# =========================================================================== ReadingParser


def test_a_reading_by_name_or_in_schema_order():
    p = ReadingParser(FEATURES)
    r = p.parse(json.dumps({"id": "r1", "ts": 5.0, "x": X}))
    assert isinstance(r, Reading)
    assert (r.id, r.ts, r.y) == ("r1", 5.0, None)
    assert r.x.dtype == np.float64 and r.x.tolist() == [21.5, 40.0, 415.5]
    r2 = p.parse(b'{"id": 7, "ts": 6, "x": [1, 2.5, "3"], "y": "0.25"}')
    assert (r2.id, r2.x.tolist(), r2.y, r2.ts) == ("7", [1.0, 2.5, 3.0], 0.25, 6.0)
    # extra keys in x and in the message are ignored; a mapping payload needs no JSON
    r3 = p.parse({"id": "r3", "x": {**X, "wind": 3}, "unit": "SI"})
    assert r3.x.tolist() == [21.5, 40.0, 415.5]
    assert abs(r3.ts - time.time()) < 60  # no ts: the arrival time
    for payload in (bytearray(b'{"id": "r4", "x": [1, 2, 3]}'), memoryview(b'{"id": "r5", "x": [1, 2, 3]}')):
        assert isinstance(p.parse(payload), Reading)


def test_list_inputs_and_numpy_values():
    p = ReadingParser(["a", "b"], check_order=False)
    assert p.reading((1, 2), rid="t").x.tolist() == [1.0, 2.0]
    for arr in (np.array([1.5, 2.5], dtype=np.float32), np.array([1, 2], dtype=np.int64),
                np.array([1, 2], dtype=np.uint8), np.array([1.0, 2.0], dtype=object)):
        r = p.reading(arr, rid=f"arr-{arr.dtype}")
        assert isinstance(r, Reading) and r.x.dtype == np.float64, arr.dtype
        assert r.x.tolist() == arr.astype(np.float64).tolist()
    src = np.array([1.0, 2.0])
    r = p.reading(src, rid="copy")
    src[0] = 99.0
    assert r.x[0] == 1.0  # the reading does not alias the caller's buffer
    r = p.reading({"a": np.float32(0.5), "b": np.int16(3)}, y=np.float64(1.0), rid="np")
    assert r.x.tolist() == [0.5, 3.0] and r.y == 1.0
    assert p.reading({"a": Fraction(1, 4), "b": 1}, rid="frac").x.tolist() == [0.25, 1.0]
    assert p.reading(np.array([True, False]), rid="bools").reason == SkipReason.NON_NUMERIC
    assert p.reading(np.zeros((1, 2)), rid="2d").reason == SkipReason.MALFORMED
    assert p.reading(np.array(1.0), rid="0d").reason == SkipReason.MALFORMED
    assert p.reading(np.zeros(3), rid="long").reason == SkipReason.MISSING_FEATURE


def test_labels():
    p = ReadingParser(FEATURES)
    assert p.parse(b'{"label_for": "r1", "y": 0.5}') == Label("r1", 0.5)
    assert p.parse(b'{"label_for": 12, "y": "2"}') == Label("12", 2.0)  # 12 and "12" are one id
    assert reason({"label_for": "r1", "y": "high"}) == SkipReason.NON_NUMERIC
    assert reason({"label_for": "r1", "y": True}) == SkipReason.NON_NUMERIC
    assert reason(b'{"label_for": "r1", "y": NaN}') == SkipReason.NON_FINITE
    assert reason(b'{"label_for": "r1", "y": -Infinity}') == SkipReason.NON_FINITE
    assert reason({"label_for": "r1", "y": 10**400}) == SkipReason.NON_FINITE
    for bad in ({"label_for": "r1"}, {"label_for": "r1", "y": None}, {"label_for": None, "y": 1},
                {"label_for": "", "y": 1}, {"label_for": ["r1"], "y": 1}, {"label_for": True, "y": 1},
                {"label_for": "r" * (MAX_ID_LEN + 1), "y": 1}):
        assert reason(bad) == SkipReason.MALFORMED, bad
    # a reading with its label inline, and one without an id: labelled ones get an id of their own
    r = parse({"x": X, "y": 3})
    assert isinstance(r, Reading) and r.y == 3.0 and r.id


@pytest.mark.parametrize(("payload", "expected"), [
    # malformed: not JSON, not an object, nested too deep, no inputs, bad id or timestamp
    (b"{not json", SkipReason.MALFORMED),
    (b"\xff\xfe\x00garbage", SkipReason.MALFORMED),
    (b"", SkipReason.MALFORMED),
    (b"[1, 2, 3]", SkipReason.MALFORMED),
    (b'"a string"', SkipReason.MALFORMED),
    (b"[" * 100_000 + b"]" * 100_000, SkipReason.MALFORMED),
    (b'{"id": "r", "x": 12}', SkipReason.MALFORMED),
    (b'{"id": "r"}', SkipReason.MALFORMED),
    (b'{"id": "r", "x": [[1, 2, 3]]}', SkipReason.MISSING_FEATURE),
    (b'{"x": [1, 2, 3]}', SkipReason.MALFORMED),  # unlabelled without an id: no label could name it
    (b'{"id": null, "x": [1, 2, 3]}', SkipReason.MALFORMED),
    (b'{"id": "", "x": [1, 2, 3]}', SkipReason.MALFORMED),
    (b'{"id": true, "x": [1, 2, 3]}', SkipReason.MALFORMED),
    (b'{"id": 1.5, "x": [1, 2, 3]}', SkipReason.MALFORMED),
    (b'{"id": {"a": 1}, "x": [1, 2, 3]}', SkipReason.MALFORMED),
    (('{"id": "' + "r" * (MAX_ID_LEN + 1) + '", "x": [1, 2, 3]}').encode(), SkipReason.MALFORMED),
    (b'{"id": "r", "ts": "yesterday", "x": [1, 2, 3]}', SkipReason.MALFORMED),
    (b'{"id": "r", "ts": NaN, "x": [1, 2, 3]}', SkipReason.MALFORMED),
    (b'{"id": "r", "ts": true, "x": [1, 2, 3]}', SkipReason.MALFORMED),
    # missing feature: absent, null, or a list of the wrong length
    (b'{"id": "r", "x": {"temp": 1, "hum": 2}}', SkipReason.MISSING_FEATURE),
    (b'{"id": "r", "x": {"temp": 1, "hum": 2, "co2": null}}', SkipReason.MISSING_FEATURE),
    (b'{"id": "r", "x": [1, 2]}', SkipReason.MISSING_FEATURE),
    (b'{"id": "r", "x": [1, 2, 3, 4]}', SkipReason.MISSING_FEATURE),
    (b'{"id": "r", "x": []}', SkipReason.MISSING_FEATURE),
    # non-numeric: text, booleans, containers; a non-numeric label
    (b'{"id": "r", "x": {"temp": "warm", "hum": 2, "co2": 3}}', SkipReason.NON_NUMERIC),
    (b'{"id": "r", "x": [1, true, 3]}', SkipReason.NON_NUMERIC),
    (b'{"id": "r", "x": [1, {"v": 2}, 3]}', SkipReason.NON_NUMERIC),
    (b'{"id": "r", "x": [1, "", 3]}', SkipReason.NON_NUMERIC),
    (b'{"id": "r", "x": [1, 2, 3], "y": "high"}', SkipReason.NON_NUMERIC),
    # non-finite: NaN/Infinity literals and strings, overflowing numbers, a non-finite label
    (b'{"id": "r", "x": [1, NaN, 3]}', SkipReason.NON_FINITE),
    (b'{"id": "r", "x": [1, Infinity, 3]}', SkipReason.NON_FINITE),
    (b'{"id": "r", "x": [1, "nan", 3]}', SkipReason.NON_FINITE),
    (b'{"id": "r", "x": [1, "-inf", 3]}', SkipReason.NON_FINITE),
    (b'{"id": "r", "x": [1, 1e400, 3]}', SkipReason.NON_FINITE),
    (('{"id": "r", "x": [1, ' + "9" * 400 + ', 3]}').encode(), SkipReason.NON_FINITE),
    (('{"id": "r", "x": [1, -' + "9" * 400 + ', 3]}').encode(), SkipReason.NON_FINITE),
    (b'{"id": "r", "x": [1, 2, 3], "y": NaN}', SkipReason.NON_FINITE),
])
def test_every_bad_input_is_a_skip_with_its_reason(payload, expected):
    out = ReadingParser(FEATURES).parse(payload)
    assert isinstance(out, Skip), out
    assert out.reason == expected, out
    assert out.detail  # something for the log


def test_out_of_order_timestamps():
    p = ReadingParser(FEATURES)
    assert isinstance(p.parse({"id": "a", "ts": 10, "x": X}), Reading)
    assert isinstance(p.parse({"id": "b", "ts": 10, "x": X}), Reading)  # equal is in order
    assert reason({"id": "c", "ts": 9.5, "x": X}, p) == SkipReason.OUT_OF_ORDER
    assert isinstance(p.parse({"id": "d", "x": X}), Reading)  # no ts: neither checked nor remembered
    assert isinstance(p.parse({"id": "e", "ts": 11, "x": X}), Reading)
    assert reason({"id": "f", "ts": 10.9, "x": X, "y": 1}, p) == SkipReason.OUT_OF_ORDER  # labelled too
    # a rejected reading does not move the clock; without check_order nothing is rejected
    assert isinstance(p.parse({"id": "g", "ts": 11, "x": X}), Reading)
    q = ReadingParser(FEATURES, check_order=False)
    assert all(isinstance(q.parse({"id": i, "ts": t, "x": X}), Reading) for i, t in enumerate([5, 3, 1]))


def test_duplicates_are_skipped_within_the_window():
    p = ReadingParser(FEATURES, dedup_window=3)
    assert isinstance(p.parse({"id": "a", "x": X}), Reading)
    assert reason({"id": "a", "x": X}, p) == SkipReason.DUPLICATE  # a QoS 1 redelivery
    assert reason({"id": "a", "x": X, "y": 1}, p) == SkipReason.DUPLICATE  # would be learned twice
    assert isinstance(p.parse({"id": 5, "x": X}), Reading)
    assert reason({"id": "5", "x": X}, p) == SkipReason.DUPLICATE  # 5 and "5" are one id
    # a duplicate is checked before the order: a late redelivery is a duplicate, not out of order
    assert isinstance(p.parse({"id": "t", "ts": 100, "x": X}), Reading)
    assert reason({"id": "t", "ts": 1, "x": X}, p) == SkipReason.DUPLICATE
    # rejected readings are not remembered; the window forgets the oldest ids
    assert reason({"id": "bad", "x": {"temp": 1}}, p) == SkipReason.MISSING_FEATURE
    assert isinstance(p.parse({"id": "bad", "ts": 100, "x": X}), Reading)  # window: 5, t, bad
    assert isinstance(p.parse({"id": "a", "ts": 100, "x": X}), Reading)  # 'a' was forgotten
    # id-less labelled readings get distinct generated ids and are not remembered
    ids = {p.parse({"x": X, "y": 1, "ts": 100}).id for _ in range(5)}
    assert len(ids) == 5
    off = ReadingParser(FEATURES, dedup_window=0)
    assert all(isinstance(off.parse({"id": "same", "x": X}), Reading) for _ in range(3))


def test_parser_state_survives_pickling():
    """Agents keep their parser in their state file: order and duplicate memory resume after a restart."""
    p = ReadingParser(FEATURES, dedup_window=100)
    assert isinstance(p.parse({"id": "a", "ts": 10, "x": X}), Reading)
    q = pickle.loads(pickle.dumps(p))
    assert reason({"id": "a", "ts": 11, "x": X}, q) == SkipReason.DUPLICATE
    assert reason({"id": "b", "ts": 9, "x": X}, q) == SkipReason.OUT_OF_ORDER
    assert isinstance(q.parse({"id": "b", "ts": 12, "x": X}), Reading)
    # a parser pickled before duplicate detection existed loads with an empty memory
    old = ReadingParser.__new__(ReadingParser)
    old.__setstate__({"features": tuple(FEATURES), "check_order": True, "last_ts": 10.0, "_seq": 1})
    assert isinstance(old.parse({"id": "a", "ts": 11, "x": X}), Reading)
    assert reason({"id": "a", "ts": 12, "x": X}, old) == SkipReason.DUPLICATE
    assert reason({"id": "c", "ts": 1, "x": X}, old) == SkipReason.OUT_OF_ORDER


def test_a_timestamp_far_ahead_is_refused_never_stored_and_a_stored_one_is_dropped_on_load():
    """One reading stamped `1e308` (or in epoch milliseconds) used to become the order mark and make every
    later timestamped reading "out of order" — across restarts, since the parser is in the agent's state."""
    import time

    p = ReadingParser(FEATURES)
    now = time.time()
    assert isinstance(p.parse({"id": "a", "ts": now, "x": X}), Reading)
    for ts in (1e308, now * 1000.0, now + 301.0):
        skip = p.parse({"id": f"f{ts}", "ts": ts, "x": X})
        assert isinstance(skip, Skip) and skip.reason == SkipReason.FUTURE_TIMESTAMP, skip
    assert p.last_ts == now  # never stored
    assert isinstance(p.parse({"id": "b", "ts": now + 1.0, "x": X}), Reading)
    assert isinstance(p.parse({"id": "c", "ts": now + 200.0, "x": X}), Reading)  # clock skew within tolerance
    # a state written before the check, holding a future mark, loads without it
    old = ReadingParser.__new__(ReadingParser)
    old.__setstate__({"features": tuple(FEATURES), "check_order": True, "last_ts": 1e308, "_seq": 1})
    assert isinstance(old.parse({"id": "d", "ts": now, "x": X}), Reading)
    with pytest.raises(ValueError, match="future_tolerance"):
        ReadingParser(FEATURES, future_tolerance=-1.0)


def test_schema_and_limits():
    with pytest.raises(ValueError):
        ReadingParser([])
    with pytest.raises(ValueError):
        ReadingParser(["a", "a"])
    with pytest.raises(ValueError):
        ReadingParser(["a"], dedup_window=-1)
    assert MAX_ID_LEN == MAX_META_STR  # the id travels whole in its prediction's metadata
    assert isinstance(parse({"id": "r" * MAX_ID_LEN, "x": X}), Reading)
    assert parse({"id": 10**100, "x": X}).id == str(10**100)
    assert reason({"id": 10**400, "x": X}) == SkipReason.MALFORMED


# --------------------------------------------------------------------------- property test

_names = st.sampled_from([*FEATURES, "other", ""])
_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=-1e6, max_value=1e6),
    st.text(max_size=8), st.sampled_from(["nan", "inf", "-Infinity", "1e400", " 3.5 ", "0x10", "1_0", "12"]),
)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=5)
                     | st.dictionaries(st.one_of(_names, st.text(max_size=4)), inner, max_size=5), max_leaves=20)
_x = st.one_of(
    st.fixed_dictionaries({f: _scalars for f in FEATURES}),  # the right names, any values
    st.dictionaries(_names, _scalars, max_size=5),
    st.lists(_scalars, min_size=2, max_size=4),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=3, max_size=3),
    _json,
)
_ids = st.one_of(st.text(max_size=300), st.integers(), st.integers(min_value=10**250, max_value=10**300), _scalars)
_messages = st.one_of(
    st.fixed_dictionaries({"x": _x}, optional={"id": _ids, "ts": _scalars, "y": _scalars, "extra": _json}),
    st.fixed_dictionaries({"label_for": _ids}, optional={"y": _scalars}),
    st.dictionaries(st.sampled_from(["id", "ts", "x", "y", "label_for", "other"]), _json, max_size=5),
)


def _check(out, n: int) -> None:
    assert isinstance(out, Reading | Label | Skip), out
    if isinstance(out, Reading):
        assert isinstance(out.x, np.ndarray) and out.x.dtype == np.float64 and out.x.shape == (n,)
        assert np.all(np.isfinite(out.x))
        assert isinstance(out.ts, float) and math.isfinite(out.ts)
        assert out.y is None or (isinstance(out.y, float) and math.isfinite(out.y))
        assert isinstance(out.id, str) and 0 < len(out.id) <= MAX_ID_LEN
    elif isinstance(out, Label):
        assert isinstance(out.y, float) and math.isfinite(out.y)
        assert isinstance(out.id, str) and 0 < len(out.id) <= MAX_ID_LEN
    else:
        assert out.reason in vars(SkipReason).values()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_messages)
def test_parser_property_any_json_object_is_a_reading_label_or_skip(obj):
    n = len(FEATURES)
    try:
        text = json.dumps(obj)  # NaN/Infinity as the JSON extension the parser accepts
    except ValueError:  # an integer json refuses to print (over 4300 digits): still a mapping payload
        text = None
    from_mapping = ReadingParser(FEATURES).parse(obj)
    _check(from_mapping, n)
    if text is not None:
        from_json = ReadingParser(FEATURES).parse(text)
        _check(from_json, n)
        # the wire form means the same as the mapping
        assert type(from_json) is type(from_mapping)
        if isinstance(from_json, Skip):
            assert from_json.reason == from_mapping.reason
        elif isinstance(from_json, Reading):
            assert from_json.id == from_mapping.id and from_json.y == from_mapping.y
            np.testing.assert_array_equal(from_json.x, from_mapping.x)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_parser_property_any_bytes_never_raise(payload):
    _check(ReadingParser(FEATURES).parse(payload), len(FEATURES))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=3, max_size=3),
       st.floats(allow_nan=False, allow_infinity=False))
def test_parser_property_finite_values_round_trip_exactly(values, y):
    """Within ±MAX_ABS a value comes through exactly; beyond it (its square could overflow) it is too_large."""
    r = ReadingParser(FEATURES).parse(json.dumps({"id": "r", "x": dict(zip(FEATURES, values, strict=True)), "y": y}))
    if max(abs(v) for v in [*values, y]) > MAX_ABS:
        assert isinstance(r, Skip) and r.reason == "too_large"
        return
    assert isinstance(r, Reading)
    assert r.x.tolist() == values and r.y == y


# =========================================================================== LabelJoin


def _r(rid: str) -> Reading:
    return Reading(rid, np.zeros(1), 0.0)


def test_label_join_evicts_the_oldest_waiting_reading():
    j = LabelJoin(capacity=3)
    assert [j.add(_r(i)) for i in "abc"] == [None, None, None]
    assert len(j) == 3 and "a" in j
    assert j.add(_r("d")).id == "a"  # full: the oldest goes
    assert j.match(Label("b", 1.0)).id == "b"  # matched ones leave the buffer ...
    assert j.add(_r("e")) is None  # ... and make room
    assert [j.add(_r(i)).id for i in "fg"] == ["c", "d"]
    assert j.match(Label("a", 1.0)) is None  # evicted: unknown now
    assert j.match(Label("zz", 1.0)) is None
    assert sorted(r for r in "abcdefg" if r in j) == ["e", "f", "g"]
    with pytest.raises(ValueError):
        LabelJoin(capacity=0)


def test_label_join_stays_bounded():
    j = LabelJoin(capacity=10)
    evicted = [e.id for i in range(1000) if (e := j.add(_r(f"r{i}"))) is not None]
    assert len(j) == 10 and evicted == [f"r{i}" for i in range(990)]


# =========================================================================== replay sources

CSV_TEXT = (
    "id,temp,hum,co2,target\n"
    "a,1.0,2.0,3.0,0.5\n"      # good
    "b,NA,2.0,3.0,0.5\n"       # NA cell: missing
    "c,1.0,2.0\n"              # short row: missing
    "d,1.0,warm,3.0,0.5\n"     # text: non-numeric
    "e,1.0,2.0,3.0,\n"         # empty label: missing
    "f,1.0,inf,3.0,0.5\n"      # non-finite
    "g,1.0,2.0,3.0,high\n"     # non-numeric label
    'h,4.0,5.0,"6.0",1.5\n'    # good (quoted)
)


def _counts(items):
    counts: dict[str, int] = {}
    for it in items:
        if isinstance(it, Skip):
            counts[it.reason] = counts.get(it.reason, 0) + 1
    return counts


@pytest.mark.parametrize("gz", [False, True])
def test_csv_source_skips_and_counts_bad_rows(tmp_path, gz):
    path = tmp_path / ("data.csv.gz" if gz else "data.csv")
    if gz:
        path.write_bytes(gzip.compress(CSV_TEXT.encode()))
    else:
        path.write_text(CSV_TEXT)
    items = run(collect(csv_source(path, "target", FEATURES)))
    assert len(items) == 8
    good = [it for it in items if isinstance(it, Reading)]
    assert [(r.id, r.x.tolist(), r.y) for r in good] == [("row0", [1.0, 2.0, 3.0], 0.5),
                                                         ("row7", [4.0, 5.0, 6.0], 1.5)]
    assert _counts(items) == {"missing_feature": 3, "non_numeric": 2, "non_finite": 1}
    with_ids = run(collect(csv_source(path, "target", FEATURES, id_column="id")))
    assert [r.id for r in with_ids if isinstance(r, Reading)] == ["a", "h"]


def test_csv_source_refuses_a_file_it_cannot_use_when_made(tmp_path):
    """Missing columns or file: a SourceError (a ValueError) at once, not a stream of skips or a traceback
    later; every bad-file case through the CLI is in tests/test_bad_inputs.py."""
    path = tmp_path / "d.csv"
    path.write_text("temp,hum,target\n1,2,3\n4,5,6\n")
    with pytest.raises(SourceError, match=r"d\.csv: feature column\(s\) 'co2' not found; columns are: 'temp', "):
        csv_source(path, "target", FEATURES)
    with pytest.raises(SourceError, match="target column 'y' not found"):
        csv_source(path, "y", ["temp", "hum"])
    with pytest.raises(SourceError, match="nope.csv: no such file"):
        csv_source(tmp_path / "nope.csv", "target", FEATURES)
    assert issubclass(SourceError, ValueError)


def test_csv_source_encoding_bom_and_ids(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("id,temp,hum,co2,target\nA,1,2,3,4\n,1,2,3,5\n", encoding="utf-8-sig")
    items = run(collect(csv_source(path, "target", FEATURES, id_column="id")))
    assert [(r.id, r.y) for r in items] == [("A", 4.0), ("r2", 5.0)]  # an empty id: numbered by the parser
    path.write_bytes("°C,hum,co2,target\n1,2,3,4\n".encode("cp1252"))
    items = run(collect(csv_source(path, "target", ["°C", "hum", "co2"], encoding="cp1252")))
    assert [r.x.tolist() for r in items] == [[1.0, 2.0, 3.0]]


def test_csv_source_file_changed_while_replayed_ends_with_a_skip(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("temp,hum,co2,target\n1,2,3,4\n5,6,7,8\n")
    src = csv_source(path, "target", FEATURES)  # checked now
    path.write_bytes(b"temp,hum,co2,target\n1,2,3,4\n\xff\xfe,6,7,8\n")  # replaced after the check
    items = run(collect(src))
    assert isinstance(items[-1], Skip) and items[-1].reason == "malformed" and "reading stopped" in items[-1].detail


def test_jsonl_source_reads_readings_labels_and_skips():
    lines = [json.dumps({"id": "r1", "ts": 1, "x": X}), "", "   ",
             json.dumps({"id": "r2", "ts": 2, "x": [1, 2, 3], "y": 4}),
             json.dumps({"label_for": "r1", "y": 0.5}),
             "{broken", json.dumps({"id": "r3", "ts": 0, "x": X}), json.dumps({"id": "r1", "ts": 3, "x": X})]
    items = run(collect(jsonl_source(io.StringIO("\n".join(lines) + "\n"), FEATURES)))
    assert [type(i).__name__ for i in items] == ["Reading", "Reading", "Label", "Skip", "Skip", "Skip"]
    assert [i.reason for i in items if isinstance(i, Skip)] == ["malformed", "out_of_order", "duplicate"]
    assert items[1].y == 4.0 and items[2] == Label("r1", 0.5)
    shared = ReadingParser(FEATURES)  # a given parser keeps its state (order, duplicates) across streams
    run(collect(jsonl_source(io.StringIO(lines[0]), parser=shared)))
    assert run(collect(jsonl_source(io.StringIO(lines[0]), parser=shared)))[0].reason == "duplicate"
    with pytest.raises(ValueError):  # no schema
        run(collect(jsonl_source(io.StringIO(lines[0]))))


def test_river_source_on_trump_approval():
    from river import datasets

    ds = datasets.TrumpApproval()  # bundled with River: no download
    ref = list(ds)[:50]
    items = run(collect(river_source(datasets.TrumpApproval(), n=50)))
    assert len(items) == 50 and all(isinstance(i, Reading) for i in items)
    names = sorted(ref[0][0])
    for i, (r, (x, y)) in enumerate(zip(items, ref, strict=True)):
        assert r.id == f"r{i}" and r.y == pytest.approx(y)
        assert r.x.tolist() == [float(x[k]) for k in names]
    chosen = run(collect(river_source(datasets.TrumpApproval(), features=["ipsos", "gallup"], n=3)))
    assert [r.x.tolist() for r in chosen] == [[ref[i][0]["ipsos"], ref[i][0]["gallup"]] for i in range(3)]
    assert run(collect(river_source(datasets.TrumpApproval(), n=0))) == []
    # a River-style dataset with gaps: None is a missing feature, a bool label is not a number
    gappy = [({"a": 1.0, "b": None}, 1.0), ({"a": 1.0, "b": 2.0}, True), ({"a": 1.0, "b": 2.0}, 3.0)]
    assert [getattr(i, "reason", "ok") for i in run(collect(river_source(gappy)))] == \
        ["missing_feature", "non_numeric", "ok"]


def test_array_source():
    X_ = np.arange(6.0).reshape(3, 2)
    items = run(collect(array_source(X_, np.array([1.0, 2.0, 3.0]), prefix="q")))
    assert [(r.id, r.x.tolist(), r.y, r.ts) for r in items] == [
        ("q0", [0.0, 1.0], 1.0, 0.0), ("q1", [2.0, 3.0], 2.0, 1.0), ("q2", [4.0, 5.0], 3.0, 2.0)]


# =========================================================================== pacing


def test_paced_keeps_order_and_count_and_rate():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = [i async for i in paced(range(20), 200.0)]  # 19 periods of 5 ms
        return got, loop.time() - t0

    got, elapsed = run(main())
    assert got == list(range(20))
    assert elapsed >= 0.5 * 19 / 200  # paced (loosely: timers may fire a little early)


def test_unpaced_sources_still_let_other_tasks_run():
    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def other():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        out = {}
        for rate in (None, 0, -5.0):
            before = ticks
            out[rate] = ([i async for i in paced(range(50), rate)], ticks - before)
        stop.set()
        await task
        return out

    for rate, (got, ticks) in run(main()).items():
        assert got == list(range(50)), rate
        assert ticks >= 40, (rate, ticks)  # the other task ran between items


# =========================================================================== declared input columns


SPEC_TEXT = "temp,site:category=north|south,rain:boolean,t:timestamp=+01:00"


def test_parser_with_declared_columns_encodes_sensor_json():
    from streamfed.fleet.columns import ColumnSpec

    p = ReadingParser(columns=ColumnSpec.parse(SPEC_TEXT))
    assert p.features == ("temp", "site", "rain", "t")
    # 06:00Z is 07:00 at +01:00: angle 2π·7/24; Monday (day 0): sin 0, cos 1
    r = parse({"id": "a", "x": {"t": "2024-05-06T06:00:00Z", "rain": "On", "site": "south", "temp": "20.5"}}, p)
    a = 2 * math.pi * 7 / 24
    assert np.allclose(r.x, [20.5, 0.0, 1.0, 1.0, math.sin(a), math.cos(a), 0.0, 1.0])
    # the same reading as a list of raw values in column order, JSON true and epoch seconds
    r2 = parse({"id": "b", "x": [20.5, "south", True, 1714975200]}, p)
    assert np.allclose(r2.x, r.x)
    assert reason({"id": "c", "x": {"temp": 1, "site": "west", "rain": "no", "t": 0}}, p) == SkipReason.UNKNOWN_LEVEL
    assert reason({"id": "d", "x": {"temp": 1, "site": "north", "rain": "wet", "t": 0}}, p) == SkipReason.BAD_BOOLEAN
    assert reason({"id": "e", "x": {"temp": 1, "site": "north", "rain": 1, "t": "noon"}}, p) == \
        SkipReason.BAD_TIMESTAMP
    assert reason({"id": "f", "x": {"temp": "hot", "site": "north", "rain": 1, "t": 0}}, p) == SkipReason.NON_NUMERIC
    assert reason({"id": "g", "x": {"temp": 1, "site": None, "rain": 1, "t": 0}}, p) == SkipReason.MISSING_FEATURE
    assert reason({"id": "h", "x": [1, "north", 1]}, p) == SkipReason.MISSING_FEATURE  # 3 values for 4 columns
    assert p.reading(np.array([1.0, 2.0, 3.0, 4.0]), rid="i").reason == SkipReason.UNKNOWN_LEVEL  # raw values
    skip = parse({"id": "j", "x": {"temp": 1, "site": "west", "rain": "no", "t": 0}}, p)
    assert "'site'" in skip.detail and "'west'" in skip.detail


def test_every_reason_a_column_gives_is_a_skip_reason():
    from streamfed.fleet import columns

    given = {columns.NON_NUMERIC, columns.NON_FINITE, columns.BAD_BOOLEAN, columns.BAD_TIMESTAMP,
             columns.UNKNOWN_LEVEL}
    assert given <= {v for k, v in vars(SkipReason).items() if k.isupper()}
    assert (SkipReason.BAD_BOOLEAN, SkipReason.BAD_TIMESTAMP, SkipReason.UNKNOWN_LEVEL) == \
        ("bad_boolean", "bad_timestamp", "unknown_level")


def test_parser_schema_is_checked_and_can_change_keeping_its_state():
    from streamfed.fleet.columns import ColumnSpec

    spec = ColumnSpec.parse("on:boolean,n")
    with pytest.raises(ValueError, match="are not the declared input columns"):
        ReadingParser(["n", "on"], columns=spec)
    assert ReadingParser(["on", "n"], columns=spec).features == ("on", "n")
    p = ReadingParser(["a", "b"])
    assert isinstance(p.parse({"id": "r1", "ts": 5, "x": [1, 2]}), Reading)
    q = p.with_schema(columns=spec)
    assert reason({"id": "r1", "ts": 6, "x": {"on": "yes", "n": 1}}, q) == SkipReason.DUPLICATE
    assert reason({"id": "r2", "ts": 4, "x": {"on": "yes", "n": 1}}, q) == SkipReason.OUT_OF_ORDER
    assert parse({"id": "r3", "ts": 7, "x": {"on": "yes", "n": 1}}, q).x.tolist() == [1.0, 1.0]
    assert isinstance(p.parse({"id": "r3", "ts": 7, "x": [1, 2]}), Reading)  # the original is untouched
    back = pickle.loads(pickle.dumps(q))  # an agent's state file keeps its parser, columns and all
    assert back.columns == spec and reason({"id": "r3", "ts": 8, "x": {"on": 1, "n": 1}}, back) == "duplicate"
    plain = q.with_schema(["x0", "x1"])
    assert plain.columns is None and reason({"id": "r3", "ts": 9, "x": [1, 2]}, plain) == "duplicate"


CSV_COLUMNS = (
    "when,site,rain,temp,target\n"
    "2024-05-06T06:00:00,north,yes,1.5,0.5\n"   # good: Monday 06:00
    "2024-05-12 18:00,south,NO,2.5,1.5\n"       # good: Sunday 18:00
    "2024-05-06T06:00:00,west,yes,1.5,0.5\n"    # unknown level
    "yesterday,north,yes,1.5,0.5\n"             # bad timestamp
    "2024-05-06T06:00:00,north,perhaps,1.5,0.5\n"  # bad boolean
    "2024-05-06T06:00:00,NA,yes,1.5,0.5\n"      # NA: missing
)


def test_csv_source_with_declared_columns(tmp_path):
    from streamfed.fleet.columns import ColumnSpec

    path = tmp_path / "d.csv"
    path.write_text(CSV_COLUMNS)
    spec = ColumnSpec.parse("temp,site:category=north|south,rain:boolean,when:timestamp")
    items = run(collect(csv_source(path, "target", columns=spec)))
    good = [i for i in items if isinstance(i, Reading)]
    assert [r.id for r in good] == ["row0", "row1"]
    assert np.allclose(good[0].x, [1.5, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    # Sunday 18:00: hour angle 3π/2, weekday angle 2π·6/7
    assert np.allclose(good[1].x, [2.5, 0.0, 1.0, 0.0, -1.0, 0.0, math.sin(12 * math.pi / 7),
                                   math.cos(12 * math.pi / 7)])
    assert _counts(items) == {"unknown_level": 1, "bad_timestamp": 1, "bad_boolean": 1, "missing_feature": 1}
    details = [i.detail for i in items if isinstance(i, Skip)]
    assert details[0].startswith("line 4: 'site': 'west' is not a declared level")
    with pytest.raises(SourceError, match=r"input column\(s\) 'sight' not found \(did you mean 'site'\?\)"):
        csv_source(path, "target", columns=ColumnSpec.parse("sight:category=a|b"))
    with pytest.raises(SourceError, match="input column 'target' is also the target"):
        csv_source(path, "target", columns=ColumnSpec.parse("target:boolean"))
    with pytest.raises(SourceError, match="give features or declared input columns, not both"):
        csv_source(path, "target", ["temp"], columns=spec)


def test_jsonl_and_river_sources_with_declared_columns():
    import datetime as dt

    from streamfed.fleet.columns import ColumnSpec

    spec = ColumnSpec.parse("site:category=a|b|*,t:timestamp")
    lines = [json.dumps({"id": 1, "x": {"site": "a", "t": "2024-05-06T00:00:00Z"}, "y": 1}),
             json.dumps({"id": 2, "x": {"site": "z", "t": "soon"}, "y": 1})]
    items = run(collect(jsonl_source(io.StringIO("\n".join(lines)), parser=ReadingParser(columns=spec))))
    assert items[0].x.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0] and items[1].reason == "bad_timestamp"
    # River datasets carry datetimes and text (e.g. river.datasets.Bikes' 'moment' and 'station')
    stream = [({"site": "b", "t": dt.datetime(2024, 5, 12, 18, 0), "extra": 1.0}, 2.0),
              ({"site": "q", "t": dt.datetime(2024, 5, 6, 6, 0)}, 3.0)]
    got = run(collect(river_source(stream, columns=spec)))
    assert np.allclose(got[0].x, [0.0, 1.0, 0.0, -1.0, 0.0, math.sin(12 * math.pi / 7), math.cos(12 * math.pi / 7)])
    assert got[1].x.tolist()[:3] == [0.0, 0.0, 1.0] and got[1].y == 3.0
