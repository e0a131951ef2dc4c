"""Tests of streamfed.evaluation.datasets.csv_fleet: any CSV file as a Fleet (`streamfed replay --dataset PATH.csv`).

Expected arrays are written out by hand or transcribed plainly with numpy/the csv module; the loader is
never used to produce its own expectations.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from streamfed.evaluation.datasets import (
    BEIJING_INPUTS,
    CsvReport,
    csv_fleet,
    csv_fleet_with_report,
    load_beijing,
)
from streamfed.evaluation.replay import AlgorithmConfig, replay

DATA = resources.files("streamfed").joinpath("data", "beijing-air")

# Two clients, 'b' first; every kind of bad row once. Data rows (blank line not counted):
# 0 b ok | 1 a ok | 2 b hum missing | 3 a load non-numeric | 4 no client | 5 b ok (multi-line quoted text)
# 6 a ok | 7 b too many fields | 8 a hum 'inf' | 9 b ok
TOY = (
    "when,site,temp,hum,load,comment\n"
    't0,b,1,10,5,"fine, thanks"\n'
    "t1,a,2,20,7,ok\n"
    "t2,b,3,NA,9,missing hum\n"
    "t3,a,4,40,oops,bad target\n"
    "t4,,5,50,11,no client\n"
    "\n"
    't5,b,6,60,13,"multi\nline"\n'
    "t6,a,7,70,15,ok\n"
    "t7,b,8,80,17,ok,EXTRA\n"
    "t8,a,9,inf,19,inf hum\n"
    "t9,b,10,100,21,ok\n"
)
RAW_B_X = np.array([[1.0, 10.0], [6.0, 60.0], [10.0, 100.0]])
RAW_B_Y = np.array([5.0, 13.0, 21.0])
RAW_A_X = np.array([[2.0, 20.0], [7.0, 70.0]])
RAW_A_Y = np.array([7.0, 15.0])


def write(tmp_path: Path, text: str | bytes, name: str = "toy.csv") -> Path:
    p = tmp_path / name
    data = text.encode("utf-8") if isinstance(text, str) else text
    p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return p


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    return write(tmp_path, TOY)


# --------------------------------------------------------------------------- reading and skipping


def test_two_clients_raw_arrays_and_skip_counts(toy: Path) -> None:
    fleet, rep = csv_fleet_with_report(toy, "load", client_column="site", normalisation="none")
    assert fleet.names == ("b", "a")  # order of first appearance
    assert fleet.feature_names == ("temp", "hum")  # 'when', 'comment' are text; 'hum' mostly numbers
    assert fleet.target == "load" and fleet.dataset == "toy" and fleet.split == "column:site"
    b, a = fleet["b"], fleet["a"]
    np.testing.assert_array_equal(b.X, RAW_B_X)
    np.testing.assert_array_equal(b.y, RAW_B_Y)
    np.testing.assert_array_equal(a.X, RAW_A_X)
    np.testing.assert_array_equal(a.y, RAW_A_Y)
    assert b.row.tolist() == [0, 5, 9] and a.row.tolist() == [1, 6]
    # per client: b lost row 2 (hum missing) and row 7 (too many fields); a lost rows 3 and 8
    assert (b.skipped, dict(b.skipped_by_column)) == (2, {"temp": 0, "hum": 1, "load": 0})
    assert (a.skipped, dict(a.skipped_by_column)) == (2, {"temp": 0, "hum": 1, "load": 1})
    # whole file, by reason
    assert (rep.rows, rep.samples, rep.skipped) == (10, 5, 5)
    assert dict(rep.missing) == {"temp": 0, "hum": 1, "load": 0}
    assert dict(rep.non_numeric) == {"temp": 0, "hum": 1, "load": 1}
    assert (rep.too_many_fields, rep.no_client, rep.truncated, rep.bom) == (1, 1, False, False)
    assert isinstance(rep, CsvReport)
    assert list(rep.ignored) == ["when", "comment"]
    assert rep.ignored["when"].startswith("non-numeric (9 of 9 values are text")
    assert rep.clients == ("b", "a") and rep.dropped_clients == ()
    s = rep.summary()
    assert "\n" not in s
    for part in ("10 rows read", "5 samples", "2 clients by 'site'", "5 skipped", "hum missing 1",
                 "hum non-numeric 1", "load non-numeric 1", "too many fields 1", "no client 1"):
        assert part in s, part


def test_paper_normalisation_matches_numpy_transcription(toy: Path) -> None:
    fleet = csv_fleet(toy, "load", client_column="site")  # default: "paper", as load_beijing
    assert fleet.normalisation == "paper"
    allx = np.vstack([RAW_B_X, RAW_A_X])
    ally = np.concatenate([RAW_B_Y, RAW_A_Y])
    x_norm = np.sqrt((allx**2).sum(axis=1)).max()  # = sqrt(10**2 + 100**2)
    assert x_norm == math.sqrt(10100.0)
    lo, hi = ally.min(), ally.max()  # 5, 21
    np.testing.assert_allclose(fleet["b"].X, RAW_B_X / x_norm, rtol=1e-15)
    np.testing.assert_allclose(fleet["a"].X, RAW_A_X / x_norm, rtol=1e-15)
    np.testing.assert_allclose(fleet["b"].y, (RAW_B_Y - 5.0) / 16.0, rtol=1e-15)
    np.testing.assert_allclose(fleet["a"].y, (RAW_A_Y - lo) / (hi - lo), rtol=1e-15)
    assert dict(fleet.scaling) == {"method": "paper", "x_norm": x_norm, "y_min": 5.0, "y_max": 21.0}
    np.testing.assert_allclose(fleet["b"].to_original(fleet["b"].y), RAW_B_Y)


def _online_transcription(v: np.ndarray, warmup: int = 2) -> np.ndarray:
    """z[t] = (v[t] - mean(v[:t])) / std(v[:t], ddof=1); zero spread -> |mean|, or 1 if the mean is 0."""
    out = []
    for t in range(warmup, v.shape[0]):
        past = v[:t]
        mean = past.mean(axis=0)
        sd = past.std(axis=0, ddof=1)
        sd = np.where(sd > 0, sd, np.where(mean != 0, np.abs(mean), 1.0))
        out.append((v[t] - mean) / sd)
    return np.array(out)


def test_online_normalisation_is_causal_per_client_and_drops_short_clients(toy: Path) -> None:
    fleet, rep = csv_fleet_with_report(toy, "load", client_column="site", normalisation="online")
    # 'a' has only 2 valid rows = the warm-up: no sample left, so it is left out and named
    assert fleet.names == ("b",) and rep.dropped_clients == ("a",)
    b = fleet["b"]
    # by hand: past of the 3rd sample is (1, 10; y 5) and (6, 60; y 13)
    np.testing.assert_allclose(b.X, [[(10 - 3.5) / math.sqrt(12.5), (100 - 35) / math.sqrt(1250)]], rtol=1e-12)
    np.testing.assert_allclose(b.y, [(21 - 9) / math.sqrt(32)], rtol=1e-12)
    assert b.warmup == 2 and b.row.tolist() == [9]

    rng = np.random.default_rng(7)
    T = 40
    lines = ["g,x1,x2,rain,y"]
    raw: dict[str, list[list[float]]] = {"p": [], "q": []}
    for t in range(T):
        for g in ("q", "p") if t % 3 else ("p", "q"):
            x1, x2 = (float(v) for v in np.round(rng.normal(size=2), 6))
            rain = 0.0 if t < 6 else float(np.round(rng.uniform(), 6))  # zero spread at first
            y = float(np.round(2 * x1 - x2 + rng.normal(scale=0.1), 6))
            lines.append(f"{g},{x1!r},{x2!r},{rain!r},{y!r}")
            raw[g].append([x1, x2, rain, y])
    p = write(toy.parent, "\n".join(lines) + "\n", "gen.csv")
    fleet = csv_fleet(p, "y", client_column="g", normalisation="online")
    assert fleet.names == ("p", "q")
    for g in ("p", "q"):
        z = _online_transcription(np.array([[float(v) for v in r] for r in raw[g]]))
        np.testing.assert_allclose(fleet[g].X, z[:, :3], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(fleet[g].y, z[:, 3], rtol=1e-10, atol=1e-12)
        assert len(fleet[g]) == T - 2


def test_explicit_features_in_given_order_as_list_or_comma_string(toy: Path) -> None:
    f1, rep = csv_fleet_with_report(toy, "load", client_column="site", features=["hum", "temp"],
                                    normalisation="none")
    f2 = csv_fleet(toy, "load", client_column="site", features=" hum, temp ", normalisation="none")
    assert f1.feature_names == f2.feature_names == ("hum", "temp")
    np.testing.assert_array_equal(f1["b"].X, RAW_B_X[:, ::-1])
    np.testing.assert_array_equal(f2["a"].X, RAW_A_X[:, ::-1])
    assert dict(rep.ignored) == {}  # nothing was detected, so nothing left out by detection
    # only temp: the hum-missing row of b and the hum=inf row of a are now valid samples
    f3 = csv_fleet(toy, "load", client_column="site", features="temp", normalisation="none")
    assert f3["b"].X.ravel().tolist() == [1.0, 3.0, 6.0, 10.0]
    assert f3["a"].X.ravel().tolist() == [2.0, 7.0, 9.0] and f3["a"].y.tolist() == [7.0, 15.0, 19.0]


def test_single_client_named_after_file_and_gzip(tmp_path: Path) -> None:
    text = "x,y\n1,2\n3,4\nNA,5\n"
    for name in ("meter.csv", "meter.csv.gz"):
        fleet, rep = csv_fleet_with_report(write(tmp_path, text, name), "y", normalisation="none")
        assert fleet.names == ("meter",) and fleet.split == "single"
        assert fleet["meter"].X.tolist() == [[1.0], [3.0]] and fleet["meter"].y.tolist() == [2.0, 4.0]
        assert fleet["meter"].skipped == 1 and rep.missing["x"] == 1


def test_utf8_bom_is_dropped(tmp_path: Path) -> None:
    text = "site,x,y\r\nA,1,2\r\nA,3,5\r\nB,4,6\r\n"  # CRLF too
    plain = csv_fleet(write(tmp_path, text, "plain.csv"), "y", client_column="site", normalisation="none")
    p = write(tmp_path, b"\xef\xbb\xbf" + text.encode(), "bom.csv")
    fleet, rep = csv_fleet_with_report(p, "y", client_column="site", normalisation="none")  # 'site' is first
    assert rep.bom and rep.encoding == "utf-8-sig" and rep.columns == ("site", "x", "y")
    assert fleet.names == plain.names == ("A", "B")
    assert fleet["A"].X.tolist() == [[1.0], [3.0]] and fleet["A"].y.tolist() == [2.0, 5.0]
    assert csv_fleet(p, "y", client_column="site", encoding="UTF8", normalisation="none").names == ("A", "B")


def test_other_encoding_and_delimiter(tmp_path: Path) -> None:
    p = write(tmp_path, "ville;x;y\nZürich;1;2\nGenève;3;4\nZürich;5;6\n".encode("latin-1"), "fr.csv")
    fleet = csv_fleet(p, "y", client_column="ville", encoding="latin-1", delimiter=";", normalisation="none")
    assert fleet.names == ("Zürich", "Genève")
    assert fleet["Zürich"].X.tolist() == [[1.0], [5.0]]


def test_max_rows_counts_rows_read_including_skipped(toy: Path) -> None:
    fleet, rep = csv_fleet_with_report(toy, "load", client_column="site", max_rows=4, normalisation="none")
    assert (rep.rows, rep.samples, rep.skipped, rep.truncated) == (4, 2, 2, True)
    assert fleet["b"].X.tolist() == [[1.0, 10.0]] and fleet["a"].X.tolist() == [[2.0, 20.0]]
    assert "max_rows reached" in rep.summary()
    _, rep = csv_fleet_with_report(toy, "load", client_column="site", max_rows=10, normalisation="none")
    assert (rep.rows, rep.truncated) == (10, False)


def test_max_clients_guard(toy: Path) -> None:
    with pytest.raises(ValueError, match=r"client column 'when' has more than 3 distinct values"):
        csv_fleet(toy, "load", client_column="when", features="temp", max_clients=3)
    assert len(csv_fleet(toy, "load", client_column="when", features="temp", max_clients=None)) == 8


# --------------------------------------------------------------------------- errors: one line, naming the problem


def _err(path: Path | str, target: str | None, **kw: object) -> str:
    with pytest.raises(ValueError) as info:
        csv_fleet(path, target, **kw)  # type: ignore[arg-type]
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.startswith(str(path)), msg
    return msg


def test_error_missing_file_and_directory(tmp_path: Path) -> None:
    assert "no such file" in _err(tmp_path / "nope.csv", "y")
    assert "not a regular file" in _err(tmp_path, "y")


def test_error_undecodable_names_encoding_and_line(tmp_path: Path) -> None:
    p = write(tmp_path, b"city,x,y\nZ\xfcrich,1,2\n", "latin.csv")
    msg = _err(p, "y")
    assert "cannot decode as utf-8" in msg and "line 2" in msg and "0xfc" in msg and "encoding=" in msg
    assert "cannot decode as ascii" in _err(p, "y", encoding="ascii")
    u16 = write(tmp_path, "x,y\n1,2\n".encode("utf-16"), "u16.csv")
    assert "UTF-16 byte-order mark" in _err(u16, "y")
    assert csv_fleet(u16, "y", encoding="utf-16", normalisation="none")[0].X.tolist() == [[1.0]]
    assert "unknown encoding 'klingon'" in _err(p, "y", encoding="klingon")


def test_error_empty_and_header_only(tmp_path: Path) -> None:
    assert "empty file" in _err(write(tmp_path, "", "empty.csv"), "y")
    assert "empty file" in _err(write(tmp_path, "\n\r\n\n", "blank.csv"), "y")
    assert "empty file" in _err(write(tmp_path, b"\xef\xbb\xbf", "bomonly.csv"), "y")
    msg = _err(write(tmp_path, "x,y\n\n", "hdr.csv"), "y")
    assert "header only, no data rows" in msg and "'x', 'y'" in msg


def test_error_unknown_columns_list_existing_ones(toy: Path) -> None:
    cols = "columns are: 'when', 'site', 'temp', 'hum', 'load', 'comment'"
    msg = _err(toy, "Load")
    assert "target column 'Load' not found" in msg and "did you mean 'load'" in msg and cols in msg
    msg = _err(toy, "load", features="temp,pressure,humidity")
    assert "feature column(s) 'pressure', 'humidity' not found" in msg and cols in msg
    msg = _err(toy, "load", client_column="station")
    assert "client column 'station' not found" in msg and cols in msg
    assert "no target column given" in _err(toy, None) and cols in _err(toy, None)


def test_error_conflicting_roles(toy: Path) -> None:
    assert "client column and the target are both 'load'" in _err(toy, "load", client_column="load")
    assert "feature 'load' is also the target" in _err(toy, "load", features="temp,load")
    assert "feature 'site' is also the client column" in _err(toy, "load", client_column="site", features="site")
    assert "features list a column twice" in _err(toy, "load", features="temp,temp")
    p = write(toy.parent, "x,x,y\n1,2,3\n", "dup.csv")
    assert "appear more than once" in _err(p, "y", features="x")


def test_duplicate_header_names_are_left_out_of_detection(tmp_path: Path) -> None:
    p = write(tmp_path, "x,x,z,y\n1,2,3,4\n5,6,7,8\n", "dup.csv")
    fleet, rep = csv_fleet_with_report(p, "y", normalisation="none")
    assert fleet.feature_names == ("z",) and rep.ignored["x"] == "name appears more than once"


def test_error_no_numeric_feature_left(tmp_path: Path) -> None:
    p = write(tmp_path, "name,city,y\nann,paris,1\nbob,rome,2\n", "text.csv")
    msg = _err(p, "y")
    assert "no numeric feature column besides target 'y'" in msg and "'name', 'city', 'y'" in msg
    msg = _err(p, "y", client_column="name")
    assert "no numeric feature column besides target 'y' and client column 'name'" in msg


def test_error_no_usable_row_says_why(tmp_path: Path) -> None:
    p = write(tmp_path, "x,y\n1,a\n2,NA\n", "bad.csv")
    msg = _err(p, "y")
    assert "no usable rows: 0 of 2 data rows are valid" in msg and "y missing 1" in msg and "y non-numeric 1" in msg


def test_error_arguments_and_bad_gzip(toy: Path) -> None:
    assert "normalisation must be one of" in _err(toy, "load", normalisation="zscore")
    assert "max_rows must be >= 1" in _err(toy, "load", max_rows=0)
    bad = toy.parent / "x.csv.gz"
    bad.write_bytes(b"not gzip")
    assert "cannot read" in _err(bad, "y")


# --------------------------------------------------------------------------- replay and the vendored Beijing files


def test_csv_fleet_runs_through_replay(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["t", "unit", "u", "v", "w", "target"])
    for t in range(120):
        for unit in ("north", "south", "east"):
            u, v, wv = rng.normal(size=3)
            w.writerow([t, unit, f"{u:.5f}", f"{v:.5f}", "NA" if t % 17 == 5 else f"{wv:.5f}",
                        f"{math.sin(u) + 0.5 * v + 0.1 * rng.normal():.5f}"])
    fleet = csv_fleet(write(tmp_path, buf.getvalue(), "units.csv"), "target", client_column="unit",
                      features="u,v,w")
    assert fleet.names == ("north", "south", "east") and all(len(s) == 113 for s in fleet)
    result = replay(fleet, "pofmkl", steps=50)
    assert np.isfinite(result.mse) and result.mse < 1.0
    assert all(np.isfinite(result.mse_per_client))


def _beijing_file(station: str) -> str:
    return f"PRSA_Data_{station}_20130301-20170228.csv.gz"


def _beijing_rows(station: str, n: int) -> tuple[list[str], list[list[str]]]:
    """The first n data rows of a vendored station file, read with the csv module alone."""
    text = gzip.decompress(DATA.joinpath(_beijing_file(station)).read_bytes()).decode("ascii")
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    return header, [r for _, r in zip(range(n), reader, strict=False)]


def _beijing_path(station: str) -> Path:
    return Path(str(DATA.joinpath(_beijing_file(station))))  # the package is installed as files


def test_beijing_station_file_read_through_csv_path() -> None:
    feats = ["PM10", "SO2", "NO2", "TEMP", "PRES", "DEWP", "WSPM"]
    fleet, rep = csv_fleet_with_report(_beijing_path("Aotizhongxin"), "PM2.5", features=",".join(feats),
                                       max_rows=400, normalisation="none")
    header, rows = _beijing_rows("Aotizhongxin", 400)
    cols = [header.index(c) for c in [*feats, "PM2.5"]]
    kept = [(i, [float(r[j]) for j in cols]) for i, r in enumerate(rows) if all(r[j] != "NA" for j in cols)]
    expected = np.array([v for _, v in kept])
    s = fleet[0]
    assert fleet.names == ("PRSA_Data_Aotizhongxin_20130301-20170228",) and fleet.target == "PM2.5"
    np.testing.assert_array_equal(s.X, expected[:, :-1])
    np.testing.assert_array_equal(s.y, expected[:, -1])
    assert s.row.tolist() == [i for i, _ in kept]
    assert rep.rows == 400 and rep.truncated and s.skipped == 400 - len(kept) > 0
    assert rep.missing["NO2"] == sum(r[header.index("NO2")] == "NA" for r in rows)
    # detection on the real header: every numeric column; 'wd' (compass words) and 'station' left out
    auto, rep = csv_fleet_with_report(_beijing_path("Aotizhongxin"), "PM2.5", max_rows=300)
    assert auto.feature_names == ("No", "year", "month", "day", "hour", "PM10", "SO2", "NO2", "CO", "O3",
                                  "TEMP", "PRES", "DEWP", "RAIN", "WSPM")
    assert set(rep.ignored) == {"wd", "station"}


def test_beijing_whole_station_equals_load_beijing() -> None:
    """Target CO and the loader's inputs: the same samples and skip counts as the dedicated loader."""
    station = "Dongsi"
    fleet = csv_fleet(_beijing_path(station), "CO", features=list(BEIJING_INPUTS), normalisation="none")
    ref = load_beijing("none")[station]
    np.testing.assert_array_equal(fleet[0].X, ref.X)
    np.testing.assert_array_equal(fleet[0].y, ref.y)
    np.testing.assert_array_equal(fleet[0].row, ref.row)
    assert fleet[0].skipped == ref.skipped and dict(fleet[0].skipped_by_column) == dict(ref.skipped_by_column)


def test_beijing_two_stations_in_one_file_by_station_column(tmp_path: Path) -> None:
    lines: list[str] = []
    for station in ("Shunyi", "Changping"):
        text = gzip.decompress(DATA.joinpath(_beijing_file(station)).read_bytes()).decode("ascii")
        head, *body = text.splitlines()
        lines = lines or [head]
        lines += body[:250]
    p = write(tmp_path, "\n".join(lines) + "\n", "two.csv")
    feats = "TEMP,PRES,DEWP,WSPM,PM10"
    fleet = csv_fleet(p, "PM2.5", client_column="station", features=feats, normalisation="none")
    assert fleet.names == ("Shunyi", "Changping")
    for station in fleet.names:
        alone = csv_fleet(_beijing_path(station), "PM2.5", features=feats, max_rows=250, normalisation="none")
        np.testing.assert_array_equal(fleet[station].X, alone[0].X)
        np.testing.assert_array_equal(fleet[station].y, alone[0].y)
    paper = csv_fleet(p, "PM2.5", client_column="station", features=feats)
    r = replay(paper, "pofmkl", AlgorithmConfig(n_kernels=4, n_features=20), steps=50)
    assert np.isfinite(r.mse)


def test_detection_majority_rule_and_header_whitespace(tmp_path: Path) -> None:
    # 'code' has one number among three texts: left out; 'x' has one stray word among numbers: kept
    p = write(tmp_path, " code , x ,y\nA1,1,10\nB2,2,20\n7,n/a?,30\nC3,4,40\n", "mix.csv")
    fleet, rep = csv_fleet_with_report(p, "y", normalisation="none")
    assert rep.columns == ("code", "x", "y") and fleet.feature_names == ("x",)
    assert rep.ignored == {"code": "non-numeric (3 of 4 values are text, e.g. 'A1')"}
    assert fleet[0].X.ravel().tolist() == [1.0, 2.0, 4.0] and rep.non_numeric["x"] == 1


# --------------------------------------------------------------------------- declared input columns

# Monday 2024-05-06 06:00 and Sunday 2024-05-12 18:00; rows 2-5 each have one bad value
DECLARED = (
    "time,site,mode,rain,temp,load\n"
    "2024-05-06T06:00:00,a,eco,yes,1.5,10\n"
    "2024-05-12 18:00,a,boost,NO,2.5,20\n"
    "2024-05-06T06:00:00,a,turbo,yes,1.5,30\n"       # unknown level
    "soon,a,eco,yes,1.5,40\n"                         # bad timestamp
    "2024-05-06T06:00:00,a,eco,perhaps,1.5,50\n"      # bad boolean
    "2024-05-06T06:00:00,a,eco,yes,warm,60\n"         # non-numeric number column
    "2024-05-06T06:00:00,a,,yes,1.5,70\n"             # missing
)
SUNDAY_6PM = [-1.0, 0.0, math.sin(12 * math.pi / 7), math.cos(12 * math.pi / 7)]


def test_declared_columns_are_encoded_as_an_agent_encodes_them(tmp_path: Path) -> None:
    path = write(tmp_path, DECLARED, "plant.csv")
    fleet, report = csv_fleet_with_report(path, "load", columns="temp,mode:category=eco|boost,rain:boolean,"
                                                                 "time:timestamp", normalisation="none")
    s = fleet["plant"]
    assert s.feature_names == ("temp", "mode=eco", "mode=boost", "rain", "time.hour_sin", "time.hour_cos",
                               "time.weekday_sin", "time.weekday_cos")
    assert np.allclose(s.X, [[1.5, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0],
                             [2.5, 0.0, 1.0, 0.0, *SUNDAY_6PM]])
    assert s.y.tolist() == [10.0, 20.0] and s.row.tolist() == [0, 1]
    assert report.skipped == 5 and report.samples == 2
    assert {r: dict(by) for r, by in report.invalid.items()} == {
        "unknown_level": {"mode": 1}, "bad_timestamp": {"time": 1}, "bad_boolean": {"rain": 1}}
    assert report.non_numeric["temp"] == 1 and report.missing["mode"] == 1
    assert dict(s.skipped_by_column) == {"temp": 1, "mode": 2, "rain": 1, "time": 1, "load": 0}
    line = report.summary()
    assert "inputs 'temp,mode:category=eco|boost,rain:boolean,time:timestamp' (8 numbers)" in line
    assert "mode unknown level 1" in line and "time bad timestamp 1" in line and "rain bad boolean 1" in line
    assert report.declared == "temp,mode:category=eco|boost,rain:boolean,time:timestamp" and report.hint() is None


def test_declared_columns_with_other_slot_hashing_and_a_spec_object(tmp_path: Path) -> None:
    from streamfed.fleet.columns import ColumnSpec, stable_bucket

    path = write(tmp_path, DECLARED, "plant.csv")
    spec = ColumnSpec.parse("mode:category=eco|*,site:hash=4")
    fleet, report = csv_fleet_with_report(path, "load", columns=spec, normalisation="none")
    x = fleet["plant"].X
    assert x.shape == (6, 6) and report.skipped == 1  # only the missing mode is skipped now
    assert x[:, :2].tolist() == [[1, 0], [0, 1], [0, 1], [1, 0], [1, 0], [1, 0]]  # boost, turbo → other
    hashed = np.zeros(4)
    hashed[stable_bucket("site=a", 4)] = 1.0
    assert all(np.array_equal(row, hashed) for row in x[:, 2:])


def test_declared_column_errors_are_one_line(toy: Path) -> None:
    cases = [
        (dict(columns="tmp,when:timestamp"), r"input column\(s\) 'tmp' not found \(did you mean 'temp'\?\)"),
        (dict(columns="load:boolean"), "input column 'load' is also the target"),
        (dict(columns="site:category=a|b", client_column="site"), "input column 'site' is also the client column"),
        (dict(columns="temp", features="temp"), "give features or declared input columns, not both"),
        (dict(columns="temp,when:wallclock"), "column 'when': unknown kind 'wallclock'"),
        (dict(columns="temp,site:hash=1"), "buckets must be a whole number from 2"),
        (dict(columns="temp,site:category="), "category needs its levels"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as e:
            csv_fleet(toy, "load", **kwargs)
        assert "\n" not in str(e.value) and str(e.value).startswith(str(toy))


def test_undeclared_text_columns_are_named_with_how_to_declare_them(tmp_path: Path) -> None:
    text = "when,site,mode,temp,load\n" + "".join(
        f"2024-05-0{1 + i % 7}T0{i % 10}:00:00,{'ab'[i % 2]},{['eco', 'boost'][i % 2]},{i},{2 * i}\n"
        for i in range(20))
    fleet, report = csv_fleet_with_report(write(tmp_path, text), "load", client_column="site")
    assert fleet.feature_names == ("temp",)
    assert dict(report.suggested) == {"when": "when:timestamp", "mode": "mode:category=eco|boost"}
    assert report.hint() == ("text columns left out: 'when', 'mode'; to learn from them declare the inputs, e.g. "
                             "--columns 'temp,when:timestamp,mode:category=eco|boost'")
    # and the suggestion works as it stands
    fleet2 = csv_fleet(write(tmp_path, text), "load", client_column="site",
                       columns="temp,when:timestamp,mode:category=eco|boost")
    assert fleet2.n_inputs == 1 + 4 + 2
    # the toy file's comments and 't0'..'t9' ids are text, but nothing to learn from: named, no suggestion
    _, toy_report = csv_fleet_with_report(write(tmp_path, TOY), "load", client_column="site")
    assert set(toy_report.ignored) == {"when", "comment"} and dict(toy_report.suggested) == {}
    assert toy_report.hint() is None
    # no numeric input at all: the error says how to declare the text ones
    only_text = "mode,load\n" + "eco,1\nboost,2\neco,3\n"
    with pytest.raises(ValueError, match=r"no numeric feature column .*declare text columns to use them, e\.g\. "
                                         r"--columns 'mode:category=eco\|boost'"):
        csv_fleet(write(tmp_path, only_text), "load")


def test_declared_category_and_timestamp_beat_the_numbers_alone_in_replay(tmp_path: Path) -> None:
    """The target depends on an operating mode (text) and the hour of day (a timestamp column): declaring
    them must beat the replay on the numeric column alone, which is all that detection keeps."""
    import datetime as dt

    rng = np.random.default_rng(7)
    offset = {"eco": -1.0, "normal": 0.0, "boost": 1.5}
    start = dt.datetime(2024, 5, 6)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["time", "unit", "mode", "temp", "load"])
    for k in range(24 * 30):
        t = start + dt.timedelta(hours=k)
        for unit in ("u1", "u2"):
            mode = str(rng.choice(list(offset)))
            temp = rng.normal()
            y = offset[mode] + math.sin(2 * math.pi * t.hour / 24) + 0.3 * temp + 0.1 * rng.normal()
            w.writerow([t.isoformat(), unit, mode, f"{temp:.4f}", f"{y:.4f}"])
    path = write(tmp_path, buf.getvalue(), "units.csv")
    plain, plain_report = csv_fleet_with_report(path, "load", client_column="unit")
    assert plain.feature_names == ("temp",) and set(plain_report.suggested) == {"time", "mode"}
    declared = csv_fleet(path, "load", client_column="unit", columns="temp,mode:category=eco|normal|boost,"
                                                                     "time:timestamp")
    assert declared.n_inputs == 8 and len(declared["u1"]) == len(plain["u1"]) == 720
    cfg = AlgorithmConfig(n_kernels=4, n_features=20)
    mse_plain = replay(plain, "fedbnr", cfg).mse
    mse_declared = replay(declared, "fedbnr", cfg).mse
    # same target scaling in both (paper normalisation of the same rows): MSEs compare directly
    assert mse_declared < 0.25 * mse_plain, (mse_declared, mse_plain)
