"""End-to-end latency percentiles over a real Mosquitto on loopback.

    .venv/bin/python benchmarks/bench_latency.py [--out benchmarks/results/latency.md] [--quick]

1. **Sample → prediction**: one async POF-MKL agent (N = 16, D = 100, M = 2) at 100 samples/s; time
   from a sample's arrival to its prediction's PUBACK (`AgentService.latencies`). Peer in the same run:
   a bare aiomqtt QoS 1 publish of a prediction-sized payload, one at a time at the same pace.
2. **Upload → global**: a real `AggregatorService` and `agents` agents, POF-MKL lock-step (and async
   with a 50 ms window); for every update, the time from its creation (it is queued for publishing at
   once) to the installation, by the agent that sent it, of the first global that includes it. Peer in
   the same run: the transport's floor for that path — a bare aiomqtt client publishes a payload of
   the update's size (QoS 1), an echo client (as the aggregator) publishes a global-sized payload back
   on receipt (QoS 1), and the first client times the round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.evaluation.bench import load_average, machine, write_section  # noqa: E402
from streamfed.fleet.agent import AgentCore, Prediction  # noqa: E402
from streamfed.fleet.aggregator import AggregatorCore  # noqa: E402
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import array_source  # noqa: E402
from streamfed.runtime.agent import AgentService, AgentSettings  # noqa: E402
from streamfed.runtime.aggregator import AggregatorService  # noqa: E402
from streamfed.runtime.broker import EmbeddedBroker  # noqa: E402
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.loadtest import MosquittoProcess  # noqa: E402
from streamfed.wire.message import encode

logging.getLogger("mqtt").setLevel(logging.ERROR)  # aiomqtt warns per pipelined publish
logging.getLogger("streamfed.fleet.agent").setLevel(logging.ERROR)  # "leaving with updates not included": expected here


def pct(a: list[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(a) * 1e3
    return {"n": int(a.size), **{f"p{q}": float(np.percentile(a, q)) for q in (50, 90, 99)}, "max": float(a.max())}


def cfg_of(fleet: str, **kw: Any) -> FleetConfig:
    return FleetConfig(fleet=fleet, algorithm="pofmkl", n_inputs=10, n_kernels=16, n_features=100, bin_size=2, **kw)


@contextlib.contextmanager
def tcp_nodelay():
    """In this process only: every aiomqtt client made with `client_kwargs` sets TCP_NODELAY on its socket
    (paho does not; with Nagle a small write waits for the ACK of the previous one, which the peer delays
    up to 40 ms when it has nothing to send back). Patched in every module that imported it by name."""
    from streamfed.runtime import connection

    original = connection.client_kwargs

    def patched(*a, **kw):  # type: ignore[no-untyped-def]
        out = original(*a, **kw)
        out["socket_options"] = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        return out

    users = [m for m in list(sys.modules.values()) if getattr(m, "__dict__", {}).get("client_kwargs") is original]
    for m in users:
        m.client_kwargs = patched  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in users:
            m.client_kwargs = original  # type: ignore[attr-defined]


class TimedCore(AgentCore):
    """An AgentCore that records, per update, creation → installation of the global including it."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.round_trips: list[float] = []

    def install_global(self, msg, now=None):  # type: ignore[no-untyped-def]
        # what the runtime calls for every decoded global (on_global is the same, returning a bool)
        pending = dict(self.outbox)
        result = super().install_global(msg, now)
        if result.installed:
            t = time.time()
            self.round_trips += [t - m.created for s, m in pending.items() if s not in self.outbox]
        return result


async def prediction_latency(broker, seconds: float, tag: str = "") -> dict:
    cfg = cfg_of(f"latp{tag}")
    rng = np.random.default_rng(1)
    n = int(100 * seconds)
    X, y = rng.uniform(-1, 1, (n, cfg.n_inputs)), rng.uniform(0, 1, n)
    svc = AgentService(AgentCore(cfg, "lat", 0, mode="async"), broker, array_source(X, y, rate_hz=100.0),
                       settings=AgentSettings(drain=0.0))
    await svc.run()
    payload = encode(svc.core.prediction_message(Prediction("r", 0.1, None, 0, 0.0)))
    bare = []
    async with aiomqtt.Client(**client_kwargs(broker, "bare-lat")) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            await c.publish("bench/lat", payload, qos=1)
            bare.append(time.perf_counter() - t0)
            await asyncio.sleep(0.01)
    return {"agent": pct(list(svc.latencies)), "bare": pct(bare)}


async def upload_to_global(broker, mode: str, n_agents: int, steps: int, rate: float | None, tag: str = "") -> dict:
    """`tag`: in the fleet's name, so that a run never meets the retained global and persistent sessions of an
    earlier one on the same broker (an aggregator starting at version 0 refuses agents ahead of it)."""
    # standardise="none" (both modes, so that they run the same learner): with the default "online" the first
    # two samples only set the scales and make no update, and a lock-step agent then waits for a global of a
    # round it never sent (AgentCore.waiting_for counts samples, not uploads) — the fleet never starts
    cfg = cfg_of(f"latg{mode}{tag}", standardise="none")
    names = [f"a{i}" for i in range(n_agents)]
    rng = np.random.default_rng(2)
    agg = AggregatorService(AggregatorCore(cfg, clients=names, mode=mode, window=0.05), broker, tick=0.01)  # type: ignore[arg-type]
    cores = [TimedCore(cfg, n, i, mode=mode) for i, n in enumerate(names)]  # type: ignore[arg-type]
    agents = [AgentService(c, broker, array_source(rng.uniform(-1, 1, (steps, 10)), rng.uniform(0, 1, steps),
                                                   rate_hz=rate),
                                                   settings=AgentSettings(linger=0.3, drain=5.0)) for c in cores]
    task = asyncio.create_task(agg.run())
    await asyncio.wait_for(agg.connected.wait(), 10)
    try:
        await asyncio.wait_for(asyncio.gather(*(a.run() for a in agents)), 120)
    finally:
        agg.stop()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(task, 5)
    rt = [x for c in cores for x in c.round_trips[5:]]  # the first rounds include connection set-up
    return {"mode": mode, "agents": n_agents, "steps": steps, "rate": rate, "rejected": agg.core.rejected,
            "version": agg.core.version, "latency_ms": pct(rt),
            "update_bytes": len(encode(next(iter(cores[0].outbox.values())))) if cores[0].outbox else None}


async def echo_floor(broker, n: int, up_bytes: int, down_bytes: int, rate: float) -> dict:
    up, down = b"u" * up_bytes, b"g" * down_bytes
    times: list[float] = []
    async with aiomqtt.Client(**client_kwargs(broker, "echo-srv")) as srv, \
            aiomqtt.Client(**client_kwargs(broker, "echo-cli")) as cli:
        await srv.subscribe("bench/echo/up", qos=1)
        await cli.subscribe("bench/echo/down", qos=1)

        async def serve() -> None:
            async for _ in srv.messages:
                await srv.publish("bench/echo/down", down, qos=1)

        server = asyncio.create_task(serve())
        it = cli.messages.__aiter__()
        for _ in range(n):
            t0 = time.perf_counter()
            await cli.publish("bench/echo/up", up, qos=1)
            await it.__anext__()
            times.append(time.perf_counter() - t0)
            await asyncio.sleep(1.0 / rate)
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await server
    return pct(times[5:])


async def main_async(quick: bool) -> dict:
    eb = await EmbeddedBroker().start()
    try:
        b = eb.config
        cfg = cfg_of("probe")
        # payload sizes of the upload → global path: an update of M = 2 kernels, a global of N = 16
        from streamfed.algorithms.pofmkl.wire import global_message as pofmkl_global_message
        from streamfed.algorithms.pofmkl.wire import update_message as pofmkl_update_message
        kv = cfg.kernel_version
        up_b = len(encode(pofmkl_update_message("f", "a0", 1, np.array([0, 1]), np.zeros((2, 200)),
                                                global_version=0, kernel_version=kv)))
        g_b = len(encode(pofmkl_global_message("f", "aggregator", np.zeros((16, 200)), 1, kernel_version=kv,
                                               included={f"a{i}": 1 for i in range(4)})))
        steps = 25 if quick else 400  # quick: a smoke run (the first 5 round trips of each agent are left out)
        res: dict[str, Any] = {}
        fast = MosquittoProcess("set_tcp_nodelay true")  # the dev settings of this bench + set_tcp_nodelay
        try:
            variants = (("shipped", b, False), ("client_nodelay", b, True), ("both_nodelay", fast.config, True))
            for variant, broker, nodelay in variants:  # interleaved: the same paths under each setting
                with tcp_nodelay() if nodelay else contextlib.nullcontext():
                    v = res[variant] = {}
                    v["prediction"] = await prediction_latency(broker, 0.5 if quick else 10.0, variant)
                    v["lockstep"] = await upload_to_global(broker, "lockstep", 4, steps, 50.0, variant)
                    v["echo_floor"] = await echo_floor(broker, steps, up_b, g_b, 50.0)
                    v["async"] = await upload_to_global(broker, "async", 4, steps, 50.0, variant)
        finally:
            fast.close()
        res["sizes"] = {"update_bytes": up_b, "global_bytes": g_b}
        res["broker"] = eb.description.split(",")[0]
    finally:
        await eb.stop()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    r = asyncio.run(main_async(args.quick))

    def row(name: str, d: dict) -> str:
        return f"| {name} | {d['n']} | {d['p50']:.2f} | {d['p90']:.2f} | {d['p99']:.2f} | {d['max']:.2f} |"

    lines = [
        "## End-to-end latency: sample → prediction, upload → global",
        "",
        "Command: `.venv/bin/python benchmarks/bench_latency.py`. "
        f"{r['broker']}; POF-MKL N = 16, D = 100, M = 2, d = 10. Each path with its transport floor, measured "
        "in the same run under three settings: as shipped (broker from `broker_config/mosquitto/dev.conf`, "
        "clients from `client_kwargs` (`streamfed.runtime.connection`) — paho leaves Nagle's algorithm on, and so does "
        "Mosquitto without `set_tcp_nodelay`); `TCP_NODELAY` on every client socket (aiomqtt's "
        "`socket_options`, patched in this process only); and both that and a Mosquitto with "
        "`set_tcp_nodelay true`. "
        f"Machine: {machine()}; load average at the end {load_average()}.",
        "",
        "| path | n | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    for variant, label in (("shipped", "as shipped"), ("client_nodelay", "clients TCP_NODELAY"),
                           ("both_nodelay", "clients + broker TCP_NODELAY")):
        v = r[variant]
        lines += [
            row(f"{label}: sample → prediction PUBACK (one agent, 100 samples/s)", v["prediction"]["agent"]),
            row(f"{label}: bare aiomqtt QoS 1 publish of a prediction payload (floor)", v["prediction"]["bare"]),
            row(f"{label}: update → its global installed, lock-step, {v['lockstep']['agents']} agents + "
                "aggregator, 50 samples/s", v["lockstep"]["latency_ms"]),
            row(f"{label}: update → its global installed, async window 50 ms, {v['async']['agents']} agents",
                v["async"]["latency_ms"]),
            row(f"{label}: bare aiomqtt echo, {r['sizes']['update_bytes']} B up, {r['sizes']['global_bytes']} B "
                "back, QoS 1 (floor of the round trip)", v["echo_floor"]),
        ]
    s, c, n = r["shipped"], r["client_nodelay"], r["both_nodelay"]
    lines += [
        "",
        f"Lock-step rounds completed: {s['lockstep']['version']} / {c['lockstep']['version']} / "
        f"{n['lockstep']['version']} (rejected: {s['lockstep']['rejected'] or 'none'} / "
        f"{c['lockstep']['rejected'] or 'none'} / {n['lockstep']['rejected'] or 'none'}). The first 5 round trips "
        "of each agent (connection set-up) are left out. A lock-step round waits for the slowest of its agents; "
        "an async update waits up to a window (50 ms, ticks every 10 ms) for the window to close.",
        "",
        f"**Nagle's algorithm costs ~40 ms per hop, on each side**: the echo round trip (p50) is "
        f"{s['echo_floor']['p50']:.1f} ms as shipped, {c['echo_floor']['p50']:.1f} ms with TCP_NODELAY on the clients "
        f"and {n['echo_floor']['p50']:.1f} ms with it on both sides; a lock-step round "
        f"{s['lockstep']['latency_ms']['p50']:.1f}"
        f" / {c['lockstep']['latency_ms']['p50']:.1f} / {n['lockstep']['latency_ms']['p50']:.1f} ms. A sender that "
        "writes a PUBACK and then a PUBLISH (or two small messages) has its second write held until the first is "
        "acknowledged, and the peer delays that ACK (up to 40 ms) when it has nothing to send back. Fix: "
        "`socket_options=[(IPPROTO_TCP, TCP_NODELAY, 1)]` in `client_kwargs`, and "
        "`set_tcp_nodelay true` in the shipped Mosquitto configurations.",
    ]
    write_section(args.out, lines, r, quick=args.quick)


if __name__ == "__main__":
    main()
