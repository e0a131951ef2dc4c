"""An aggregator behind its agents (issue 15, part 5): a lost state directory, or one restored from an older
copy. Before: a fresh FedBNR aggregator "accepted" every upload and applied none, waiting forever for sequence
numbers the agents no longer held (version 0 for good, while `accepted` grew). Now it says so, takes nothing
from clients ahead of it, and with `--recover` starts a new epoch in which the agents upload their totals
again: FedBNR's global is rebuilt exactly.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.core.stats import SufficientStats
from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.wire.message import decode, encode

STEPS = 120


@pytest.fixture(scope="module")
def streams():
    return load_beijing(normalisation="paper", split="station", steps=2 * STEPS + 16).streams[:3]


def fedbnr_cfg() -> FleetConfig:
    return FleetConfig(fleet="t", algorithm="fedbnr", n_inputs=10, n_kernels=1, n_features=6, kernels=["gaussian:2.0"],
                       standardise="none", fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=False))


def run(agents, agg, streams, cfg, steps: range, now: float) -> float:
    """Every agent learns `steps` of its stream; updates go to `agg`, its globals and acks to every agent."""
    for t in steps:
        now += 0.01
        for a, s in zip(agents, streams, strict=True):
            _, msgs = a.on_reading(Reading(f"{t}", s.X[t], float(t), float(s.y[t])), now=now)
            deliver(msgs, agg, agents, cfg, now)
        deliver([], agg, agents, cfg, now, tick=True)
    return now


def deliver(msgs, agg, agents, cfg, now, tick=False) -> None:
    queue = list(msgs) + (agg.tick(now) if tick else [])
    while queue:
        m = queue.pop(0)
        payload = encode(m, cfg)
        if m.kind.endswith(".update"):
            queue += agg.on_update(m.client, payload, now=now)
        elif m.kind.endswith(".global"):
            for a in agents:
                a.on_global(decode(payload, cfg, kernel_version=a.kernel_version), now=now)
        elif m.kind == "ack":
            for a in agents:
                if a.client_id == m.client:
                    queue += a.on_ack(decode(payload, cfg))


def centralised(streams, steps: list[int], agents) -> SufficientStats:
    """The statistics of every sample every agent learned (the first `steps[i]` of stream i), from the raw
    samples."""
    learner = agents[0].learner.client  # the feature map (shared by the fleet)
    phis = np.concatenate([np.stack([learner.features(s.X[t]) for t in range(k)]) for s, k in zip(streams, steps,
                                                                                                  strict=True)])
    ys = np.concatenate([s.y[:k] for s, k in zip(streams, steps, strict=True)])
    return SufficientStats.from_samples(phis, ys)


def test_a_fresh_aggregator_refuses_clients_ahead_of_it_and_says_so(streams, caplog) -> None:
    cfg = fedbnr_cfg()
    names = [s.name for s in streams]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    now = run(agents, agg, streams, cfg, range(STEPS), 0.0)
    assert agg.version > 3
    fresh = AggregatorCore(cfg, clients=names, mode="async", window=0.0)  # its state directory is gone
    with caplog.at_level(logging.ERROR, logger="streamfed.fleet.aggregator"):
        run(agents, fresh, streams, cfg, range(STEPS, STEPS + 40), now)
    assert fresh.counters.accepted == 0 and fresh.version == 0
    assert fresh.rejected.get("ahead_of_state", 0) >= 3
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(said) == len(names) and all("--recover" in m for m in said)


def test_recover_starts_a_new_epoch_and_rebuilds_fedbnrs_global_exactly(streams, caplog) -> None:
    """With --recover, the fresh aggregator publishes a global above every version the agents saw, of a new
    epoch; each agent joins it by uploading everything it has learned, and the global's sums equal the
    centralised statistics of every sample of every agent (nothing lost, nothing counted twice)."""
    cfg = fedbnr_cfg()
    names = [s.name for s in streams]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    now = run(agents, agg, streams, cfg, range(STEPS), 0.0)
    seen = agg.version
    fresh = AggregatorCore(cfg, clients=names, mode="async", window=0.0, recover=True)
    with caplog.at_level(logging.WARNING, logger="streamfed.fleet.aggregator"):
        now = run(agents, fresh, streams, cfg, range(STEPS, STEPS + 40), now)
    steps = [STEPS + 40] * len(agents)
    for i, (a, s) in enumerate(zip(agents, streams, strict=True)):
        while a.learner.pending_samples:  # every sample in some upload
            now = run([a], fresh, [s], cfg, range(steps[i], steps[i] + 1), now)
            steps[i] += 1
    deliver([fresh.global_message()], fresh, agents, cfg, now, tick=True)  # the last global, to everyone
    assert fresh.version > seen and any("recovering a lost state" in r.getMessage() for r in caplog.records)
    g = fresh.global_message()
    assert g.epoch == 1 and all(a.global_version == fresh.version and a.global_epoch == 1 for a in agents)
    ref = centralised(streams, steps, agents)
    got = SufficientStats.from_packed({k: np.asarray(g.arrays[k]) for k in ("S_upper", "b", "n", "q")})
    assert float(got.n) == sum(steps)
    np.testing.assert_allclose(got.S, ref.S, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.b, ref.b, rtol=1e-10, atol=1e-10)
    assert abs(float(got.q) - float(ref.q)) <= 1e-10 * float(ref.q)
    assert fresh.rejected.get("ahead_of_state", 0) == 1  # the first one started the recovery


def test_recover_restarts_pofmkl_from_zero_and_the_fleet_goes_on(streams) -> None:
    """POF-MKL's θ is not a sum of per-client totals: --recover restarts it from 0 above every version the agents
    saw; every agent installs it, every later update is taken (the first of each may carry error-feedback
    residual the lost state had counted) and the fleet keeps publishing — no stall, nothing wedged."""
    from streamfed.algorithms.pofmkl import POFMKLParams

    cfg = FleetConfig(fleet="t", algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=10, bin_size=2,
                      standardise="none", pofmkl=POFMKLParams(eta=0.05, xi=0.2))
    names = [s.name for s in streams]
    agents = [AgentCore(cfg, n, i, mode="async") for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, mode="async", window=0.0)
    now = run(agents, agg, streams, cfg, range(STEPS), 0.0)
    seen = agg.version
    fresh = AggregatorCore(cfg, clients=names, mode="async", window=0.0, recover=True)
    run(agents, fresh, streams, cfg, range(STEPS, 2 * STEPS), now)
    assert fresh.rejected == {"ahead_of_state": 1}
    assert fresh.version > seen + STEPS // 2 and all(a.global_version == fresh.version for a in agents)
    assert all(len(a.outbox) <= 1 for a in agents)  # at most the update of the last step, not yet in a global
    theta = fresh.global_message().arrays["theta"]
    assert np.all(np.isfinite(theta)) and 0 < float(np.abs(theta).max()) < 10.0


def test_a_lost_state_over_the_production_broker_is_said_then_recovered(streams) -> None:
    """The same over Mosquitto with the production configuration (TLS, the dynsec roster): the aggregator's state
    directory is lost mid-stream; a fresh aggregator refuses the agents ahead of it and takes nothing; restarted
    with --recover it rebuilds FedBNR's global from the agents' totals — every sample every agent has uploaded,
    once."""
    import asyncio

    from streamfed.runtime.agent import AgentService, AgentSettings
    from streamfed.runtime.aggregator import AggregatorService
    from streamfed.runtime.runner import array_source_from
    from tests import brokers

    cfg = fedbnr_cfg()
    names = [s.name.lower() for s in streams]
    live = 240
    broker = brokers.start_or_fail("prod", roster={"fleet": [{"name": cfg.fleet, "agents": names}]})

    async def serve(recover: bool) -> tuple[AggregatorService, asyncio.Task]:
        agg = AggregatorService(AggregatorCore(cfg, clients=names, mode="async", window=0.05, recover=recover),
                                broker.broker_config(f"{cfg.fleet}.aggregator"))
        task = asyncio.create_task(agg.run())
        await asyncio.wait_for(agg.connected.wait(), 10)
        return agg, task

    async def stop(agg: AggregatorService, task: asyncio.Task) -> None:
        agg.stop()
        await asyncio.wait_for(task, 10)

    async def main() -> tuple[list[AgentService], AggregatorService, AggregatorService]:
        agg, task = await serve(False)
        agents = [AgentService(AgentCore(cfg, n, i), broker.broker_config(n),
                               array_source_from(s.X[:live], s.y[:live], 60.0),
                               settings=AgentSettings(linger=1.0, drain=30.0))
                  for i, (n, s) in enumerate(zip(names, streams, strict=True))]
        runs = [asyncio.create_task(a.run()) for a in agents]
        await asyncio.sleep(1.5)
        await stop(agg, task)  # its state directory is gone: a fresh one takes over
        fresh, task = await serve(False)
        await asyncio.sleep(1.0)
        await stop(fresh, task)
        recovered, task = await serve(True)
        await asyncio.wait_for(asyncio.gather(*runs), 60)
        await stop(recovered, task)
        return agents, fresh, recovered

    with broker:
        agents, fresh, recovered = asyncio.run(main())
    assert fresh.core.version == 0 and fresh.core.counters.accepted == 0
    assert fresh.core.rejected.get("ahead_of_state", 0) >= 1
    g = recovered.core.global_message()
    assert g.epoch == 1 and all(a.core.global_epoch == 1 and not a.core.outbox for a in agents)
    steps = [live - a.core.learner.pending_samples for a in agents]  # the last samples may wait below the floor
    ref = centralised(streams, steps, [a.core for a in agents])
    got = SufficientStats.from_packed({k: np.asarray(g.arrays[k]) for k in ("S_upper", "b", "n", "q")})
    assert float(got.n) == sum(steps)
    np.testing.assert_allclose(got.S, ref.S, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.b, ref.b, rtol=1e-10, atol=1e-10)
