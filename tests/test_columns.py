"""Declared input columns (streamfed.fleet.columns): each kind's numbers, written out by hand; hashing that is
River's and the same in every process; every bad spec refused in one line, every bad value a reason."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys

import numpy as np
import pytest

from streamfed.fleet.columns import (
    Column,
    ColumnSpec,
    Invalid,
    murmur3_32,
    stable_bucket,
    suggest_column,
)

S2 = math.sqrt(2) / 2


def enc(column: Column, value) -> list[float] | Invalid:
    out = np.zeros(column.width)
    bad = column.encode(value, out)
    return bad if bad is not None else out.tolist()


def close(got, want) -> bool:
    return not isinstance(got, Invalid) and np.allclose(got, want, atol=1e-12)


# =========================================================================== timestamps


def test_timestamp_hour_and_weekday_on_circles():
    t = Column("t", "timestamp")
    # Monday 2024-05-06 06:00: hour angle 2π·6/24 = π/2 (sin 1, cos 0); Monday is day 0 (sin 0, cos 1)
    assert close(enc(t, "2024-05-06T06:00:00"), [1.0, 0.0, 0.0, 1.0])
    # 18:00: angle 3π/2 (sin -1, cos 0); Sunday is day 6: angle 2π·6/7 = 12π/7 (sin -sin(2π/7), cos cos(2π/7))
    assert close(enc(t, "2024-05-12 18:00"), [-1.0, 0.0, -0.7818314824680298, 0.6234898018587336])
    # 03:00 → π/4; Wednesday (day 2) → 4π/7
    assert close(enc(t, "2024-05-08T03:00"), [S2, S2, 0.9749279121818236, -0.2225209339563144])
    # midnight: angle 0 — and 23:59:59.9 is next to it on the circle
    assert close(enc(t, "2024-05-06T00:00:00"), [0.0, 1.0, 0.0, 1.0])
    late = enc(t, "2024-05-06T23:59:59.900")
    assert abs(late[0]) < 1e-4 and late[1] > 0.9999


def test_timestamp_raw_hour_is_fractional_and_weekday_counts_from_monday():
    t = Column("t", "timestamp", raw=True)
    assert t.outputs == ("t.hour_sin", "t.hour_cos", "t.weekday_sin", "t.weekday_cos", "t.hour", "t.weekday")
    assert enc(t, "2024-05-06T06:30:00")[4:] == [6.5, 0.0]  # Monday
    assert enc(t, "2024-05-12T00:45:36")[4:] == [0.76, 6.0]  # Sunday; 45 min 36 s = 0.76 h
    # the angle uses the fraction too: 06:30 → 2π·6.5/24
    assert math.isclose(enc(t, "2024-05-06T06:30:00")[0], math.sin(2 * math.pi * 6.5 / 24))


def test_timestamp_epoch_seconds_and_time_zones():
    utc = Column("t", "timestamp", raw=True)
    # 2024-05-06T06:00:00Z = 19849 days · 86400 s + 6 h = 1714975200
    for value in (1714975200, 1714975200.0, "1714975200", "2024-05-06T06:00:00Z", "2024-05-06T08:00:00+02:00"):
        assert enc(utc, value)[4:] == [6.0, 0.0], value
    berlin = Column("t", "timestamp", timezone="Europe/Berlin", raw=True)
    assert enc(berlin, 1714975200)[4:] == [8.0, 0.0]  # summer: UTC+2
    assert enc(berlin, "2024-01-15T05:00:00Z")[4:] == [6.0, 0.0]  # winter: UTC+1 (Monday 15 January)
    assert enc(berlin, "2024-05-06 06:00")[4:] == [6.0, 0.0]  # no offset: Berlin's wall clock as written
    east = Column("t", "timestamp", timezone="+08:00", raw=True)
    # Sunday 23:30 UTC is Monday 07:30 at +08:00: the weekday moves with the zone
    assert enc(east, "2024-05-05T23:30:00Z")[4:] == [7.5, 0.0]
    assert enc(Column("t", "timestamp", timezone="-0530", raw=True), 1714975200)[4:] == [0.5, 0.0]


def test_timestamp_accepts_datetimes_from_python_sources():
    import datetime as dt

    t = Column("t", "timestamp", raw=True)
    assert enc(t, dt.datetime(2024, 5, 6, 6, 0))[4:] == [6.0, 0.0]
    assert enc(t, dt.date(2024, 5, 12))[4:] == [0.0, 6.0]
    aware = dt.datetime(2024, 5, 6, 6, 0, tzinfo=dt.timezone(dt.timedelta(hours=-4)))
    assert enc(t, aware)[4:] == [10.0, 0.0]


@pytest.mark.parametrize("value", ["yesterday", "2024-13-01", "06:00", "", "nan", float("inf"), 1.7e12,
                                   True, None, [2024, 5, 6]])
def test_unparseable_timestamps_are_a_reason_not_an_exception(value):
    bad = enc(Column("t", "timestamp"), value)
    assert isinstance(bad, Invalid) and bad.reason == "bad_timestamp", bad
    assert "'t'" in bad.detail
    if value == 1.7e12:
        assert "milliseconds" in bad.detail


# =========================================================================== booleans and numbers


@pytest.mark.parametrize("value, expected", [
    ("true", 1.0), ("TRUE", 1.0), ("Yes", 1.0), (" on ", 1.0), ("1", 1.0), (True, 1.0), (1, 1.0), (np.True_, 1.0),
    ("false", 0.0), ("No", 0.0), ("OFF", 0.0), ("0", 0.0), (False, 0.0), (0, 0.0), (0.0, 0.0),
])
def test_booleans(value, expected):
    assert enc(Column("rain", "boolean"), value) == [expected]


@pytest.mark.parametrize("value", ["maybe", "2", "t", "", 2, 0.5, None, "nan"])
def test_bad_booleans(value):
    bad = enc(Column("rain", "boolean"), value)
    assert isinstance(bad, Invalid) and bad.reason == "bad_boolean" and "'rain'" in bad.detail


def test_numbers_as_before():
    n = Column("temp")
    assert enc(n, "21.5") == [21.5] and enc(n, 3) == [3.0]
    assert enc(n, "warm").reason == "non_numeric" and enc(n, True).reason == "non_numeric"
    assert enc(n, "1e999").reason == "non_finite" and enc(n, float("nan")).reason == "non_finite"


# =========================================================================== categories


def test_one_hot_layout_and_unknown_levels():
    site = Column("site", "category", levels=("north", "south", "east"))
    assert site.width == 3 and site.outputs == ("site=north", "site=south", "site=east")
    assert enc(site, "north") == [1.0, 0.0, 0.0]
    assert enc(site, " east ") == [0.0, 0.0, 1.0]  # CSV cells are stripped
    bad = enc(site, "west")
    assert bad.reason == "unknown_level" and "'west'" in bad.detail and "north, south, east" in bad.detail
    assert enc(site, "North").reason == "unknown_level"  # levels are exact text
    other = Column("site", "category", levels=("north", "south"), other=True)
    assert other.outputs == ("site=north", "site=south", "site=<other>")
    assert enc(other, "west") == [0.0, 0.0, 1.0] and enc(other, "south") == [0.0, 1.0, 0.0]


def test_numeric_levels_match_their_text():
    floor = Column("floor", "category", levels=("1", "2", "10"))
    assert enc(floor, 2) == [0.0, 1.0, 0.0] and enc(floor, 10.0) == [0.0, 0.0, 1.0] and enc(floor, "1") == [1, 0, 0]
    assert enc(floor, [1]).reason == "unknown_level"


def test_murmur3_published_vectors():
    # the reference MurmurHash3_x86_32 test vectors
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"", 0xFFFFFFFF) == 0x81F16F39
    assert murmur3_32(b"\x00\x00\x00\x00") == 0x2362F9DE
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"Hello, world!", 1234) == 0xFAF6CDB3
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723


def test_hashing_is_rivers_feature_hasher_rule():
    """River's FeatureHasher(alternate_sign=False) puts {"site": level} in bucket murmur3("site=level", seed)
    mod N (signed hash, floor modulo), value 1: ours is that rule with the seed fixed at 0."""
    from river.preprocessing import FeatureHasher

    levels = ["north", "south", "a", "bb", "ccc", "dddd", "ünïcode", "Gare du Nord", "0"]
    for river_seed in (0, 1, 42):
        hasher = FeatureHasher(n_features=97, seed=river_seed, alternate_sign=False)
        murmur_seed = hasher._seed  # River derives its MurmurHash seed from `seed`
        for level in levels:
            h = murmur3_32(f"site={level}".encode(), murmur_seed)
            signed = h - 2**32 if h >= 2**31 else h
            assert hasher.transform_one({"site": level}) == {signed % 97: 1}, (river_seed, level)
    for level in levels:
        h = murmur3_32(f"site={level}".encode())
        assert stable_bucket(f"site={level}", 97) == (h - 2**32 if h >= 2**31 else h) % 97


def test_hashed_column_sets_one_bucket_and_never_skips():
    zone = Column("zone", "category", buckets=8)
    assert zone.outputs == tuple(f"zone#{b}" for b in range(8))
    for level in ("z1", "z2", "anything at all", "", 7):
        x = enc(zone, level)
        assert sum(x) == 1.0 and x.index(1.0) == stable_bucket(f"zone={str(level).strip()}", 8)


TOKENS = ["site=north", "site=south", "zone=Gare du Nord", "zone=ünïcode", "x=0", "x="]


def test_hash_buckets_are_the_same_in_fresh_processes():
    """Python's own hash of a str changes with every process (PYTHONHASHSEED); ours must not."""
    code = ("from streamfed.fleet.columns import stable_bucket; import sys; "
            f"print([stable_bucket(t, 1024) for t in {TOKENS!r}], hash('site=north'))")
    runs = []
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "OPENBLAS_NUM_THREADS": "1"}).stdout.split("]")
        runs.append((out[0] + "]", out[1].strip()))
    assert runs[0][1] != runs[1][1], "the two processes should have had different str hashes"
    assert runs[0][0] == runs[1][0] == str([stable_bucket(t, 1024) for t in TOKENS])


# =========================================================================== specs


def test_spec_layout_parse_and_text():
    spec = ColumnSpec.parse("temp, site:category=north|south|*, zone:hash=4, rain:boolean, "
                            "t:timestamp=Europe/Berlin|raw")
    assert spec.names == ("temp", "site", "zone", "rain", "t")
    assert spec.width == 1 + 3 + 4 + 1 + 6
    assert spec.outputs[:5] == ("temp", "site=north", "site=south", "site=<other>", "zone#0")
    assert [(s.start, s.stop) for s in spec.slices] == [(0, 1), (1, 4), (4, 8), (8, 9), (9, 15)]
    assert spec.text == "temp,site:category=north|south|*,zone:hash=4,rain:boolean,t:timestamp=Europe/Berlin|raw"
    assert ColumnSpec.parse(spec.text) == spec
    assert ColumnSpec.parse("a:number,b") == ColumnSpec((Column("a"), Column("b")))


def test_spec_from_records_as_in_toml():
    spec = ColumnSpec.from_records([
        {"name": "site", "kind": "category", "levels": ["north", "south"], "other": True},
        {"name": "t", "kind": "timestamp", "timezone": "+08:00"},
    ])
    assert spec == ColumnSpec.parse("site:category=north|south|*,t:timestamp=+08:00")


def test_spec_encodes_a_reading_and_reports_the_first_bad_column():
    spec = ColumnSpec.parse("temp,site:category=a|b,t:timestamp")
    x = spec.encode(["2.5", "b", "2024-05-06T06:00:00Z"])
    assert np.allclose(x, [2.5, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    assert spec.encode(["2.5", "c", "noon"]).reason == "unknown_level"
    assert spec.encode(["2.5", "a", "noon"]).reason == "bad_timestamp"


def test_check_width_names_the_width():
    spec = ColumnSpec.parse("temp,site:category=a|b|c,t:timestamp")
    spec.check_width(8)
    with pytest.raises(ValueError) as e:
        spec.check_width(3)
    msg = str(e.value)
    assert "\n" not in msg and "make 8 numbers" in msg and "n_inputs=3" in msg and "n_inputs = 8" in msg
    assert "temp 1, site 3, t 4" in msg


@pytest.mark.parametrize("text, needle", [
    ("x:nope", "unknown kind 'nope'"),
    ("x:hash", "hash=N needs a whole number"),
    ("x:hash=16x", "hash=N needs a whole number"),
    ("x:hash=1", "buckets must be a whole number from 2 to 65536"),
    ("x:hash=0", "buckets must be"),
    ("x:hash=100000", "buckets must be"),
    ("x:category", "category needs its levels"),
    ("x:category=", "category needs its levels"),
    ("x:category=*", "the level list is empty"),
    ("x:category=a|a", "levels are repeated: ['a']"),
    ("x:category=a||b", "levels must be non-empty"),
    ("x:timestamp=Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
    ("x:timestamp=UTC|+01:00", "one time zone at most"),
    ("x:boolean=yes", "a boolean column takes no options"),
    ("x,x:boolean", "declared twice: ['x']"),
    ("x,,y", "an empty column"),
    ("", "no input columns declared"),
    (":boolean", "needs a name"),
])
def test_bad_specs_are_one_line_errors(text, needle):
    with pytest.raises(ValueError) as e:
        ColumnSpec.parse(text)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("record, needle", [
    ({"name": "x", "kind": "hash"}, "hashing is kind 'category' with buckets = N"),
    ({"name": "x", "kind": "category"}, "needs either levels (one-hot) or buckets"),
    ({"name": "x", "kind": "category", "levels": ["a"], "buckets": 4}, "needs either levels"),
    ({"name": "x", "kind": "category", "levels": []}, "the level list is empty"),
    ({"name": "x", "kind": "category", "levels": "abc"}, "levels must be a list"),
    ({"name": "x", "kind": "category", "buckets": 4, "other": True}, "'other' is for one-hot levels"),
    ({"name": "x", "levels": ["a"]}, "levels do(es) not apply to a number column"),
    ({"name": "x", "kind": "boolean", "timezone": "UTC", "raw": True}, "timezone, raw do(es) not apply"),
    ({"name": "x", "level": ["a"]}, "unknown key(s) ['level']"),
    ({"kind": "boolean"}, "has no name"),
])
def test_bad_records_are_one_line_errors(record, needle):
    with pytest.raises(ValueError) as e:
        ColumnSpec.from_records([record])
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_specs_pickle_with_their_zone():
    spec = ColumnSpec.parse("t:timestamp=Europe/Berlin|raw,site:category=a|b")
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and back.encode([1714975200, "b"]).tolist()[4:] == [8.0, 0.0, 0.0, 1.0]


# =========================================================================== suggestions for undeclared columns


def test_suggestions_for_text_columns():
    assert suggest_column("rain", ["yes", "No", "on"]) == "rain:boolean"
    assert suggest_column("when", ["2024-05-06 06:00", "2024-05-06T07:00:00Z", "bad"]) == "when:timestamp"
    assert suggest_column("site", ["b", "a", "b"]) == "site:category=b|a"  # order of first appearance
    many = [f"s{i % 40}" for i in range(400)]  # 40 levels, each repeated: hashed, 2 buckets a level or more
    assert suggest_column("station", many) == "station:hash=128"
    assert suggest_column("note", [f"free text {i}" for i in range(100)]) is None  # an id or a comment
    assert suggest_column("a,b", ["x"]) is None  # not expressible in --columns


# =========================================================================== the [inputs] section


CONFIG = """
[fleet]
fleet = "f"
algorithm = "pofmkl"
n_inputs = 8

[[inputs.columns]]
name = "temp"

[[inputs.columns]]
name = "site"
kind = "category"
levels = ["north", "south"]
other = true

[[inputs.columns]]
name = "t"
kind = "timestamp"
timezone = "Europe/Berlin"
"""


def test_inputs_section_of_the_configuration():
    from streamfed.fleet.config import StreamfedConfig

    cfg = StreamfedConfig.from_toml(CONFIG, env={})
    assert cfg.inputs.spec == ColumnSpec.parse("temp,site:category=north|south|*,t:timestamp=Europe/Berlin")
    assert cfg.inputs.spec.width == cfg.fleet.n_inputs == 8
    assert StreamfedConfig.from_toml(CONFIG.split("[[inputs")[0], env={}).inputs is None  # optional
    over = StreamfedConfig.from_toml(CONFIG, env={"STREAMFED_INPUTS__COLUMNS": '[{"name": "on", "kind": "boolean"}]'})
    assert over.inputs.spec.text == "on:boolean"


@pytest.mark.parametrize("edit, needle", [
    (("timezone = \"Europe/Berlin\"", "timezone = \"Mars/Olympus\""), "unknown time zone 'Mars/Olympus'"),
    (("kind = \"timestamp\"", "kind = \"time\""), "unknown kind 'time'"),
    (("levels = [\"north\", \"south\"]", "levels = []"), "the level list is empty"),
    (("other = true", "others = true"), "others"),
    (("name = \"t\"", "name = \"site\""), "declared twice: ['site']"),
])
def test_bad_inputs_section_is_refused(edit, needle):
    from pydantic import ValidationError

    from streamfed.fleet.config import StreamfedConfig

    with pytest.raises(ValidationError) as e:
        StreamfedConfig.from_toml(CONFIG.replace(*edit), env={})
    assert needle in str(e.value)


def test_the_commented_example_in_edge_agent_toml_is_valid_and_as_wide_as_it_says():
    import re
    import tomllib
    from pathlib import Path

    from streamfed.fleet.config import InputsConfig

    text = (Path(__file__).resolve().parents[1] / "edge" / "agent.toml").read_text(encoding="utf-8")
    block = text[text.index("\n# [[inputs.columns]]\n"):]  # the example, not the prose naming the tables
    toml = "\n".join(line.removeprefix("# ") for line in block.splitlines() if line.startswith("# "))
    spec = InputsConfig.model_validate(tomllib.loads(toml)["inputs"]).spec
    stated = int(re.search(r"makes [\d + ]+ = (\d+) inputs \(n_inputs = (\d+)\)", text).group(1))
    assert spec.width == stated == 19
    assert spec.text == ("TEMP,wd:category=N|E|S|W|*,station:hash=8,rain:boolean,"
                         "time:timestamp=Asia/Shanghai")
