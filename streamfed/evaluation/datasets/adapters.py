"""Client streams from any CSV file or any River dataset.

Both skip (and count, per column) every row with a missing or non-numeric value in a used column;
nothing is imputed. Non-finite numbers (`nan`, `inf`) count as missing.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import numbers
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamfed.evaluation.datasets.base import ClientStream

NA_VALUES: frozenset[str] = frozenset({"", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", "?", "-"})


def _number(text: str, na_values: frozenset[str]) -> float | None:
    """The finite float in `text`, or None if it is missing or not a number."""
    text = text.strip()
    if text in na_values:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def from_csv(path: str | Path, target: str, features: Sequence[str] | None = None, *,
             name: str | None = None, n: int | None = None, delimiter: str = ",",
             na_values: Iterable[str] = NA_VALUES, encoding: str = "utf-8") -> ClientStream:
    """One client stream from a CSV file with a header row (`.gz` files are decompressed).

    `features` defaults to every column except `target` that holds at least one number; the columns
    left out (text, dates, categories) are named in a `UserWarning` — declare them through
    :func:`~streamfed.evaluation.datasets.csv_fleet.csv_fleet` (`columns=`) to learn from them. Rows are kept in
    file order; `n` stops reading once `n` samples have been taken (counts then cover the rows read).
    A short row's absent fields count as missing. `row` records each sample's 0-based data-row index.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     p = os.path.join(tmp, "toy.csv")
    ...     with open(p, "w") as f:
    ...         _ = f.write("a,b,label,who\\n1,2,3,x\\nNA,5,6,y\\n7,8,oops,z\\n10,11,12,w\\n")
    ...     s = from_csv(p, target="label", features=["a", "b"])
    >>> s.feature_names, s.X.tolist(), s.y.tolist()
    (('a', 'b'), [[1.0, 2.0], [10.0, 11.0]], [3.0, 12.0])
    >>> s.skipped, dict(s.skipped_by_column)
    (2, {'a': 1, 'b': 0, 'label': 1})
    """
    path = Path(path)
    na = frozenset(na_values)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    reader = csv.reader(io.StringIO(raw.decode(encoding), newline=""), delimiter=delimiter)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise ValueError(f"{path}: empty file, expected a header row") from None
    if target not in header:
        raise ValueError(f"{path}: target column {target!r} not in header {header}")
    if features is None:
        rows: Iterable[list[str]] = list(reader)
        candidates = [h for h in header if h != target]
        index = {h: j for j, h in enumerate(header)}
        features = [h for h in candidates
                    if any(index[h] < len(r) and _number(r[index[h]], na) is not None for r in rows)]
        left_out = [h for h in candidates if h not in features]
        if left_out:  # text, dates, categories: said, never dropped silently
            warnings.warn(f"{path}: columns without a number left out of the inputs: {left_out}; declare them "
                          "(categories, timestamps, booleans) with csv_fleet(..., columns=...) or "
                          "`streamfed replay --columns`", UserWarning, stacklevel=2)
    else:
        rows = reader
        unknown = [f for f in features if f not in header]
        if unknown:
            raise ValueError(f"{path}: feature columns {unknown} not in header {header}")
    used = [*features, target]
    cols = [header.index(c) for c in used]
    counts = dict.fromkeys(used, 0)
    out: list[list[float]] = []
    kept_rows: list[int] = []
    skipped = 0
    for i, r in enumerate(rows):
        if n is not None and len(out) >= n:
            break
        values = [_number(r[j], na) if j < len(r) else None for j in cols]
        if any(v is None for v in values):
            skipped += 1
            for c, v in zip(used, values, strict=True):
                if v is None:
                    counts[c] += 1
            continue
        out.append(values)  # type: ignore[arg-type]
        kept_rows.append(i)
    arr = np.array(out, dtype=np.float64).reshape(len(out), len(used))
    return ClientStream(name or path.name.split(".")[0], arr[:, :-1], arr[:, -1], tuple(features),
                        skipped=skipped, skipped_by_column=counts, row=np.array(kept_rows, dtype=np.int64))


def _real(v: Any) -> float | None:
    if isinstance(v, numbers.Real):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def from_river(dataset: Iterable[tuple[Mapping[Any, Any], Any]], n: int | None = None, *,
               name: str | None = None, features: Sequence[Any] | None = None,
               target_name: str = "y") -> ClientStream:
    """One client stream from anything yielding River-style `(x: dict, y)` pairs.

    The features are `features` if given, else the keys of the first `x` in sorted order (by their
    text); keys absent from that set are ignored, and a feature absent from a later `x` counts as
    missing. Values must be real numbers (bools count as 0/1); anything else — strings, None, NaN —
    makes the row skipped and counted (the target under `target_name`). `n` stops after `n` samples.

    >>> rows = [({"b": 1, "a": 2.0}, 3.0), ({"a": None, "b": 1}, 4.0), ({"a": 5, "b": 6}, "x")]
    >>> s = from_river(rows, name="toy")
    >>> s.feature_names, s.X.tolist(), s.y.tolist(), dict(s.skipped_by_column)
    (('a', 'b'), [[2.0, 1.0]], [3.0], {'a': 1, 'b': 0, 'y': 1})
    """
    keys: list[Any] | None = list(features) if features is not None else None
    out: list[list[float]] = []
    targets: list[float] = []
    kept_rows: list[int] = []
    counts: dict[str, int] = {}
    skipped = 0
    for i, (x, y) in enumerate(dataset):
        if n is not None and len(out) >= n:
            break
        if keys is None:
            keys = sorted(x, key=str)
        if not counts:
            counts = dict.fromkeys([*(str(k) for k in keys), target_name], 0)
        values = [_real(x[k]) if k in x else None for k in keys]
        yv = _real(y)
        if yv is None or any(v is None for v in values):
            skipped += 1
            for k, v in zip(keys, values, strict=True):
                if v is None:
                    counts[str(k)] += 1
            if yv is None:
                counts[target_name] += 1
            continue
        out.append(values)  # type: ignore[arg-type]
        targets.append(yv)
        kept_rows.append(i)
    names = tuple(str(k) for k in keys or ())
    X = np.array(out, dtype=np.float64).reshape(len(out), len(names))
    return ClientStream(name or type(dataset).__name__, X, np.array(targets, dtype=np.float64), names,
                        skipped=skipped, skipped_by_column=counts, row=np.array(kept_rows, dtype=np.int64))
