"""The Beijing multi-site air-quality streams (docs/algorithms.md §11), from the vendored CSVs.

Target `CO`; inputs :data:`BEIJING_INPUTS`, optionally followed by :data:`BEIJING_EXTRAS` (wind
direction as the sine and cosine of its compass bearing — N = 0°, E = 90°, so `wd_sin` is the
eastward and `wd_cos` the northward component — and hour of day as `sin/cos(2π·hour/24)`).
A row with `NA` in any used column is skipped and counted, never imputed. Each station file is
parsed once per process and kept in memory (read-only arrays).

Splits:

- `"station"`: client `c` is station `BEIJING_STATIONS[c]`, its valid rows in time order.
- `"mixed"`: client `c` has home station `c` and others `c+1, c+2, c+3` (mod 12). Its length is
  the number of valid rows of its home station. At each step the source is drawn with probabilities
  (0.7, 0.1, 0.1, 0.1) by `numpy.random.default_rng([seed, c]).choice`, and the client takes that
  source's next not-yet-used valid row in time order. (If a source ran out, which cannot happen
  with these lengths, its draws would go to the home station instead.) Deterministic for a seed.

Skipped counts cover the rows a client has read: for each source, every row up to its last used
one, and the whole file once all of a source's valid rows have been used (a full station stream
therefore has `len + skipped (+ warmup) == 35064`).
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from streamfed.evaluation.datasets.base import ClientStream, Fleet
from streamfed.evaluation.datasets.normalise import DEFAULT_WARMUP, normalise_streams, paper_constants

log = logging.getLogger(__name__)

BEIJING_STATIONS: tuple[str, ...] = (
    "Aotizhongxin", "Changping", "Dingling", "Dongsi", "Guanyuan", "Gucheng",
    "Huairou", "Nongzhanguan", "Shunyi", "Tiantan", "Wanliu", "Wanshouxigong",
)
BEIJING_TARGET = "CO"
BEIJING_INPUTS: tuple[str, ...] = (
    "PM2.5", "PM10", "SO2", "NO2", "O3", "TEMP", "PRES", "DEWP", "RAIN", "WSPM",
)
BEIJING_EXTRAS: tuple[str, ...] = ("wd_sin", "wd_cos", "hour_sin", "hour_cos")
BEIJING_ROWS = 35064
SPLITS: tuple[str, ...] = ("station", "mixed")
MIXED_PROBABILITIES: tuple[float, ...] = (0.7, 0.1, 0.1, 0.1)

_COLUMNS: tuple[str, ...] = ("No", "year", "month", "day", "hour", "PM2.5", "PM10", "SO2", "NO2", "CO",
                             "O3", "TEMP", "PRES", "DEWP", "RAIN", "wd", "WSPM", "station")
_WD_COL = _COLUMNS.index("wd")
COMPASS: tuple[str, ...] = ("N", "NNE", "NE", "ENE", "E", "ESE", "SE", "SSE",
                            "S", "SSW", "SW", "WSW", "W", "WNW", "NW", "NNW")


def _compass_code(letters: bytes) -> int:
    """Base-5 code of a compass word (N=1, E=2, S=3, W=4), the key the parser looks bearings up by."""
    code = 0
    for ch in letters:
        code = code * 5 + b" NESW".index(ch)
    return code


_BEARINGS = np.full(5**3, np.nan)
for _i, _word in enumerate(COMPASS):
    _BEARINGS[_compass_code(_word.encode())] = 22.5 * _i


def station_file(station: str) -> str:
    """File name of a station's CSV inside the package data directory `streamfed/data/beijing-air/`."""
    if station not in BEIJING_STATIONS:
        raise ValueError(f"unknown station {station!r}; expected one of {BEIJING_STATIONS}")
    return f"PRSA_Data_{station}_20130301-20170228.csv.gz"


@dataclass(frozen=True)
class _Table:
    columns: dict[str, np.ndarray]  # every numeric column, NaN where missing; `wd` as a bearing
    time: np.ndarray  # datetime64[h]


# The parsed table of a station file is kept in a cache folder (`.npy`, named by a hash of the compressed file and
# of this format number: bump it when the parser's output changes): reading it back is ~50× cheaper than
# decompressing and parsing the CSV, which a short replay would otherwise pay for all 12 stations (the paper's
# normalisation looks at every row). The values are the parser's, bit for bit.
_PARSED_FORMAT = 1
CACHE_ENV = "STREAMFED_DATA_CACHE"  # a folder, or "off"; default $XDG_CACHE_HOME/streamfed/datasets


def cache_dir() -> Path | None:
    """Where parsed station tables are cached: ``$STREAMFED_DATA_CACHE`` (``off`` or empty: nowhere), else
    ``$XDG_CACHE_HOME/streamfed/datasets`` (``~/.cache`` without it)."""
    env = os.environ.get(CACHE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "no") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "streamfed" / "datasets"


def _parse_station(station: str, data: bytes) -> np.ndarray:
    """The `(rows, columns)` table of a station's compressed CSV `data` (`_COLUMNS`; see `_prsa_parser.parse_prsa`)."""
    raw = gzip.decompress(data)
    start = raw.index(b"\n") + 1
    header = [h.strip().strip('"') for h in raw[:start].decode("ascii").strip().split(",")]
    if tuple(header) != _COLUMNS:
        raise ValueError(f"{station}: unexpected header {header}")
    from streamfed.evaluation.datasets._prsa_parser import parse_prsa  # numba only when a file must be parsed

    out, err, hard = parse_prsa(np.frombuffer(raw, np.uint8), start, len(_COLUMNS), _WD_COL, _BEARINGS)
    if err != -1:
        line = raw[: err].count(b"\n") + 1
        raise ValueError(f"{station}: cannot parse line {line} near byte {err}")
    for r, c, b, e in hard:
        out[r, c] = float(raw[b:e])
    return out


def _parsed_table(station: str, data: bytes) -> np.ndarray:
    """`_parse_station`, through the cache folder: a table cached for these bytes is read back; a missing,
    unreadable or malformed one is parsed again and written (atomically; an unwritable folder is logged, not an
    error)."""
    folder = cache_dir()
    if folder is None:
        return _parse_station(station, data)
    key = hashlib.blake2b(data, digest_size=16, person=b"beijing-%d" % _PARSED_FORMAT).hexdigest()
    path = folder / f"{station}-{key}.npy"
    try:
        out = np.load(path, allow_pickle=False)
        if out.dtype == np.float64 and out.ndim == 2 and out.shape[1] == len(_COLUMNS) and out.flags.c_contiguous:
            return out
        log.info("%s: malformed cached table (%s, %s): parsed again", path, out.dtype, out.shape)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError) as e:  # truncated or not a .npy file: parse again, replace it
        log.info("%s: unreadable cached table (%s): parsed again", path, e)
    out = _parse_station(station, data)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{path.name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, out, allow_pickle=False)
        os.replace(tmp, path)
    except OSError as e:
        log.info("cannot cache the parsed %s table in %s: %s", station, folder, e)
    return out


@cache
def _read_station(station: str) -> _Table:
    data = resources.files("streamfed").joinpath("data", "beijing-air", station_file(station)).read_bytes()
    out = _parsed_table(station, data)
    cols = {name: np.ascontiguousarray(out[:, j]) for j, name in enumerate(_COLUMNS) if name != "station"}
    for a in cols.values():
        a.setflags(write=False)
    y, mo, d, h = (cols[k].astype(np.int64) for k in ("year", "month", "day", "hour"))
    months = ((y - 1970) * 12 + (mo - 1)).astype("datetime64[M]")
    time = months.astype("datetime64[D]") + (d - 1).astype("timedelta64[D]")
    time = time.astype("datetime64[h]") + h.astype("timedelta64[h]")
    time.setflags(write=False)
    return _Table(cols, time)


@dataclass(frozen=True)
class _Source:
    """One station's usable rows: raw features and target, and where rows were skipped."""

    X: np.ndarray  # (n_valid, d)
    y: np.ndarray
    rows: np.ndarray  # data-row index of each valid row
    time: np.ndarray
    bad_before: np.ndarray  # (n_rows + 1,) skipped rows among the first k rows
    na_before: dict[str, np.ndarray]  # per used column, the same but for rows where it is missing


@cache
def _source(station: str, extras: bool) -> _Source:
    t = _read_station(station)
    cols = dict(t.columns)
    used = [*BEIJING_INPUTS, BEIJING_TARGET]
    if extras:
        used.append("wd")
    missing = {c: ~np.isfinite(cols[c]) for c in used}
    bad = np.logical_or.reduce(list(missing.values()))
    ok = ~bad
    feats = [cols[c][ok] for c in BEIJING_INPUTS]
    if extras:
        wd = np.deg2rad(cols["wd"][ok])
        hour = 2.0 * np.pi * cols["hour"][ok] / 24.0
        feats += [np.sin(wd), np.cos(wd), np.sin(hour), np.cos(hour)]

    def before(mask: np.ndarray) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(mask)])

    src = _Source(X=np.column_stack(feats), y=cols[BEIJING_TARGET][ok], rows=np.flatnonzero(ok),
                  time=t.time[ok], bad_before=before(bad),
                  na_before={c: before(m) for c, m in missing.items()})
    for a in (src.X, src.y, src.rows, src.time, src.bad_before, *src.na_before.values()):
        a.setflags(write=False)  # cached and shared across calls
    return src


@cache
def _paper_constants(extras: bool) -> dict[str, float]:
    names = BEIJING_INPUTS + (BEIJING_EXTRAS if extras else ())
    return paper_constants([ClientStream(s, _source(s, extras).X, _source(s, extras).y, names)
                            for s in BEIJING_STATIONS])


def _skip_counts(srcs: list[_Source], source: np.ndarray, row: np.ndarray
                 ) -> tuple[int, dict[str, int]]:
    """Skipped rows a client read past, given the (source, row) of every sample it consumed."""
    skipped = 0
    by_col = dict.fromkeys(srcs[0].na_before, 0)
    for j, src in enumerate(srcs):
        used = row[source == j]
        if used.size == 0:
            continue
        end = src.bad_before.size - 1 if used.size == src.rows.size else int(used.max()) + 1
        skipped += int(src.bad_before[end])
        for c, nb in src.na_before.items():
            by_col[c] += int(nb[end])
    return skipped, by_col


def _mixed_choice(seed: int, client: int, length: int, available: list[int]) -> np.ndarray:
    """Source slot (0 = home, 1..3 = others) of each step of a mixed client."""
    rng = np.random.default_rng([seed, client])
    choice = rng.choice(len(MIXED_PROBABILITIES), size=length, p=MIXED_PROBABILITIES)
    for k in range(1, len(available)):  # an exhausted source's extra draws go home
        pos = np.flatnonzero(choice == k)
        choice[pos[available[k]:]] = 0
    return choice


def load_beijing(normalisation: str = "paper", split: str = "station", seed: int = 0,
                 steps: int | None = None, extras: bool = False, *,
                 warmup: int = DEFAULT_WARMUP) -> Fleet:
    """The 12 Beijing stations as a fleet of client streams (predict `CO`).

    `normalisation`: `"paper"`, `"online"` or `"none"` (see :mod:`streamfed.evaluation.datasets.normalise`;
    the `"paper"` constants are always those of the whole dataset — all stations, all valid rows,
    whatever `split` and `steps` — as the POF-MKL authors did). `split`: `"station"` or `"mixed"`
    (`seed` drives the mixing). `steps` cuts every stream to its first `steps` samples. `extras` adds
    wind direction and hour of day. `warmup`: samples that only initialise `"online"` statistics.

    >>> fleet = load_beijing("paper", steps=100)
    >>> fleet.names[:2], len(fleet[0]), fleet.n_inputs
    (('Aotizhongxin', 'Changping'), 100, 10)
    >>> fleet[0].skipped_by_column["CO"] <= fleet[0].skipped
    True
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if steps is not None and steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    srcs = [_source(s, extras) for s in BEIJING_STATIONS]
    names = BEIJING_INPUTS + (BEIJING_EXTRAS if extras else ())
    n_st = len(BEIJING_STATIONS)
    # samples to consume per client: online warm-up samples come first and are not emitted
    extra = warmup if normalisation == "online" else 0
    raw: list[ClientStream] = []
    for c, station in enumerate(BEIJING_STATIONS):
        if split == "station":
            home = srcs[c]
            n = home.rows.size if steps is None else min(home.rows.size, steps + extra)
            source = np.full(n, c)
            row_in_src = np.arange(n)
            label = station
        else:
            ids = [(c + k) % n_st for k in range(len(MIXED_PROBABILITIES))]
            choice = _mixed_choice(seed, c, srcs[c].rows.size, [srcs[i].rows.size for i in ids])
            if steps is not None:
                choice = choice[: steps + extra]
            n = choice.size
            source = np.asarray(ids)[choice]
            row_in_src = np.empty(n, dtype=np.int64)
            for k in range(len(ids)):  # the k-th draw of a source takes its k-th valid row
                pos = np.flatnonzero(choice == k)
                row_in_src[pos] = np.arange(pos.size)
            label = f"{station}-mixed"
        X = np.empty((n, len(names)))
        y = np.empty(n)
        rows = np.empty(n, dtype=np.int64)
        time = np.empty(n, dtype="datetime64[h]")
        for j in np.unique(source):
            m = source == j
            idx = row_in_src[m]
            src = srcs[j]
            X[m], y[m], rows[m], time[m] = src.X[idx], src.y[idx], src.rows[idx], src.time[idx]
        skipped, by_col = _skip_counts(srcs, source, rows)
        raw.append(ClientStream(label, X, y, names, skipped=skipped, skipped_by_column=by_col,
                                time=time, source=source, row=rows))
    constants = _paper_constants(extras) if normalisation == "paper" else None
    streams, scaling = normalise_streams(raw, normalisation, warmup=warmup, constants=constants)
    return Fleet(tuple(streams), dataset="beijing-air", normalisation=normalisation, split=split,
                 seed=seed if split == "mixed" else None, target=BEIJING_TARGET,
                 sources=BEIJING_STATIONS, scaling=scaling)

