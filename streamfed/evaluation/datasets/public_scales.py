"""Declared, data-independent scales for the Beijing streams: what a differentially private agent standardises
with (`[fleet.public_scales]`, docs/privacy.md § The privacy boundary), taken from published standards and
physical conventions — never from the readings, which are the private data.

Each value is `centre ± scale` in the dataset's units (µg/m³ for the pollutants, °C, hPa, mm, m/s):

* pollutants (PM2.5, PM10, SO2, NO2, O3, and the target CO): China's ambient air-quality standard GB 3095-2012,
  Grade II limits (24-hour means: PM2.5 75, PM10 150, SO2 150, NO2 80, CO 4 mg/m³ = 4000 µg/m³; O3 the 1-hour
  limit, 200). A concentration is nonnegative and the limit marks "polluted": centre = half the limit, scale =
  the limit, so clean air sits near −0.5 and ten times the limit at +9.5 (inputs are winsorised at ±5);
* TEMP and DEWP: Beijing's continental monsoon climate, winters below 0 °C and summers near 26 °C: centre
  12 °C (temperature) and 2 °C (dew point), scale 12 °C;
* PRES: the ICAO standard atmosphere at sea level, 1013.25 hPa (the stations lie near sea level), scale 10 hPa
  (a deep synoptic low);
* RAIN: none most hours; scale 2.5 mm (the WMO boundary of light and moderate hourly rain);
* WSPM: the Beaufort scale's light to gentle breeze, centre 2.5 m/s, scale 2.5 m/s.

They were set from these sources before any run, not tuned on the data (a replay that chose them from the
streams would leak them, and would flatter the utility figures).

>>> from streamfed.evaluation.datasets import BEIJING_INPUTS
>>> scales = beijing_public_scales()
>>> len(scales["x_mean"]) == len(BEIJING_INPUTS), scales["y_mean"], scales["y_scale"]
(True, 2000.0, 4000.0)
"""

from __future__ import annotations

from typing import Any

from streamfed.evaluation.datasets.beijing import BEIJING_INPUTS

__all__ = ["BEIJING_PUBLIC_SCALES", "beijing_public_scales"]

#: input → (centre, scale), in the order of :data:`BEIJING_INPUTS`; the target CO last
BEIJING_PUBLIC_SCALES: dict[str, tuple[float, float]] = {
    "PM2.5": (37.5, 75.0), "PM10": (75.0, 150.0), "SO2": (75.0, 150.0), "NO2": (40.0, 80.0),
    "O3": (100.0, 200.0), "TEMP": (12.0, 12.0), "PRES": (1013.25, 10.0), "DEWP": (2.0, 12.0),
    "RAIN": (0.0, 2.5), "WSPM": (2.5, 2.5), "CO": (2000.0, 4000.0),
}


def beijing_public_scales() -> dict[str, Any]:
    """The declared scales of the Beijing inputs (:data:`BEIJING_INPUTS`, without extras) and target, as
    `[fleet.public_scales]` takes them."""
    xs = [BEIJING_PUBLIC_SCALES[name] for name in BEIJING_INPUTS]
    y = BEIJING_PUBLIC_SCALES["CO"]
    return {"x_mean": [c for c, _ in xs], "x_scale": [s for _, s in xs], "y_mean": y[0], "y_scale": y[1]}
