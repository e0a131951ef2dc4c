"""Tests of streamfed.evaluation.datasets: the Beijing loader against an independent csv-module transcription,
the normalisations, the client splits, the adapters and the synthetic generator."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
import re
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamfed.core.standardise import OnlineStandardiser
from streamfed.evaluation.datasets import (
    BEIJING_EXTRAS,
    BEIJING_INPUTS,
    BEIJING_ROWS,
    BEIJING_STATIONS,
    ClientStream,
    Fleet,
    from_csv,
    from_river,
    iter_dicts,
    load_beijing,
    normalise,
    online_standardise,
    synthetic_fleet,
)

DATA = resources.files("streamfed").joinpath("data", "beijing-air")
INPUTS = ["PM2.5", "PM10", "SO2", "NO2", "O3", "TEMP", "PRES", "DEWP", "RAIN", "WSPM"]
BEARING = {w: 22.5 * i for i, w in enumerate(
    ["N", "NNE", "NE", "ENE", "E", "ESE", "SE", "SSE", "S", "SSW", "SW", "WSW", "W", "WNW", "NW", "NNW"])}


def _file(station: str) -> str:
    return f"PRSA_Data_{station}_20130301-20170228.csv.gz"


@cache
def raw_columns(station: str) -> dict[str, tuple[str, ...]]:
    """The vendored file read with the csv module alone: a transcription independent of the loader."""
    text = gzip.decompress(DATA.joinpath(_file(station)).read_bytes()).decode("ascii")
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    return dict(zip(header, zip(*reader, strict=True), strict=True))


@cache
def na_flags(station: str, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per column, whether each raw row has `NA` there; `"*"`: in any of `columns`."""
    flags = {c: np.array([v == "NA" for v in raw_columns(station)[c]]) for c in columns}
    flags["*"] = np.logical_or.reduce(list(flags.values()))
    return flags


def recount(station: str, columns: list[str], upto: int | None = None) -> tuple[int, dict[str, int]]:
    """Rows among the first `upto` with `NA` in any of `columns`, and per column."""
    flags = na_flags(station, tuple(columns))
    return int(flags["*"][:upto].sum()), {c: int(flags[c][:upto].sum()) for c in columns}


def expected_station(station: str, extras: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Raw X, y of a station, built value by value with `float`."""
    cols = raw_columns(station)
    keep = ~na_flags(station, tuple([*INPUTS, "CO"] + (["wd"] if extras else [])))["*"]

    def kept(c: str) -> list[str]:
        return [v for v, k in zip(cols[c], keep, strict=True) if k]

    X = [[float(v) for v in kept(c)] for c in INPUTS]
    if extras:
        wd = [math.radians(BEARING[v]) for v in kept("wd")]
        hour = [2 * math.pi * int(v) / 24 for v in kept("hour")]
        X += [[math.sin(a) for a in wd], [math.cos(a) for a in wd],
              [math.sin(a) for a in hour], [math.cos(a) for a in hour]]
    return np.array(X).T, np.array([float(v) for v in kept("CO")])


def past_only_loop(v: np.ndarray, warmup: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Online standardisation written the slow, obvious way: two-pass statistics of `v[:t]`."""
    v = v.reshape(len(v), -1)
    z, off, sc = [], [], []
    for t in range(warmup, len(v)):
        past = v[:t]
        mean = past.mean(axis=0)
        std = past.std(axis=0, ddof=1) if t >= 2 else np.zeros(v.shape[1])
        flat = past.max(axis=0) == past.min(axis=0)  # zero spread: all past values equal
        scale = np.where(flat, np.where(past[0] != 0, np.abs(past[0]), 1.0), std)
        z.append((v[t] - mean) / scale)
        off.append(mean)
        sc.append(scale)
    return np.array(z), np.array(off), np.array(sc)


@pytest.fixture(scope="module")
def raw_fleet() -> Fleet:
    return load_beijing("none")


# ---------------------------------------------------------------- vendored files


def test_vendored_files_match_provenance() -> None:
    text = DATA.joinpath("PROVENANCE.md").read_text()
    listed = dict(re.findall(r"\| `(PRSA_Data_\w+-\d+\.csv\.gz)` \| `([0-9a-f]{64})` \|", text))
    assert sorted(listed) == sorted(_file(s) for s in BEIJING_STATIONS)
    for name, digest in listed.items():
        assert hashlib.sha256(DATA.joinpath(name).read_bytes()).hexdigest() == digest
    assert "CC BY 4.0" in text and "501" in text


# ---------------------------------------------------------------- Beijing loader


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
def test_station_counts_match_csv_recount(raw_fleet: Fleet) -> None:
    assert raw_fleet.names == BEIJING_STATIONS
    for s, station in zip(raw_fleet, BEIJING_STATIONS, strict=True):
        assert len(raw_columns(station)["No"]) == BEIJING_ROWS
        assert len(s) + s.skipped == BEIJING_ROWS
        skipped, by_col = recount(station, [*INPUTS, "CO"])
        assert s.skipped == skipped > 0
        assert dict(s.skipped_by_column) == by_col


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
def test_station_values_match_csv_transcription(raw_fleet: Fleet) -> None:
    for s, station in zip(raw_fleet, BEIJING_STATIONS, strict=True):
        X, y = expected_station(station)
        assert s.feature_names == BEIJING_INPUTS
        assert np.array_equal(s.X, X) and np.array_equal(s.y, y)  # bit-exact, like float(text)
        assert np.all(np.diff(s.time.astype(np.int64)) > 0)  # time order
        assert np.all(np.diff(s.row) > 0) and np.all(s.source == BEIJING_STATIONS.index(station))
        ymdh = [int(raw_columns(station)[c][s.row[-1]]) for c in ("year", "month", "day", "hour")]
        assert str(s.time[-1]) == "{}-{:02d}-{:02d}T{:02d}".format(*ymdh)


def test_extras_match_transcription() -> None:
    fleet = load_beijing("none", extras=True)
    assert fleet.feature_names == BEIJING_INPUTS + BEIJING_EXTRAS
    for station in ("Shunyi", "Huairou"):
        s = fleet[station]
        X, y = expected_station(station, extras=True)
        np.testing.assert_allclose(s.X, X, rtol=0, atol=1e-15)
        assert np.array_equal(s.y, y)
        assert (len(s), s.skipped) == (len(y), recount(station, [*INPUTS, "CO", "wd"])[0])
        assert s.skipped_by_column["wd"] == recount(station, ["wd"])[0]


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
def test_steps_cut_streams_and_count_only_rows_read(raw_fleet: Fleet) -> None:
    fleet = load_beijing("none", steps=700)
    for s, full in zip(fleet, raw_fleet, strict=True):
        assert len(s) == 700
        assert np.array_equal(s.X, full.X[:700]) and np.array_equal(s.y, full.y[:700])
        skipped, by_col = recount(s.name, [*INPUTS, "CO"], upto=int(s.row[-1]) + 1)
        assert (s.skipped, dict(s.skipped_by_column)) == (skipped, by_col)
        assert len(s) + s.skipped == s.row[-1] + 1
    assert len(load_beijing("none", steps=0)[0]) == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="split"):
        load_beijing(split="random")
    with pytest.raises(ValueError, match="normalisation"):
        load_beijing("zscore")


# ---------------------------------------------------------------- paper normalisation


@pytest.mark.parametrize("extras", [False, True])
def test_paper_normalisation(raw_fleet: Fleet, extras: bool) -> None:
    fleet = load_beijing("paper", extras=extras)
    norms = np.concatenate([np.linalg.norm(s.X, axis=1) for s in fleet])
    assert abs(norms.max() - 1.0) <= 4 * np.finfo(float).eps
    ys = np.concatenate([s.y for s in fleet])
    assert ys.min() == 0.0 and ys.max() == 1.0
    assert fleet.scaling["method"] == "paper"
    if not extras:
        raw_y = np.concatenate([s.y for s in raw_fleet])
        assert (fleet.scaling["y_min"], fleet.scaling["y_max"]) == (raw_y.min(), raw_y.max())
        for s, r in zip(fleet, raw_fleet, strict=True):
            np.testing.assert_allclose(s.to_original(s.y), r.y, rtol=1e-12)
            np.testing.assert_allclose(s.X * fleet.scaling["x_norm"], r.X, rtol=1e-12)


def test_paper_constants_are_whole_dataset_whatever_the_cut() -> None:
    full, cut = load_beijing("paper"), load_beijing("paper", steps=50)
    mixed = load_beijing("paper", split="mixed")
    assert dict(full.scaling) == dict(cut.scaling) == dict(mixed.scaling)
    assert np.array_equal(cut[3].X, full[3].X[:50])


@given(st.integers(1, 4), st.integers(1, 30), st.integers(1, 4), st.integers(0, 2**32 - 1))
@settings(max_examples=25, deadline=None)
def test_paper_invariants_on_any_fleet(n_clients: int, n_steps: int, d: int, seed: int) -> None:
    f = normalise(synthetic_fleet(n_clients, n_steps, d, seed), "paper")
    norms = np.concatenate([np.linalg.norm(s.X, axis=1) for s in f])
    ys = np.concatenate([s.y for s in f])
    assert abs(norms.max() - 1.0) <= 4 * np.finfo(float).eps
    assert ys.min() == 0.0 and ys.max() <= 1.0
    assert ys.max() == 1.0 or ys.size == 1


# ---------------------------------------------------------------- online normalisation


def test_online_loader_matches_plain_loop(raw_fleet: Fleet) -> None:
    fleet = load_beijing("online", steps=1500)
    for name in ("Aotizhongxin", "Dingling", "Wanliu"):
        s, raw = fleet[name], raw_fleet[name]
        assert (s.warmup, len(s)) == (2, 1500)
        zx, _, _ = past_only_loop(raw.X[:1502], 2)
        zy, oy, sy = past_only_loop(raw.y[:1502], 2)
        np.testing.assert_allclose(s.X, zx, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(s.y, zy[:, 0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(s.y_offset, oy[:, 0], rtol=1e-12)
        np.testing.assert_allclose(s.y_scale, sy[:, 0], rtol=1e-9)
        np.testing.assert_allclose(s.to_original(s.y), raw.y[2:1502], rtol=1e-12)
        assert np.array_equal(s.row, raw.row[2:1502])


def test_online_full_streams_account_for_every_row() -> None:
    for s in load_beijing("online", warmup=5):
        assert s.warmup == 5 and len(s) + s.skipped + s.warmup == BEIJING_ROWS
        assert np.all(np.isfinite(s.X)) and np.all(np.isfinite(s.y))


# quarter-integers: exact, and never so close together that two-pass and Welford statistics disagree
arrays = hnp.arrays(np.float64, st.tuples(st.integers(2, 40), st.integers(1, 3)),
                    elements=st.integers(-400, 400).map(lambda k: k / 4))


@given(arrays, st.integers(1, 3), st.data())
@settings(max_examples=60, deadline=None)
def test_online_uses_only_past_samples(v: np.ndarray, warmup: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(0, len(v) - 1))
    changed = v.copy()
    changed[t:] = data.draw(hnp.arrays(np.float64, changed[t:].shape, elements=st.floats(-1e6, 1e6)))
    before = online_standardise(v, warmup)
    after = online_standardise(changed, warmup)
    for a, b in zip(before, after, strict=True):  # outputs before t are bit-identical
        assert np.array_equal(a[:t], b[:t], equal_nan=True)
    z, off, sc = before
    assert np.all(np.isnan(z[:warmup]))
    if len(v) > warmup:
        ez, eo, es = past_only_loop(v, warmup)
        np.testing.assert_allclose(z[warmup:], ez, rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(z[warmup:] * sc[warmup:] + off[warmup:], v[warmup:], rtol=1e-9, atol=1e-9)


def test_running_standardiser_matches_batch() -> None:
    v = np.random.default_rng(3).normal(5.0, 2.0, size=(60, 3))
    v[:10, 1] = 4.0  # a stretch with zero spread
    z, _, _ = online_standardise(v, 3)
    rs = OnlineStandardiser(3, warmup=3)  # the agents' and estimators' one-sample-at-a-time form
    for t, x in enumerate(v):
        if t < 3:
            assert not rs.ready
        else:
            np.testing.assert_allclose(rs.transform(x), z[t], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(rs.mean + rs.scale * z[t], x, rtol=1e-12)
        rs.update(x)


# ---------------------------------------------------------------- mixed split


@pytest.mark.slow  # ~3-5 s: the whole Beijing fleet mixed
def test_mixed_split(raw_fleet: Fleet) -> None:
    fleet = load_beijing("none", split="mixed", seed=7)
    n = len(BEIJING_STATIONS)
    assert fleet.split == "mixed" and fleet.seed == 7
    for c, s in enumerate(fleet):
        assert s.name == f"{BEIJING_STATIONS[c]}-mixed"
        assert len(s) == len(raw_fleet[c])  # length = home length
        others = [(c + k) % n for k in range(4)]
        shares = np.array([np.mean(s.source == j) for j in others])
        assert set(np.unique(s.source)) == set(others)
        np.testing.assert_allclose(shares, [0.7, 0.1, 0.1, 0.1], atol=0.01)
        for j in others:  # each source is read in time order, each row at most once, none passed over
            m = s.source == j
            src = raw_fleet[j]
            k = int(m.sum())
            assert np.array_equal(s.row[m], src.row[:k])
            assert np.array_equal(s.X[m], src.X[:k]) and np.array_equal(s.y[m], src.y[:k])
        expected = sum(recount(BEIJING_STATIONS[j], [*INPUTS, "CO"], int(s.row[s.source == j].max()) + 1)[0]
                       for j in others)
        assert s.skipped == expected


def test_mixed_split_is_deterministic() -> None:
    a = load_beijing("paper", split="mixed", seed=1)
    b = load_beijing("paper", split="mixed", seed=1)
    c = load_beijing("paper", split="mixed", seed=2)
    cut = load_beijing("paper", split="mixed", seed=1, steps=300)
    for sa, sb, sc, sk in zip(a, b, c, cut, strict=True):
        assert np.array_equal(sa.X, sb.X) and np.array_equal(sa.source, sb.source)
        assert not np.array_equal(sa.source, sc.source)
        assert np.array_equal(sk.X, sa.X[:300]) and np.array_equal(sk.source, sa.source[:300])


def test_mixed_online_standardises_per_client() -> None:
    raw = load_beijing("none", split="mixed", seed=0, steps=402)
    on = load_beijing("online", split="mixed", seed=0, steps=400)
    for r, s in zip(raw, on, strict=True):
        z, _, _ = online_standardise(r.X, 2)
        np.testing.assert_allclose(s.X, z[2:], rtol=1e-12)
        assert np.array_equal(s.source, r.source[2:])


# ---------------------------------------------------------------- adapters


def test_from_csv_on_a_vendored_file_equals_the_loader(raw_fleet: Fleet) -> None:
    path = Path(str(DATA.joinpath(_file("Gucheng"))))
    s = from_csv(path, target="CO", features=INPUTS)
    ref = raw_fleet["Gucheng"]
    assert s.name == "PRSA_Data_Gucheng_20130301-20170228"
    assert np.array_equal(s.X, ref.X) and np.array_equal(s.y, ref.y) and np.array_equal(s.row, ref.row)
    assert (s.skipped, dict(s.skipped_by_column)) == (ref.skipped, dict(ref.skipped_by_column))
    # default features: the numeric columns; the text ones (wd, station) are named, not dropped silently
    with pytest.warns(UserWarning, match=r"left out of the inputs: \['wd', 'station'\]"):
        auto = from_csv(path, target="CO", n=10)
    assert auto.feature_names == ("No", "year", "month", "day", "hour", *INPUTS)
    assert len(auto) == 10


def test_from_csv_skips_and_counts(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("a;b;y\n1;2;3\n;2;3\nx;y;z\n4;inf;5\n6;7\n8;9;10\n")
    s = from_csv(p, "y", ["b", "a"], delimiter=";")
    assert s.feature_names == ("b", "a") and s.X.tolist() == [[2.0, 1.0], [9.0, 8.0]]
    assert s.skipped == 4 and dict(s.skipped_by_column) == {"b": 2, "a": 2, "y": 2}
    assert s.row.tolist() == [0, 5]
    with pytest.raises(ValueError, match="target"):
        from_csv(p, "q", delimiter=";")


@given(hnp.arrays(np.float64, st.tuples(st.integers(0, 25), st.integers(2, 4)),
                  elements=st.floats(-1e6, 1e6, allow_subnormal=False)), st.data())
@settings(max_examples=30, deadline=None)
def test_from_csv_round_trip(values: np.ndarray, data: st.DataObject) -> None:
    holes = data.draw(hnp.arrays(np.bool_, values.shape, elements=st.booleans()))
    names = [f"c{j}" for j in range(values.shape[1])]
    text = ",".join(names) + "\n" + "".join(
        ",".join("NA" if h else repr(float(v)) for v, h in zip(row, hrow, strict=True)) + "\n"
        for row, hrow in zip(values, holes, strict=True))
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "r.csv"
        p.write_text(text)
        s = from_csv(p, target=names[-1], features=names[:-1])
    keep = ~holes.any(axis=1)
    assert len(s) + s.skipped == len(values) and s.skipped == int((~keep).sum())
    assert np.array_equal(s.X, values[keep][:, :-1]) and np.array_equal(s.y, values[keep][:, -1])
    assert dict(s.skipped_by_column) == {n: int(holes[:, j].sum()) for j, n in enumerate(names)}


def test_from_river_trump_approval_is_local() -> None:
    from river import datasets

    ds = datasets.TrumpApproval()
    assert Path(ds.path).exists()  # bundled with river: no download
    s = from_river(ds)
    assert s.name == "TrumpApproval" and len(s) == ds.n_samples == 1001 and s.skipped == 0
    assert list(s.feature_names) == sorted(next(iter(ds))[0])
    for (x, y), (x2, y2) in zip(ds, iter_dicts(s), strict=True):
        assert x2 == {k: float(v) for k, v in x.items()} and y2 == y
    assert len(from_river(datasets.TrumpApproval(), n=5)) == 5


def test_from_river_skips_and_counts() -> None:
    rows = [({"b": 1, "a": 2.0}, 1.0), ({"a": None, "b": 1}, 2.0), ({"a": 1.0}, 3.0),
            ({"a": 1.0, "b": "x"}, float("nan")), ({"a": True, "b": np.int64(4), "c": 9}, np.float32(5))]
    s = from_river(rows)
    assert s.X.tolist() == [[2.0, 1.0], [1.0, 4.0]] and s.y.tolist() == [1.0, 5.0]
    assert s.skipped == 3 and dict(s.skipped_by_column) == {"a": 1, "b": 2, "y": 1}
    assert s.row.tolist() == [0, 4]


def test_iter_dicts_round_trip() -> None:
    s = load_beijing("paper", steps=20)[0]
    pairs = list(iter_dicts(s))
    assert len(pairs) == 20 and list(pairs[0][0]) == list(BEIJING_INPUTS)
    assert np.array_equal([list(x.values()) for x, _ in pairs], s.X) and [y for _, y in pairs] == s.y.tolist()


# ---------------------------------------------------------------- synthetic fleet and data types


@given(st.integers(1, 4), st.integers(0, 40), st.integers(1, 5), st.integers(0, 2**32 - 1),
       st.floats(0.0, 1.0))
@settings(max_examples=30, deadline=None)
def test_synthetic_is_deterministic_and_prefix_stable(n_clients: int, n_steps: int, d: int, seed: int,
                                                     h: float) -> None:
    a = synthetic_fleet(n_clients, n_steps, d, seed, heterogeneity=h)
    b = synthetic_fleet(n_clients, n_steps, d, seed, heterogeneity=h)
    longer = synthetic_fleet(n_clients + 1, n_steps + 5, d, seed, heterogeneity=h)
    assert len(a) == n_clients and a.n_inputs == d
    for sa, sb, sl in zip(a, b, longer, strict=False):
        assert np.array_equal(sa.X, sb.X) and np.array_equal(sa.y, sb.y)
        assert np.array_equal(sl.X[:n_steps], sa.X) and np.array_equal(sl.y[:n_steps], sa.y)
        assert np.all(np.isfinite(sa.y))


def test_synthetic_heterogeneity() -> None:
    def client_functions(h: float) -> list[np.ndarray]:
        f = synthetic_fleet(4, 300, 2, seed=5, noise=0.0, heterogeneity=h)
        # noise-free targets at common inputs, via each client's least-squares fit on a quadratic basis
        grid = np.random.default_rng(0).uniform(-1, 1, size=(50, 2))

        def quad(X: np.ndarray) -> np.ndarray:
            return np.column_stack([np.ones(len(X)), X, X**2, X[:, :1] * X[:, 1:]])

        return [quad(grid) @ np.linalg.lstsq(quad(s.X), s.y, rcond=None)[0] for s in f]

    same, diff = client_functions(0.0), client_functions(1.0)
    spread = lambda fs: np.mean([np.std(fs[i] - fs[0]) for i in range(1, 4)])  # noqa: E731
    assert spread(same) < 0.1 and spread(diff) > 10 * spread(same)
    assert not np.array_equal(synthetic_fleet(2, 10, 2, 1).streams[0].y, synthetic_fleet(2, 10, 2, 2)[0].y)


def test_client_stream_validation_and_immutability() -> None:
    X = np.zeros((3, 2))
    s = ClientStream("a", X, np.zeros(3), ("u", "v"), skipped_by_column={"u": 1})
    assert X.flags.writeable and not s.X.flags.writeable  # caller's array untouched, stored copy frozen
    with pytest.raises(ValueError):
        s.X[0, 0] = 1.0
    with pytest.raises(TypeError):
        s.skipped_by_column["u"] = 2  # type: ignore[index]
    with pytest.raises(ValueError, match="rows"):
        ClientStream("a", np.zeros((2, 2)), np.zeros(3), ("u", "v"))
    with pytest.raises(ValueError, match="names"):
        ClientStream("a", X, np.zeros(3), ("u",))
    with pytest.raises(ValueError, match="unique"):
        Fleet((s, s), dataset="x", normalisation="none", split="custom")
