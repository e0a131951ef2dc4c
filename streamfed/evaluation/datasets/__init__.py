"""Client data streams for streaming federated learning (docs/algorithms.md §11).

- :func:`load_beijing` — the 12 Beijing air-quality stations (vendored, CC BY 4.0), with the
  `"paper"` / `"online"` / `"none"` normalisations and the `"station"` / `"mixed"` client splits;
- :func:`load_ccpp` — the Combined Cycle Power Plant table (vendored, CC BY 4.0; the FedBNR thesis's benchmark);
- :func:`synthetic_fleet` — a seeded non-i.i.d. toy fleet;
- :func:`from_csv`, :func:`from_river` — any CSV file or River dataset as a :class:`ClientStream`;
- :func:`csv_fleet`, :func:`csv_fleet_with_report` — any CSV file as a :class:`Fleet`, one client per
  value of a client column, normalised like the Beijing fleet, with a :class:`CsvReport` of skipped rows;
- :func:`iter_dicts` — a stream as River-style `(dict, y)` pairs.

Everything is a pure function of its arguments and the packaged files.
"""

from streamfed.evaluation.datasets.adapters import NA_VALUES, from_csv, from_river
from streamfed.evaluation.datasets.base import NORMALISATIONS, ClientStream, Fleet, iter_dicts
from streamfed.evaluation.datasets.beijing import (
    BEIJING_EXTRAS,
    BEIJING_INPUTS,
    BEIJING_ROWS,
    BEIJING_STATIONS,
    BEIJING_TARGET,
    COMPASS,
    MIXED_PROBABILITIES,
    SPLITS,
    load_beijing,
    station_file,
)
from streamfed.evaluation.datasets.ccpp import CCPP_INPUTS, CCPP_ROWS, CCPP_TARGET, load_ccpp
from streamfed.evaluation.datasets.csv_fleet import CsvReport, csv_fleet, csv_fleet_with_report
from streamfed.evaluation.datasets.normalise import (
    DEFAULT_WARMUP,
    normalise,
    normalise_streams,
    online_standardise,
    paper_constants,
)
from streamfed.evaluation.datasets.synthetic import synthetic_fleet

__all__ = [
    "BEIJING_EXTRAS", "BEIJING_INPUTS", "BEIJING_ROWS", "BEIJING_STATIONS", "BEIJING_TARGET", "CCPP_INPUTS",
    "CCPP_ROWS", "CCPP_TARGET", "COMPASS",
    "DEFAULT_WARMUP", "MIXED_PROBABILITIES", "NA_VALUES", "NORMALISATIONS", "SPLITS",
    "ClientStream", "CsvReport", "Fleet",
    "csv_fleet", "csv_fleet_with_report", "from_csv", "from_river", "iter_dicts", "load_beijing", "load_ccpp",
    "normalise", "normalise_streams",
    "online_standardise", "paper_constants", "station_file", "synthetic_fleet",
]
