"""A fleet of client streams from any CSV file: one client per value of a client column.

This is the dataset side of `streamfed replay --dataset PATH.csv --target COL [--client-column COL]
[--features A,B,...]`. The file is read with the standard :mod:`csv` module, row by row, in file
order; nothing is imputed.

- **Clients.** With `client_column`, each distinct (non-empty) value of that column is one client,
  in order of first appearance in the file, and a client's samples are its rows in file order.
  Without it the whole file is one client, named after the file (`air.csv.gz` → `air`).
- **Features.** The given numeric columns in the given order; or the declared input `columns` (a
  :class:`~streamfed.fleet.columns.ColumnSpec` or its `--columns` text: booleans, categories, timestamps
  encoded exactly as an agent encodes them, so a replay and a fleet lay `x` out the same way); else every
  *numeric* column other than the target and the client column, in header order. A column is numeric
  when, in the rows read, finite numbers are more than half of its present values (missing-value
  markers, :data:`NA_VALUES`, aside): so a text column (`"NW"`, a station name, a date) is left out,
  while a numeric column with a few stray words is kept and the rows holding them are skipped and
  counted. The columns left out are listed, with the reason, in :attr:`CsvReport.ignored`, and the text
  columns among them with the `--columns` item that would declare them in :attr:`CsvReport.suggested`
  (:meth:`CsvReport.hint` says it in one line).
- **Skipped rows.** A row whose target or any feature is missing (empty or an NA marker) or not a
  finite number is skipped and counted: per client in :attr:`ClientStream.skipped` /
  :attr:`ClientStream.skipped_by_column`, and for the whole file, split into `missing` and
  `non_numeric` per column, in :class:`CsvReport`; a value a declared column's kind refuses (a bad
  boolean or timestamp, an undeclared level) is counted by reason and column in
  :attr:`CsvReport.invalid`; a number beyond `±max_abs` (default 1e150, so that no square or sum of squares
  overflows a float64) is skipped as `too_large` (:attr:`CsvReport.too_large`). Missing means empty or one of
  `na_values` (by default :data:`NA_VALUES`), except a declared category level, which is a level even when it
  reads `None` or `NA`. A row with more fields than the header is skipped
  as `too_many_fields` (its values cannot be trusted to be aligned); a short row's absent fields are
  missing. A row with an empty client value belongs to no client and is counted as `no_client`.
  Blank lines are ignored and not counted.
- **Normalisation** — the same code, and the same default, as the Beijing fleet
  (:func:`~streamfed.evaluation.datasets.load_beijing`), through
  :func:`~streamfed.evaluation.datasets.normalise.normalise_streams`:

  - `"paper"` (default, as for Beijing): inputs divided by the largest input row norm, target
    min-max scaled to `[0, 1]`, both over *all* clients and *all* rows read. **Not causal**: every
    sample is scaled with constants that depend on the future (paper-faithful replay only).
  - `"online"`: **causal** — each client standardises every column (inputs and target) with the
    running mean and sample standard deviation of *its own past* samples only; its first `warmup`
    samples only initialise the statistics and are not emitted (:attr:`ClientStream.warmup`).
  - `"none"`: raw values.

  A class label (`label=True`: the target of a classifier) is never normalised, only the inputs.
  A client left with no sample (all its rows skipped, or no more rows than `warmup` under
  `"online"`) is left out of the fleet and named in :attr:`CsvReport.dropped_clients`.

Every problem with the file or the arguments is a :class:`ValueError` with a one-line message that
starts with the path.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from streamfed.evaluation.datasets.adapters import NA_VALUES
from streamfed.evaluation.datasets.base import NORMALISATIONS, ClientStream, Fleet
from streamfed.evaluation.datasets.normalise import DEFAULT_WARMUP, TOO_LARGE, normalise_streams

# declared columns are encoded by the agent's encoder, so a replay lays x out as a fleet does
from streamfed.fleet.columns import ColumnSpec, Invalid, suggest_column

# the column checks' messages are the agent's: one user, one set of messages (the agent's module is numba-free)
from streamfed.fleet.sources import MAX_ABS, columns_hint, open_binary, unknown_columns

__all__ = ["CsvReport", "csv_fleet", "csv_fleet_with_report"]



@dataclass(frozen=True)
class CsvReport:
    """What :func:`csv_fleet_with_report` read from a CSV file and what it skipped, and why.

    `rows` counts the data rows read (blank lines excluded); `samples` the rows that became samples
    (before any online warm-up); `skipped = rows - samples`. Every skipped row has exactly one
    primary reason: `no_client` (empty client value), `too_many_fields`, or bad values — a row can
    then count under several columns in `missing` (empty or NA marker), `non_numeric` (text that
    is not a finite number) and `invalid` (`{reason: {column: count}}`: values a declared column's kind
    refuses, `bad_boolean`, `bad_timestamp`, `unknown_level`), but once in `skipped`. `truncated` says
    that `max_rows` stopped the reading before the end of the file. With declared columns, `declared`
    is their `--columns` text and `features` the names of the numbers they make (`site=north`, ...).
    """

    path: str
    encoding: str  # the codec used (`utf-8-sig` for UTF-8, so a byte-order mark is dropped)
    bom: bool  # the file starts with a UTF-8 byte-order mark
    columns: tuple[str, ...]
    target: str
    client_column: str | None
    features: tuple[str, ...]
    clients: tuple[str, ...]  # the fleet's clients, in order of first appearance
    rows: int
    samples: int
    skipped: int
    missing: Mapping[str, int] = field(default_factory=dict)
    non_numeric: Mapping[str, int] = field(default_factory=dict)
    too_many_fields: int = 0
    no_client: int = 0
    ignored: Mapping[str, str] = field(default_factory=dict)  # column left out by feature detection -> why
    dropped_clients: tuple[str, ...] = ()
    truncated: bool = False
    invalid: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    declared: str | None = None
    suggested: Mapping[str, str] = field(default_factory=dict)  # text column left out -> a --columns item
    too_large: Mapping[str, int] = field(default_factory=dict)  # column -> numbers beyond ±max_abs
    na_values: tuple[str, ...] = ()  # the missing-value markers used

    def hint(self) -> str | None:
        """One line naming the text columns feature detection left out and how to declare them (None when
        it left none out, or the inputs were given).

        >>> r = CsvReport("a.csv", "utf-8-sig", False, ("x", "site", "y"), "y", None, ("x",), ("a",), rows=3,
        ...               samples=3, skipped=0, ignored={"site": "non-numeric"},
        ...               suggested={"site": "site:category=n|s"})
        >>> r.hint()
        "text columns left out: 'site'; to learn from them declare the inputs, e.g. --columns 'x,site:category=n|s'"
        """
        if not self.suggested:
            return None
        example = ",".join([*self.features, *self.suggested.values()])
        return (f"text columns left out: {', '.join(repr(c) for c in self.suggested)}; to learn from them declare "
                f"the inputs, e.g. --columns {shlex.quote(example)}")

    def summary(self) -> str:
        """One line for a console: rows, samples, clients, features and the skipped rows by reason.

        >>> r = CsvReport("a.csv", "utf-8-sig", False, ("x", "y"), "y", None, ("x",), ("a",), rows=3,
        ...               samples=2, skipped=1, missing={"x": 1, "y": 0})
        >>> r.summary()
        "a.csv: 3 rows read, 2 samples, 1 client, features ['x'], target 'y'; 1 skipped (x missing 1)"
        """
        n = len(self.clients)
        parts = [f"{self.path}: {self.rows} rows read{' (max_rows reached)' if self.truncated else ''}",
                 f"{self.samples} samples", f"{n} client{'s' if n != 1 else ''}"
                 + (f" by {self.client_column!r}" if self.client_column else ""),
                 f"features {list(self.features)}", f"target {self.target!r}"]
        if self.declared is not None:
            parts[3] = f"inputs {self.declared!r} ({len(self.features)} numbers)"
        text = ", ".join(parts) + f"; {self.skipped} skipped"
        why = [f"{c} missing {k}" for c, k in self.missing.items() if k]
        why += [f"{c} non-numeric {k}" for c, k in self.non_numeric.items() if k]
        why += [f"{c} {r.replace('_', ' ')} {k}" for r, by in self.invalid.items() for c, k in by.items() if k]
        why += [f"{c} too large {k}" for c, k in self.too_large.items() if k]
        if self.too_many_fields:
            why.append(f"too many fields {self.too_many_fields}")
        if self.no_client:
            why.append(f"no client {self.no_client}")
        if why:
            text += f" ({', '.join(why)})"
        if self.ignored:
            text += f"; ignored columns {list(self.ignored)}"
        if self.dropped_clients:
            text += f"; clients without samples left out: {list(self.dropped_clients)}"
        return text


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".csv", ".tsv", ".txt"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name


def _decode_error(path: Path, codec: str, head: bytes) -> str:
    """Where the file stops being valid `codec`: `line N: reason (bytes xx)`, for the error message."""
    decoder = codecs.getincrementaldecoder(codec)()
    lineno = 0
    try:
        with open_binary(path) as f:
            for lineno, line in enumerate(f, 1):  # noqa: B007 (used after the loop)
                decoder.decode(line)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        bad = e.object[e.start:e.end].hex(" ")
        where = f"line {lineno}: {e.reason} (byte{'s' if e.end - e.start > 1 else ''} 0x{bad})"
    else:  # pragma: no cover - the reader failed, so the decoder must too
        where = "undecodable text"
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) and "16" not in codec:
        return f"{where}; the file starts with a UTF-16 byte-order mark, try encoding='utf-16'"
    return f"{where}; pass the file's encoding, e.g. encoding='latin-1' or 'cp1252'"


def _classify(text: str, na: frozenset[str], max_abs: float = MAX_ABS) -> float | bool | str:
    """A finite float within `±max_abs`, or False (missing: empty / NA marker), True (present but not a finite
    number) or `"too_large"` (a finite number beyond `±max_abs`: its square could overflow the statistics)."""
    text = text.strip()
    if not text or text in na:
        return False
    try:
        v = float(text)
    except ValueError:
        return True
    if not math.isfinite(v):
        return True
    return v if abs(v) <= max_abs else TOO_LARGE


@dataclass
class _Client:
    rows: list[int] = field(default_factory=list)
    values: list[list[float]] = field(default_factory=list)
    skipped: int = 0
    by_column: dict[str, int] = field(default_factory=dict)


def csv_fleet_with_report(
    path: str | Path,
    target: str | None,
    *,
    client_column: str | None = None,
    features: Sequence[str] | str | None = None,
    normalisation: str = "paper",
    encoding: str = "utf-8",
    delimiter: str = ",",
    max_rows: int | None = None,
    na_values: Sequence[str] | frozenset[str] = NA_VALUES,
    warmup: int = DEFAULT_WARMUP,
    max_clients: int | None = 1000,
    columns: ColumnSpec | str | None = None,
    max_abs: float = MAX_ABS,
    label: bool = False,
) -> tuple[Fleet, CsvReport]:
    """Read a CSV file into a :class:`Fleet` (see the module docstring) and say what was skipped.

    `path`: a CSV file with a header row (`.gz`: gzip-compressed). `target`: the column to predict
    (`None` raises, listing the columns). `client_column`: the column naming each row's client, or
    `None` for one client named after the file. `features`: input columns, a sequence or one
    comma-separated string; `None` for every numeric column. `columns`: declared input columns instead of
    `features` (a :class:`~streamfed.fleet.columns.ColumnSpec`, or its `--columns` text such as
    `"temp,site:category=a|b,time:timestamp"`). `normalisation`: `"paper"` (default,
    not causal), `"online"` (causal) or `"none"`. `encoding`: the text encoding; UTF-8 is read as
    `utf-8-sig`, so a byte-order mark is dropped. `max_rows`: read at most this many data rows
    (skipped rows included). `max_clients`: refuse a client column with more distinct values (a
    guard against naming a timestamp column; `None` for no limit). `na_values`: the cells that mean "no
    value" (an empty cell always does; a declared category level is a level, not missing). `max_abs`: a
    number beyond `±max_abs` is skipped and counted as `too_large` (default 1e150: any square and sum of
    squares of such numbers stays finite). `label`: the target is a class label (a classifier's), never
    normalised.

    Returns the fleet (`dataset` is the file's stem, `target` the target column, `split`
    `"column:<client_column>"` or `"single"`; each stream's `row` is the 0-based data-row index of
    each sample) and a :class:`CsvReport`.

    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     p = os.path.join(tmp, "plant.csv")
    ...     with open(p, "w", encoding="utf-8") as f:
    ...         _ = f.write("site,temp,load,note\\n"
    ...                     "A,1,10,ok\\nB,2,20,ok\\nA,3,NA,gap\\nB,oops,40,bad\\nA,5,50,ok\\nB,6,60,ok\\n")
    ...     fleet, report = csv_fleet_with_report(p, "load", client_column="site", normalisation="none")
    >>> fleet.names, fleet.feature_names, fleet.target
    (('A', 'B'), ('temp',), 'load')
    >>> fleet["A"].X.ravel().tolist(), fleet["A"].y.tolist(), fleet["A"].row.tolist()
    ([1.0, 5.0], [10.0, 50.0], [0, 4])
    >>> fleet["B"].skipped, dict(fleet["B"].skipped_by_column)
    (1, {'temp': 1, 'load': 0})
    >>> report.summary()  # doctest: +ELLIPSIS
    "...plant.csv: 6 rows read, 4 samples, 2 clients by 'site', ...; 2 skipped (load missing 1, temp non-numeric 1)..."
    >>> dict(report.ignored)
    {'note': "non-numeric (6 of 6 values are text, e.g. 'ok')"}
    """
    path = Path(path)
    where = str(path)
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"{where}: normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"{where}: max_rows must be >= 1, got {max_rows}")
    if warmup < 1:
        raise ValueError(f"{where}: warmup must be >= 1, got {warmup}")
    spec: ColumnSpec | None = None
    if columns is not None:
        if features is not None:
            raise ValueError(f"{where}: give features or declared input columns, not both")
        try:
            spec = columns if isinstance(columns, ColumnSpec) else ColumnSpec.parse(columns)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    if not path.exists():
        raise ValueError(f"{where}: no such file")
    if not path.is_file():
        raise ValueError(f"{where}: not a regular file")
    try:
        codec = codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"{where}: unknown encoding {encoding!r}") from None
    if codec == "utf-8":
        codec = "utf-8-sig"
    na = frozenset(na_values)
    if not max_abs > 0:
        raise ValueError(f"{where}: max_abs must be > 0, got {max_abs!r}")

    # -- read the header and up to max_rows data rows ------------------------------------------------
    try:
        with open_binary(path) as fb:
            head = fb.read(4)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ValueError(f"{where}: cannot read: {e}") from None
    bom = head.startswith(codecs.BOM_UTF8)
    header: list[str] | None = None
    records: list[list[str]] = []
    truncated = False
    reader = None
    try:
        # newline="": only the csv module splits records (quoted fields may hold line breaks)
        with io.TextIOWrapper(open_binary(path), encoding=codec, newline="") as text:
            reader = csv.reader(text, delimiter=delimiter)
            for rec in reader:
                if not rec:
                    continue  # blank line
                if header is None:
                    header = [h.strip() for h in rec]
                    continue
                if max_rows is not None and len(records) >= max_rows:
                    truncated = True
                    break
                records.append(rec)
    except UnicodeDecodeError:
        raise ValueError(f"{where}: cannot decode as {encoding}: {_decode_error(path, codec, head)}") from None
    except csv.Error as e:
        line = reader.line_num if reader is not None else 0
        raise ValueError(f"{where}: malformed CSV at line {line}: {e}") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ValueError(f"{where}: cannot read: {e}") from None
    if header is None:
        raise ValueError(f"{where}: empty file, expected a header row and data rows")
    if not records:
        raise ValueError(f"{where}: header only, no data rows; {columns_hint(header)}")

    # -- resolve the columns ---------------------------------------------------------------------------
    index: dict[str, int] = {}
    duplicated: set[str] = set()
    for j, h in enumerate(header):
        if h in index:
            duplicated.add(h)
        else:
            index[h] = j

    def check(what: str, names: Sequence[str]) -> None:
        unknown = [n for n in names if n not in index]
        if unknown:
            raise unknown_columns(where, what, unknown, header)
        dup = [n for n in names if n in duplicated]
        if dup:
            raise ValueError(f"{where}: {what} {dup} appear more than once in the header; {columns_hint(header)}")

    if target is None or not str(target).strip():
        raise ValueError(f"{where}: no target column given; {columns_hint(header)}")
    check("target column", [target])
    if client_column is not None:
        check("client column", [client_column])
        if client_column == target:
            raise ValueError(f"{where}: the client column and the target are both {target!r}")
    ignored: dict[str, str] = {}
    suggested: dict[str, str] = {}
    if spec is not None:
        check("input column(s)", spec.names)
        for bad, role in ((target, "target"), (client_column, "client column")):
            if bad in spec.names:
                raise ValueError(f"{where}: input column {bad!r} is also the {role}")
        feats = list(spec.names)
    elif features is not None:
        names = [f.strip() for f in features.split(",")] if isinstance(features, str) else [str(f) for f in features]
        names = [f for f in names if f]
        if not names:
            raise ValueError(f"{where}: features is empty; {columns_hint(header)}")
        check("feature column(s)", names)
        for bad, role in ((target, "target"), (client_column, "client column")):
            if bad in names:
                raise ValueError(f"{where}: feature {bad!r} is also the {role}")
        if len(set(names)) != len(names):
            raise ValueError(f"{where}: features list a column twice: {names}")
        feats = names
    else:
        feats = []
        width = len(header)
        for j, h in enumerate(header):
            if h in (target, client_column):
                continue
            if not h:
                ignored[f"<column {j + 1}>"] = "no name"
                continue
            if h in duplicated:
                ignored[h] = "name appears more than once"
                continue
            if index[h] != j:
                continue
            numbers = texts = 0
            example = ""
            for rec in records:
                if j >= len(rec) or len(rec) > width:
                    continue
                v = _classify(rec[j], na, max_abs)
                if v is True:
                    texts += 1
                    example = example or rec[j].strip()[:20]
                elif v is not False:
                    numbers += 1
            if numbers > texts:
                feats.append(h)
            elif numbers + texts == 0:
                ignored[h] = "no value"
            else:
                ignored[h] = f"non-numeric ({texts} of {numbers + texts} values are text, e.g. {example!r})"
                present = [rec[j] for rec in records if j < len(rec) <= width and rec[j].strip() not in na]
                item = suggest_column(h, present)
                if item is not None and ":category=" in item:
                    # a text column's markers (`None` on a traffic file's holiday column) are levels too: a
                    # declared level is never missing, so the suggestion learns those rows when pasted
                    item = suggest_column(h, [rec[j] for rec in records if j < len(rec) <= width and rec[j].strip()])
                if item is not None:
                    suggested[h] = item
        if not feats:
            others = f" and client column {client_column!r}" if client_column else ""
            declare = (f"; declare text columns to use them, e.g. --columns {shlex.quote(','.join(suggested.values()))}"
                       if suggested else "")
            raise ValueError(f"{where}: no numeric feature column besides target {target!r}{others}; "
                             f"{columns_hint(header)}{declare}")

    # -- rows into per-client samples ------------------------------------------------------------------
    used = [*feats, target]
    cols = [index[c] for c in used]
    width = len(header)
    single = _stem(path) or path.name
    ci = index[client_column] if client_column is not None else -1
    clients: dict[str, _Client] = {}
    missing = dict.fromkeys(used, 0)
    non_numeric = dict.fromkeys(used, 0)
    too_large = dict.fromkeys(used, 0)
    invalid: dict[str, dict[str, int]] = {}
    too_many = no_client = 0
    for i, rec in enumerate(records):
        if ci < 0:
            name = single
        else:
            name = rec[ci].strip() if ci < len(rec) else ""
            if not name:
                no_client += 1
                continue
        c = clients.get(name)
        if c is None:
            if max_clients is not None and len(clients) >= max_clients:
                raise ValueError(f"{where}: client column {client_column!r} has more than {max_clients} distinct "
                                 f"values (is it really a client id? raise max_clients to allow more)")
            c = clients[name] = _Client(by_column=dict.fromkeys(used, 0))
        if len(rec) > width:
            too_many += 1
            c.skipped += 1
            continue
        if spec is not None:
            row = _encode_row(spec, rec, cols, na, max_abs)
            if isinstance(row, list):
                c.values.append(row)
                c.rows.append(i)
                continue
            c.skipped += 1
            for col, v in zip(used, row, strict=True):
                if v is not None:
                    c.by_column[col] += 1
                    counts = (missing if v is False else non_numeric if v is True else too_large if v == TOO_LARGE
                              else invalid.setdefault(v, {}))
                    counts[col] = counts.get(col, 0) + 1
            continue
        values = [_classify(rec[j], na, max_abs) if j < len(rec) else False for j in cols]
        if any(isinstance(v, bool | str) for v in values):
            c.skipped += 1
            for col, v in zip(used, values, strict=True):
                if isinstance(v, bool | str):
                    c.by_column[col] += 1
                    counts = missing if v is False else non_numeric if v is True else too_large
                    counts[col] += 1
            continue
        c.values.append(values)  # type: ignore[arg-type]
        c.rows.append(i)

    # -- streams, normalisation, fleet -----------------------------------------------------------------
    need = warmup + 1 if normalisation == "online" else 1
    raw: list[ClientStream] = []
    dropped: list[str] = []
    for name, c in clients.items():
        if len(c.values) < need:
            dropped.append(name)
            continue
        names = spec.outputs if spec is not None else tuple(feats)
        arr = np.array(c.values, dtype=np.float64).reshape(len(c.values), len(names) + 1)
        raw.append(ClientStream(name, arr[:, :-1], arr[:, -1], names, skipped=c.skipped,
                                skipped_by_column=c.by_column, row=np.array(c.rows, dtype=np.int64)))
    samples = sum(len(c.values) for c in clients.values())
    if not raw:
        why = [f"{k} missing {v}" for k, v in missing.items() if v]
        why += [f"{k} non-numeric {v}" for k, v in non_numeric.items() if v]
        why += [f"{k} {r.replace('_', ' ')} {v}" for r, by in invalid.items() for k, v in by.items() if v]
        why += [f"{k} too large {v}" for k, v in too_large.items() if v]
        why += [f"too many fields {too_many}"] if too_many else []
        why += [f"no client {no_client}"] if no_client else []
        extra = f" (online normalisation needs more than {warmup} per client)" if samples else ""
        raise ValueError(f"{where}: no usable rows: {samples} of {len(records)} data rows are valid{extra}"
                         + (f"; skipped: {', '.join(why)}" if why else ""))
    streams, scaling = normalise_streams(raw, normalisation, warmup=warmup, target=not label)
    fleet = Fleet(tuple(streams), dataset=single, normalisation=normalisation,
                  split=f"column:{client_column}" if client_column is not None else "single",
                  target=target, scaling=scaling)
    report = CsvReport(
        path=where, encoding=codec, bom=bom, columns=tuple(header), target=target, client_column=client_column,
        features=fleet.feature_names, clients=fleet.names, rows=len(records), samples=samples,
        skipped=len(records) - samples, missing=MappingProxyType(missing),
        non_numeric=MappingProxyType(non_numeric), too_many_fields=too_many, no_client=no_client,
        ignored=MappingProxyType(ignored), dropped_clients=tuple(dropped), truncated=truncated,
        invalid=MappingProxyType({r: MappingProxyType(by) for r, by in invalid.items()}),
        declared=spec.text if spec is not None else None, suggested=MappingProxyType(suggested),
        too_large=MappingProxyType(too_large), na_values=tuple(sorted(na)))
    return fleet, report


_NUMBER_REASONS = ("non_numeric", "non_finite")  # a number column's refusals: counted as non-numeric, as before


def _encode_row(spec: ColumnSpec, rec: list[str], cols: list[int], na: frozenset[str],
                max_abs: float = MAX_ABS) -> list[float] | tuple[bool | str | None, ...]:
    """One row through the declared columns: `[*x, y]`, or (a tuple) per used column — inputs, then the
    target — what is wrong with it: False missing, True non-numeric, a reason the column's kind gave, None
    nothing."""
    x = np.zeros(spec.width)
    problems: list[bool | str | None] = []
    for col, where, j in zip(spec.columns, spec.slices, cols, strict=False):
        cell = rec[j] if j < len(rec) else None
        if cell is None or col.missing(cell, na):
            problems.append(False)
            continue
        bad = col.encode(cell, x[where], max_abs=max_abs)
        if isinstance(bad, Invalid):
            problems.append(True if bad.reason in _NUMBER_REASONS else bad.reason)
        else:
            problems.append(None)
    y = _classify(rec[cols[-1]], na, max_abs) if cols[-1] < len(rec) else False
    problems.append(y if isinstance(y, bool | str) else None)
    if any(p is not None for p in problems):
        return tuple(problems)
    return [*x.tolist(), float(y)]


def csv_fleet(
    path: str | Path,
    target: str | None,
    *,
    client_column: str | None = None,
    features: Sequence[str] | str | None = None,
    normalisation: str = "paper",
    encoding: str = "utf-8",
    delimiter: str = ",",
    max_rows: int | None = None,
    na_values: Sequence[str] | frozenset[str] = NA_VALUES,
    warmup: int = DEFAULT_WARMUP,
    max_clients: int | None = 1000,
    columns: ColumnSpec | str | None = None,
    max_abs: float = MAX_ABS,
    label: bool = False,
) -> Fleet:
    """The fleet of :func:`csv_fleet_with_report`, without the report.

    Per-client skipped counts stay on the streams (:attr:`ClientStream.skipped`,
    :attr:`ClientStream.skipped_by_column`).

    >>> import io, os, tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     p = os.path.join(tmp, "meter.csv")
    ...     with open(p, "w", encoding="utf-8-sig") as f:  # with a byte-order mark
    ...         _ = f.write("x,y\\n0,1\\n3,0\\n4,3\\n")
    ...     fleet = csv_fleet(p, "y")
    >>> fleet.names, fleet.normalisation, fleet["meter"].X.ravel().tolist(), fleet["meter"].y.tolist()
    (('meter',), 'paper', [0.0, 0.75, 1.0], [0.3333333333333333, 0.0, 1.0])
    """
    return csv_fleet_with_report(
        path, target, client_column=client_column, features=features, normalisation=normalisation,
        encoding=encoding, delimiter=delimiter, max_rows=max_rows, na_values=na_values, warmup=warmup,
        max_clients=max_clients, columns=columns, max_abs=max_abs, label=label)[0]
