"""Runtime figures over a real Mosquitto on loopback (started here, like the test fixtures).

    .venv/bin/python benchmarks/bench_runtime.py [--out benchmarks/results/runtime.md]

1. Aggregator ingest: K POF-MKL updates (M = 2, D = 100, N = 16) wait in a persistent session's queue;
   a receiver then connects and drains them. Side by side in the same run: a bare aiomqtt subscriber
   (receives, does nothing) and the streamfed aggregator (strict decode, seq dedupe, validation,
   aggregation into θ). Reported: messages/s of each and their ratio (median of repeats).
2. Agent latency: one agent at 100 samples/s; time from a sample's arrival to its prediction being
   acknowledged by the broker (QoS 1 PUBACK). Peer in the same run: a bare aiomqtt QoS 1 publish of a
   prediction-sized payload (the transport's own floor).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import statistics
import sys
import time
from pathlib import Path

import aiomqtt
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamfed.agent import AgentCore  # noqa: E402
from streamfed.aggregator import AggregatorCore  # noqa: E402
from streamfed.broker import EmbeddedBroker  # noqa: E402
from streamfed.config import FleetConfig  # noqa: E402
from streamfed.fleet import kernel_version  # noqa: E402
from streamfed.protocol import encode, pofmkl_update_message  # noqa: E402
from streamfed.runtime.agent import AgentService  # noqa: E402
from streamfed.runtime.aggregator import AggregatorService  # noqa: E402
from streamfed.sources import array_source  # noqa: E402
from streamfed.topics import Channel, topic_filter, updates_topic  # noqa: E402

K_CLIENTS, K_SEQ = 50, 100  # 5,000 queued updates (Mosquitto dev.conf queues up to 10,000)


def updates(cfg: FleetConfig) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(0)
    kv = kernel_version(cfg)
    out = []
    for s in range(1, K_SEQ + 1):
        for c in range(K_CLIENTS):
            k = np.sort(rng.choice(cfg.n_kernels, cfg.bin_size, replace=False))
            delta = rng.standard_normal((cfg.bin_size, 2 * cfg.n_features))
            msg = pofmkl_update_message(cfg.fleet, f"c{c}", s, k, delta,
                                        global_version=0, kernel_version=kv)
            out.append((f"c{c}", encode(msg)))
    return out


async def _fill(broker, cfg, payloads, session_id: str, shared: bool = False) -> None:
    """Create the receiver's persistent session (subscribe, disconnect), then publish the stream."""
    async with aiomqtt.Client(**broker.aiomqtt_kwargs(session_id, persistent=True)) as c:
        await c.subscribe(topic_filter(Channel.UPDATES, cfg.fleet), qos=1)
    async with aiomqtt.Client(**broker.aiomqtt_kwargs("bench-pub"), max_inflight_messages=100) as p:
        for i in range(0, len(payloads), 100):
            await asyncio.gather(*(p.publish(updates_topic(cfg.fleet, c), pl, qos=1) for c, pl in payloads[i:i + 100]))


async def bare_rate(broker, cfg, payloads, run: int) -> float:
    sid = f"bare-{run}"
    await _fill(broker, cfg, payloads, sid)
    n = 0
    t0 = time.perf_counter()  # both receivers are timed from before they connect
    async with aiomqtt.Client(**broker.aiomqtt_kwargs(sid, persistent=True)) as c:
        async for _ in c.messages:
            n += 1
            if n == len(payloads):
                break
        return n / (time.perf_counter() - t0)


async def aggregator_rate(broker, cfg, payloads, run: int) -> tuple[float, dict]:
    sid = f"{cfg.fleet}.agg-{run}"
    await _fill(broker, cfg, payloads, sid)
    core = AggregatorCore(cfg, clients=[f"c{c}" for c in range(K_CLIENTS)], mode="async", window=0.2)
    svc = AggregatorService(core, broker, client_id=sid)
    t0 = time.perf_counter()
    task = asyncio.create_task(svc.run())
    while svc.ingested < len(payloads):
        await asyncio.sleep(0.002)
    rate = len(payloads) / (time.perf_counter() - t0)
    svc.stop()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(task, 5)
    return rate, {"accepted": core.counters.accepted, "rejected": core.rejected}


async def agent_latency(broker, cfg, seconds: float) -> dict:
    rng = np.random.default_rng(1)
    n = int(100 * seconds)
    X, y = rng.uniform(-1, 1, (n, cfg.n_inputs)), rng.uniform(0, 1, n)
    svc = AgentService(AgentCore(cfg, "lat", 0, mode="async"), broker, array_source(X, y, rate_hz=100.0),
                       drain=0.0)  # no aggregator here: nobody will include its updates
    await svc.run()
    agent = np.array(svc.latencies) * 1e3
    # the transport's floor: QoS 1 publish of a prediction-sized payload, one at a time, same rate
    payload = encode(svc.core.prediction_message(type("P", (), {"reading_id": "r", "mean": 0.1, "var": None,
                                                                 "global_version": 0, "latency_s": 0.0})()))
    bare = []
    async with aiomqtt.Client(**broker.aiomqtt_kwargs("bare-lat")) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            await c.publish("bench/lat", payload, qos=1)
            bare.append((time.perf_counter() - t0) * 1e3)
            await asyncio.sleep(0.01)
    bare = np.array(bare)
    return {"n": agent.size, "agent_p50": float(np.percentile(agent, 50)), "agent_p99": float(np.percentile(agent, 99)),
            "bare_p50": float(np.percentile(bare, 50)), "bare_p99": float(np.percentile(bare, 99))}


async def main(out: Path | None, repeats: int, seconds: float) -> None:
    eb = await EmbeddedBroker().start()
    try:
        broker = eb.config
        cfg = FleetConfig(fleet="bench", algorithm="pofmkl", n_inputs=10, n_kernels=16, n_features=100, bin_size=2)
        payloads = updates(cfg)
        bare, agg = [], []
        for r in range(repeats):
            bare.append(await bare_rate(broker, cfg, payloads, r))
            a, info = await aggregator_rate(broker, cfg, payloads, r)
            agg.append(a)
            assert info["accepted"] == len(payloads) and not info["rejected"], info
        lat = await agent_latency(broker, FleetConfig(fleet="lat", algorithm="pofmkl", n_inputs=10, n_kernels=16,
                                                      n_features=100, bin_size=2), seconds)
    finally:
        await eb.stop()
    b, a = statistics.median(bare), statistics.median(agg)
    lines = [
        "## MQTT runtime: aggregator ingest and agent latency",
        "",
        "Command: `.venv/bin/python benchmarks/bench_runtime.py`. Mosquitto on loopback "
        f"({eb.description.split(',')[0]}); {len(payloads)} POF-MKL updates (N = 16, D = 100, M = 2, "
        f"{len(payloads[0][1])} bytes each) from {K_CLIENTS} clients; median of {repeats} runs. "
        f"Machine: {platform.machine()}, 2 cores, Python {platform.python_version()}.",
        "",
        "| receiver | messages / s | ratio to bare |",
        "|---|---|---|",
        f"| bare aiomqtt subscriber (no work) | {b:,.0f} | 1.00 |",
        f"| streamfed aggregator (decode, validate, dedupe, aggregate) | {a:,.0f} | {a / b:.2f} |",
        "",
        f"Agent at 100 samples/s for {seconds:g} s ({lat['n']} samples), sample arrival → prediction PUBACK:",
        "",
        "| path | p50 ms | p99 ms |",
        "|---|---|---|",
        f"| streamfed agent (predict + learn + publish prediction and update) | {lat['agent_p50']:.2f} | "
        f"{lat['agent_p99']:.2f} |",
        f"| bare aiomqtt QoS 1 publish of the same payload | {lat['bare_p50']:.2f} | {lat['bare_p99']:.2f} |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.write_text(text)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    asyncio.run(main(args.out, args.repeats, args.seconds))
