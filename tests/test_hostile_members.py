"""A fleet against its own members (issue 15, parts 1, 2 and 4), over a real Mosquitto started from the shipped
production configuration (TLS, the dynamic-security roster binding every account to its client id;
tests/brokers.py). The attacker, `mallory`, is an authenticated agent of the fleet: everything it sends is
protocol-valid, on its own topic, with its own account. What each attempt did before this work is said in its
test; each test fails on that code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiomqtt
import numpy as np
import pytest

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.algorithms.fedbnr.wire import stats_update_message
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.algorithms.pofmkl.wire import update_message
from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from streamfed.fleet.sources import Reading, array_source
from streamfed.runtime.agent import AgentService, AgentSettings
from streamfed.runtime.aggregator import AggregatorService
from streamfed.runtime.connection import client_kwargs
from streamfed.wire import topics
from streamfed.wire.message import Message, encode
from tests import brokers

HONEST = ["h1", "h2", "h3"]
ROSTER = {"fleet": [{"name": "hf", "agents": [*HONEST, "mallory", "outsider"], "sensor_adapters": True}]}
STEPS = 120


@pytest.fixture(scope="module")
def broker() -> Iterator[brokers.Broker]:
    b = brokers.start_or_fail("prod", roster=ROSTER)
    with b:
        yield b


@pytest.fixture(scope="module")
def streams() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    fleet = load_beijing(normalisation="paper", split="station", steps=STEPS)
    return {n: (s.X, s.y) for n, s in zip(HONEST, fleet.streams, strict=False)}


def pofmkl_cfg(**robust: Any) -> FleetConfig:
    return FleetConfig(fleet="hf", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=10, bin_size=2,
                       standardise="none", pofmkl=POFMKLParams(eta=0.05, xi=0.2), robust=Robustness(**robust))


def fedbnr_cfg(**robust: Any) -> FleetConfig:
    return FleetConfig(fleet="hf", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=6, kernels=["gaussian:2.0"],
                       standardise="none", fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=False),
                       robust=Robustness(**robust))


async def fleet(broker: brokers.Broker, cfg: FleetConfig, streams: dict[str, tuple[np.ndarray, np.ndarray]],
                attack: Any = None, *, clients: list[str] | None = None, rate_hz: float | None = None,
                agents: dict[str, AgentService] | None = None, attacker: str = "mallory") -> AggregatorService:
    """The aggregator and the honest agents over `broker`; `attack(mallory)` runs alongside with mallory's own
    connection. Returns when every honest agent's updates are in the global (and the attack is done)."""
    names = clients or [*HONEST, "mallory"]
    async with aiomqtt.Client(**client_kwargs(broker.broker_config("hf.aggregator"), "hf.aggregator")) as c:
        await c.publish(topics.global_topic(cfg.fleet), b"", qos=1, retain=True)  # the last test's global
    agg = AggregatorService(AggregatorCore(cfg, clients=names, mode="async", window=0.05),
                            broker.broker_config("hf.aggregator"))
    agg_task = asyncio.create_task(agg.run())
    await asyncio.wait_for(agg.connected.wait(), 10)
    services = agents if agents is not None else {
        n: AgentService(AgentCore(cfg, n, i), broker.broker_config(n), array_source(*streams[n], rate_hz=rate_hz),
                        settings=AgentSettings(linger=0.5)) for i, n in enumerate(HONEST)}
    tasks = [asyncio.create_task(a.run()) for a in services.values()]
    attacker_task = None
    if attack is not None:
        attacker_task = asyncio.create_task(attack(aiomqtt.Client(**client_kwargs(broker.broker_config(attacker),
            broker.client_ids[attacker]))))

    async def settled() -> None:
        while any(s.core.outbox or s.core.steps < STEPS for s in services.values()):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(settled(), 90)
    if attacker_task is not None:
        await asyncio.wait_for(attacker_task, 60)
    for s in services.values():
        s.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 20)
    agg.stop()
    await asyncio.wait_for(agg_task, 10)
    return agg


async def publish(client: aiomqtt.Client, msgs: list[Message], cfg: FleetConfig) -> None:
    async with client:
        for m in msgs:
            await client.publish(topics.updates_topic(cfg.fleet, m.client), encode(m, cfg), qos=1)


def test_huge_pofmkl_deltas_from_a_member_are_refused_and_move_no_one(broker, streams) -> None:
    """Before: four updates of ±1e100 (every value within the old ±1e100 check) from one authenticated agent took
    every agent's MSE from ~0.004 to ~1e197, and honest updates then exceeded the bound too."""
    cfg = pofmkl_cfg()
    kv = cfg.kernel_version
    evil = [update_message(cfg.fleet, "mallory", s, np.array([0, 1]), np.full((2, 20), (-1) ** s * 1e100),
                           global_version=0, kernel_version=kv) for s in range(1, 5)]
    agg = asyncio.run(asyncio.wait_for(fleet(broker, cfg, streams, lambda c: publish(c, evil, cfg)), 120))
    theta = agg.core.aggregation.global_message(cfg.fleet, "x", kv).arrays["theta"]
    assert agg.core.rejected.get("invalid_update", 0) == 4
    assert np.all(np.isfinite(theta)) and float(np.abs(theta).max()) < 10.0
    assert agg.core.included() == {n: agg.core.included()[n] for n in HONEST}  # mallory is in nothing


def test_a_fedbnr_upload_claiming_2_53_samples_is_refused(broker, streams) -> None:
    """Before: `n = 2^53` passed every check (MSE 0.001 → 1e12 for everyone, permanently)."""
    cfg = fedbnr_cfg()
    f = cfg.feature_dim
    iu = np.triu_indices(f)
    S = np.eye(f)[iu][None, :] * 1.0
    evil = [stats_update_message(cfg.fleet, "mallory", 1, S, np.zeros((1, f)), 2.0**53, 1.0, global_version=0,
                                 kernel_version=cfg.kernel_version)]
    agg = asyncio.run(asyncio.wait_for(fleet(broker, cfg, streams, lambda c: publish(c, evil, cfg)), 120))
    g = agg.core.aggregation.global_message(cfg.fleet, "x", cfg.kernel_version)
    assert agg.core.rejected.get("invalid_update", 0) == 1
    assert float(g.arrays["n"]) == len(HONEST) * STEPS  # exactly the honest samples


def test_one_huge_sensor_reading_is_clipped_and_the_agent_keeps_uploading(broker, streams) -> None:
    """Before: a sensor label y = 1e50 became an accepted update of ~9e48 (global θ ~1e50); y = 1e150 a refused
    update after which the agent's included mark never advanced and it resent ~590 updates every 10 s."""
    cfg = pofmkl_cfg().model_copy(update={"standardise": "online"})
    X, y = streams["h1"]
    feats = [f"x{i}" for i in range(10)]
    h1 = AgentService(AgentCore(cfg, "h1", 0), broker.broker_config("h1"), sensor_features=feats,
                      settings=AgentSettings(linger=0.5))
    rows = [{"id": f"r{t}", "x": [float(v) for v in X[t]], "y": float(y[t])} for t in range(STEPS)]
    rows[60]["y"], rows[61]["y"] = 1e50, 1e150

    async def sensor(_: aiomqtt.Client) -> None:
        await asyncio.wait_for(h1.connected.wait(), 10)  # subscribed: no reading is published before
        adapter = aiomqtt.Client(**client_kwargs(broker.broker_config("h1.sensor"), broker.client_ids["h1.sensor"]))
        async with adapter:
            for r in rows:
                await adapter.publish(topics.sensor_topic(cfg.fleet, "h1"), json.dumps(r).encode(), qos=1)

    agg = asyncio.run(asyncio.wait_for(fleet(broker, cfg, streams, sensor, clients=["h1"], agents={"h1": h1}), 120))
    theta = agg.core.aggregation.global_message(cfg.fleet, "x", cfg.kernel_version).arrays["theta"]
    assert h1.core.counters.learned == STEPS and not h1.core.outbox  # every update of h1 is in the global
    assert h1.core.learner.diagnostics()["targets_winsorised"] == 2.0
    # within what labels at ±label_bound allow (before: θ ~1e50 for everyone)
    assert agg.core.rejected == {} and float(np.abs(theta).max()) < 100.0


def test_a_flooding_member_is_held_to_its_rate_and_to_its_share_of_the_global(broker, streams) -> None:
    """Before: one client sent 194k valid uploads in 20 s and became 99.5% of the samples in the global. Now
    (robust aggregation, share cap 0.4: above each of the three honest clients' third) its uploads beyond its rate
    are refused as `rate_limited` and what is taken never makes it more than 40% of the global's samples."""
    cfg = fedbnr_cfg(aggregation="robust", share_cap=0.4, max_sample_rate=40.0, sample_burst=80.0)
    mallory = AgentCore(cfg, "mallory", 3)
    X, y = streams["h1"]
    flood: list[Message] = []
    for t in range(4000):  # 500 valid uploads of 8 real samples each (h1's, replayed)
        _, msgs = mallory.on_reading(Reading(f"m{t}", X[t % STEPS], float(t), float(y[t % STEPS])))
        flood += [m for m in msgs if m.kind.endswith(".update")]

    agg = asyncio.run(asyncio.wait_for(fleet(broker, cfg, streams, lambda c: publish(c, flood, cfg), rate_hz=30.0),
                                       120))
    # its share of the samples in the global (the honest clients' uploads may be down-weighted themselves by the
    # soft screen, so the share is the aggregation's own count, not 1 − honest samples / n)
    share = agg.core.aggregation.client_shares()["mallory"]
    assert agg.core.rejected.get("rate_limited", 0) > 0
    assert 0.0 < share <= 0.4 + 1e-9, share


def test_an_account_outside_the_aggregators_roster_is_refused(broker, streams) -> None:
    """The broker lets `outsider` (an account of the fleet's broker roster) publish on its own updates topic; the
    aggregator's roster does not name it: its valid update is refused as `unknown_client`, counted, and nothing
    of it reaches the global. (Production aggregators refuse to start without a roster.)"""
    cfg = fedbnr_cfg()
    X, y = streams["h1"]
    outsider = AgentCore(cfg, "outsider", 9)
    ups: list[Message] = []
    for t in range(16):
        _, msgs = outsider.on_reading(Reading(f"o{t}", X[t], float(t), float(y[t])))
        ups += [m for m in msgs if m.kind.endswith(".update")]
    agg = asyncio.run(asyncio.wait_for(fleet(broker, cfg, streams, lambda c: publish(c, ups, cfg),
                                             attacker="outsider"), 120))
    g = agg.core.aggregation.global_message(cfg.fleet, "x", cfg.kernel_version)
    assert agg.core.rejected == {"unknown_client": len(ups)} and len(ups) == 2
    assert float(g.arrays["n"]) == len(HONEST) * STEPS


def test_a_reading_stamped_far_in_the_future_is_refused_and_later_readings_are_learned(broker, streams) -> None:
    """Before: one reading with `ts = 1e308` became the agent's order mark, so every later timestamped reading was
    skipped as out of order (and the mark survived restarts). Over the production broker, through the agent's
    sensor account: it is refused as `future_timestamp`, counted, and every later reading is learned."""
    import time

    cfg = fedbnr_cfg()
    X, y = streams["h1"]
    h1 = AgentService(AgentCore(cfg, "h1", 0), broker.broker_config("h1"), sensor_features=[f"x{i}" for i in range(10)],
                      settings=AgentSettings(linger=0.5))
    now = time.time()
    rows = [{"id": f"r{t}", "ts": now - STEPS + t, "x": [float(v) for v in X[t]], "y": float(y[t])}
            for t in range(STEPS)]
    rows.insert(10, {"id": "bad", "ts": 1e308, "x": [float(v) for v in X[10]], "y": float(y[10])})

    async def sensor(_: aiomqtt.Client) -> None:
        await asyncio.wait_for(h1.connected.wait(), 10)
        adapter = aiomqtt.Client(**client_kwargs(broker.broker_config("h1.sensor"), broker.client_ids["h1.sensor"]))
        async with adapter:
            for r in rows:
                await adapter.publish(topics.sensor_topic(cfg.fleet, "h1"), json.dumps(r).encode(), qos=1)

    asyncio.run(asyncio.wait_for(fleet(broker, cfg, streams, sensor, clients=["h1"], agents={"h1": h1}), 120))
    assert h1.core.counters.skipped == {"future_timestamp": 1}
    assert h1.core.counters.learned == STEPS
