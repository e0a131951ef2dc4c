"""Mosquitto's `$SYS` statistics as Prometheus metrics (`streamfed broker-metrics`).

The broker publishes its counters under `$SYS/broker/…` every `sys_interval` seconds (retained, so a new
subscriber gets them at once). :class:`BrokerMetrics` keeps the latest value of each and exposes them —
most importantly ``mosquitto_publish_messages_dropped_total``: QoS 1/2 messages the broker threw away
(a full offline queue, `max_queued_messages`), which no client is ever told about. :class:`SysSubscriber`
logs in (on the production broker as the `monitor` account, bound to its client id) and feeds it.

Names: ``$SYS/broker/<a>/<b>`` becomes ``mosquitto_<a>_<b>`` (spaces and slashes as ``_``); the
cumulative counts are counters (``…_total``), ``load/<what>/<window>`` is ``mosquitto_load_<what>``
with a ``window`` label (``1min``, ``5min``, ``15min``), ``uptime`` is ``mosquitto_uptime_seconds``, the
version is ``mosquitto_broker_info{version=…}``. ``mosquitto_exporter_connected`` (1 while subscribed)
and ``mosquitto_exporter_last_update_timestamp_seconds`` tell a silent exporter from a quiet broker.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator

import aiomqtt
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamfed.fleet.config import BrokerConfig
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.session import check_subscription, reconnect_loop

__all__ = ["COUNTERS", "BrokerMetrics", "SysSubscriber"]

log = logging.getLogger(__name__)

SYS_FILTER = "$SYS/#"
_PREFIX = "$SYS/broker/"
# Cumulative since the broker started (Prometheus handles the reset at a broker restart).
COUNTERS = frozenset({
    "bytes/received", "bytes/sent", "messages/received", "messages/sent",
    "publish/bytes/received", "publish/bytes/sent",
    "publish/messages/dropped", "publish/messages/received", "publish/messages/sent",
})
_LOAD = re.compile(r"load/(.+)/(\d+min)")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _metric_name(path: str) -> str:
    return "mosquitto_" + re.sub(r"[^a-zA-Z0-9]+", "_", path).strip("_").lower()


class BrokerMetrics(Collector):
    """The latest `$SYS` values of one broker, as a Prometheus collector (thread-safe: fed from the MQTT
    loop, read from the metrics server's thread).

    >>> m = BrokerMetrics()
    >>> for topic, value in [("$SYS/broker/publish/messages/dropped", b"12"),
    ...                      ("$SYS/broker/clients/connected", b"3"),
    ...                      ("$SYS/broker/load/publish/dropped/1min", b"0.50"),
    ...                      ("$SYS/broker/uptime", b"42 seconds"),
    ...                      ("$SYS/broker/version", b"mosquitto version 2.0.11")]:
    ...     _ = m.update(topic, value)
    >>> m.value("mosquitto_publish_messages_dropped_total"), m.value("mosquitto_clients_connected")
    (12.0, 3.0)
    >>> m.value("mosquitto_load_publish_dropped", window="1min"), m.value("mosquitto_uptime_seconds")
    (0.5, 42.0)
    >>> m.update("$SYS/broker/clients/connected", b"not a number")  # ignored, counted
    False
    >>> m.ignored
    1
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, float]] = {}
        self.version: str | None = None
        self.connected = False
        self.updates = 0
        self.ignored = 0
        self.last_update: float | None = None

    def update(self, topic: str, payload: bytes) -> bool:
        """Record one `$SYS` message; False (and counted in `ignored`) for one it cannot read."""
        if not topic.startswith(_PREFIX):
            return False
        path, text = topic[len(_PREFIX):], payload.decode("utf-8", "replace").strip()
        with self._lock:
            self.updates += 1
            self.last_update = time.time()
            if path == "version":
                self.version = text
                return True
            number = _NUMBER.match(text)
            if number is None or (path != "uptime" and number.end() != len(text)):
                self.ignored += 1
                return False
            value = float(number.group())
            labels: tuple[tuple[str, str], ...] = ()
            if path == "uptime":
                key, kind = "mosquitto_uptime_seconds", "gauge"
            elif (load := _LOAD.fullmatch(path)) is not None:
                key, kind, labels = _metric_name("load/" + load.group(1)), "gauge", (("window", load.group(2)),)
            elif path in COUNTERS:
                key, kind = _metric_name(path) + "_total", "counter"
            else:
                key, kind = _metric_name(path), "gauge"
            self._values[(key, labels)] = (kind, value)
        return True

    def value(self, name: str, **labels: str) -> float | None:
        """The latest value of metric `name` (counters with their ``_total``), None if not seen yet."""
        with self._lock:
            got = self._values.get((name, tuple(sorted(labels.items()))))
        return None if got is None else got[1]

    def set_connected(self, connected: bool) -> None:
        with self._lock:
            self.connected = connected

    def describe(self) -> Iterable[Metric]:
        return []  # families depend on what the broker publishes: no fixed description

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            values = dict(self._values)
            version, connected, updates, last = self.version, self.connected, self.updates, self.last_update
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for (key, labels), (kind, value) in sorted(values.items()):
            fam = families.get(key)
            if fam is None:
                names = [k for k, _ in labels]
                doc = f"Mosquitto $SYS value ({'cumulative' if kind == 'counter' else 'current'})"
                if kind == "counter":
                    fam = CounterMetricFamily(key.removesuffix("_total"), doc, labels=names)
                else:
                    fam = GaugeMetricFamily(key, doc, labels=names)
                families[key] = fam
            fam.add_metric([v for _, v in labels], value)
        yield from families.values()
        if version is not None:
            info = GaugeMetricFamily("mosquitto_broker_info", "The broker's $SYS/broker/version", labels=["version"])
            info.add_metric([version], 1.0)
            yield info
        yield GaugeMetricFamily("mosquitto_exporter_connected", "1 while subscribed to $SYS", value=float(connected))
        yield CounterMetricFamily("mosquitto_exporter_sys_updates", "$SYS messages received", value=float(updates))
        if last is not None:
            yield GaugeMetricFamily("mosquitto_exporter_last_update_timestamp_seconds",
                                    "When the last $SYS message arrived (Unix time)", value=last)


class SysSubscriber:
    """Subscribes to `$SYS/#` with `broker` (its user name; `client_id`, default the user name — the
    production broker binds the `monitor` account to client id `monitor`) and feeds `metrics` until
    :meth:`stop`, reconnecting with back-off. A broker that refuses the login or the subscription three
    times raises :class:`~streamfed.runtime.session.BrokerRefused`.

    >>> sub = SysSubscriber(BrokerConfig(username="monitor", password="x"), BrokerMetrics())
    >>> sub.client_id
    'monitor'
    """

    def __init__(self, broker: BrokerConfig, metrics: BrokerMetrics, client_id: str | None = None,
                 max_refusals: int = 3) -> None:
        self.broker = broker
        self.metrics = metrics
        self.client_id = client_id or broker.username or "streamfed-broker-metrics"
        self.max_refusals = max_refusals
        self.refusals: dict[str, int] = {}
        self.subscribed = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        await reconnect_loop(self._session, name=f"broker-metrics {self.client_id}", stop=self._stop,
                             refusals=self.refusals, max_refusals=self.max_refusals,
                             on_lost=lambda: self.metrics.set_connected(False), logger=log)

    async def _session(self) -> None:
        # A clean, non-persistent session: statistics are retained and re-sent on every subscription.
        async with aiomqtt.Client(**client_kwargs(self.broker, self.client_id), timeout=5.0) as client:
            check_subscription(SYS_FILTER, await client.subscribe(SYS_FILTER, qos=0))
            self.metrics.set_connected(True)
            self.subscribed.set()
            stopper = asyncio.create_task(self._stop.wait())
            try:
                async for msg in _until(client.messages, stopper):
                    self.metrics.update(msg.topic.value, bytes(msg.payload))  # type: ignore[arg-type]
            finally:
                stopper.cancel()
                self.metrics.set_connected(False)


async def _until(messages: AsyncIterator[aiomqtt.Message], stopper: asyncio.Task[bool]
                 ) -> AsyncIterator[aiomqtt.Message]:
    """The messages of a client until `stopper` is done."""
    while not stopper.done():
        nxt = asyncio.ensure_future(messages.__anext__())
        done, _ = await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if nxt in done:
            yield nxt.result()
        else:
            nxt.cancel()
            return
