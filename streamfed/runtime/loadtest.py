"""Fleet load test: many simulated agents against Mosquitto and one real aggregator process.

    python -m streamfed.runtime.loadtest run --agents 1000 --seconds 60            # prints a JSON summary
    python -m streamfed.runtime.loadtest run --agents 50 --seconds 10 --processes 1

What runs:

* **Mosquitto**, started here from a minimal config (loopback, anonymous, persistence off, no
  connection limit) with its descriptor limit raised to the hard limit — unless a broker is given;
* **one aggregator process**: the real `streamfed aggregator` command (async windows of `window`
  seconds, the fleet's client list, Prometheus metrics on a free port);
* **agent processes** (`processes` of them, `python -m streamfed.runtime.loadtest agents SPEC OUT`): each runs
  its share of the agents as real :class:`~streamfed.runtime.agent.AgentService` objects sharing one
  asyncio event loop, one MQTT connection each (persistent v5 session, last will, QoS 1). Every agent
  learns `rate` labelled samples per second for `seconds` seconds (synthetic data; each agent's first
  sample at a random phase within the first period, then on a fixed schedule), publishes its
  prediction and its update per sample, and stays until its updates are included (at most `drain` s);
* **a monitor** in this process: one subscriber to the retained global (it records when each global
  arrives and its `included` map) and a sampler of the aggregator's CPU time and resident set.

What is compared: every agent's published update seqs (its last seq; an agent numbers its updates
1, 2, …) with the `included` map of the last global (every seq up to it is in the model) — an update
missing there is *lost*; the aggregator's rejection counters (Prometheus) — *rejected*; and per update,
the time from its creation (queued for publishing) to the arrival at the monitor of the first global
that includes it — the *aggregator lag*, to compare with the window. Also the lag from the broker's
PUBACK to the agent (the broker holds the update and has passed it on), which leaves out the agent
side, and the share of updates whose lag is below one window. An update that arrives just after a
window closed waits a whole window, so the lag's p99 is about 0.99 window + the delivery and
aggregation delay: below one window only while that delay stays under 1% of it.

Beside that end-to-end lag, the standard consumer-lag measures, from timestamps the aggregator takes anyway
(its trace: ``STREAMFED_AGGREGATOR_TRACE``, see :mod:`streamfed.runtime.aggregator`; same machine, same
clock): the *ingest lag*, from an update's creation (the `created` time it carries: queued for publishing)
to its application to the aggregator's state (also from the broker's PUBACK to the agent); and per window,
how late it was closed after it was due, and the delay from its close to its global being acknowledged by
the broker (published) and to the global's arrival at the monitor.

Agents' settings that depend on the test: `resend_after` is at least three windows (an update waits
up to a window for its global; a shorter timer resends what the aggregator holds, each a `stale_seq`
rejection), and an agent process freezes what its connections built and collects young objects less
often (see `_run_agents`). Per agent process the result also says why connections were lost (the
reconnect loop's messages, counted) and how much CPU the garbage collector took.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamfed import algorithms
from streamfed.fleet.config import BrokerConfig, FleetConfig
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.mosquitto import Mosquitto, free_port

__all__ = ["LoadTestOptions", "run_loadtest", "summary_lines", "raise_nofile", "MosquittoProcess"]

_CLK = os.sysconf("SC_CLK_TCK")


@dataclass
class LoadTestOptions:
    """A load test's configuration (see the module docstring)."""

    agents: int = 1000
    seconds: float = 60.0
    rate: float = 1.0  # labelled samples per second per agent
    processes: int = 1  # agent processes (agents split evenly)
    window: float = 1.0  # the aggregator's async window, seconds
    algorithm: str = algorithms.DEFAULT
    n_inputs: int = 4
    n_kernels: int = 8
    n_features: int = 50
    bin_size: int = 1
    ramp: float | None = None  # seconds over which agents connect (default: agents / 100)
    profile: str | None = None  # write a cProfile of agent process 0 here
    drain: float = 30.0  # after its last sample, an agent waits at most this long for inclusion
    seed: int = 0
    keep: str | None = None  # copy the run's logs (agents, aggregator, Mosquitto) into this directory
    light: bool = False  # light simulated agents (streamfed.runtime.loadtest_light), many per process
    outbox_limit: int = 8  # flow control: updates sent and not yet included before samples are coalesced
    linger: float | None = None  # light agents: seconds connected after the drain (default: 2 windows, ≥ 3 s)

    def resend_timeout(self) -> float:
        """An agent's `resend_after`: an update waits up to a window for its global, so a timer shorter
        than that (plus delivery) resends updates the aggregator holds, each one a `stale_seq` rejection.
        The timer is the fallback (the aggregator's acks report real gaps), so it can be generous."""
        return max(10.0, 3.0 * self.window)

    def fleet_config(self, fleet: str) -> FleetConfig:
        # The load meant is one update per sample: an algorithm that batches samples behind a privacy floor
        # uploads each one, and one that refits hyperparameters at every global keeps them (the cost measured is
        # the transport's and the aggregation's, not an optimiser's).
        fields = algorithms.get(self.algorithm).Params.model_fields
        # the dictionary's sizes, for the families that learn over one
        params = {k: v for k, v in (("min_upload", 1), ("fit_hyperparameters", False), ("n_kernels", self.n_kernels),
                                    ("n_features", self.n_features), ("bin_size", self.bin_size)) if k in fields}
        return FleetConfig(fleet=fleet, algorithm=self.algorithm, n_inputs=self.n_inputs,
                           max_clients=max(10_000, self.agents), params=params)


# --------------------------------------------------------------------------- process helpers


def raise_nofile() -> int:
    """Raise this process's open-file limit to its hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def proc_stat(pid: int) -> tuple[float, int, int]:
    """`(cpu seconds, VmRSS bytes, VmHWM bytes)` of a live process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _CLK  # utime, stime
    rss = hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return cpu, rss, hwm


MOSQUITTO_CONF = """per_listener_settings false
listener {port} 127.0.0.1
protocol mqtt
allow_anonymous true
persistence false
max_connections -1
max_queued_messages 10000
max_packet_size 16777216
log_dest stderr
log_type error
log_type warning
connection_messages false
"""


class MosquittoProcess(Mosquitto):
    """A private Mosquitto for a load test, started at once on a free port: no connection limit, its
    descriptor limit raised. `extra`: more configuration lines (e.g. ``set_tcp_nodelay true``).
    `log` is the path of its log; :meth:`close` stops it and removes its directory."""

    def __init__(self, extra: str = "") -> None:
        super().__init__(lambda port: MOSQUITTO_CONF.format(port=port) + extra + "\n",
                         preexec_fn=raise_nofile, prefix="streamfed-load-mosq-")
        self.log = self.log_path
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def config(self) -> BrokerConfig:
        return BrokerConfig(host="127.0.0.1", port=self.port)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- agent processes


def _agent_main(spec_path: str, out_path: str) -> int:
    """One agent process: its share of the fleet on one event loop; writes per-agent results."""
    raise_nofile()
    # aiomqtt warns once per publish while more than a few await their PUBACK (pipelining: by design);
    # at a thousand agents that alone is tens of thousands of log lines
    import aiomqtt  # noqa: F401 - first: importing it sets its "mqtt" logger to WARNING

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("mqtt").setLevel(logging.ERROR)
    logging.getLogger("aiomqtt").setLevel(logging.ERROR)
    logging.getLogger("streamfed.runtime.agent").addHandler(_LOST_REASONS)
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("light"):
        from streamfed.runtime.loadtest_light import run_light_agents

        Path(out_path).write_text(json.dumps(run_light_agents(spec, _LOST_REASONS.counts)))
        return 0
    if spec.get("profile"):
        import cProfile

        prof = cProfile.Profile()
        result = prof.runcall(asyncio.run, _run_agents(spec))
        prof.dump_stats(spec["profile"])
        Path(out_path).write_text(json.dumps(result))
        return 0
    result = asyncio.run(_run_agents(spec))
    Path(out_path).write_text(json.dumps(result))
    return 0


class _LostReasons(logging.Handler):
    """Counts why connections were lost (the reconnect loop logs each with its MQTT error)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if "connection lost" in record.msg and len(record.args or ()) >= 2:
            reason = str(record.args[1])[:80]  # type: ignore[index]
            self.counts[reason] = self.counts.get(reason, 0) + 1


_LOST_REASONS = _LostReasons()


async def _run_agents(spec: dict[str, Any]) -> dict[str, Any]:
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.sources import Reading
    from streamfed.runtime.agent import AgentService, AgentSettings

    cfg = FleetConfig.model_validate(spec["fleet"])
    broker = BrokerConfig.model_validate(spec["broker"])
    rate, n_samples = float(spec["rate"]), int(spec["samples"])
    period = 1.0 / rate
    go = asyncio.Event()  # set once every agent here is connected (or `t_start` has passed)
    start_at = [float(spec["t_start"])]
    _warm_up(cfg)
    lateness: list[float] = []  # how late (s) each sample was taken, vs its schedule
    last_taken = [0.0]

    class Agent(AgentService):
        """An AgentService that also notes when each update was first acknowledged by the broker."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.created: dict[int, float] = {}
            self.acked: dict[int, float] = {}

        def _sent(self, is_update: bool, msg: Any, nbytes: int) -> None:
            if is_update:
                self.created.setdefault(msg.seq, msg.created)
                self.acked.setdefault(msg.seq, time.time())
            super()._sent(is_update, msg, nbytes)

    def source(index: int, rng: np.random.Generator):  # type: ignore[no-untyped-def]
        phase = rng.uniform(0, period)
        X = rng.uniform(-1, 1, (n_samples, cfg.n_inputs))
        y = np.sin(X.sum(axis=1)) + 0.1 * rng.standard_normal(n_samples)

        async def gen():  # type: ignore[no-untyped-def]
            await go.wait()
            for i in range(n_samples):
                due = start_at[0] + phase + i * period
                delay = due - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                lateness.append(time.time() - due)
                last_taken[0] = max(last_taken[0], time.time())
                yield Reading(f"s{i}", X[i], due, float(y[i]))

        return gen()

    services = []
    for name, index in spec["clients"]:
        core = AgentCore(cfg, name, index, mode="async")
        services.append(Agent(core, broker, source(index, np.random.default_rng([spec["seed"], index])),
                              settings=AgentSettings(drain=float(spec["drain"]), connect_timeout=30.0,
                                                     outbox_limit=int(spec.get("outbox_limit", 8)),
                                                     resend_after=float(spec["resend_after"]))))
    ramp = float(spec["ramp"])
    t0 = time.time()

    async def start(k: int, svc: Agent) -> None:
        await asyncio.sleep(ramp * k / max(1, len(services)))
        await svc.run()

    import gc

    gc_time = [0.0, 0]  # seconds in collections, collections of the oldest generation
    gc_by_gen = [0.0, 0.0, 0.0]
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.thread_time()
        else:
            took = time.thread_time() - gc_started[0]  # CPU: not time preempted
            gc_time[0] += took
            gc_time[1] += info["generation"] == 2
            gc_by_gen[info["generation"]] += took

    gc.callbacks.append(on_gc)
    cpu0 = time.process_time()
    tasks = [asyncio.create_task(start(k, s)) for k, s in enumerate(services)]
    connected_at = None
    late = float(spec["t_start"]) + float(spec.get("connect_grace", 60.0))
    while not all(s.connected.is_set() for s in services):
        if all(t.done() for t in tasks) or time.time() > late:
            break
        await asyncio.sleep(0.05)
    else:
        connected_at = time.time()
    # the schedule starts at t_start, or a second after the last connection if that came later
    start_at[0] = max(start_at[0], time.time() + 1.0)
    gc_at_start = list(gc_time)  # collections while connecting (each agent's run() collects once) vs after
    # A process that hosts many agents: what the connections built (clients, sockets, sessions) is alive
    # until the end, so it leaves the collector's view as each agent's own start-up state did, and young
    # collections run every 10,000 allocations instead of 700 — nearly all garbage here is freed by
    # reference counting, and at a thousand agents the default thresholds cost ~15% of the process (its
    # collections measured with gc.callbacks). Each agent's run() collects and freezes once (gc_freeze).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lat = np.array([x for s in services for x in s.latencies]) if services else np.zeros(0)
    return {
        "pid": os.getpid(), "cpu_s": time.process_time() - cpu0, "maxrss_bytes": usage.ru_maxrss * 1024,
        "started": t0, "all_connected_at": connected_at, "t_start": start_at[0], "ended": time.time(),
        "last_sample_at": last_taken[0],
        "errors": errors[:10],
        "n_errors": len(errors),
        "lost_reasons": dict(_LOST_REASONS.counts),
        "gc_s": gc_time[0] - gc_at_start[0], "gc_full": gc_time[1] - gc_at_start[1],
        "gc_connecting_s": gc_at_start[0], "gc_full_connecting": gc_at_start[1],
        "gc_counts": [gen["collections"] for gen in gc.get_stats()], "gc_s_by_generation": gc_by_gen,
        "gc_tracked": len(gc.get_objects()), "gc_frozen": gc.get_freeze_count(),
        "lateness": [float(np.percentile(lateness, q)) for q in (50, 99, 100)] if lateness else None,
        "prediction_latency_s": [float(np.percentile(lat, q)) for q in (50, 99)] if lat.size else None,
        "agents": {s.client_id: {
            "seq": s.core.seq, "learned": s.core.counters.learned, "outbox": sorted(s.core.outbox),
            "resent": s.core.counters.resent, "reconnects": s.reconnects,
            "dropped_predictions": s.dropped_predictions, "rejected_globals": s.core.counters.rejected_globals,
            "global_version": s.core.global_version,
            "created": [s.created.get(q) for q in range(1, s.core.seq + 1)],
            "acked": [s.acked.get(q) for q in range(1, s.core.seq + 1)],
        } for s in services},
    }


def _warm_up(cfg: FleetConfig) -> None:
    """Load every numba function an agent uses (from numba's cache, or compile it) before the clock starts."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import encode

    core = AgentCore(cfg, "warmup", 0, mode="async")
    for i in range(3):
        core.on_reading(Reading(f"w{i}", np.zeros(cfg.n_inputs), 0.0, 0.0))
    agg = AggregatorCore(cfg, mode="async")
    core.on_global_payload(encode(agg.global_message()))


# --------------------------------------------------------------------------- the orchestrator


def _scrape(port: int, prefix: str = "streamfed_aggregator_updates_") -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            key, _, value = line.rpartition(" ")
            out[key] = out.get(key, 0.0) + float(value)
    return out


def _streamfed_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "streamfed"
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from streamfed.cli import main; main()"]


async def _monitor(broker: BrokerConfig, fleet: str, globals_seen: list[tuple[float, int, dict[str, int]]],
                   ready: asyncio.Event, stop: asyncio.Event) -> None:
    import aiomqtt
    import msgpack

    from streamfed.wire.topics import global_topic

    async with aiomqtt.Client(**client_kwargs(broker, f"{fleet}.monitor"), max_queued_incoming_messages=0) as c:
        await c.subscribe(global_topic(fleet), qos=1)
        ready.set()

        async def receive() -> None:
            async for m in c.messages:
                t = time.time()
                env = msgpack.unpackb(bytes(m.payload), raw=False)  # type: ignore[arg-type]
                globals_seen.append((t, int(env["global_version"]), dict(env.get("included") or {})))

        task = asyncio.create_task(receive())
        await stop.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await task


async def _run(opts: LoadTestOptions, broker: BrokerConfig, workdir: Path, mosq_pid: int | None = None
               ) -> dict[str, Any]:
    fleet = f"load{random.getrandbits(32):08x}"
    cfg = opts.fleet_config(fleet)
    clients = [f"a{i:05d}" for i in range(opts.agents)]
    toml = workdir / "fleet.json"
    toml.write_text(json.dumps({"fleet": cfg.model_dump(mode="json"), "broker": broker.model_dump(mode="json")}))
    metrics_port = free_port()
    trace_path = workdir / "aggregator-trace.json"
    agg_log = open(workdir / "aggregator.log", "wb")  # noqa: SIM115 - closed below
    agg = subprocess.Popen([*_streamfed_cmd(), "aggregator", "--config", str(toml), "--clients", ",".join(clients),
                            "--window", str(opts.window), "--metrics-port", str(metrics_port)],
                           stdout=agg_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           env=dict(os.environ, STREAMFED_AGGREGATOR_TRACE=str(trace_path)),
                           # SIGINT stops it (and it writes its trace) even when this runs in the background,
                           # where the shell has SIGINT ignored and a child would inherit that
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    globals_seen: list[tuple[float, int, dict[str, int]]] = []
    samples: list[tuple[float, float, int]] = []  # (time, aggregator cpu s, rss)
    # (time, cpu s, rss) of Mosquitto and of the agent processes (summed); the aggregator's ingest-lag gauge
    others: dict[str, list[tuple[float, float, int]]] = {"mosquitto": [], "agents": []}
    ingest_gauge: list[tuple[float, float]] = []
    stop, ready = asyncio.Event(), asyncio.Event()
    mon = asyncio.create_task(_monitor(broker, fleet, globals_seen, ready, stop))
    agents_procs: list[subprocess.Popen[bytes]] = []
    try:
        await asyncio.wait_for(ready.wait(), 20)
        deadline = time.monotonic() + 60
        while not globals_seen:  # the aggregator publishes its (retained) global once connected
            if agg.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"aggregator did not come up: {(workdir / 'aggregator.log').read_text()[-2000:]}")
            await asyncio.sleep(0.05)
        ramp = opts.ramp if opts.ramp is not None else max(1.0, opts.agents / (500 if opts.light else 100))
        t_start = time.time() + ramp + 3.0  # every agent's first sample comes after the ramp
        n_samples = max(1, round(opts.seconds * opts.rate))
        shares = [[(c, i) for i, c in enumerate(clients) if i % opts.processes == p] for p in range(opts.processes)]
        outs = []
        for p, share in enumerate(shares):
            spec = {"fleet": cfg.model_dump(mode="json"), "broker": broker.model_dump(mode="json"),
                    "clients": share,
                    "rate": opts.rate, "samples": n_samples, "t_start": t_start, "drain": opts.drain,
                    "ramp": ramp, "seed": opts.seed, "profile": opts.profile if p == 0 else None,
                    "resend_after": opts.resend_timeout(), "light": opts.light,
                    "outbox_limit": opts.outbox_limit,
                    "linger": opts.linger if opts.linger is not None else max(3.0, 2 * opts.window)}
            sp, out = workdir / f"agents{p}.json", workdir / f"agents{p}.out.json"
            sp.write_text(json.dumps(spec))
            outs.append(out)
            agents_procs.append(subprocess.Popen(
                [sys.executable, "-m", "streamfed.runtime.loadtest", "agents", str(sp), str(out)],
                stdout=open(workdir / f"agents{p}.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                stdin=subprocess.DEVNULL, preexec_fn=raise_nofile))
        next_scrape = 0.0
        while any(p.poll() is None for p in agents_procs):
            now = time.time()
            samples.append((now, *proc_stat(agg.pid)[:2]))
            with contextlib.suppress(OSError):
                if mosq_pid is not None:
                    others["mosquitto"].append((now, *proc_stat(mosq_pid)[:2]))
                stats = [proc_stat(p.pid)[:2] for p in agents_procs if p.poll() is None]
                if len(stats) == len(agents_procs):
                    others["agents"].append((now, sum(c for c, _ in stats), sum(r for _, r in stats)))
            if now >= next_scrape:
                next_scrape = now + 2.0
                with contextlib.suppress(Exception):
                    ingest_gauge.append((now, max(_scrape(metrics_port, "streamfed_aggregator_ingest_lag_seconds")
                                                  .values(), default=float("nan"))))
            if now > t_start + opts.seconds + opts.drain + ramp + 600:
                raise RuntimeError("agent processes did not finish in time")
            await asyncio.sleep(0.5)
        failed = [p.returncode for p in agents_procs if p.returncode]
        if failed:
            logs = "\n".join((workdir / f"agents{p}.log").read_text()[-3000:] for p in range(opts.processes))
            raise RuntimeError(f"agent processes failed ({failed}):\n{logs}")
        results = [json.loads(o.read_text()) for o in outs]
        t_start = max(r["t_start"] for r in results)
        await asyncio.sleep(opts.window + 0.5)  # a last window closes
        cpu_end, _, hwm = proc_stat(agg.pid)
        metrics = _scrape(metrics_port)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(mon, 5)
        for p in agents_procs:
            if p.poll() is None:
                p.kill()
        stop_s = None
        if agg.poll() is None:
            agg.send_signal(signal.SIGINT)
            t_stop = time.monotonic()
            try:
                agg.wait(60)  # it writes its trace on the way out (with a thousand clients: seconds)
                stop_s = time.monotonic() - t_stop
            except subprocess.TimeoutExpired:
                agg.kill()
                agg.wait()
        agg_log.close()
    trace = json.loads(trace_path.read_text()) if trace_path.exists() else None
    out = _analyse(opts, fleet, t_start, results, globals_seen, samples, cpu_end, hwm, metrics, trace)
    out["aggregator_stop_s"] = stop_s  # None: killed after 60 s (no trace then)
    out["ingest_lag_gauge_max_s"] = max((v for t, v in ingest_gauge if t_start <= t <= t_start + opts.seconds
                                         and math.isfinite(v)), default=float("nan"))
    for name, series in others.items():
        steady = [x for x in series if t_start <= x[0] <= t_start + opts.seconds]
        out[f"{name}_steady"] = {
            "cpu_fraction": ((steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
                             if len(steady) >= 2 and steady[-1][0] > steady[0][0] else float("nan")),
            "rss_bytes_max": max((x[2] for x in series), default=0)}
    return out


def _analyse(opts: LoadTestOptions, fleet: str, t_start: float, results: list[dict[str, Any]],
             globals_seen: list[tuple[float, int, dict[str, int]]], samples: list[tuple[float, float, int]],
             cpu_end: float, hwm: int, metrics: dict[str, float], trace: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    agents = {c: a for r in results for c, a in r["agents"].items()}
    final = globals_seen[-1][2] if globals_seen else {}
    final_version = globals_seen[-1][1] if globals_seen else 0
    behind = [final_version - int(a.get("global_version", 0)) for a in agents.values()]
    lost = {c: a["seq"] - final.get(c, 0) for c, a in agents.items() if final.get(c, 0) < a["seq"]}
    over = {c: final[c] - a["seq"] for c, a in agents.items() if final.get(c, 0) > a["seq"]}
    # lag: creation of an update -> arrival of the first global including it; also from the broker's
    # PUBACK (the broker has it and has passed it on): what is left is the aggregator's part and the fan-out
    lags, lag_t, ack_lags = [], [], []
    prev: dict[str, int] = {}
    for t, _, inc in globals_seen:
        for c, mark in inc.items():
            a = agents.get(c)
            if a is None:
                continue
            for s in range(prev.get(c, 0) + 1, min(mark, a["seq"]) + 1):
                created = a["created"][s - 1]
                if created is not None:
                    lags.append(t - created)
                    lag_t.append(created)
                acked = a["acked"][s - 1] if "acked" in a else None
                if acked is not None:
                    ack_lags.append(t - acked)
        prev = inc
    lags_a = np.array(lags)
    order = np.argsort(lag_t) if lags else np.zeros(0, dtype=int)
    tenth = max(1, len(order) // 10)
    learned = sum(a["learned"] for a in agents.values())
    # the time over which the samples were actually taken (longer than `seconds` when agents fell behind)
    sampling = max(opts.seconds, max(r.get("last_sample_at", 0.0) for r in results) - t_start)
    updates = sum(a["seq"] for a in agents.values())
    rejected = {k.split('reason="')[1].split('"')[0]: v for k, v in metrics.items()
                if "rejected" in k and 'reason="' in k and v}
    accepted = sum(v for k, v in metrics.items() if "accepted" in k)
    sample_end = t_start + opts.seconds
    steady = [s for s in samples if t_start <= s[0] <= sample_end]
    agg_cpu = ((steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
               if len(steady) >= 2 and steady[-1][0] > steady[0][0] else float("nan"))
    def pct(a: Any, q: float) -> float:
        return float(np.percentile(a, q)) if len(a) else float("nan")

    def dist(a: Any) -> dict[str, float]:
        return {"p50": pct(a, 50), "p99": pct(a, 99), "max": float(np.max(a)) if len(a) else float("nan"),
                "n": len(a)}

    consumer = _consumer_lag(agents, globals_seen, trace) if trace is not None else None

    return {
        "options": asdict(opts), "fleet": fleet,
        "agents": len(agents), "samples_learned": learned,
        "samples_expected": opts.agents * round(opts.seconds * opts.rate),
        "samples_per_s": learned / sampling, "sampling_s": sampling,
        "updates_published": updates, "updates_per_s": updates / sampling,
        "updates_accepted": accepted, "updates_rejected": rejected, "updates_lost": sum(lost.values()),
        "clients_with_lost": len(lost), "included_beyond_published": len(over),
        "resent": sum(a["resent"] for a in agents.values()),
        "outbox_left": sum(len(a["outbox"]) for a in agents.values()),
        "reconnects": sum(a["reconnects"] for a in agents.values()),
        "lost_reasons": {k: sum(r.get("lost_reasons", {}).get(k, 0) for r in results)
                         for k in sorted({k for r in results for k in r.get("lost_reasons", {})})},
        "dropped_predictions": sum(a["dropped_predictions"] for a in agents.values()),
        "rejected_globals": sum(a["rejected_globals"] for a in agents.values()),
        "globals_seen": len(globals_seen), "final_version": final_version,
        "versions_behind_max": max(behind, default=0),
        "agents_more_than_2_behind": sum(b > 2 for b in behind),
        "agents_without_global": sum(int(a.get("global_version", 0)) == 0 for a in agents.values()),
        "lag_s": {"p50": pct(lags_a, 50), "p95": pct(lags_a, 95), "p99": pct(lags_a, 99),
                  "max": float(lags_a.max()) if lags else float("nan"), "n": len(lags),
                  "p50_first_tenth": pct(lags_a[order[:tenth]], 50) if lags else float("nan"),
                  "p50_last_tenth": pct(lags_a[order[-tenth:]], 50) if lags else float("nan")},
        "lag_from_ack_s": {"p50": pct(ack_lags, 50), "p99": pct(ack_lags, 99),
                           "max": max(ack_lags) if ack_lags else float("nan"), "n": len(ack_lags)},
        # the share of updates in a global within one window of their creation
        "within_window": float((lags_a < opts.window).mean()) if lags else float("nan"),
        "window_s": opts.window,
        **({"ingest_lag_s": dist(consumer["ingest"]), "ingest_lag_from_ack_s": dist(consumer["ingest_ack"]),
            "ingest_unmatched": consumer["unmatched"],
            "close_late_s": dist(consumer["close_late"]), "close_to_published_s": dist(consumer["close_pub"]),
            "close_to_monitor_s": dist(consumer["close_mon"]), "windows_closed": len(consumer["close_late"])}
           if consumer is not None else {}),
        "aggregator": {"cpu_fraction_steady": agg_cpu, "rss_bytes_max": max((s[2] for s in samples), default=0),
                       "hwm_bytes": hwm, "cpu_s_total": cpu_end},
        "agent_processes": [{"cpu_s": r["cpu_s"], "cpu_sampling_s": r.get("cpu_sampling_s"),
                             "cpu_connect_s": r.get("cpu_connect_s"), "maxrss_bytes": r["maxrss_bytes"],
                             "errors": r["n_errors"],
                             "gc_s": r.get("gc_s"), "gc_full": r.get("gc_full"),
                             "gc_connecting_s": r.get("gc_connecting_s"), "gc_counts": r.get("gc_counts"),
                             "gc_s_by_generation": r.get("gc_s_by_generation"),
                             "gc_tracked": r.get("gc_tracked"), "gc_frozen": r.get("gc_frozen"),
                             "lateness_s": r["lateness"], "prediction_latency_s": r["prediction_latency_s"],
                             "connect_s": (r["all_connected_at"] - r["started"]) if r["all_connected_at"] else None,
                             "wall_s": r["ended"] - r["started"]} for r in results],
        "loadavg": list(os.getloadavg()),
    }


def _consumer_lag(agents: dict[str, Any], globals_seen: list[tuple[float, int, dict[str, int]]],
                  trace: dict[str, Any]) -> dict[str, Any]:
    """Consumer-lag measures from the aggregator's trace (see the module docstring): per applied update, the
    time since its creation and since the broker's PUBACK to its agent; per closed window, how late it closed
    after it was due, and the delay to its global's PUBACK at the aggregator and to its arrival at the monitor.
    An applied update is matched to its seq through the client's mark (every seq up to it is in): a step of
    exactly one names the seq applied; other steps (a gap filled) are counted as unmatched."""
    ingest, ingest_ack, unmatched = [], [], 0
    marks: dict[str, int] = {}
    for client, mark, t in trace["applied"]:
        prev = marks.get(client, 0)
        marks[client] = max(prev, mark)
        a = agents.get(client)
        if a is None or mark != prev + 1 or mark > len(a["created"]):
            unmatched += 1
            continue
        if a["created"][mark - 1] is not None:
            ingest.append(t - a["created"][mark - 1])
        if a.get("acked") and a["acked"][mark - 1] is not None:
            ingest_ack.append(t - a["acked"][mark - 1])
    published = {int(v): t for v, t in trace["published"]}
    seen: dict[int, float] = {}
    for t, v, _ in globals_seen:
        seen.setdefault(v, t)
    close_late, close_pub, close_mon = [], [], []
    for v, due, closed in trace["closed"]:
        close_late.append(closed - due)
        if v in published:
            close_pub.append(published[v] - closed)
        if v in seen:
            close_mon.append(seen[v] - closed)
    return {"ingest": ingest, "ingest_ack": ingest_ack, "unmatched": unmatched, "close_late": close_late,
            "close_pub": close_pub, "close_mon": close_mon}


def run_loadtest(opts: LoadTestOptions, broker: BrokerConfig | None = None) -> dict[str, Any]:
    """Run a load test (starting a private Mosquitto unless `broker` is given); returns the summary."""
    raise_nofile()
    load_start = list(os.getloadavg())
    workdir = Path(tempfile.mkdtemp(prefix="streamfed-load-"))
    mosq = MosquittoProcess() if broker is None else None
    try:
        b = broker or mosq.config  # type: ignore[union-attr]
        mosq_cpu0 = proc_stat(mosq.proc.pid)[0] if mosq else None
        out = asyncio.run(_run(opts, b, workdir, mosq.proc.pid if mosq else None))
        out["loadavg_start"] = load_start
        if mosq is not None:
            cpu, rss, hwm = proc_stat(mosq.proc.pid)
            out["mosquitto"] = {"cpu_s": cpu - (mosq_cpu0 or 0.0), "rss_bytes": rss, "hwm_bytes": hwm}
        return out
    finally:
        if opts.keep:
            keep = Path(opts.keep)
            keep.mkdir(parents=True, exist_ok=True)
            for f in [*workdir.glob("*.log"), *([mosq.log] if mosq is not None and mosq.log.exists() else [])]:
                shutil.copy(f, keep / f.name)
        if mosq is not None:
            mosq.close()
        shutil.rmtree(workdir, ignore_errors=True)


def summary_lines(r: dict[str, Any]) -> list[str]:
    """A short human-readable summary of :func:`run_loadtest`'s result."""
    lag = r["lag_s"]
    a = r["aggregator"]
    out = [
        f"{r['agents']} agents × {r['options']['rate']:g} samples/s for {r['options']['seconds']:g} s "
        f"({r['options']['processes']} agent process(es)), window {r['window_s']:g} s",
        f"samples learned {r['samples_learned']} / {r['samples_expected']} "
        f"({r['samples_per_s']:.0f}/s over {r.get('sampling_s', 0):.0f} s); "
        f"updates published {r['updates_published']} ({r['updates_per_s']:.0f}/s), "
        f"accepted {r['updates_accepted']:.0f}",
        f"lost {r['updates_lost']} (clients {r['clients_with_lost']}), rejected {r['updates_rejected'] or 0}, "
        f"resent {r['resent']}, left in outboxes {r['outbox_left']}, reconnects {r['reconnects']}"
        + (f" ({r['lost_reasons']})" if r.get("lost_reasons") else ""),
        f"lag p50 {lag['p50']:.3f} s, p99 {lag['p99']:.3f} s, max {lag['max']:.3f} s (window {r['window_s']:g} s; "
        f"{100 * r.get('within_window', float('nan')):.1f}% within it); from the broker's PUBACK p50 "
        f"{r['lag_from_ack_s']['p50']:.3f} s, p99 {r['lag_from_ack_s']['p99']:.3f} s",
        f"aggregator CPU {a['cpu_fraction_steady']:.2f} of a core, RSS max {a['rss_bytes_max'] / 2**20:.0f} MiB"
        + (f"; ingest-lag gauge max {r['ingest_lag_gauge_max_s']:.3f} s" if "ingest_lag_gauge_max_s" in r else ""),
        f"versions behind at the end: max {r['versions_behind_max']} (final v{r['final_version']}; "
        f"{r['agents_more_than_2_behind']} agents > 2 behind, {r['agents_without_global']} without a global)",
    ]
    for name in ("mosquitto", "agents"):
        st = r.get(f"{name}_steady")
        if st:
            out.append(f"{name} CPU {st['cpu_fraction']:.2f} of a core (steady), "
                       f"RSS max {st['rss_bytes_max'] / 2**20:.0f} MiB")
    out.append(f"load average start {r.get('loadavg_start')} end {r.get('loadavg')}")
    if "ingest_lag_s" in r:
        ms = {k: {q: 1e3 * v for q, v in r[k].items() if q != "n"}
              for k in ("ingest_lag_s", "ingest_lag_from_ack_s", "close_late_s", "close_to_published_s",
                        "close_to_monitor_s")}
        out.append(
            f"ingest lag (created → applied) p50 {ms['ingest_lag_s']['p50']:.1f} ms, "
            f"p99 {ms['ingest_lag_s']['p99']:.1f} ms, max {ms['ingest_lag_s']['max']:.1f} ms "
            f"(from PUBACK p50 {ms['ingest_lag_from_ack_s']['p50']:.1f} ms, "
            f"p99 {ms['ingest_lag_from_ack_s']['p99']:.1f} ms; {r['ingest_lag_s']['n']} matched, "
            f"{r['ingest_unmatched']} unmatched); {r['windows_closed']} windows: closed after due p50 "
            f"{ms['close_late_s']['p50']:.1f} ms, max {ms['close_late_s']['max']:.1f} ms; close → global published "
            f"(PUBACK) p50 {ms['close_to_published_s']['p50']:.1f} ms, max {ms['close_to_published_s']['max']:.1f} ms; "
            f"close → at the monitor p50 {ms['close_to_monitor_s']['p50']:.1f} ms, p99 "
            f"{ms['close_to_monitor_s']['p99']:.1f} ms, max {ms['close_to_monitor_s']['max']:.1f} ms")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m streamfed.runtime.loadtest")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    for f in ("agents", "processes", "n_kernels", "n_features", "n_inputs", "bin_size", "seed", "outbox_limit"):
        r.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(LoadTestOptions, f))
    for f in ("seconds", "rate", "window", "drain"):
        r.add_argument("--" + f, type=float, default=getattr(LoadTestOptions, f))
    r.add_argument("--ramp", type=float, default=None)
    r.add_argument("--linger", type=float, default=None)
    r.add_argument("--light", action="store_true",
                   help="light simulated agents: one paho connection each, many per process, pre-built updates")
    r.add_argument("--profile", default=None)
    r.add_argument("--keep", default=None, help="copy the run's logs into this directory")
    r.add_argument("--algorithm", default=algorithms.DEFAULT, choices=algorithms.fleet_names())
    r.add_argument("--json", type=Path)
    a = sub.add_parser("agents")
    a.add_argument("spec")
    a.add_argument("out")
    args = ap.parse_args(argv)
    if args.cmd == "agents":
        return _agent_main(args.spec, args.out)
    opts = LoadTestOptions(**{k: v for k, v in vars(args).items() if k not in ("cmd", "json")})
    res = run_loadtest(opts)
    print("\n".join(summary_lines(res)))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
