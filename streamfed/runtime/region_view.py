"""The reducer's view of its shards — one per region when regional brokers are bridged to a core
(docs/sharding.md): when each last delivered a partial the reducer took, how long that partial travelled, and
how many globals behind the shard was when it sent it. A region cut off from the core shows as a growing
silence; a bridge that queues shows as a long transit when its queue drains.

Exported by :class:`RegionCollector` (read at scrape time), labels ``fleet`` and ``shard``:

=========================================================== ======= =============================================
``streamfed_reducer_shard_last_partial_timestamp_seconds``  gauge   Unix time of the last partial taken (or, for a
                                                                     shard never heard from, when the reducer
                                                                     started: a region that never shows up alerts)
``streamfed_reducer_shard_partial_transit_seconds``         gauge   arrival − the shard's send time, last partial
``streamfed_reducer_shard_versions_behind``                 gauge   the reducer's version − the global version the
                                                                     shard had when it sent its last partial
``streamfed_reducer_shard_partials_total``                  counter partials taken (repeats included)
=========================================================== ======= =============================================

Alerts on these are in `broker_config/prometheus/rules/streamfed.rules.yml` (``StreamfedRegionSilent``,
``StreamfedRegionLagging``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["RegionView", "RegionCollector", "ShardSeen"]


@dataclass
class ShardSeen:
    """What the reducer last saw of one shard."""

    last: float  # Unix time of the last partial taken (the reducer's start time until one arrives)
    transit: float | None = None  # seconds from the shard's send time to its arrival
    behind: int | None = None  # reducer version − the shard's global version at sending
    partials: int = 0


class RegionView:
    """Per shard: the last partial's arrival, transit time and the shard's lag in global versions.

    >>> view = RegionView("f", ["north", "south"], now=100.0)
    >>> view.observe("north", sent=104.5, shard_version=3, reducer_version=5, now=105.0)
    >>> s = view.seen()
    >>> (s["north"].last, s["north"].transit, s["north"].behind, s["south"].last, s["south"].partials)
    (105.0, 0.5, 2, 100.0, 0)
    """

    def __init__(self, fleet: str, shards: Sequence[str] | None = None, now: float | None = None) -> None:
        self.fleet = fleet
        start = time.time() if now is None else now
        self._seen: dict[str, ShardSeen] = {s: ShardSeen(start) for s in shards or ()}

    def observe(self, shard: str, *, sent: float, shard_version: int, reducer_version: int,
                now: float | None = None) -> None:
        """A partial from `shard` the reducer took (applied, or acknowledged as a repeat)."""
        now = time.time() if now is None else now
        seen = self._seen.setdefault(shard, ShardSeen(now))
        seen.last = now
        seen.transit = max(0.0, now - sent)  # clocks of two hosts: never a negative transit
        seen.behind = max(0, reducer_version - shard_version)
        seen.partials += 1

    def seen(self) -> dict[str, ShardSeen]:
        return {k: ShardSeen(v.last, v.transit, v.behind, v.partials) for k, v in sorted(self._seen.items())}


class RegionCollector(Collector):
    """Prometheus collector over :class:`RegionView` objects (one per reducer in this process).

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> view = RegionView("f", ["north"], now=100.0)
    >>> reg = CollectorRegistry()
    >>> reg.register(RegionCollector([view]))
    >>> 'streamfed_reducer_shard_last_partial_timestamp_seconds{fleet="f",shard="north"} 100.0' in (
    ...     generate_latest(reg).decode())
    True
    """

    def __init__(self, views: Iterable[RegionView]) -> None:
        self.views = list(views)

    def collect(self) -> Iterator[Metric]:
        labels = ["fleet", "shard"]
        last = GaugeMetricFamily("streamfed_reducer_shard_last_partial_timestamp_seconds",
                                 "Unix time the reducer last took a partial from this shard (its start if never)",
                                 labels=labels)
        transit = GaugeMetricFamily("streamfed_reducer_shard_partial_transit_seconds",
                                    "Seconds the shard's last partial travelled (bridge queues included)",
                                    labels=labels)
        behind = GaugeMetricFamily("streamfed_reducer_shard_versions_behind",
                                   "Globals the shard had not seen yet when it sent its last partial", labels=labels)
        count = CounterMetricFamily("streamfed_reducer_shard_partials", "Partials taken from this shard", labels=labels)
        for view in self.views:
            for shard, s in view.seen().items():
                key = [view.fleet, shard]
                last.add_metric(key, s.last)
                count.add_metric(key, s.partials)
                if s.transit is not None:
                    transit.add_metric(key, s.transit)
                if s.behind is not None:
                    behind.add_metric(key, s.behind)
        yield from (last, transit, behind, count)

    def describe(self) -> Iterator[Metric]:
        return iter(())
