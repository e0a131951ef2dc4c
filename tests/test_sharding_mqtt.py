"""Sharded aggregation over a real Mosquitto (started by the fixtures on a free loopback port): agents
publish as usual, two shards split the updates through an MQTT v5 shared subscription, a reducer
publishes the global — and the result equals the single aggregator's / the centralised one."""

import asyncio
import contextlib

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
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sharding import ReducerCore, ShardCore
from streamfed.fleet.sources import array_source
from streamfed.runtime.agent import AgentService, AgentSettings
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.shard import ReducerService, ShardService
from tests.oracles.fedbnr import assert_global_is_centralised

STEPS = 60


@pytest.fixture(scope="module")
def streams():
    return load_beijing(normalisation="paper", split="station", steps=STEPS).streams[:4]


async def run_sharded(cfg, broker, names, agents, n_shards=2, mode="lockstep", window=0.05, timeout=90.0,
                      reducer_broker=None):
    """`broker`: the shards' broker configuration, or a function of the shard's user name giving it (one
    account per shard on the production broker); `reducer_broker`: the reducer's, default the same."""
    def shard_broker(i):
        return broker(f"{cfg.fleet}.shard.s{i}") if callable(broker) else broker

    reducer = ReducerService(ReducerCore(cfg, clients=names, mode=mode, window=window,
                                         shards=[f"s{i}" for i in range(n_shards)]), reducer_broker or broker)
    shards = [ShardService(ShardCore(cfg, f"s{i}", clients=names, mode=mode), shard_broker(i), group="agg")
              for i in range(n_shards)]
    services = [reducer, *shards]
    tasks = [asyncio.create_task(s.run()) for s in services]
    for s in services:
        await asyncio.wait_for(s.connected.wait(), 10)
    agent_tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        await asyncio.wait_for(asyncio.gather(*agent_tasks), timeout)
    finally:
        for s in [*agents, *services]:
            s.stop()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    return reducer, shards


LOCKSTEP = FleetConfig(standardise="none", fleet="sharded", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=20,
                       bin_size=2, seed=3, pofmkl=POFMKLParams(eta=0.05, lam=1e-4, xi=0.2))


@pytest.mark.parametrize("flavour", ["dev", "prod"])
def test_sharded_lockstep_fleet_over_mosquitto_equals_replay(mosquitto_dev, mosquitto_factory, streams, flavour):
    """`prod`: the shipped production configuration — TLS, the dynamic-security accounts (agents log in as
    themselves, each shard as `sharded.shard.<name>`, the reducer as `sharded.reducer`, each bound to its
    client id; only the shards may join the `$share` group)."""
    cfg = LOCKSTEP
    names = [s.name for s in streams]
    if flavour == "dev":
        def login(user):
            return mosquitto_dev.broker_config()
    else:
        prod = mosquitto_factory("prod", roster={"fleet": [{"name": cfg.fleet, "agents": names, "aggregator": False,
                                                             "shards": ["s0", "s1"], "shard_group": "agg"}]})

        def login(user):
            return prod.broker_config(user)

    async def main():
        agents = [AgentService(AgentCore(cfg, n, i, mode="lockstep"), login(n), array_source(s.X, s.y),
                               settings=AgentSettings(linger=0.3))
                  for i, (n, s) in enumerate(zip(names, streams, strict=True))]
        reducer, shards = await run_sharded(cfg, login, names, agents, reducer_broker=login(f"{cfg.fleet}.reducer"))
        return reducer, shards, agents

    reducer, shards, agents = asyncio.run(main())
    # the reference: the in-process lock-step of the same clients (as the single-aggregator test uses)
    bank = RFFBank(AlgorithmConfig(n_kernels=4).specs(), 20, 10, seed=3)
    ref = [POFMKLClient(bank, 0.05, 1e-4, 0.2, 2, rng=np.random.default_rng([3, c])) for c in range(4)]
    srv = POFMKLServer(4, bank.dim)
    run_lockstep(ref, srv, [s.X for s in streams], [s.y for s in streams])
    red = reducer.core
    assert red.version == STEPS
    assert np.array_equal(red.aggregation.server.theta, srv.theta)  # bit for bit (pofmkl.round partials)
    for a, r in zip(agents, ref, strict=True):
        assert a.core.learner.client.cumulative_loss == pytest.approx(r.cumulative_loss, rel=1e-10)
        assert a.core.global_version == STEPS
    assert red.accepted == 4 * STEPS  # every update summed exactly once
    # the broker really split the stream: each shard took some, together all of them
    taken = [s.core.counters.accepted for s in shards]
    assert all(t > 0 for t in taken) and sum(taken) >= 4 * STEPS, taken
    assert all(s.core.held == 0 for s in shards)
    assert not {k: v for k, v in red.rejected.items() if k != "duplicate"}


def test_sharded_fedbnr_fleet_over_mosquitto_equals_centralised(mosquitto_dev, streams):
    cfg = FleetConfig(standardise="none", fleet="shardbnr", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=10,
                      kernels=["gaussian:1.0"], fedbnr=FedBNRParams(min_upload=10, fit_hyperparameters=False))
    broker = mosquitto_dev.broker_config()
    names = [s.name for s in streams[:3]]

    async def main():
        agents = [AgentService(AgentCore(cfg, n, i), broker, array_source(s.X, s.y), settings=AgentSettings(linger=0.5))
                  for i, (n, s) in enumerate(zip(names, streams[:3], strict=True))]
        reducer, shards = await run_sharded(cfg, broker, names, agents, mode="async")
        return reducer, shards, agents

    reducer, shards, agents = asyncio.run(main())
    # 6 uploads of 10 per agent
    assert_global_is_centralised(reducer.core.aggregation.server, agents[0].core.learner.client, streams[:3])
    taken = [s.core.counters.accepted for s in shards]
    assert all(t > 0 for t in taken), taken
    for a in agents:  # each agent installed the final global, its own uploads all included
        assert a.core.learner.global_version == reducer.core.version


def test_broker_roles_give_shards_and_the_reducer_only_their_topics():
    """The production broker's generated roles (broker_config/scripts/make-dynsec.py): what each shard, the
    reducer and an agent (even one named like a shard) may publish and receive."""
    from paho.mqtt.client import topic_matches_sub

    from streamfed.wire import topics
    from tests.test_broker_config import dynsec

    accounts, roles = dynsec.build({"fleet": [{"name": "f", "agents": ["a1", "s0"], "shards": ["s0", "s1"]}]})

    def allows(user: str, acltype: str, topic: str) -> bool:
        [acc] = [a for a in accounts if a.username == user]
        return any(acl["acltype"] == acltype and acl["allow"] and topic_matches_sub(acl["topic"], topic)
                   for r in roles if r["rolename"] in acc.roles for acl in r["acls"])

    send, recv = "publishClientSend", "publishClientReceive"
    upd, glob = topics.updates_topic("f", "a1"), topics.global_topic("f")
    part, sack = topics.channel_topic("f", "partials", "s0"), topics.channel_topic("f", "shard_acks", "s0")
    shard, reducer = "f.shard.s0", "f.reducer"
    assert allows(shard, recv, upd) and allows(shard, recv, glob)
    assert allows(shard, send, part) and allows(shard, recv, sack)
    assert not allows(shard, send, glob) and not allows(shard, send, sack)
    assert not allows("f.shard.s1", send, part)  # one shard cannot forge another's partial
    assert allows(reducer, recv, part) and allows(reducer, send, glob)
    assert allows(reducer, send, sack) and allows(reducer, send, topics.acks_topic("f", "a1"))
    assert not allows(reducer, recv, upd)  # the reducer sees partial sums, never an agent's update
    for agent in ("a1", "s0"):  # an agent (even one named like a shard) cannot forge partials or acks
        assert not allows(agent, send, part) and not allows(agent, recv, sack)


def test_cli_reducer_and_shards_serve_an_async_fleet(mosquitto_dev, streams, tmp_path):
    """`streamfed reducer` and two `streamfed shard` processes (the commands users run, from a TOML file)
    take every update of asynchronous agents: each agent's whole outbox ends up in the global."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    broker = mosquitto_dev.broker_config()
    cfg = FleetConfig(standardise="none",
                      fleet="shardcli", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=10, bin_size=1)
    conf = tmp_path / "fleet.toml"
    conf.write_text(f'[fleet]\nstandardise = "none"\nfleet = "shardcli"\n'
                    f'algorithm = "pofmkl"\nn_inputs = 10\nn_kernels = 4\n'
                    f'n_features = 10\nbin_size = 1\n\n[broker]\nhost = "{broker.host}"\nport = {broker.port}\n')
    names = [s.name for s in streams[:2]]
    exe = Path(sys.executable).parent / "streamfed"
    common = ["--config", str(conf), "--clients", ",".join(names), "--mode", "async"]
    cmds = [[str(exe), "reducer", *common, "--window", "0.1", "--shards", "s0,s1"],
            *[[str(exe), "shard", *common, "--name", s, "--group", "cli"] for s in ("s0", "s1")]]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, OPENBLAS_NUM_THREADS="1")) for c in cmds]
    try:
        async def main():
            await asyncio.sleep(3.0)  # processes starting; an update sent before a shard subscribed is resent
            agents = [AgentService(AgentCore(cfg, n, i), broker, array_source(s.X, s.y, rate_hz=200.0),
                                   settings=AgentSettings(linger=0.3, resend_after=1.0, drain=30.0))
                      for i, (n, s) in enumerate(zip(names, streams[:2], strict=True))]
            await asyncio.wait_for(asyncio.gather(*(a.run() for a in agents)), 90)
            return agents

        agents = asyncio.run(main())
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        outs = [p.communicate(timeout=15)[0] for p in procs]
    for a in agents:
        assert a.core.outbox == {}, "every update of the agent is in a global"
        assert a.core.global_version > 0 and a.core.stats.samples == STEPS
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert "reducer of fleet 'shardcli'" in outs[0] and "shard 's0'" in outs[1] and "shard 's1'" in outs[2]


def test_reducer_killed_mid_run_resumes_from_its_state(mosquitto_dev, streams, tmp_path):
    """SIGKILL of the `streamfed reducer` process (with `--state-dir`) in the middle of a lock-step fleet, then
    the same command again: it resumes from its write-ahead checkpoint, the agents resend what it lost, and the
    fleet ends with the replay's θ — every update counted exactly once."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import aiomqtt

    from streamfed.wire.message import decode
    from streamfed.wire.topics import global_topic

    cfg = LOCKSTEP.model_copy(update={"fleet": "reducerkill"})
    broker = mosquitto_dev.broker_config()
    names = [s.name for s in streams]
    conf = tmp_path / "fleet.toml"
    conf.write_text(f'[fleet]\nstandardise = "none"\nfleet = "{cfg.fleet}"\n'
                    f'algorithm = "pofmkl"\nn_inputs = 10\nn_kernels = 4\n'
                    f'n_features = 20\nbin_size = 2\nseed = 3\n\n[fleet.pofmkl]\neta = 0.05\nlam = 0.0001\nxi = 0.2\n\n'
                    f'[broker]\nhost = "{broker.host}"\nport = {broker.port}\n')
    exe = Path(sys.executable).parent / "streamfed"
    common = ["--config", str(conf), "--clients", ",".join(names), "--mode", "lockstep"]
    reducer_cmd = [str(exe), "reducer", *common, "--shards", "s0,s1", "--state-dir", str(tmp_path / "state")]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")

    def start(cmd):
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    procs = [start([str(exe), "shard", *common, "--name", s, "--group", "kill"]) for s in ("s0", "s1")]
    reducer = [start(reducer_cmd)]  # the current reducer process
    killed_at = []
    try:
        async def main():
            await asyncio.sleep(3.0)  # processes starting; agents resend what reaches no shard
            agents = [AgentService(AgentCore(cfg, n, i, mode="lockstep"), broker, array_source(s.X, s.y),
                                   settings=AgentSettings(linger=0.3, resend_after=2.0))
                      for i, (n, s) in enumerate(zip(names, streams, strict=True))]

            async def killer():
                async with aiomqtt.Client(**client_kwargs(broker, "killer")) as c:
                    await c.subscribe(global_topic(cfg.fleet), qos=1)
                    async for m in c.messages:
                        g = decode(m.payload, cfg, kinds=("pofmkl.global",))
                        if g.global_version >= 20:
                            reducer[0].send_signal(signal.SIGKILL)
                            reducer[0].wait()
                            killed_at.append(g.global_version)
                            await asyncio.sleep(0.5)
                            reducer[0] = start(reducer_cmd)  # the same command: resumes from --state-dir
                            return

            k = asyncio.create_task(killer())
            await asyncio.wait_for(asyncio.gather(*(a.run() for a in agents)), 120)
            await k
            return agents

        agents = asyncio.run(main())
    finally:
        for p in [*procs, reducer[0]]:
            p.send_signal(signal.SIGINT)
        outs = [p.communicate(timeout=15)[0] for p in [*procs, reducer[0]]]
    assert killed_at and killed_at[0] < STEPS
    assert "resumed" in outs[-1], outs[-1]  # the second reducer started from the state file
    bank = RFFBank(AlgorithmConfig(n_kernels=4).specs(), 20, 10, seed=3)
    ref = [POFMKLClient(bank, 0.05, 1e-4, 0.2, 2, rng=np.random.default_rng([3, c])) for c in range(4)]
    srv = POFMKLServer(4, bank.dim)
    run_lockstep(ref, srv, [s.X for s in streams], [s.y for s in streams])
    for a, r in zip(agents, ref, strict=True):
        assert a.core.global_version == STEPS
        assert np.array_equal(a.core.learner.client.theta, srv.theta)  # through a reducer restart, bit for bit
        assert a.core.learner.client.cumulative_loss == pytest.approx(r.cumulative_loss, rel=1e-10)


def test_sharded_personal_fedbnr_fleet_over_mosquitto_keeps_every_clients_statistics(mosquitto_dev, streams):
    """Personalised FedBNR through shards and the reducer over Mosquitto: partials carry per-client sums, and
    the reducer ends with each client's exact statistics (Φ_kᵀΦ_k, Φ_kᵀy_k, n_k, q_k of its own samples)."""
    cfg = FleetConfig(standardise="none",
                      fleet="shardpersonal", algorithm="fedbnr-personal", n_inputs=10, n_features=10,
                      kernels=["gaussian:1.0"], params={"min_upload": 10, "fit_hyperparameters": False})
    broker = mosquitto_dev.broker_config()
    names = [s.name for s in streams[:3]]

    async def main():
        agents = [AgentService(AgentCore(cfg, n, i), broker, array_source(s.X, s.y), settings=AgentSettings(linger=0.5))
                  for i, (n, s) in enumerate(zip(names, streams[:3], strict=True))]
        reducer, shards = await run_sharded(cfg, broker, names, agents, mode="async")
        return reducer, shards, agents

    reducer, shards, agents = asyncio.run(main())
    server = reducer.core.aggregation.server
    n_up = (len(streams[0].y) // 10) * 10
    assert reducer.core.included() == {n: n_up // 10 for n in names}
    probe = agents[0].core.learner.client
    for n, s in zip(names, streams[:3], strict=True):
        phi = probe.features_many(s.X[:n_up])
        y = s.y[:n_up]
        st, _ = server.clients[n]
        assert st.n == n_up
        np.testing.assert_allclose(st.S, phi.T @ phi, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(st.b, phi.T @ y, rtol=1e-10, atol=1e-10)
        assert st.q == pytest.approx(float(y @ y), rel=1e-10)
    assert all(s.core.counters.accepted > 0 for s in shards)
    for a in agents:  # each agent installed the final global
        assert a.core.learner.global_version == reducer.core.version
