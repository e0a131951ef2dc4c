"""The Beijing loader's cache of parsed station tables (issue 29): what it returns is the parser's table bit for bit,
whether read back, parsed after a damaged or malformed cached file (which is then replaced), or with the cache
off or unwritable."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from streamfed.evaluation.datasets import beijing

STATION = "Dongsi"


@pytest.fixture(scope="module")
def data() -> bytes:
    return resources.files("streamfed").joinpath("data", "beijing-air", beijing.station_file(STATION)).read_bytes()


@pytest.fixture(scope="module")
def parsed(data: bytes) -> np.ndarray:
    return beijing._parse_station(STATION, data)


def _same(a: np.ndarray, b: np.ndarray) -> bool:  # NaN where the CSV says NA: compared by their bits
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def test_a_table_is_cached_then_read_back_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      data: bytes, parsed: np.ndarray) -> None:
    monkeypatch.setenv(beijing.CACHE_ENV, str(tmp_path))
    first = beijing._parsed_table(STATION, data)
    files = list(tmp_path.glob(f"{STATION}-*.npy"))
    assert len(files) == 1 and _same(first, parsed)
    monkeypatch.setattr(beijing, "_parse_station", lambda *a: pytest.fail("parsed though cached"))
    assert _same(beijing._parsed_table(STATION, data), parsed)


def test_other_bytes_are_not_answered_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     data: bytes) -> None:
    monkeypatch.setenv(beijing.CACHE_ENV, str(tmp_path))
    beijing._parsed_table(STATION, data)
    other = resources.files("streamfed").joinpath("data", "beijing-air", beijing.station_file("Tiantan")).read_bytes()
    assert _same(beijing._parsed_table(STATION, other), beijing._parse_station(STATION, other))
    assert len(list(tmp_path.glob("*.npy"))) == 2


@pytest.mark.parametrize("damage", ["truncated", "garbage", "wrong shape", "wrong dtype"])
def test_a_damaged_cached_table_is_parsed_again_and_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             data: bytes, parsed: np.ndarray, damage: str) -> None:
    monkeypatch.setenv(beijing.CACHE_ENV, str(tmp_path))
    beijing._parsed_table(STATION, data)
    (path,) = tmp_path.glob(f"{STATION}-*.npy")
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "garbage":
        path.write_bytes(b"not a table")
    elif damage == "wrong shape":
        np.save(path, parsed[:, :5])
    else:
        np.save(path, parsed.astype(np.float32))
    assert _same(beijing._parsed_table(STATION, data), parsed)
    assert _same(np.load(path), parsed)  # replaced by the parsed table


def test_without_a_usable_cache_the_table_is_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    data: bytes, parsed: np.ndarray) -> None:
    monkeypatch.setenv(beijing.CACHE_ENV, "off")
    assert beijing.cache_dir() is None and _same(beijing._parsed_table(STATION, data), parsed)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(beijing.CACHE_ENV, str(blocked / "cache"))
    assert _same(beijing._parsed_table(STATION, data), parsed)
