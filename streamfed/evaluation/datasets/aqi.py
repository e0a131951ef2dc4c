"""A classification stream from the Beijing stations: each station predicts the band of its PM2.5 reading
under China's air-quality index (HJ 633-2012, the 24-hour PM2.5 breakpoints applied to hourly readings) from
its other readings (PM10, SO2, NO2, CO, O3, TEMP, PRES, DEWP, RAIN, WSPM; with `extras` wind direction and
hour of day). Inputs are as read (`"none"` normalisation): a learner standardises them online.

The six bands (µg/m³): I `[0, 35]`, II `(35, 75]`, III `(75, 115]`, IV `(115, 150]`, V `(150, 250]`,
VI `> 250` — classes 0 to 5.

>>> aqi_band(np.array([10.0, 35.0, 35.1, 200.0, 400.0])).tolist()
[0, 0, 1, 4, 5]
>>> fleet = beijing_aqi(steps=50)
>>> fleet.n_inputs, len(fleet[0]), sorted(set(fleet[0].y.tolist())) <= [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
(10, 50, True)
"""

from __future__ import annotations

import numpy as np

from streamfed.evaluation.datasets.base import ClientStream, Fleet
from streamfed.evaluation.datasets.beijing import BEIJING_TARGET, load_beijing

__all__ = ["AQI_BREAKPOINTS", "AQI_NAMES", "aqi_band", "beijing_aqi"]

#: Upper ends of bands I–V (µg/m³, PM2.5); above the last is band VI.
AQI_BREAKPOINTS = (35.0, 75.0, 115.0, 150.0, 250.0)
AQI_NAMES = ("I excellent", "II good", "III lightly polluted", "IV moderately polluted", "V heavily polluted",
             "VI severely polluted")


def aqi_band(pm25: np.ndarray) -> np.ndarray:
    """The band index (0–5) of each PM2.5 concentration (a band includes its upper breakpoint)."""
    return np.searchsorted(np.asarray(AQI_BREAKPOINTS), np.asarray(pm25, dtype=np.float64), side="left")


def beijing_aqi(steps: int | None = None, extras: bool = False) -> Fleet:
    """The 12 stations, each a stream of `(other readings, AQI band of PM2.5)` in time order."""
    base = load_beijing("none", "station", steps=steps, extras=extras)
    streams = []
    for s in base.streams:
        names = list(s.feature_names)
        k = names.index("PM2.5")
        X = np.concatenate([np.delete(s.X, k, axis=1), s.y[:, None]], axis=1)
        streams.append(ClientStream(s.name, X, aqi_band(s.X[:, k]).astype(np.float64),
                                    (*names[:k], *names[k + 1:], BEIJING_TARGET)))
    return Fleet(tuple(streams), dataset="beijing-aqi", normalisation="none", split="station", target="PM2.5 band")
