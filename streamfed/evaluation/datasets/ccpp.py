"""The Combined Cycle Power Plant data (the FedBNR thesis's Table 3.1 benchmark), from the vendored CSV.

UCI Machine Learning Repository, "Combined Cycle Power Plant" (dataset 294), CC BY 4.0; Tüfekci (2014),
Int. J. Electrical Power & Energy Systems 60: 126–140, and Kaya, Tüfekci & Gürgen (2012), ICETCEE.
9,568 rows of hourly averages: inputs :data:`CCPP_INPUTS` — ambient temperature `AT` (°C), exhaust vacuum
`V` (cm Hg), ambient pressure `AP` (mbar), relative humidity `RH` (%) — and target `PE`, the net electrical
output (MW). Provenance and checksum: `streamfed/data/ccpp/PROVENANCE.md`.

>>> X, y = load_ccpp()
>>> X.shape, y.shape, CCPP_INPUTS
((9568, 4), (9568,), ('AT', 'V', 'AP', 'RH'))
>>> float(X[0, 0]), float(y[0])  # the first published row
(14.96, 463.26)
"""

from __future__ import annotations

import gzip
import io
from functools import cache
from importlib import resources

import numpy as np

__all__ = ["CCPP_INPUTS", "CCPP_ROWS", "CCPP_TARGET", "load_ccpp"]

CCPP_INPUTS: tuple[str, ...] = ("AT", "V", "AP", "RH")
CCPP_TARGET = "PE"
CCPP_ROWS = 9568


@cache
def _table() -> np.ndarray:
    raw = gzip.decompress(resources.files("streamfed").joinpath("data", "ccpp", "ccpp.csv.gz").read_bytes())
    text = raw.decode("ascii")
    header = text[: text.index("\n")].strip().split(",")
    if tuple(header) != (*CCPP_INPUTS, CCPP_TARGET):
        raise ValueError(f"ccpp.csv: unexpected header {header}")
    table = np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    if table.shape != (CCPP_ROWS, 5) or not np.all(np.isfinite(table)):
        raise ValueError(f"ccpp.csv: expected {CCPP_ROWS} finite rows of 5 values, got {table.shape}")
    table.setflags(write=False)
    return table


def load_ccpp() -> tuple[np.ndarray, np.ndarray]:
    """`(X (9568, 4), y (9568,))` in the published row order and units (read-only arrays, parsed once)."""
    t = _table()
    return t[:, :4], t[:, 4]
