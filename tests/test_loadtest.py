"""`streamfed.runtime.loadtest`, small: 20 real agent services in one process, the `streamfed aggregator` command
and a real Mosquitto; every published update must be in the last global, none rejected."""

import math

import pytest

from streamfed.runtime.loadtest import LoadTestOptions, run_loadtest


def test_small_load_test_loses_and_rejects_nothing(mosquitto_dev):
    opts = LoadTestOptions(agents=20, seconds=5.0, rate=2.0, window=0.5, drain=20.0, ramp=1.0)
    r = run_loadtest(opts, broker=mosquitto_dev.broker_config())
    assert r["agents"] == 20
    assert r["samples_learned"] == r["samples_expected"] == 200
    # async POF-MKL: one update per sample, but an agent's first two samples only set its scales (standardise)
    updates = 200 - 2 * 20
    assert r["updates_published"] == updates
    assert r["updates_lost"] == 0 and r["clients_with_lost"] == 0, r
    assert r["updates_rejected"] == {}, r["updates_rejected"]
    assert r["updates_accepted"] == r["updates_published"] and r["resent"] == 0
    assert r["outbox_left"] == 0
    assert r["included_beyond_published"] == 0
    assert r["lag_s"]["n"] == updates and 0 < r["lag_s"]["p50"] < 10 and math.isfinite(r["lag_s"]["max"])
    assert r["aggregator"]["hwm_bytes"] > 0
    # consumer lag from the aggregator's trace: every update matched, windows closed on time (timer, not tick)
    assert r["aggregator_stop_s"] is not None
    assert r["ingest_lag_s"]["n"] == updates and r["ingest_unmatched"] == 0
    assert 0 <= r["ingest_lag_s"]["p50"] < r["lag_s"]["p50"]
    assert r["windows_closed"] > 0 and 0 <= r["close_late_s"]["max"] < 0.05
    assert r["close_to_monitor_s"]["n"] > 0 and r["close_to_published_s"]["n"] > 0


def test_agents_of_one_process_share_the_decoding_of_a_global():
    """`install_global` (the agent service's path) decodes a payload once for every agent of the same
    fleet in the process, and ends in the same state and counters as `AgentCore.on_global_payload`."""
    import numpy as np

    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading
    from streamfed.runtime.shared_globals import SharedGlobals, install_global
    from streamfed.wire.message import encode

    cfg = FleetConfig(standardise="none", fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
    agg = AggregatorCore(cfg, mode="async", window=0.0)
    agents = [AgentCore(cfg, f"a{i}", i, mode="async") for i in range(3)]
    reference = AgentCore(cfg, "a0", 0, mode="async")
    for core in (*agents, reference):
        _, msgs = core.on_reading(Reading("r", np.array([0.1, 0.2]), 0.0, 0.5))
        for m in msgs if core is not reference else []:
            agg.on_update(core.client_id, encode(m), now=0.0)
    agg.tick(now=1.0)
    assert agg.version > 0
    payload = encode(agg.global_message())
    bad = payload[:-3]
    shared = SharedGlobals()
    results = [install_global(core, payload, shared) for core in agents]
    assert shared.hits == len(agents) - 1
    expected = reference.on_global_payload(payload)
    assert all(r == expected for r in results)
    assert agents[0].global_version == reference.global_version
    assert np.array_equal(agents[0].learner.client.theta, reference.learner.client.theta)
    rejected = [install_global(core, bad, shared) for core in agents]
    expected_bad = reference.on_global_payload(bad)
    assert all(r == expected_bad and not r.installed for r in rejected)
    assert agents[0].counters.rejected_globals_by == reference.counters.rejected_globals_by
    assert shared.hits == 2 * (len(agents) - 1)


def test_light_agents_lose_nothing_and_all_hold_a_global(mosquitto_dev):
    """`--light`: 50 simulated agents in one process, one paho connection each, updates built from a real
    AgentCore's; the real aggregator accepts every one and every agent ends with a recent global."""
    opts = LoadTestOptions(agents=50, seconds=4.0, rate=2.0, window=0.5, drain=20.0, ramp=1.0, light=True)
    r = run_loadtest(opts, broker=mosquitto_dev.broker_config())
    assert r["agents"] == 50
    assert r["samples_learned"] == r["samples_expected"] == 400
    assert r["updates_published"] > 0 and r["updates_lost"] == 0 and r["clients_with_lost"] == 0, r
    assert r["updates_rejected"] == {} and r["updates_accepted"] == r["updates_published"]
    assert r["outbox_left"] == 0 and r["agents_without_global"] == 0
    assert r["versions_behind_max"] <= 2


@pytest.mark.slow
def test_light_agents_keep_their_connection_through_the_linger(mosquitto_dev):
    """A linger longer than Mosquitto's 1.5 keepalives: the agents still ping, the broker closes none of them.
    (Before: no housekeeping in the linger, and every agent of the 10,000-agent runs — linger 60 s, keepalive
    30 s — lost its connection once at the end.)"""
    opts = LoadTestOptions(agents=10, seconds=2.0, rate=2.0, window=0.5, drain=20.0, ramp=1.0, light=True,
                           linger=10.0)
    r = run_loadtest(opts, broker=mosquitto_dev.broker_config(keepalive=4))  # closed after 6 s silent
    assert r["updates_lost"] == 0 and r["outbox_left"] == 0, r
    assert r["reconnects"] == 0 and r["lost_reasons"] == {}, r["lost_reasons"]
