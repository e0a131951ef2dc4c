"""`streamfed demo`: a whole fleet on one machine with no configuration.

A broker (Mosquitto from `broker_config/` when installed, else an in-process one — it says which),
one aggregator and one agent per Beijing station, all in this process over real MQTT; a live table of
per-agent error and regret; a Prometheus endpoint; a summary at the end. `duration` bounds it.

The agents read the vendored streams as the sensors gave them (CO in µg/m³) and standardise them online
themselves, as a real agent does by default (`standardise = "online"`): each error is reported both in
the stream's units (the agent's predictions are mapped back) and standardised — divided by the scale of the
station's earlier targets, the learner's own units (:class:`DemoStats`). Under differential privacy the
agents standardise with declared scales instead: the POF-MKL paper's normalisation of the whole dataset
(inputs divided by the largest row norm, the target min-max scaled), public knowledge of the sensors.

A classifier (e.g. pFedGP) predicts each station's PM2.5 AQI band (:mod:`streamfed.evaluation.datasets.aqi`)
and its table shows accuracy, log loss and calibration instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from streamfed import algorithms
from streamfed.core.standardise import DEFAULT_WARMUP
from streamfed.evaluation.datasets import ClientStream, load_beijing, paper_constants
from streamfed.evaluation.datasets.aqi import beijing_aqi
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig, PublicScales
from streamfed.fleet.robustness import Robustness
from streamfed.fleet.sources import array_source
from streamfed.fleet.telemetry import AgentStats
from streamfed.runtime.agent import AgentService
from streamfed.runtime.aggregator import AggregatorService
from streamfed.runtime.broker import EmbeddedBroker
from streamfed.runtime.exporter import StreamfedCollector, make_registry, serve_metrics
from streamfed.wire.message import Reason

__all__ = ["UNITS", "DemoOptions", "DemoStats", "fleet_errors", "public_scales", "run_demo"]

UNITS = "µg/m³"  # of the Beijing target, CO, as the dataset records it


@dataclass(frozen=True)
class DemoOptions:
    duration: float = 30.0
    agents: int = 12
    rate: float = 100.0  # samples per second per agent
    algorithm: str = algorithms.DEFAULT
    n_kernels: int = 16
    n_features: int = 50
    bin_size: int = 1
    eta: float = 0.005
    window: float = 0.2  # aggregation window (s)
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    out_dir: str = "out/demo"
    dp_epsilon: float | None = None  # differentially private uploads (docs/privacy.md)
    secure_aggregation: bool = False


class DemoStats(AgentStats):
    """An agent's stats (its MSE in the stream's units, as the agent scores it) plus its error standardised:
    each error divided by the scale of the targets scored before it — the sample standard deviation of the
    station's past, as the agent's online standardiser has it (the first two only set it), or a declared
    `y_scale`. With online scales that is the error in the learner's own units.

    >>> s = DemoStats("a")
    >>> for y, yhat in ((10.0, 0.0), (12.0, 10.0), (14.0, 12.0), (11.0, 12.0)):
    ...     s.observe_prediction(y, yhat)
    >>> s.mse, s.z_samples, round(s.z_mse, 6)  # scales √2, then 2: (2/√2)² and (1/2)², averaged
    (27.25, 2, 1.125)
    """

    __slots__ = ("_count", "_m2", "_mean", "y_scale", "z_samples", "z_sq_error_sum")

    def __init__(self, client: str, *, y_scale: float | None = None, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.y_scale = None if y_scale is None else float(y_scale)
        # the targets' running mean and sum of squared deviations (Welford): OnlineStandardiser's rule for one
        # column, in plain floats — on the hot path of every agent, where numpy's per-call cost is 20 µs
        self._count, self._mean, self._m2 = 0, 0.0, 0.0
        self.z_samples = 0
        self.z_sq_error_sum = 0.0

    def _past_scale(self) -> float | None:
        """The targets' sample standard deviation so far, or `|mean|`, or 1 when they have no spread
        (:class:`~streamfed.core.standardise.OnlineStandardiser`'s scale); None before two."""
        if self._count < DEFAULT_WARMUP:
            return None
        s = math.sqrt(self._m2 / (self._count - 1))
        return s if s > 0.0 else (abs(self._mean) if self._mean != 0.0 else 1.0)

    def observe_prediction(self, y: float, yhat: float, latency_s: float | None = None,
                           var: float | None = None, proba: np.ndarray | None = None) -> None:
        before = self.samples
        super().observe_prediction(y, yhat, latency_s, var, proba)
        if self.samples == before:  # not scored (a non-finite error): not folded in either
            return
        scale = self._past_scale() if self.y_scale is None else self.y_scale
        if scale is not None:
            self.z_samples += 1
            self.z_sq_error_sum += ((y - yhat) / scale) ** 2
        if self.y_scale is None:
            delta = y - self._mean
            mean = self._mean + delta / (self._count + 1)
            m2 = self._m2 + delta * (y - mean)
            if math.isfinite(m2):  # else refused, as the agent's standardiser refuses it
                self._count, self._mean, self._m2 = self._count + 1, mean, m2

    @property
    def z_mse(self) -> float:
        """The MSE standardised (NaN before the scales are set)."""
        return self.z_sq_error_sum / self.z_samples if self.z_samples else math.nan


def public_scales(streams: Iterable[ClientStream]) -> PublicScales:
    """The POF-MKL paper's normalisation of `streams` as declared scales: every input divided by the largest
    input row norm, the target mapped to `[0, 1]` by its minimum and range (docs/privacy.md: declared scales,
    not the running ones, under differential privacy).

    >>> s = ClientStream("a", np.array([[3.0, 4.0], [0.0, 1.0]]), np.array([10.0, 30.0]), ("u", "v"))
    >>> p = public_scales([s])
    >>> p.x_scale, p.y_mean, p.y_scale
    ((5.0, 5.0), 10.0, 20.0)
    """
    streams = list(streams)
    c = paper_constants(streams)
    d = streams[0].X.shape[1]
    span = c["y_max"] - c["y_min"]
    return PublicScales(x_mean=(0.0,) * d, x_scale=(c["x_norm"] if c["x_norm"] > 0 else 1.0,) * d,
                        y_mean=c["y_min"], y_scale=span if span > 0 else 1.0)


def _prometheus_config(out_dir: str, port: int) -> Path:
    """A Prometheus config scraping this demo's endpoint every 5 s, with the shipped rules if present."""
    path = Path(out_dir) / "prometheus.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    rules = Path(__file__).resolve().parents[1] / "broker_config" / "prometheus" / "rules" / "streamfed.rules.yml"
    lines = ["global:", "  scrape_interval: 5s", "  evaluation_interval: 5s"]
    if rules.exists():
        lines += ["rule_files:", f"  - {rules}"]
    lines += ["scrape_configs:", "  - job_name: streamfed-demo", "    static_configs:",
              f"      - targets: ['127.0.0.1:{port}']"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _fmt(v: float | None, spec: str = ".4f") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _p99_ms(latencies: Iterable[float]) -> float | None:
    """The 99th percentile of an agent's prediction latencies (seconds), in ms; None before any."""
    lat = sorted(latencies)
    return lat[int(0.99 * (len(lat) - 1))] * 1e3 if lat else None


def _sqrt(v: float | None) -> float | None:
    return None if v is None or not v >= 0.0 else math.sqrt(v)


def fleet_errors(stats: Iterable[AgentStats]) -> dict[str, float]:
    """The fleet's error over every scored sample of `stats`: `mse` standardised (:class:`DemoStats`; NaN
    without), `mse_stream` and `rmse_stream` in the stream's units.

    >>> a, b = DemoStats("a", y_scale=2.0), DemoStats("b", y_scale=4.0)
    >>> a.observe_prediction(1.0, 3.0); b.observe_prediction(0.0, 4.0)
    >>> fleet_errors([a, b])
    {'mse': 1.0, 'mse_stream': 10.0, 'rmse_stream': 3.1622776601683795}
    """
    stats = list(stats)
    n = sum(s.samples for s in stats)
    zn = sum(s.z_samples for s in stats if isinstance(s, DemoStats))
    mse_stream = sum(s.sq_error_sum for s in stats) / n if n else math.nan
    return {"mse": sum(s.z_sq_error_sum for s in stats if isinstance(s, DemoStats)) / zn if zn else math.nan,
            "mse_stream": mse_stream, "rmse_stream": math.sqrt(mse_stream) if n else math.nan}


def _standardised_by(stats: list[AgentStats]) -> str:
    """What the standardised figures are divided by, in words."""
    declared = [s.y_scale for s in stats if isinstance(s, DemoStats) and s.y_scale is not None]
    if declared:
        return f"in units of the declared scale, {declared[0]:g} {UNITS}"
    return "in standard deviations of each station's past CO"


def _table(services: list[AgentService], agg: AggregatorService, title: str, classifier: bool = False) -> Table:
    t = Table(title=title, expand=False)
    # regression: the MSE standardised (the learner's units), the RMSE (all, last 100) in the stream's units
    scores = ("acc", "log loss", "ECE") if classifier else ("MSE z", f"RMSE {UNITS}", "RMSE100")
    for col in ("agent", "n", *scores, "R(T)", "R/T", *(() if classifier else ("cov95",)), "v", "kB up", "p99 ms"):
        t.add_column(col, justify="left" if col == "agent" else "right")
    for s in services:
        st = s.core.stats
        p99 = _p99_ms(s.latencies)
        r = st.regret
        rt = r / st.learner_steps if r is not None and st.learner_steps else None
        c = st.classification
        if classifier:
            shown = (("—", "—", "—") if c is None else
                     (_fmt(c.accuracy, ".3f"), _fmt(c.log_loss, ".3f"), _fmt(c.expected_calibration_error, ".3f")))
            t.add_row(s.client_id[:12], str(st.samples), *shown, _fmt(r, ".3f"), _fmt(rt, ".2e"),
                      str(st.global_version or 0), f"{st.upload_bytes / 1e3:.0f}", _fmt(p99, ".2f"))
            continue
        z = st.z_mse if isinstance(st, DemoStats) else None
        t.add_row(s.client_id[:12], str(st.samples), _fmt(z), _fmt(_sqrt(st.mse), ".1f"),
                  _fmt(_sqrt(st.windowed_mse), ".1f"), _fmt(r, ".3f"),
                  _fmt(rt, ".2e"), _fmt(st.coverage, ".3f"), str(st.global_version or 0),
                  f"{st.upload_bytes / 1e3:.0f}", _fmt(p99, ".2f"))
    a = agg.core
    t.caption = (f"aggregator: global v{a.version}, {a.counters.accepted} updates accepted, "
                 f"{sum(a.rejected.values())} rejected, {a.counters.rounds} rounds")
    if not classifier:
        e = fleet_errors(s.core.stats for s in services)
        t.caption += (f"\nfleet: MSE {_fmt(e['mse'])} standardised; RMSE {_fmt(e['rmse_stream'], '.1f')} {UNITS} "
                      f"of CO (MSE z: {_standardised_by([s.core.stats for s in services])})")
    return t


async def run_demo(opts: DemoOptions, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    broker = await EmbeddedBroker().start()
    console.print(f"[bold]broker[/]: {broker.description}")
    alg = algorithms.get(opts.algorithm)
    classifier = alg.task == "classification"
    # a classifier runs on the stations' PM2.5 AQI bands, a regressor on CO: the readings as the sensors gave
    # them, which the agents standardise themselves (the default), so their errors are in the stream's units
    fleet = beijing_aqi() if classifier else load_beijing(normalisation="none", split="station")
    streams = fleet.streams[: opts.agents]
    settings: dict[str, Any] = dict(alg.demo_settings())  # what makes a good live demo of this algorithm
    # the demo's dictionary and step size, for the families whose settings have them, unless its own say otherwise
    fields = alg.Params.model_fields
    ours = {"n_kernels": opts.n_kernels, "n_features": opts.n_features, "bin_size": opts.bin_size, "eta": opts.eta}
    params = {k: v for k, v in ours.items() if k in fields} | dict(settings.pop("params", {}))
    declared: PublicScales | None = None
    if opts.dp_epsilon is not None:
        # DP refuses the agents' running scales (docs/privacy.md): a regressor declares the paper's normalisation
        # of the whole dataset; a classifier (whose label is never scaled) takes its inputs as they come
        if classifier:
            settings["standardise"] = "none"
        else:
            settings["public_scales"] = declared = public_scales(fleet.streams)
    # the fleet declares its sensors' rate: the aggregator's rate limits follow from it (docs/reliability.md §7.1)
    if 0 < opts.rate < float("inf"):
        settings.setdefault("robust", Robustness(sensor_rate=opts.rate))
    cfg = FleetConfig(fleet="demo", algorithm=opts.algorithm, n_inputs=streams[0].X.shape[1],
                      params=alg.Params(**params), dp_epsilon=opts.dp_epsilon,
                      secure_aggregation=opts.secure_aggregation, **settings)
    bcfg = broker.config
    agg = AggregatorService(AggregatorCore(cfg, clients=[s.name for s in streams], mode="async", window=opts.window),
                            bcfg, freeze=True)
    y_scale = None if declared is None else declared.y_scale
    agents = [AgentService(AgentCore(cfg, s.name, i, mode="async", stats=None if classifier else DemoStats(
                  s.name, fleet=cfg.fleet, algorithm=cfg.algorithm, y_scale=y_scale)),
                  bcfg, array_source(s.X, s.y, rate_hz=opts.rate))
              for i, s in enumerate(streams)]
    collector = StreamfedCollector([a.core.stats for a in agents], [agg.core.stats])
    server, port = serve_metrics(make_registry(collector), host=opts.metrics_host, port=opts.metrics_port)
    prom = _prometheus_config(opts.out_dir, port)
    console.print(f"[bold]metrics[/]: {server.url}\n  scrape them with: prometheus --config.file={prom} "
                  f"--storage.tsdb.path={opts.out_dir}/prometheus-data --web.listen-address=127.0.0.1:9090\n"
                  "  (recording rules and alerts: broker_config/prometheus/; dashboard: broker_config/grafana/)")
    shown = [cfg.algorithm, *(f"{s}={getattr(cfg.params, k)}" for s, k in (
        ("N", "n_kernels"), ("D", "n_features"), ("M", "bin_size")) if k in fields)]
    console.print(f"[bold]fleet[/]: {len(agents)} agents ({', '.join(shown)}) at {opts.rate:g} samples/s each, "
                  f"for {opts.duration:g} s; "
                  f"predictions on streamfed/v1/demo/predictions/+")
    # Compile (or load from numba's cache) the per-sample and aggregation paths once, before the clock
    # starts: on a fresh install that takes longer than a short demo, and it is process-wide, so the
    # services' own warm-ups are then instant. In a thread, so the live view stays responsive.
    from streamfed.core import compiled

    how = {"aot": "ahead-of-time build",
           "mixed": "partly an ahead-of-time build, partly numba JIT — `streamfed kernels build` builds them all",
           "jit": "numba JIT; cached after the first run — `streamfed kernels build` compiles them once for good",
           }[compiled.backend()]
    with console.status(f"loading the learners' kernels ({how})…"):
        warm_started = time.monotonic()
        await asyncio.to_thread(lambda: (agents[0].core.warm_up(), agg.core.warm_up()))
    console.print(f"[bold]ready[/]: kernels ({how}) loaded in {time.monotonic() - warm_started:.1f} s")
    started = time.monotonic()
    agg_task = asyncio.create_task(agg.run())
    try:
        await asyncio.wait_for(agg.connected.wait(), 10)
        tasks = [asyncio.create_task(a.run()) for a in agents]
        with Live(_table(agents, agg, "streamfed demo", classifier), console=console, refresh_per_second=4,
                  transient=False) as live:
            behind = 0  # the most versions any agent was behind the aggregator, at any look (after its first global)
            while time.monotonic() - started < opts.duration and not all(t.done() for t in tasks):
                await asyncio.sleep(0.25)
                behind = max([behind, *(agg.core.version - a.core.global_version for a in agents
                                        if a.core.global_version)])
                live.update(_table(agents, agg, f"streamfed demo — {time.monotonic() - started:.0f}s", classifier))
            streamed = time.monotonic() - started
            for a in agents:
                a.stop()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            for a in agents:
                a.core.stats.update_from_learner(a.core.learner)
            live.update(_table(agents, agg, f"streamfed demo — final after {time.monotonic() - started:.0f}s",
                               classifier))
    finally:
        agg.stop()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(agg_task, 5)
        server.close()
        await broker.stop()
    samples = sum(a.core.stats.samples for a in agents)
    # what the sensors produced while the fleet ran: `rate` readings a second each (a stream may end sooner)
    offered = sum(min(len(s.y), int(opts.rate * streamed)) for s in streams)
    errors = fleet_errors(a.core.stats for a in agents)
    p99 = [v for a in agents if (v := _p99_ms(a.latencies)) is not None]
    summary = {
        "broker": broker.kind, "agents": len(agents), "rate": opts.rate, "samples": samples,
        "samples_offered": offered, "learned_share": samples / max(offered, 1),
        "max_versions_behind": behind, "agents_without_global": sum(not a.core.global_version for a in agents),
        "connections_lost": agg.reconnects + sum(a.reconnects for a in agents),
        "prediction_p99_ms": max(p99) if p99 else None,
        "global_version": agg.core.version, "updates_accepted": agg.core.counters.accepted,
        "updates_rejected": sum(agg.core.rejected.values()),
        "rejected_by_reason": {str(r): n for r, n in agg.core.rejected.items() if n},
        "mean_regret_per_sample": sum((a.core.stats.regret or 0.0) / max(a.core.stats.learner_steps or 1, 1)
                                      for a in agents) / len(agents),
        "wall_s": time.monotonic() - started,
        "globals_superseded": agg.superseded,  # waiting globals a newer one replaced before publishing
    }
    if not classifier:
        # standardised (the learner's units), then in the stream's: CO in µg/m³, per agent and for the fleet
        summary |= {"fleet_mse": errors["mse"], "fleet_mse_stream": errors["mse_stream"],
                    "fleet_rmse_stream": errors["rmse_stream"], "stream_units": UNITS,
                    "standardised": _standardised_by([a.core.stats for a in agents]),
                    "agents_mse": {a.client_id: _nan_none(a.core.stats.z_mse) for a in agents},
                    "agents_rmse_stream": {a.client_id: _nan_none(_sqrt(a.core.stats.mse)) for a in agents}}
    score = (f"fleet MSE {errors['mse']:.4f} standardised, RMSE {errors['rmse_stream']:.1f} {UNITS} "
             f"(MSE {errors['mse_stream']:.4g} ({UNITS})²) of CO")
    if classifier:
        scored = [a.core.stats.classification for a in agents if a.core.stats.classification is not None]
        n = sum(c.n for c in scored)
        summary["fleet_accuracy"] = sum(c.correct for c in scored) / n if n else math.nan
        summary["fleet_log_loss"] = sum(c.log_loss_sum for c in scored) / n if n else math.nan
        score = (f"fleet accuracy {summary['fleet_accuracy']:.3f}, log loss {summary['fleet_log_loss']:.3f} "
                 "(PM2.5 AQI band)")
    console.print(f"\n[bold]summary[/]: {samples} samples learned by {len(agents)} agents in "
                  f"{summary['wall_s']:.1f}s; {score}; mean R(T)/T "
                  f"{summary['mean_regret_per_sample']:.2e}; global v{agg.core.version} from "
                  f"{agg.core.counters.accepted} updates; " + _rejections(summary["rejected_by_reason"]) + ".")
    console.print(f"[bold]federation[/]: {samples} of {offered} readings learned ({summary['learned_share']:.1%}); "
                  f"agents at most {behind} version(s) behind the aggregator"
                  + (f", {summary['agents_without_global']} never received a global" if summary["agents_without_global"]
                     else "")
                  + f"; {summary['connections_lost']} connection(s) lost; prediction p99 "
                  f"{_fmt(summary['prediction_p99_ms'], '.2f')} ms (worst agent).")
    out = Path(opts.out_dir) / "summary.json"
    out.write_text(json.dumps(summary, indent=1, default=float) + "\n")
    console.print(f"[bold]written[/]: {out}")
    return summary


def _nan_none(v: float | None) -> float | None:
    """`v`, or None for a value JSON cannot hold (NaN before any sample)."""
    return None if v is None or not math.isfinite(v) else float(v)


def _rejections(by_reason: dict[str, int]) -> str:
    """What the aggregator refused, in words: `stale_seq` is an agent's resend of an update already applied
    (delivery is at least once; dropping the copy makes it exactly once), anything else is bad input."""
    dup = by_reason.get(Reason.STALE_SEQ, 0)
    bad = {r: n for r, n in by_reason.items() if r != Reason.STALE_SEQ}
    text = f"{dup} resent duplicate(s) dropped" if dup else "no duplicate"
    if bad:
        text += ", rejected: " + ", ".join(f"{r} {n}" for r, n in bad.items())
    return text + ("" if bad else ", nothing rejected")
