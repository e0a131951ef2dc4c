"""Agents and aggregator over a real Mosquitto (started by the fixtures on a free loopback port)."""

import asyncio
import contextlib
import time

import aiomqtt
import numpy as np
import pytest

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.server import POFMKLServer, run_lockstep
from streamfed.core.features import RFFBank
from streamfed.evaluation.datasets import load_beijing
from streamfed.evaluation.replay import AlgorithmConfig
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import array_source
from streamfed.runtime.agent import AgentService, AgentSettings
from streamfed.runtime.aggregator import AggregatorService
from streamfed.runtime.connection import client_kwargs
from streamfed.wire.message import decode
from streamfed.wire.topics import Channel, topic_filter
from tests.oracles.fedbnr import assert_global_is_centralised

STEPS = 60


@pytest.fixture(scope="module")
def streams():
    return load_beijing(normalisation="paper", split="station", steps=STEPS).streams[:4]


async def run_fleet(agents, aggregator, timeout=60.0):
    agg_task = asyncio.create_task(aggregator.run())
    await asyncio.wait_for(aggregator.connected.wait(), 10)
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    finally:
        aggregator.stop()
        for a in agents:
            a.stop()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(agg_task, 5)


def test_lockstep_fleet_over_mosquitto_equals_replay(mosquitto_dev, streams):
    cfg = FleetConfig(standardise="none", fleet="lockstep", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=20,
                      bin_size=2, seed=3, pofmkl=POFMKLParams(eta=0.05, lam=1e-4, xi=0.2))
    broker = mosquitto_dev.broker_config()
    names = [s.name for s in streams]

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, clients=names, mode="lockstep"), broker)
        agents = [AgentService(AgentCore(cfg, n, i, mode="lockstep"), broker, array_source(s.X, s.y),
                               settings=AgentSettings(linger=0.3))
                  for i, (n, s) in enumerate(zip(names, streams, strict=True))]
        await run_fleet(agents, agg)
        return agg, agents

    agg, agents = asyncio.run(main())
    bank = RFFBank(AlgorithmConfig(n_kernels=4).specs(), 20, 10, seed=3)
    ref = [POFMKLClient(bank, 0.05, 1e-4, 0.2, 2, rng=np.random.default_rng([3, c])) for c in range(4)]
    srv = POFMKLServer(4, bank.dim)
    run_lockstep(ref, srv, [s.X for s in streams], [s.y for s in streams])
    assert agg.core.version == STEPS
    assert np.max(np.abs(agg.core.aggregation.server.theta - srv.theta)) <= 1e-12
    for a, r in zip(agents, ref, strict=True):
        assert a.core.learner.client.cumulative_loss == pytest.approx(r.cumulative_loss, rel=1e-12)
        assert a.core.global_version == STEPS  # the last global reached every agent
    assert agg.core.rejected == {}


def test_fedbnr_fleet_over_mosquitto_equals_centralised(mosquitto_dev, streams):
    cfg = FleetConfig(standardise="none", fleet="bnr", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=10,
                      kernels=["gaussian:1.0"], fedbnr=FedBNRParams(min_upload=10, fit_hyperparameters=False))
    broker = mosquitto_dev.broker_config()
    names = [s.name for s in streams[:3]]

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, clients=names, window=0.05), broker)
        agents = [AgentService(AgentCore(cfg, n, i), broker, array_source(s.X, s.y), settings=AgentSettings(linger=0.5))
                  for i, (n, s) in enumerate(zip(names, streams[:3], strict=True))]
        await run_fleet(agents, agg)
        return agg, agents

    agg, agents = asyncio.run(main())
    # 6 uploads of 10 per agent
    assert_global_is_centralised(agg.core.aggregation.server, agents[0].core.learner.client, streams[:3])
    for a in agents:  # each agent installed the final global with all its own uploads included
        assert a.core.learner.global_version == agg.core.version


@pytest.mark.parametrize("qos", [0, 1])
def test_subscriber_receives_every_prediction(mosquitto_dev, streams, qos):
    cfg = FleetConfig(standardise="none",
                      fleet=f"preds{qos}", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=10)
    broker = mosquitto_dev.broker_config()
    names = [s.name for s in streams[:2]]

    async def main():
        got = []
        async with aiomqtt.Client(**client_kwargs(broker, "viewer-preds")) as sub:
            await sub.subscribe(topic_filter(Channel.PREDICTIONS, cfg.fleet), qos=1)
            agg = AggregatorService(AggregatorCore(cfg, clients=names, mode="async", window=0.05), broker)
            agents = [AgentService(AgentCore(cfg, n, i), broker, array_source(s.X, s.y),
                                   settings=AgentSettings(prediction_qos=qos))
                      for i, (n, s) in enumerate(zip(names, streams[:2], strict=True))]
            await run_fleet(agents, agg)

            async def collect():
                async for m in sub.messages:
                    got.append((m.topic.value, decode(m.payload, cfg, kinds=("prediction",))))
                    if len(got) == 2 * STEPS:
                        return
            await asyncio.wait_for(collect(), 10)
        return got

    got = asyncio.run(main())
    assert len(got) == 2 * STEPS
    for topic, msg in got:
        assert topic == f"streamfed/v1/{cfg.fleet}/predictions/{msg.client}"
        assert msg.arrays["mean"].shape == (1,) and np.isfinite(msg.arrays["mean"][0])
        assert msg.global_version >= 0 and msg.meta["latency_s"] >= 0 and msg.meta["reading"]
    for c in names:
        seqs = [m.seq for _, m in got if m.client == c]
        assert seqs == list(range(1, STEPS + 1))


def test_aggregator_takes_a_queued_burst_like_its_core(mosquitto_dev):
    """Updates waiting in the aggregator's persistent session arrive in one burst, and the receiver
    takes them in batches: every one is handled, in order — valid ones, duplicates, garbage and
    updates of unknown clients counted exactly as a core fed the same sequence directly counts them,
    and the same global θ."""
    from streamfed.algorithms.pofmkl.wire import update_message as pofmkl_update_message
    from streamfed.fleet.robustness import Robustness
    from streamfed.wire.message import encode
    from streamfed.wire.topics import updates_topic

    cfg = FleetConfig(standardise="none",  # random deltas: far beyond what honest labels give, hence the bound
                      fleet="burst", algorithm="pofmkl", n_inputs=4, n_kernels=6, n_features=8, bin_size=2,
                      robust=Robustness(label_bound=1e6))
    names = [f"c{i}" for i in range(8)]
    rng = np.random.default_rng(11)
    ref = AggregatorCore(cfg, clients=names, mode="async", window=60.0)
    stream = []
    for s in range(1, 41):
        for c in [*names, "stranger"]:
            k = np.sort(rng.choice(cfg.params.n_kernels, 2, replace=False))
            payload = encode(pofmkl_update_message(cfg.fleet, c, s, k, rng.standard_normal((2, 16)),
                                                   global_version=0, kernel_version=ref.kernel_version))
            stream.append((c, payload))
            if rng.random() < 0.1:
                stream.append((c, payload))  # a duplicate
            if rng.random() < 0.05:
                stream.append((c, payload[:-3]))  # truncated
    broker = mosquitto_dev.broker_config()
    sid = "burst.aggregator"

    async def main():
        async with aiomqtt.Client(**client_kwargs(broker, sid, persistent=True)) as c:  # the session
            await c.subscribe(topic_filter(Channel.UPDATES, cfg.fleet), qos=1)
        async with aiomqtt.Client(**client_kwargs(broker, "burst-pub"), max_inflight_messages=100) as p:
            for c, payload in stream:  # one at a time: the broker keeps the order
                await p.publish(updates_topic(cfg.fleet, c), payload, qos=1)
        agg = AggregatorService(AggregatorCore(cfg, clients=names, mode="async", window=60.0), broker,
                                client_id=sid)
        task = asyncio.create_task(agg.run())
        try:
            async with asyncio.timeout(30):
                while agg.ingested < len(stream):
                    await asyncio.sleep(0.01)
        finally:
            agg.stop()
            await asyncio.wait_for(task, 10)
        return agg

    agg = asyncio.run(main())
    for c, payload in stream:
        ref.on_update(c, payload, now=0.0)
    assert agg.ingested == len(stream)
    assert agg.core.counters.accepted == ref.counters.accepted == 40 * len(names)
    assert agg.core.rejected == ref.rejected and set(ref.rejected) == {"stale_seq", "unknown_client", "not_msgpack"}
    later = time.time() + 3600  # past both windows
    assert [m.kind for m in ref.tick(now=later)] == [m.kind for m in agg.core.tick(now=later)] == ["pofmkl.global"]
    assert agg.core.aggregation.server.theta.tobytes() == ref.aggregation.server.theta.tobytes()


def test_prediction_is_published_before_the_sample_is_learned(mosquitto_dev, streams, monkeypatch):
    """Live predictions go out (QoS 0, written to the socket, Nagle off) before their sample's update
    exists: at each publish the agent has learned, and built updates for, only the samples before it.
    Writing them directly leaves no idle socket writer behind (it would fire on every loop turn)."""
    import socket

    import paho.mqtt.client as mqtt

    cfg = FleetConfig(standardise="none", fleet="first", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=10)
    broker = mosquitto_dev.broker_config()
    s = streams[0]
    writes = []
    loop_write = mqtt.Client.loop_write
    monkeypatch.setattr(mqtt.Client, "loop_write", lambda self: writes.append(1) or loop_write(self))

    class Watched(AgentService):
        def _emit(self, pred):
            live = self._client is not None and not self.predictions
            if live:
                nodelay.append(self._client._client.socket().getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            seen.append((live, self.core.counters.learned, self.core.seq, self.core.steps))
            super()._emit(pred)

    seen: list[tuple[bool, int, int, int]] = []
    nodelay: list[int] = []

    async def main():
        # no aggregator here: room for every update, so that each sample makes one (flow control would hold
        # them after `outbox_limit`, as it should with no global ever coming)
        agent = Watched(AgentCore(cfg, "a", 0, mode="async"), broker, array_source(s.X, s.y, rate_hz=200.0),
                        settings=AgentSettings(drain=0.0, outbox_limit=STEPS + 1))
        await agent.run()
        return agent

    agent = asyncio.run(main())
    assert [x[1:] for x in seen] == [(t, t, t) for t in range(STEPS)]
    live = sum(x[0] for x in seen)
    assert live >= STEPS // 2  # all but the first few (taken while connecting) went straight out
    assert len(agent.latencies) == STEPS and agent.dropped_predictions == 0
    assert nodelay and all(nodelay)
    assert len(writes) < 10 * STEPS, len(writes)  # a few per message, not one per loop turn


def test_qos1_predictions_leave_ahead_of_their_samples_updates(mosquitto_dev, streams):
    """With prediction_qos=1 predictions go through the sender with the updates, oldest first: a
    subscriber sees each sample's prediction before that sample's update."""
    cfg = FleetConfig(standardise="none", fleet="order1", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=10)
    broker = mosquitto_dev.broker_config()
    s = streams[0]

    async def main():
        got = []
        async with aiomqtt.Client(**client_kwargs(broker, "viewer-order1")) as sub:
            await sub.subscribe(f"streamfed/v1/{cfg.fleet}/#", qos=1)
            agent = AgentService(AgentCore(cfg, "a", 0, mode="async"), broker, array_source(s.X, s.y, rate_hz=100.0),
                                 settings=AgentSettings(drain=0.0, prediction_qos=1,
                                                        outbox_limit=STEPS + 1))  # no aggregator: see above
            await agent.run()

            async def collect():
                async for m in sub.messages:
                    kind = m.topic.value.split("/")[3]
                    if kind in ("predictions", "updates"):
                        got.append((kind, decode(m.payload, cfg).seq))
                    if len(got) == 2 * STEPS:
                        return
            await asyncio.wait_for(collect(), 10)
        return got

    got = asyncio.run(main())
    where = {item: i for i, item in enumerate(got)}
    assert all(where[("predictions", t)] < where[("updates", t)] for t in range(1, STEPS + 1))


@pytest.mark.parametrize("algorithm", ["fedbnr", "fedbnr-personal"])
def test_a_joining_agents_first_prediction_uses_the_fleet_prior_as_the_replay_does(mosquitto_dev, streams, algorithm):
    """Two agents stream 40 samples each; then a third agent joins (its own rows from step 40 on). Over
    Mosquitto its very first prediction already uses the fleet's global as the prior — it waits for the retained
    global — and equals the replay's cold-start prediction for the same join (`join={client: 40}`): the
    global statistics are the same sums (order-free; σ, λ fixed)."""
    from streamfed.evaluation.datasets.base import ClientStream, Fleet
    from streamfed.evaluation.replay import replay

    n, m = 40, 12
    own = {"min_upload": 10, "fit_hyperparameters": False}
    cfg = FleetConfig(standardise="none",
                      fleet=f"join-{algorithm}", algorithm=algorithm, n_inputs=10, n_kernels=1, n_features=10,
                      kernels=["gaussian:1.0"], seed=5, params=own)
    broker = mosquitto_dev.broker_config()
    names = [s.name for s in streams[:3]]
    first: list = []

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, mode="async", window=0.05), broker)
        agg_task = asyncio.create_task(agg.run())
        await asyncio.wait_for(agg.connected.wait(), 10)
        try:
            early = [AgentService(AgentCore(cfg, nm, i), broker, array_source(s.X[:n], s.y[:n]),
                                  settings=AgentSettings(linger=0.5))
                     for i, (nm, s) in enumerate(zip(names[:2], streams[:2], strict=True))]
            await asyncio.wait_for(asyncio.gather(*(a.run() for a in early)), 30)
            assert agg.core.included() == {nm: n // 10 for nm in names[:2]}
            late_src = streams[2]
            late = AgentService(AgentCore(cfg, names[2], 2), broker, array_source(late_src.X[n:n + m],
                                                                                    late_src.y[n:n + m]),
                                settings=AgentSettings(linger=0.2, wait_for_global=5.0))
            late.on_prediction = lambda p: first.append(p) if not first else None
            await asyncio.wait_for(late.run(), 30)
            return agg, late
        finally:
            agg.stop()
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(agg_task, 5)

    agg, late = asyncio.run(main())
    assert first and first[0].global_version > 0  # the first prediction was made with the fleet's global
    cut = [ClientStream(s.name, s.X[:k], s.y[:k], s.feature_names) for s, k in zip(streams[:3], (n, n, n + m),
                                                                                      strict=True)]
    fleet = Fleet(tuple(cut), dataset="beijing-air", normalisation="paper", split="station")
    acfg = AlgorithmConfig(n_kernels=1, kernels=("gaussian:1.0",), n_features=10, params={algorithm: own})
    r = replay(fleet, algorithm, acfg, seed=5, join={names[2]: n})
    assert abs(first[0].mean - r.means[2][n]) <= 1e-10 * max(1.0, abs(r.means[2][n]))
    assert abs(first[0].var - r.variances[2][n]) <= 1e-10 * r.variances[2][n]
    from_scratch = AgentCore(cfg, "nobody", 9).learner.predict(streams[2].X[n])
    assert abs(from_scratch[0] - first[0].mean) > 1e-6  # the prior made a difference
