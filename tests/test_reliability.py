"""Reliability and security (issue 7): durable state, exactly-once effect over at-least-once delivery,
hostile input, access control — against real Mosquitto brokers and real processes.

The fault-injection test runs the aggregator and three agents as subprocesses
(`python -m streamfed.runtime.runner`), each hosting a POF-MKL lock-step fleet and a FedBNR fleet on the
same Beijing streams; it SIGKILLs the aggregator mid-stream and restarts it, restarts the broker, SIGKILLs
an agent and restarts it, and checks the final globals against the fault-free references. Set
`STREAMFED_RELIABILITY_REPORT=path.json` to keep the measured numbers (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.server import POFMKLServer, run_lockstep
from streamfed.algorithms.pofmkl.wire import global_message as pofmkl_global_message
from streamfed.algorithms.pofmkl.wire import update_message as pofmkl_update_message
from streamfed.cli import app
from streamfed.core.features import RFFBank
from streamfed.evaluation.datasets import load_beijing
from streamfed.evaluation.replay import AlgorithmConfig
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import BrokerConfig, FleetConfig
from streamfed.fleet.persistence import StateError, StateStore, atomic_write, dumps, loads, read_state
from streamfed.fleet.sources import Label, Reading, ReadingParser, Skip, array_source
from streamfed.runtime.agent import AgentService, AgentSettings
from streamfed.runtime.aggregator import AggregatorService
from streamfed.runtime.session import BrokerRefused
from streamfed.wire.message import ack_message, decode, encode

REPO = Path(__file__).resolve().parent.parent
STEPS = 120
AUTH_REFUSALS = {"Not authorized", "Bad user name or password"}


def pof_cfg(fleet: str = "rel-pof") -> FleetConfig:
    return FleetConfig(standardise="none",
                       fleet=fleet, algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=20, bin_size=2, seed=3,
                       pofmkl=POFMKLParams(eta=0.05, lam=1e-4, xi=0.2))


def bnr_cfg(fleet: str = "rel-bnr", **kw) -> FleetConfig:
    return FleetConfig(standardise="none", fleet=fleet, algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=10,
                       kernels=["gaussian:1.0"], fedbnr=FedBNRParams(min_upload=10, **kw))


@pytest.fixture(scope="module")
def streams():
    return load_beijing(normalisation="paper", split="station", steps=STEPS).streams[:3]


def reference_lockstep(streams, steps=STEPS):
    bank = RFFBank(AlgorithmConfig(n_kernels=4).specs(), 20, 10, seed=3)
    clients = [POFMKLClient(bank, 0.05, 1e-4, 0.2, 2, rng=np.random.default_rng([3, c])) for c in range(len(streams))]
    server = POFMKLServer(4, bank.dim)
    run_lockstep(clients, server, [s.X[:steps] for s in streams], [s.y[:steps] for s in streams])
    return clients, server


def reading(s, t):
    return Reading(f"s{t}", s.X[t], float(t), float(s.y[t]))


def disk(snapshot, kind):
    """A snapshot as a restarted process reads it back: through the state-file format."""
    return loads(dumps({**snapshot, "kind": kind}), kind=kind)


def route(msgs, agg, agents, cfg, now=0.0):
    """A lossless broker: updates to the aggregator, globals to every agent; returns what was published."""
    published, queue = [], list(msgs)
    while queue:
        m = queue.pop(0)
        payload = encode(m, cfg)
        if m.kind.endswith(".update"):
            queue += agg.on_update(m.client, payload, now=now)
        elif m.kind.endswith(".global"):
            published.append(m)
            for a in agents:
                a.on_global_payload(payload)
    return published


# =========================================================================== the state file


def test_state_file_round_trips_learners_and_arrays(tmp_path):
    core = AgentCore(bnr_cfg(), "a", 0)
    rng = np.random.default_rng(0)
    for t in range(25):
        core.on_reading(Reading(f"r{t}", rng.random(10), float(t), float(rng.random())))
    with StateStore(tmp_path / "a.state", kind="agent") as store:
        assert store.load() is None
        n = store.save({"core": core.snapshot(), "arr": np.arange(3.0)})
        back = store.load()
    assert n == (tmp_path / "a.state").stat().st_size and back["kind"] == "agent"
    assert back["arr"].tolist() == [0.0, 1.0, 2.0]
    twin = AgentCore(bnr_cfg(), "a", 0)
    twin.restore(back["core"])
    x = rng.random(10)
    assert twin.learner.predict(x) == core.learner.predict(x) and twin.seq == core.seq == 2
    assert [m.seq for m in twin.unacknowledged()] == [1, 2]


def test_a_crash_between_write_and_rename_leaves_the_old_state(tmp_path, monkeypatch):
    path = tmp_path / "agg.state"
    with StateStore(path, kind="aggregator") as store:
        store.save({"version": 1})

        def crash(*a, **k):
            raise OSError("power cut")

        monkeypatch.setattr(os, "replace", crash)
        with pytest.raises(OSError, match="power cut"):
            store.save({"version": 2})
        monkeypatch.undo()
        assert store.load()["version"] == 1
    assert not list(tmp_path.glob(".agg.state.tmp-*"))  # the failed write cleaned up after itself
    # a process killed mid-write leaves its temp file: ignored, then removed by the next owner
    stray = tmp_path / ".agg.state.tmp-killed"
    stray.write_bytes(dumps({"kind": "aggregator", "version": 3})[:40])
    assert read_state(path)["version"] == 1
    with StateStore(path, kind="aggregator") as store:
        assert not stray.exists() and store.load()["version"] == 1


@pytest.mark.parametrize("damage, reason", [
    (lambda b: b[:-7], "truncated: body has"),
    (lambda b: b[:20], "truncated header"),
    (lambda b: b + b"x", "trailing bytes"),
    (lambda b: b[:-3] + bytes([b[-3] ^ 1]) + b[-2:], "checksum mismatch"),
    (lambda b: b"\x80\x05" + b[2:], "bad magic"),
    (lambda b: b"", "truncated header"),
    (lambda b: b[:16] + (3).to_bytes(4, "little") + b[20:], "format version 3"),  # (1 and 2 are read)
])
def test_a_damaged_state_file_is_reported_never_loaded(tmp_path, damage, reason):
    path = tmp_path / "a.state"
    atomic_write(path, damage(dumps({"kind": "agent", "x": list(range(20))})))
    with pytest.raises(StateError, match=reason) as e:
        read_state(path)
    assert str(path) in str(e.value)
    with StateStore(path, kind="agent") as store, pytest.raises(StateError, match=reason):
        store.load()


def test_services_refuse_damaged_foreign_or_locked_state(tmp_path):
    cfg = pof_cfg()
    feats = [f"x{i}" for i in range(10)]
    svc = AgentService(AgentCore(cfg, "a", 0), None, sensor_features=feats, state_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(StateError, match="in use by another process"):
        AgentService(AgentCore(cfg, "a", 0), None, sensor_features=feats, state_dir=tmp_path)  # type: ignore[arg-type]
    svc.checkpoint()
    svc.store.close()
    path = tmp_path / "agent-rel-pof-a.state"
    assert read_state(path, "agent")["source_pos"] == 0
    with pytest.raises(StateError, match="different fleet configuration"):
        other = cfg.model_copy(update={"seed": 4})
        AgentService(AgentCore(other, "a", 0), None, sensor_features=feats, state_dir=tmp_path)  # type: ignore[arg-type]
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(StateError, match="truncated"):
        AgentService(AgentCore(cfg, "a", 0), None, sensor_features=feats, state_dir=tmp_path)  # type: ignore[arg-type]
    agg_path = tmp_path / "aggregator-rel-pof.state"
    agg_path.write_bytes(dumps({"kind": "agent"}))
    with pytest.raises(StateError, match="holds a 'agent' state"):
        AggregatorService(AggregatorCore(cfg, clients=["a"]), None, state_dir=tmp_path)  # type: ignore[arg-type]


# =========================================================================== cores: snapshot, restore, exactly once


def test_lockstep_fleet_restored_mid_round_equals_the_reference(streams):
    """Every core is snapshotted and rebuilt from its snapshot mid-round, twice; messages in flight are
    delivered again (duplicates) and out of order: the result is bit-for-bit the reference protocol."""
    cfg = pof_cfg()
    names = [s.name for s in streams]

    def fresh():
        return [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)], \
            AggregatorCore(cfg, clients=names, mode="lockstep", offline="wait")

    agents, agg = fresh()
    replayed = 0
    for t in range(STEPS):
        msgs = [m for a, s in zip(agents, streams, strict=True) for m in a.on_reading(reading(s, t))[1]]
        if t in (40, 77):  # crash everyone after the first update reached the aggregator
            route(msgs[:1], agg, agents, cfg)
            snaps = [disk(a.snapshot(), "agent") for a in agents], disk(agg.snapshot(), "aggregator")
            agents, agg = fresh()
            for a, snap in zip(agents, snaps[0], strict=True):
                a.restore(snap)
            agg.restore(snaps[1])
            msgs = [m for a in agents for m in a.unacknowledged()][::-1]  # everything again, reversed
            replayed += 1
        route(msgs, agg, agents, cfg)
    ref_clients, ref_server = reference_lockstep(streams)
    assert replayed == 2 and agg.version == STEPS
    assert np.max(np.abs(agg.aggregation.server.theta - ref_server.theta)) <= 1e-12
    assert agg.rejected == {"stale_seq": 2}  # the two updates that had arrived before the crashes
    for a, r in zip(agents, ref_clients, strict=True):
        assert a.learner.client.cumulative_loss == pytest.approx(r.cumulative_loss, rel=1e-12)
        assert a.counters.learned == STEPS and not a.outbox


def test_fedbnr_duplicates_reordering_replays_and_gaps_change_nothing(streams):
    cfg = bnr_cfg()
    agent = AgentCore(cfg, "a", 0)
    agg = AggregatorCore(cfg, clients=["a"], window=0.0)
    ups = [m for t in range(60) for m in agent.on_reading(reading(streams[0], t))[1]]
    assert [m.seq for m in ups] == [1, 2, 3, 4, 5, 6]
    payloads = [encode(m, cfg) for m in ups]
    agg.on_update("a", payloads[0])
    out = agg.on_update("a", payloads[3])  # seqs 2 and 3 missing: a gap, reported in an ack
    acks = [m for m in out if m.kind == "ack"]
    assert agg.counters.gaps == 1 and acks and acks[0].arrays["missing"].tolist() == [2, 3]
    assert agg.state()["missing"] == {"a": [2, 3]}
    assert [m.seq for m in agent.on_ack(decode(encode(acks[0]), cfg, kinds=("ack",)))] == [2, 3, 4, 5, 6]
    snap = disk(agg.snapshot(), "aggregator")
    agg = AggregatorCore(cfg, clients=["a"], window=0.0)
    agg.restore(snap)  # the out-of-order upload waits in the restored server's buffer
    for p in [payloads[2], payloads[0], payloads[3], payloads[1], payloads[5], payloads[4], payloads[1]]:
        agg.on_update("a", p)
    assert agg.rejected == {"stale_seq": 3} and agg.aggregation.server.included == {"a": 6}
    assert agg.aggregation.server.stats.n == 60
    phi = agent.learner.client.features_many(streams[0].X[:60]).reshape(60, -1)
    np.testing.assert_allclose(agg.aggregation.server.stats.S[0], phi.T @ phi, rtol=1e-12, atol=1e-12)


def test_restarted_agent_resends_what_no_global_includes_and_nothing_else():
    cfg = pof_cfg()
    agent = AgentCore(cfg, "a", 0, mode="async")
    agg = AggregatorCore(cfg, clients=["a"], mode="async", window=1.0)
    rng = np.random.default_rng(1)
    msgs = [m for t in range(6) for m in agent.on_reading(Reading(f"r{t}", rng.random(10), 0.0, 0.3))[1]]
    for m in msgs[:4]:
        agg.on_update("a", encode(m, cfg), now=0.0)
    glob = agg.tick(now=2.0)
    route(glob, agg, [agent], cfg)
    assert [m.seq for m in agent.unacknowledged()] == [5, 6]  # 1-4 are in the global
    back = AgentCore(cfg, "a", 0, mode="async")
    back.restore(disk(agent.snapshot(), "agent"))
    # the aggregator crashed after checkpointing version 1; on reconnect it acks what it holds
    hello = [m for m in agg.hello() if m.client == "a"]
    assert [m.seq for m in back.on_ack(decode(encode(hello[0]), cfg, kinds=("ack",)))] == [5, 6]
    for m in back.unacknowledged() + back.unacknowledged():
        agg.on_update("a", encode(m, cfg), now=3.0)
    route(agg.tick(now=5.0), agg, [back], cfg)
    assert agg.included() == {"a": 6} and not back.outbox and agg.rejected == {"stale_seq": 2}


def test_an_ack_resends_at_once_what_it_names_missing_or_is_old_not_what_is_on_its_way():
    """The ack an aggregator sends when an agent comes online lists what it held *then*: updates the agent
    sent a moment before are on their way, and resending them only makes duplicates (the demo showed
    ~30 `stale_seq` refusals in 4 s). Those wait for their resend timer; old ones and the ones the ack
    names missing (a real gap) go again at once."""
    cfg = pof_cfg()
    core = AgentCore(cfg, "a", 0, mode="async")
    rng = np.random.default_rng(1)
    for t in range(4):
        core.on_reading(Reading(f"r{t}", rng.random(10), 0.0, 0.3))
    assert sorted(core.outbox) == [1, 2, 3, 4]
    svc = AgentService(core, BrokerConfig(), source=array_source(np.zeros((0, 10)), np.zeros(0)),
                       settings=AgentSettings(ack_grace=1.0))
    now = time.monotonic()
    svc._sent_at = {1: now - 5.0, 2: now - 0.1, 3: now - 0.1, 4: now - 0.1}
    ack = ack_message(cfg.fleet, "a", 0, missing=[3], seq=1)  # holds nothing; seq 3 known missing
    svc._ack(encode(ack, cfg))
    assert [m.seq for m in svc.updates] == [1, 3]
    svc.updates.clear()
    svc._sent_at = {s: now - 2.0 for s in (1, 2, 3, 4)}  # all sent long enough ago
    svc._ack(encode(ack_message(cfg.fleet, "a", 2, seq=2), cfg))
    assert [m.seq for m in svc.updates] == [3, 4]
    assert core.counters.resent == 4


def test_aggregator_checkpoints_before_it_hands_out_a_global(streams):
    cfg = pof_cfg()
    names = [s.name for s in streams]
    agg = AggregatorCore(cfg, clients=names, mode="lockstep")
    seen = []
    agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
    agg.checkpoint = lambda core: seen.append((core.snapshot()["aggregation"].server.version, agents[0].global_version))
    for t in range(3):
        msgs = [m for a, s in zip(agents, streams, strict=True) for m in a.on_reading(reading(s, t))[1]]
        route(msgs, agg, agents, cfg)
    assert seen == [(1, 0), (2, 1), (3, 2)]  # each state was saved before its global went out


def test_restore_refuses_a_state_for_another_fleet(streams):
    agg = AggregatorCore(pof_cfg(), clients=["a"], mode="lockstep")
    with pytest.raises(ValueError, match="different fleet configuration"):
        AggregatorCore(pof_cfg("other"), clients=["a"], mode="lockstep").restore(agg.snapshot())
    with pytest.raises(ValueError, match="clients"):
        AggregatorCore(pof_cfg(), clients=["a", "b"], mode="lockstep").restore(agg.snapshot())
    snap = AgentCore(pof_cfg(), "a", 0).snapshot()
    with pytest.raises(ValueError, match="client, index, mode"):
        AgentCore(pof_cfg(), "b", 1).restore(snap)


# =========================================================================== hostile input at the agent


def test_hostile_globals_are_rejected_by_reason_and_change_nothing():
    cfg = pof_cfg()
    agent = AgentCore(cfg, "a", 0)
    kv = agent.kernel_version
    theta = np.full((4, 40), 0.01)
    good = encode(pofmkl_global_message(cfg.fleet, "aggregator", theta, 2, kernel_version=kv))
    assert agent.on_global_payload(good).installed and agent.global_version == 2
    nan = theta.copy()
    nan[1, 3] = np.nan
    huge = np.full((4, 40), 1e308)
    cases = {
        "not_msgpack": b"\xc1garbage",
        "too_large": b"\x00" * (cfg.protocol_schema.max_bytes + 1),
        "non_finite": encode(pofmkl_global_message(cfg.fleet, "aggregator", nan, 3, kernel_version=kv)),
        "wrong_shape": encode(pofmkl_global_message(cfg.fleet, "aggregator", theta[:3], 3, kernel_version=kv)),
        "wrong_kernel_version": encode(pofmkl_global_message(cfg.fleet, "aggregator", theta, 3, kernel_version="k0")),
        "wrong_fleet": encode(pofmkl_global_message("elsewhere", "aggregator", theta, 3, kernel_version=kv)),
        "unknown_kind": encode(pofmkl_update_message(cfg.fleet, "a", 3, np.array([0]), np.ones((1, 40)),
                                                     global_version=0, kernel_version=kv)),
        "wrong_dtype": encode(dataclasses.replace(pofmkl_global_message(
            cfg.fleet, "aggregator", theta, 3, kernel_version=kv), arrays={"theta": theta.astype(np.float32)})),
    }
    before = agent.learner.client.theta.copy()
    for reason, payload in cases.items():
        res = agent.on_global_payload(payload)
        assert (res.installed, res.reason) == (False, reason)
    # θ whose squared norm overflows: finite on the wire, unusable in the learner
    res = agent.on_global_payload(encode(pofmkl_global_message(cfg.fleet, "aggregator", huge, 3, kernel_version=kv)))
    assert res == (False, "non_finite", res.detail)
    old = agent.on_global_payload(good)  # a replay of an old version: ignored, not an error
    assert old == (False, None, "") and agent.counters.ignored_globals == 1
    assert agent.counters.rejected_globals_by == {r: 1 for r in cases} | {"non_finite": 2}
    assert agent.global_version == 2 and np.array_equal(agent.learner.client.theta, before)


def test_bad_sensor_input_is_skipped_counted_and_not_learned():
    """Each kind of bad reading is skipped with its reason; the learner ends exactly as if it had only
    ever seen the good readings."""
    cfg = FleetConfig(standardise="none", fleet="sense", algorithm="fedbnr", n_inputs=2, n_kernels=1, n_features=5,
                      kernels=["gaussian:1.0"], fedbnr=FedBNRParams(min_upload=2))
    parser = ReadingParser(["a", "b"])
    agent, twin = AgentCore(cfg, "s", 0), AgentCore(cfg, "s", 0)
    good = [{"id": f"g{i}", "ts": float(i), "x": {"a": 0.1 * i, "b": 1.0 - 0.1 * i}, "y": 0.5 + 0.01 * i}
            for i in range(8)]
    bad = {
        "missing_feature": {"id": "m", "ts": 9.0, "x": {"a": 1.0}, "y": 1.0},
        "non_numeric": {"id": "n", "ts": 9.0, "x": {"a": 1.0, "b": "warm"}, "y": 1.0},
        "non_finite": {"id": "f", "ts": 9.0, "x": {"a": float("nan"), "b": 1.0}, "y": 1.0},
        "malformed": b"\xff{not json",
        "out_of_order": {"id": "o", "ts": 0.5, "x": {"a": 1.0, "b": 1.0}, "y": 1.0},
        "unknown_reading": {"label_for": "never-seen", "y": 3.0},
        "duplicate": good[2],
    }
    stream = good[:4] + list(bad.values()) + good[4:] + [{"id": "late", "ts": 20.0, "x": [0.3, 0.3]},
                                                          {"label_for": "late", "y": 0.7}]
    for item in stream:
        parsed = parser.parse(item if isinstance(item, bytes) else json.dumps(item, allow_nan=True))
        if isinstance(parsed, Skip):
            agent.on_skip(parsed)
        elif isinstance(parsed, Label):
            agent.on_label(parsed)
        else:
            agent.on_reading(parsed)
    assert agent.counters.skipped == {r: 1 for r in bad}
    assert agent.counters.learned == 9 and agent.stats.skipped["duplicate"] == 1
    for g in good:
        twin.on_reading(Reading(g["id"], np.array([g["x"]["a"], g["x"]["b"]]), g["ts"], g["y"]))
    twin.on_reading(Reading("late", np.array([0.3, 0.3]), 20.0, 0.7))
    np.testing.assert_array_equal(agent.learner.client.own_stats().S, twin.learner.client.own_stats().S)
    np.testing.assert_array_equal(agent.learner.client.own_stats().b, twin.learner.client.own_stats().b)


# =========================================================================== access control (prod broker)


async def _run_fleet(agg, agents, timeout=30.0):
    agg_task = asyncio.create_task(agg.run())
    try:
        await asyncio.wait_for(agg.connected.wait(), 10)
        await asyncio.wait_for(asyncio.gather(*(a.run() for a in agents)), timeout)
    finally:
        agg.stop()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(agg_task, 5)


def test_services_run_end_to_end_on_the_production_broker(mosquitto_factory, streams):
    """TLS with the test CA, each service its own account bound to its client id (agents log in as
    themselves, the aggregator as `<fleet>.aggregator`)."""
    cfg = bnr_cfg("acl-bnr")
    names = ["a1", "a2"]
    mosquitto_prod = mosquitto_factory("prod", roster={"fleet": [{"name": "acl-bnr", "agents": names}]})

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, clients=names, window=0.05),
                                mosquitto_prod.broker_config("acl-bnr.aggregator"))
        agents = [AgentService(AgentCore(cfg, n, i), mosquitto_prod.broker_config(n),
                               array_source(s.X[:40], s.y[:40]))
                  for i, (n, s) in enumerate(zip(names, streams[:2], strict=True))]
        await _run_fleet(agg, agents)
        return agg, agents

    agg, agents = asyncio.run(main())
    assert mosquitto_prod.broker_config("a1").use_tls
    assert agg.core.included() == {"a1": 4, "a2": 4} and agg.core.aggregation.server.stats.n == 80
    assert agg.core.rejected == {} and agg.refusals == {}
    for a in agents:
        assert a.core.global_version == agg.core.version and not a.core.outbox and a.refusals == {}


def test_refused_connections_surface_with_the_mqtt_reason(mosquitto_prod):
    cfg = pof_cfg("acl-refused")

    async def run(svc):
        t0 = time.monotonic()
        with pytest.raises(BrokerRefused) as e:
            await asyncio.wait_for(svc.run(), 15)
        return e.value, time.monotonic() - t0

    wrong = mosquitto_prod.broker_config("a1", password="not-the-password")
    agent = AgentService(AgentCore(cfg, "a1", 0), wrong, sensor_features=[f"x{i}" for i in range(10)])
    err, took = asyncio.run(run(agent))
    # Mosquitto answers a wrong password with CONNACK 0x87 "Not authorized" (0x86 on some versions)
    assert err.reason in AUTH_REFUSALS and err.count == 3 and took < 5
    assert agent.refusals == {err.reason: 3} and str(err).endswith(err.reason)
    agg = AggregatorService(AggregatorCore(cfg, clients=["a1"], mode="async"),
                            mosquitto_prod.broker_config("aggregator", password="nope"))
    err, _ = asyncio.run(run(agg))
    assert err.reason in AUTH_REFUSALS and agg.refusals == {err.reason: 3}
    auth_reason = err.reason
    # user a1 posing as client a2: the broker binds a1 to its own client id and refuses the connection
    impostor = AgentService(AgentCore(cfg, "a2", 1), mosquitto_prod.broker_config("a1"),
                            sensor_features=[f"x{i}" for i in range(10)])
    err, _ = asyncio.run(run(impostor))
    assert err.reason == "Not authorized" and impostor.refusals == {"Not authorized": 3}
    # a broker certificate that does not verify (the system CAs do not know the test CA)
    untrusted = wrong.model_copy(update={"tls_ca": None, "tls": True, "password": None, "username": None})
    agent = AgentService(AgentCore(cfg, "a1", 0), untrusted, sensor_features=[f"x{i}" for i in range(10)])
    err, _ = asyncio.run(run(agent))
    assert err.reason.startswith("TLS: ") and "CERTIFICATE_VERIFY_FAILED" in err.reason
    # and the CLI says so and exits with status 2 instead of retrying forever
    conf = Path(wrong.tls_ca).parent.parent / "refused.toml"
    conf.write_text(f'[fleet]\nfleet = "acl-refused"\nalgorithm = "pofmkl"\nn_inputs = 10\n[broker]\n'
                    f'host = "{wrong.host}"\nport = {wrong.port}\nusername = "aggregator"\npassword = "nope"\n'
                    f'tls_ca = "{wrong.tls_ca}"\n')
    res = CliRunner().invoke(app, ["aggregator", "--config", str(conf), "--clients", "a1"])
    assert res.exit_code == 2 and f"refused the connection 3 times: {auth_reason}" in " ".join(res.output.split())


# =========================================================================== the CLI's --state-dir


def test_cli_agent_resumes_from_its_state_dir(mosquitto_dev, tmp_path, streams):
    s = streams[0]
    csv = tmp_path / "a.csv"
    csv.write_text("y," + ",".join(f"x{i}" for i in range(10)) + "\n"
                   + "".join(",".join(repr(float(v)) for v in (s.y[t], *s.X[t])) + "\n" for t in range(30)))
    conf = tmp_path / "f.toml"
    b = mosquitto_dev.broker_config()
    conf.write_text('[fleet]\nfleet = "cli-state"\nalgorithm = "fedbnr"\nn_inputs = 10\nn_features = 5\n'
                    f'[fleet.fedbnr]\nmin_upload = 100\n[broker]\nhost = "{b.host}"\nport = {b.port}\n')
    args = ["agent", "--config", str(conf), "--client", "c1", "--source", f"csv:{csv}", "--target", "y",
            "--features", ",".join(f"x{i}" for i in range(10)), "--state-dir", str(tmp_path / "state")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    state = read_state(tmp_path / "state" / "agent-cli-state-c1.state", "agent")
    assert state["source_pos"] == 30 and state["core"]["counters"].learned == 30
    second = CliRunner().invoke(app, args)  # the same CSV again: every row is learned already
    assert second.exit_code == 0 and "resumed at item 30" in " ".join(second.output.split())
    state = read_state(tmp_path / "state" / "agent-cli-state-c1.state", "agent")
    # the agent standardises its stream (the default): the first two rows only set the scales
    assert state["core"]["counters"].learned == 30 and state["core"]["learner"].pending_samples == 28


# =========================================================================== fault injection


class Proc:
    """A runner subprocess with its log; killed (whole process group) when the test ends."""

    def __init__(self, spec: Path, role: str, client: str | None, logdir: Path) -> None:
        self.args = [sys.executable, "-m", "streamfed.runtime.runner", str(spec), role] + ([client] if client else [])
        self.log = logdir / f"{role}{'-' + client if client else ''}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> float:
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(self.args, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                                         start_new_session=True)
        return time.monotonic()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            self.proc.wait(10)


def wait_until(pred, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        for p in procs:
            if p.proc.poll() not in (None, 0):
                raise AssertionError(f"{p.log.name} exited with {p.proc.returncode}:\n{p.log.read_text()[-3000:]}")
        time.sleep(0.02)
    logs = "\n".join(f"--- {p.log.name}\n{p.log.read_text()[-2500:]}" for p in procs)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


def test_fleet_survives_crashes_and_a_broker_restart(mosquitto_factory, tmp_path, streams):
    broker = mosquitto_factory("dev")
    names = [s.name for s in streams]
    for n, s in zip(names, streams, strict=True):
        np.savez(tmp_path / f"{n}.npz", X=s.X[:STEPS], y=s.y[:STEPS])
    pof, bnr = pof_cfg(), bnr_cfg()
    state = tmp_path / "state"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "broker": broker.broker_config().model_dump(mode="json"), "state_dir": str(state),
        "fleets": [
            {"config": pof.model_dump(mode="json"), "mode": "lockstep", "offline": "wait", "clients": names,
             "rate": 20.0, "streams": {n: f"{n}.npz" for n in names}},
            {"config": bnr.model_dump(mode="json"), "mode": "async", "window": 0.05, "clients": names,
             "rate": 12.0, "streams": {n: f"{n}.npz" for n in names}},
        ]}))
    agg_state = state / "aggregator-rel-pof.state"
    bnr_state = state / "aggregator-rel-bnr.state"

    def version(path=agg_state):
        st = read_state(path)
        return st["core"]["aggregation"].server.version if st else 0

    def agent_steps(name):
        st = read_state(state / f"agent-rel-pof-{name}.state")
        return st["core"]["steps"] if st else 0

    report: dict = {"faults": []}
    agg = Proc(spec, "aggregator", None, tmp_path)
    agents = [Proc(spec, "agent", n, tmp_path) for n in names]
    procs = [agg, *agents]
    try:
        # 1. the aggregator is SIGKILLed mid-stream and started again
        wait_until(lambda: version() >= 20, 60, "POF-MKL round 20", procs)
        agg.kill()
        v_pof, v_bnr = version(), version(bnr_state)
        t0 = agg.start()
        t_ready = wait_until(lambda: "resumed from" in agg.log.read_text() and time.monotonic(), 60,
                             "the aggregator to load its state", procs) - t0
        wait_until(lambda: version() > v_pof, 60, "a global after the aggregator restart", procs)
        t_pof = time.monotonic() - t0
        wait_until(lambda: version(bnr_state) > v_bnr, 60, "a FedBNR global after the restart", procs)
        report["faults"].append({"fault": "aggregator SIGKILL + restart", "at_version": {"pofmkl": v_pof,
                                 "fedbnr": v_bnr}, "state_loaded_s": t_ready,
                                 "recovery_s": {"pofmkl": t_pof, "fedbnr": time.monotonic() - t0}})
        # 2. the broker restarts (SIGTERM, persistence reloaded) under everyone
        wait_until(lambda: version() >= 50, 60, "POF-MKL round 50", procs)
        v_pof, v_bnr = version(), version(bnr_state)
        broker.restart()
        t0 = time.monotonic()
        wait_until(lambda: version() > v_pof + 1, 60, "globals after the broker restart", procs)
        report["faults"].append({"fault": "broker restart", "at_version": {"pofmkl": v_pof, "fedbnr": v_bnr},
                                 "recovery_s": {"pofmkl": time.monotonic() - t0}})
        # 3. an agent is SIGKILLed and started again; lock-step rounds wait for it
        wait_until(lambda: version() >= 80, 60, "POF-MKL round 80", procs)
        victim = agents[1]
        victim.kill()
        steps_at_kill = agent_steps(names[1])
        v_pof = version()
        t0 = victim.start()
        t_ready = wait_until(lambda: "resumed from" in victim.log.read_text() and time.monotonic(), 60,
                             "the agent to load its state", procs) - t0
        wait_until(lambda: agent_steps(names[1]) > steps_at_kill, 60, "the restarted agent's next sample", procs)
        t_agent = time.monotonic() - t0
        wait_until(lambda: version() > v_pof + 1, 60, "globals after the agent restart", procs)
        report["faults"].append({"fault": "agent SIGKILL + restart", "at_version": {"pofmkl": v_pof},
                                 "agent_steps_at_kill": steps_at_kill, "state_loaded_s": t_ready,
                                 "recovery_s": {"next_sample": t_agent, "pofmkl": time.monotonic() - t0}})
        # the streams end; every agent leaves once its updates are in a global it has installed
        for a in agents:
            wait_until(lambda a=a: a.proc.poll() is not None, 90, f"{a.log.name} to finish", procs)
            assert a.proc.returncode == 0, a.log.read_text()[-3000:]
        agg.kill(signal.SIGTERM)
        assert agg.proc.returncode == 0, agg.log.read_text()[-3000:]
    finally:
        for p in procs:
            p.kill()
    log_text = agg.log.read_text()
    assert log_text.count("resumed from") == 2  # both fleets' aggregators resumed from their state

    # POF-MKL lock-step: the reference protocol's θ, every sample learned once with the right global
    ref_clients, ref_server = reference_lockstep(streams)
    final = read_state(agg_state, "aggregator")["core"]
    assert final["aggregation"].server.version == STEPS and final["aggregation"].included() == {n: STEPS for n in names}
    pof_diff = float(np.max(np.abs(final["aggregation"].server.theta - ref_server.theta)))
    assert pof_diff <= 1e-12
    resent = {}
    for n, r in zip(names, ref_clients, strict=True):
        st = read_state(state / f"agent-rel-pof-{n}.state", "agent")
        c = st["core"]
        assert c["counters"].learned == STEPS and st["source_pos"] == STEPS and c["outbox"] == []
        assert c["learner"].client.cumulative_loss == pytest.approx(r.cumulative_loss, rel=1e-12)
        resent[n] = c["counters"].resent
    # FedBNR: the global sums every sample exactly once — the centralised posterior
    g = read_state(bnr_state, "aggregator")["core"]["aggregation"].server
    assert g.included == {n: STEPS // 10 for n in names} and g.stats.n == len(names) * STEPS
    probe = AgentCore(bnr, "probe", 0).learner.client
    phi = np.concatenate([probe.features_many(s.X[:STEPS]).reshape(STEPS, -1) for s in streams])
    y = np.concatenate([s.y[:STEPS] for s in streams])
    sig, lam, _ = fit_hyperparameters(phi.T @ phi, phi.T @ y, float(len(y)), float(y @ y))
    assert g.sigma[0] == pytest.approx(sig, rel=1e-6) and g.lam[0] == pytest.approx(lam, rel=1e-6)
    # the sums are the centralised ones to rounding (each sample summed once, in some order) ...
    np.testing.assert_allclose(g.stats.S[0], phi.T @ phi, rtol=0, atol=1e-12)
    np.testing.assert_allclose(g.stats.b[0], phi.T @ y, rtol=0, atol=1e-12)
    assert g.stats.q == pytest.approx(float(y @ y), rel=1e-14)
    # ... so is the posterior mean (the fitted σ makes A ill-conditioned, cond ~1e7: rounding of the sums
    # shows at ~1e-9 relative; compared on the scale of m)
    sigma, lam = g.sigma[0], g.lam[0]
    eye = np.eye(phi.shape[1]) / lam**2
    m_central = np.linalg.solve(phi.T @ phi / sigma**2 + eye, phi.T @ y) / sigma**2
    m_global = np.linalg.solve(g.stats.S[0] / sigma**2 + eye, g.stats.b[0]) / sigma**2
    bnr_diff = float(np.max(np.abs(m_global - m_central)))
    bnr_scale = float(np.max(np.abs(m_central)))
    assert bnr_diff <= 1e-8 * max(1.0, bnr_scale)
    # and with a well-conditioned prior (σ = λ = 1) the posterior means agree within 1e-8 absolutely
    eye1 = np.eye(phi.shape[1])
    unit_diff = float(np.max(np.abs(np.linalg.solve(g.stats.S[0] + eye1, g.stats.b[0])
                                    - np.linalg.solve(phi.T @ phi + eye1, phi.T @ y))))
    assert unit_diff <= 1e-8
    for n in names:
        c = read_state(state / f"agent-rel-bnr-{n}.state", "agent")["core"]
        assert c["counters"].learned == STEPS and c["outbox"] == []
    report.update(pofmkl_max_abs_theta_diff=pof_diff, fedbnr_max_abs_mean_diff=bnr_diff,
                  fedbnr_max_abs_mean=bnr_scale, fedbnr_unit_prior_mean_diff=unit_diff,
                  fedbnr_cond_A=float(np.linalg.cond(phi.T @ phi / sigma**2 + eye)),
                  fedbnr_max_abs_S_diff=float(np.max(np.abs(g.stats.S[0] - phi.T @ phi))),
                  samples_learned={"pofmkl": len(names) * STEPS, "fedbnr": int(g.stats.n)},
                  pofmkl_updates_resent=resent,
                  aggregator_rejected={"pofmkl": final["counters"]["rejected"],
                                       "fedbnr": read_state(bnr_state)["core"]["counters"]["rejected"]})
    print(json.dumps(report, indent=1))
    if os.environ.get("STREAMFED_RELIABILITY_REPORT"):
        Path(os.environ["STREAMFED_RELIABILITY_REPORT"]).write_text(json.dumps(report, indent=1))
