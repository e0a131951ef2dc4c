"""The Prometheus exporter: a collector over the fleet's telemetry (:mod:`streamfed.fleet.telemetry`),
read at scrape time, and the HTTP server that serves it.

A :class:`StreamfedCollector` registered on an explicit :class:`~prometheus_client.CollectorRegistry`
reads a live set of stats objects only when Prometheus scrapes, so one process can serve a demo fleet of
hundreds of agents cheaply; :func:`serve_metrics` serves a registry over HTTP.

Exported metrics (all prefixed ``streamfed_``; ``fleet`` and ``client`` identify an agent):

======================================================== ========= ===============================
name                                                     type      labels
======================================================== ========= ===============================
``streamfed_agent_info``                                 gauge(1)  fleet, client, algorithm
``streamfed_agent_samples_total``                        counter   fleet, client
``streamfed_agent_samples_skipped_total``                counter   fleet, client, reason
``streamfed_agent_learner_steps_total``                  counter   fleet, client
``streamfed_agent_cumulative_loss``                      gauge     fleet, client
``streamfed_agent_best_kernel_cumulative_loss``          gauge     fleet, client
``streamfed_agent_regret``                               gauge     fleet, client
``streamfed_agent_mse``                                  gauge     fleet, client
``streamfed_agent_windowed_mse``                         gauge     fleet, client
``streamfed_agent_interval_hits_total``                  counter   fleet, client
``streamfed_agent_interval_predictions_total``           counter   fleet, client
``streamfed_agent_interval_coverage_ratio``              gauge     fleet, client
``streamfed_agent_accuracy``                             gauge     fleet, client (classifiers)
``streamfed_agent_log_loss``                             gauge     fleet, client (classifiers)
``streamfed_agent_expected_calibration_error``           gauge     fleet, client (classifiers)
``streamfed_agent_kernel_weight``                        gauge     fleet, client, kernel
``streamfed_agent_learner_value``                        gauge     fleet, client, name
``streamfed_agent_recent_skip_ratio``                    gauge     fleet, client
``streamfed_agent_healthy``                              gauge     fleet, client
``streamfed_agent_upload_bytes_total``                   counter   fleet, client
``streamfed_agent_upload_messages_total``                counter   fleet, client
``streamfed_agent_global_version``                       gauge     fleet, client
``streamfed_agent_global_epoch``                         gauge     fleet, client
``streamfed_agent_global_staleness_seconds``             gauge     fleet, client
``streamfed_agent_global_versions_behind``               gauge     fleet, client
``streamfed_agent_prediction_duration_seconds``          histogram fleet, client (small fleets)
``streamfed_agent_dp_epsilon``                           gauge     fleet, client (differential privacy on)
``streamfed_agent_dp_delta``                             gauge     fleet, client (differential privacy on)
``streamfed_agent_dp_budget``                            gauge     fleet, client (with a budget)
``streamfed_agent_dp_budget_exhausted``                  gauge     fleet, client (differential privacy on)
``streamfed_prediction_duration_seconds``                histogram fleet
``streamfed_aggregator_updates_accepted_total``          counter   fleet
``streamfed_aggregator_updates_rejected_total``          counter   fleet, reason
``streamfed_aggregator_active_clients``                  gauge     fleet
``streamfed_aggregator_rounds_total``                    counter   fleet
``streamfed_aggregator_last_round_timestamp_seconds``    gauge     fleet
``streamfed_aggregator_aggregation_duration_seconds``    histogram fleet
``streamfed_aggregator_global_version``                  gauge     fleet
``streamfed_aggregator_value``                           gauge     fleet, name
``streamfed_aggregator_ingest_lag_seconds``              gauge     fleet
======================================================== ========= ===============================

A gauge that is not known yet (no learner read, no interval prediction, no global received, no
round) is omitted rather than exported as NaN.

Under differential privacy an agent's series are only those independent of its data beyond what the
accountant covers (:attr:`AgentStats.withholds_data_statistics`): info, upload bytes and messages, health, the
global's version, epoch, staleness and versions behind, the ``dp_*`` gauges and the learner values
``dp_epsilon`` / ``dp_uploads``. Every quality metric, count of samples and latency is withheld (and the agent
left out of the fleet-wide latency histogram) unless the operator opted in (``unnoised_metrics``;
docs/privacy.md § The privacy boundary).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from streamfed.fleet.telemetry import DP_PUBLIC_VALUES, AgentStats, AggregatorStats

__all__ = ["MetricsServer", "StreamfedCollector", "make_registry", "serve_metrics"]


# =========================================================================== collector

_A = ("fleet", "client")


def _histogram(name: str, doc: str, labels: Sequence[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=list(labels), unit="seconds")


def _add_histogram(fam: HistogramMetricFamily, labels: list[str], bounds: Sequence[float],
                   cumulative: list[int], total: float) -> None:
    buckets = [(_le(b), float(c)) for b, c in zip(bounds, cumulative, strict=False)]
    buckets.append(("+Inf", float(cumulative[-1])))
    fam.add_metric(labels, buckets, total)


def _le(bound: float) -> str:
    return repr(float(bound))  # Go's ParseFloat reads repr; "1e-05" and "0.001" are both fine


class StreamfedCollector(Collector):
    """A Prometheus collector over a live set of :class:`AgentStats` and :class:`AggregatorStats`,
    read at scrape time. Add and remove stats objects at any time (thread-safe).

    Latency: a fleet-wide histogram per fleet always; per-client histograms only while the collector
    serves at most `per_client_histograms_max` agents (each costs ~20 series per client).

    >>> from prometheus_client import generate_latest
    >>> agent = AgentStats("a1", fleet="demo", algorithm="pofmkl")
    >>> agent.observe_prediction(1.0, 0.5, latency_s=0.0001)
    >>> registry = make_registry(StreamfedCollector([agent], [AggregatorStats("demo")]))
    >>> text = generate_latest(registry).decode()
    >>> print([line for line in text.splitlines() if line.startswith("streamfed_agent_mse")][0])
    streamfed_agent_mse{client="a1",fleet="demo"} 0.25
    """

    def __init__(self, agents: Iterable[AgentStats] = (), aggregators: Iterable[AggregatorStats] = (), *,
                 per_client_histograms_max: int = 50) -> None:
        self.per_client_histograms_max = int(per_client_histograms_max)
        self._lock = threading.Lock()
        self._agents: dict[tuple[str, str], AgentStats] = {}
        self._aggregators: dict[str, AggregatorStats] = {}
        self.add(*agents, *aggregators)

    # ------------------------------------------------------------------ the live set
    def add(self, *stats: AgentStats | AggregatorStats) -> None:
        """Serve these stats objects from now on (`ValueError` for a duplicate fleet/client)."""
        with self._lock:
            for s in stats:
                if isinstance(s, AgentStats):
                    key = (s.fleet, s.client)
                    if self._agents.get(key, s) is not s:
                        raise ValueError(f"agent {s.client!r} of fleet {s.fleet!r} is already collected")
                    self._agents[key] = s
                elif isinstance(s, AggregatorStats):
                    if self._aggregators.get(s.fleet, s) is not s:
                        raise ValueError(f"an aggregator of fleet {s.fleet!r} is already collected")
                    self._aggregators[s.fleet] = s
                else:
                    raise TypeError(f"expected AgentStats or AggregatorStats, got {type(s).__name__}")

    def remove(self, *stats: AgentStats | AggregatorStats) -> None:
        """Stop serving these stats objects (their series go stale in Prometheus)."""
        with self._lock:
            for s in stats:
                if isinstance(s, AgentStats):
                    self._agents.pop((s.fleet, s.client), None)
                else:
                    self._aggregators.pop(s.fleet, None)

    @property
    def agents(self) -> list[AgentStats]:
        with self._lock:
            return list(self._agents.values())

    @property
    def aggregators(self) -> list[AggregatorStats]:
        with self._lock:
            return list(self._aggregators.values())

    # ------------------------------------------------------------------ Collector protocol
    def describe(self) -> Iterable[Metric]:
        """Every family this collector may export (empty), so a registry can refuse name clashes."""
        return list(self._families(per_client=True).values())

    def _families(self, per_client: bool) -> dict[str, Metric]:
        def g(name: str, doc: str, labels: Sequence[str] = _A, unit: str = "") -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels), unit=unit)

        def c(name: str, doc: str, labels: Sequence[str] = _A, unit: str = "") -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=list(labels), unit=unit)

        fams: list[Metric] = [
            InfoMetricFamily("streamfed_agent", "Agents served by this endpoint, with their algorithm.", labels=_A),
            c("streamfed_agent_samples", "Samples scored (predicted, then learned)."),
            c("streamfed_agent_samples_skipped", "Samples dropped before scoring, by reason.", (*_A, "reason")),
            c("streamfed_agent_learner_steps", "Samples the learner has learned from (T of the regret)."),
            g("streamfed_agent_cumulative_loss", "Learner's cumulative squared loss, sum of (yhat - y)^2."),
            g("streamfed_agent_best_kernel_cumulative_loss",
              "Cumulative squared loss of the best single kernel (comparator) in hindsight."),
            g("streamfed_agent_regret", "Regret R(T): learner loss minus best kernel loss in hindsight."),
            g("streamfed_agent_mse", "Running mean squared error of all scored predictions."),
            g("streamfed_agent_windowed_mse", "Mean squared error of the most recent scored predictions."),
            c("streamfed_agent_interval_hits", "Targets inside the central 95% predictive interval."),
            c("streamfed_agent_interval_predictions", "Predictions made with a predictive variance."),
            g("streamfed_agent_interval_coverage_ratio", "Fraction of targets inside the 95% predictive interval."),
            g("streamfed_agent_accuracy", "A classifier's prequential accuracy (the most probable class, predicted "
              "before learning the label)."),
            g("streamfed_agent_log_loss", "A classifier's mean log loss, -log p(true class) floored at 1e-12."),
            g("streamfed_agent_expected_calibration_error", "A classifier's expected calibration error (15 "
              "equal-width bins of the top probability)."),
            g("streamfed_agent_kernel_weight", "Normalised kernel weight.", (*_A, "kernel")),
            g("streamfed_agent_recent_skip_ratio", "Share of the source's recent items skipped (bad input)."),
            g("streamfed_agent_healthy", "1, or 0 while the agent cannot write its state (its updates are held back)."),
            g("streamfed_agent_learner_value", "A number the learner reports about itself (e.g. shared vs own log "
              "evidence).", (*_A, "name")),
            c("streamfed_agent_upload_bytes", "Payload bytes of model updates uploaded.", unit="bytes"),
            c("streamfed_agent_upload_messages", "Model update messages uploaded."),
            g("streamfed_agent_global_version", "Version of the global model in use."),
            g("streamfed_agent_global_epoch", "Epoch of the global model in use (a new learned kernel or (θ, Z) "
              "starts one)."),
            g("streamfed_agent_global_staleness_seconds", "Seconds since the global model in use was received.",
              unit="seconds"),
            g("streamfed_agent_global_versions_behind", "Global versions between the one in use and the newest known."),
            g("streamfed_agent_dp_epsilon", "Differential privacy spent by this agent's uploads: epsilon at dp_delta."),
            g("streamfed_agent_dp_delta", "The delta at which streamfed_agent_dp_epsilon is accounted."),
            g("streamfed_agent_dp_budget", "The epsilon budget after which the agent stops uploading."),
            g("streamfed_agent_dp_budget_exhausted", "1 when the privacy budget stopped this agent's uploads."),
            _histogram("streamfed_prediction_duration_seconds", "Prediction latency of a fleet's agents.",
                       ("fleet",)),
            c("streamfed_aggregator_updates_accepted", "Model updates accepted.", ("fleet",)),
            c("streamfed_aggregator_updates_rejected", "Model updates rejected, by reason.", ("fleet", "reason")),
            g("streamfed_aggregator_active_clients", "Clients heard within the activity window.", ("fleet",)),
            c("streamfed_aggregator_rounds", "Aggregation rounds (or windows) completed.", ("fleet",)),
            g("streamfed_aggregator_last_round_timestamp_seconds", "Unix time of the last completed round.",
              ("fleet",), unit="seconds"),
            _histogram("streamfed_aggregator_aggregation_duration_seconds", "Duration of one aggregation.",
                       ("fleet",)),
            g("streamfed_aggregator_global_version", "Version of the newest global model published.", ("fleet",)),
            g("streamfed_aggregator_ingest_lag_seconds", "Age of the last accepted update when it was taken in "
              "(by its sender's clock): an aggregator falling behind its input.", ("fleet",)),
            g("streamfed_aggregator_value", "A number the aggregation reports about itself (e.g. kernels reset after "
              "an overflow).", ("fleet", "name")),
        ]
        if per_client:
            fams.append(_histogram("streamfed_agent_prediction_duration_seconds", "Prediction latency per agent.",
                                   _A))
        return {f.name: f for f in fams}

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            agents = list(self._agents.values())
            aggregators = list(self._aggregators.values())
        per_client = len(agents) <= self.per_client_histograms_max
        f = self._families(per_client)
        newest = {a.fleet: a.global_version or 0 for a in aggregators}
        fleet_latency: dict[str, tuple[tuple[float, ...], list[int], float]] = {}

        for s in agents:
            lab = [s.fleet, s.client]
            f["streamfed_agent"].add_metric(lab, {"algorithm": s.algorithm})  # type: ignore[attr-defined]
            f["streamfed_agent_upload_bytes"].add_metric(lab, s.upload_bytes)  # type: ignore[attr-defined]
            f["streamfed_agent_upload_messages"].add_metric(lab, s.upload_messages)  # type: ignore[attr-defined]
            f["streamfed_agent_healthy"].add_metric(lab, s.healthy)  # type: ignore[attr-defined]
            if s.global_version is not None:
                f["streamfed_agent_global_version"].add_metric(lab, s.global_version)  # type: ignore[attr-defined]
                f["streamfed_agent_global_epoch"].add_metric(lab, s.global_epoch)  # type: ignore[attr-defined]
                f["streamfed_agent_global_staleness_seconds"].add_metric(  # type: ignore[attr-defined]
                    lab, s.staleness_seconds())
            f["streamfed_agent_global_versions_behind"].add_metric(  # type: ignore[attr-defined]
                lab, s.versions_behind(newest.get(s.fleet, 0)))
            if s.dp_epsilon is not None and s.dp_delta is not None:
                f["streamfed_agent_dp_epsilon"].add_metric(lab, s.dp_epsilon)  # type: ignore[attr-defined]
                f["streamfed_agent_dp_delta"].add_metric(lab, s.dp_delta)  # type: ignore[attr-defined]
                f["streamfed_agent_dp_budget_exhausted"].add_metric(lab, float(s.dp_exhausted))  # type: ignore[attr-defined]
                if s.dp_budget is not None:
                    f["streamfed_agent_dp_budget"].add_metric(lab, s.dp_budget)  # type: ignore[attr-defined]
            if s.withholds_data_statistics:
                # differential privacy: only numbers the accountant covers or that are public (uploads, versions,
                # health) leave; every statistic of the raw stream stays on the device (docs/privacy.md)
                for name, v in list(s.learner_values.items()):
                    if name in DP_PUBLIC_VALUES:
                        f["streamfed_agent_learner_value"].add_metric([*lab, name], v)  # type: ignore[attr-defined]
                continue
            f["streamfed_agent_samples"].add_metric(lab, s.samples)  # type: ignore[attr-defined]
            for reason, n in list(s.skipped.items()):
                f["streamfed_agent_samples_skipped"].add_metric([*lab, reason], n)  # type: ignore[attr-defined]
            if s.learner_steps is not None:
                f["streamfed_agent_learner_steps"].add_metric(lab, s.learner_steps)  # type: ignore[attr-defined]
            for name, value in (("streamfed_agent_cumulative_loss", s.learner_loss),
                                ("streamfed_agent_best_kernel_cumulative_loss", s.best_kernel_loss),
                                ("streamfed_agent_regret", s.regret)):
                if value is not None:
                    f[name].add_metric(lab, value)  # type: ignore[attr-defined]
            if s.samples and s.classification is None:  # a classifier's "mean" is a class index: no MSE
                f["streamfed_agent_mse"].add_metric(lab, s.mse)  # type: ignore[attr-defined]
                f["streamfed_agent_windowed_mse"].add_metric(lab, s.windowed_mse)  # type: ignore[attr-defined]
            if s.interval_total:
                hits, total = s.interval_hits, s.interval_total
                f["streamfed_agent_interval_hits"].add_metric(lab, hits)  # type: ignore[attr-defined]
                f["streamfed_agent_interval_predictions"].add_metric(lab, total)  # type: ignore[attr-defined]
                f["streamfed_agent_interval_coverage_ratio"].add_metric(lab, hits / total)  # type: ignore[attr-defined]
            cls = s.classification
            if cls is not None and cls.n:  # classifiers only, once they have scored a prediction
                f["streamfed_agent_accuracy"].add_metric(lab, cls.accuracy)  # type: ignore[attr-defined]
                f["streamfed_agent_log_loss"].add_metric(lab, cls.log_loss)  # type: ignore[attr-defined]
                f["streamfed_agent_expected_calibration_error"].add_metric(  # type: ignore[attr-defined]
                    lab, cls.expected_calibration_error)
            for kernel, w in zip(s.kernel_names, list(s.kernel_weights), strict=False):
                f["streamfed_agent_kernel_weight"].add_metric([*lab, kernel], w)  # type: ignore[attr-defined]
            if s.recent_skip_ratio is not None:
                f["streamfed_agent_recent_skip_ratio"].add_metric(lab, s.recent_skip_ratio)  # type: ignore[attr-defined]
            for name, v in list(s.learner_values.items()):
                f["streamfed_agent_learner_value"].add_metric([*lab, name], v)  # type: ignore[attr-defined]

            counts = list(s.latency.counts)
            if per_client:
                _add_histogram(f["streamfed_agent_prediction_duration_seconds"], lab,  # type: ignore[arg-type]
                               s.latency.bounds, list(accumulate(counts)), s.latency.sum)
            acc = fleet_latency.get(s.fleet)
            if acc is None:
                fleet_latency[s.fleet] = (s.latency.bounds, counts, s.latency.sum)
            elif acc[0] == s.latency.bounds:  # agents with other buckets cannot be merged: left out
                fleet_latency[s.fleet] = (acc[0], [x + y for x, y in zip(acc[1], counts, strict=True)],
                                          acc[2] + s.latency.sum)
        for fleet, (bounds, counts, total) in fleet_latency.items():
            _add_histogram(f["streamfed_prediction_duration_seconds"], [fleet],  # type: ignore[arg-type]
                           bounds, list(accumulate(counts)), total)

        for a in aggregators:
            lab = [a.fleet]
            f["streamfed_aggregator_updates_accepted"].add_metric(lab, a.updates_accepted)  # type: ignore[attr-defined]
            for reason, n in list(a.rejected_by_reason.items()):
                f["streamfed_aggregator_updates_rejected"].add_metric([a.fleet, reason], n)  # type: ignore[attr-defined]
            f["streamfed_aggregator_active_clients"].add_metric(lab, a.active_clients())  # type: ignore[attr-defined]
            f["streamfed_aggregator_rounds"].add_metric(lab, a.rounds)  # type: ignore[attr-defined]
            if a.last_round_wall is not None:
                f["streamfed_aggregator_last_round_timestamp_seconds"].add_metric(  # type: ignore[attr-defined]
                    lab, a.last_round_wall)
            if a.global_version is not None:
                f["streamfed_aggregator_global_version"].add_metric(lab, a.global_version)  # type: ignore[attr-defined]
            if a.ingest_lag_s is not None:
                f["streamfed_aggregator_ingest_lag_seconds"].add_metric(lab, a.ingest_lag_s)  # type: ignore[attr-defined]
            for name, v in list(a.values.items()):
                f["streamfed_aggregator_value"].add_metric([a.fleet, name], v)  # type: ignore[attr-defined]
            _add_histogram(f["streamfed_aggregator_aggregation_duration_seconds"], lab,  # type: ignore[arg-type]
                           a.aggregation.bounds, a.aggregation.cumulative(), a.aggregation.sum)

        # families without samples are left out: promtool flags a HELP/TYPE with no series
        return (m for m in f.values() if m.samples)


def make_registry(*collectors: Collector) -> CollectorRegistry:
    """A fresh registry (not the process-global default) holding `collectors`.

    >>> reg = make_registry(StreamfedCollector())
    >>> list(reg.collect())
    []
    """
    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    return registry


# =========================================================================== HTTP


class MetricsServer:
    """A running metrics HTTP server (prometheus_client's threaded WSGI server); :meth:`close`
    stops it. Also a context manager.

    >>> server, port = serve_metrics(make_registry(StreamfedCollector()))
    >>> server.url == f"http://127.0.0.1:{port}/metrics"
    True
    >>> server.close()
    """

    def __init__(self, httpd: Any, thread: threading.Thread, host: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host = host
        self.port = int(httpd.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._httpd is None:
            return
        httpd, self._httpd = self._httpd, None
        httpd.shutdown()  # returns once serve_forever has exited
        httpd.server_close()
        self._thread.join(timeout)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0) -> tuple[MetricsServer, int]:
    """Serve `registry` on `http://host:port/metrics` from a daemon thread; `port=0` picks a free port.
    Returns the server (call `.close()` to stop it) and the port actually bound."""
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    server = MetricsServer(httpd, thread, host)
    return server, server.port
