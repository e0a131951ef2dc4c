"""Stats objects and the Prometheus collector of `streamfed.fleet.telemetry`, against plain recomputation."""

from __future__ import annotations

import doctest
import math
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import streamfed.fleet.telemetry as metrics_module
from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.learner import StatsLearner
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.learner import POFMKLLearner
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.core.features import RFFBank, gaussian_dictionary
from streamfed.evaluation.datasets.synthetic import synthetic_fleet
from streamfed.fleet.sources import SkipReason
from streamfed.fleet.telemetry import (
    DEFAULT_REJECT_REASONS,
    DEFAULT_SKIP_REASONS,
    PREDICTION_BUCKETS,
    Z95,
    AgentStats,
    AggregatorStats,
    LatencyHistogram,
    WindowedMSE,
)
from streamfed.runtime.exporter import StreamfedCollector, make_registry, serve_metrics
from streamfed.wire.message import Reason


def test_doctests() -> None:
    result = doctest.testmod(metrics_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 8 and result.failed == 0


def samples(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every exposed sample as {(name, sorted labels): value}, parsed back from the text format."""
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def lab(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


# --------------------------------------------------------------------------- building blocks


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=200), st.integers(1, 25))
def test_windowed_mse_is_the_mean_of_the_last_w(values: list[float], w: int) -> None:
    win = WindowedMSE(w)
    for i, v in enumerate(values):
        win.add(v)
        tail = np.array(values[max(0, i + 1 - w) : i + 1])
        assert win.n == tail.size
        assert win.values() == tail.tolist()
        assert win.value == pytest.approx(tail.mean(), rel=1e-9, abs=1e-6)
    if not values:
        assert math.isnan(win.value)


def test_windowed_mse_does_not_drift() -> None:
    # huge errors followed by tiny ones: a plain running sum would keep ~1e-4 of rounding residue
    rng = np.random.default_rng(0)
    big, small = rng.uniform(1e11, 1e12, 5000), rng.uniform(0, 1e-3, 20_000)
    win = WindowedMSE(64)
    for v in np.concatenate([big, small]):
        win.add(float(v))
    assert win.value == pytest.approx(small[-64:].mean(), rel=1e-12)


def test_latency_histogram_against_numpy() -> None:
    rng = np.random.default_rng(1)
    xs = np.concatenate([10 ** rng.uniform(-6, 0.5, 2000), np.array(PREDICTION_BUCKETS)])  # bounds land in `le`
    h = LatencyHistogram()
    for x in xs:
        h.observe(float(x))
    for bad in (-1.0, math.nan, math.inf):
        h.observe(bad)
    bounds = np.array(PREDICTION_BUCKETS)
    expected = [int(np.count_nonzero(xs <= b)) for b in bounds] + [xs.size]
    assert h.cumulative() == expected
    assert h.count == xs.size
    assert h.sum == pytest.approx(xs.sum(), rel=1e-12)
    with pytest.raises(ValueError):
        LatencyHistogram((0.1, 0.1))
    with pytest.raises(ValueError):
        LatencyHistogram((0.1, math.inf))


# --------------------------------------------------------------------------- agent stats


def test_observe_prediction_against_recomputation() -> None:
    rng = np.random.default_rng(2)
    n = 700
    y, yhat = rng.standard_normal(n), rng.standard_normal(n)
    var = rng.uniform(0.2, 3.0, n)
    lat = 10 ** rng.uniform(-5, -1, n)
    s = AgentStats("a", fleet="f", window=50)
    for i in range(n):
        s.observe_prediction(float(y[i]), float(yhat[i]), float(lat[i]), float(var[i]) if i % 2 else None)
    e2 = (y - yhat) ** 2
    assert s.samples == n
    assert s.mse == pytest.approx(e2.mean(), rel=1e-12)
    assert s.windowed_mse == pytest.approx(e2[-50:].mean(), rel=1e-12)
    odd = np.arange(n) % 2 == 1
    hits = np.abs(y - yhat)[odd] <= Z95 * np.sqrt(var[odd])
    assert (s.interval_hits, s.interval_total) == (int(hits.sum()), int(odd.sum()))
    assert s.coverage == pytest.approx(hits.mean())
    assert s.latency.count == n and s.latency.sum == pytest.approx(lat.sum())


def test_skips_and_non_finite_predictions() -> None:
    s = AgentStats("a", skip_reasons=("malformed", "non_finite"))
    assert s.skipped == {"malformed": 0, "non_finite": 0}  # known reasons exist at zero from the start
    s.skip("malformed")
    s.skip("sensor_gap", 3)
    s.skip(Reason.NON_FINITE)  # an enum member counts under its value
    s.observe_prediction(1.0, math.nan)
    s.observe_prediction(1e200, -1e200)  # the squared error overflows
    assert s.skipped == {"malformed": 1, "non_finite": 3, "sensor_gap": 3}
    assert all(type(k) is str for k in s.skipped)
    assert s.samples == 0 and s.sq_error_sum == 0.0 and math.isnan(s.mse) and math.isnan(s.coverage)


def test_uploads_and_global_versions_with_a_fake_clock() -> None:
    t = [100.0]
    s = AgentStats("a", clock=lambda: t[0])
    assert s.staleness_seconds() is None and s.versions_behind() == 0
    s.uploaded(1000)
    s.uploaded(500, messages=2)
    assert (s.upload_bytes, s.upload_messages) == (1500, 3)
    s.global_received(3)
    t[0] = 112.5
    assert s.staleness_seconds() == 12.5
    s.saw_version(5)
    assert s.versions_behind() == 2 and s.versions_behind(newest=7) == 4
    s.global_received(5, at=110.0)
    assert s.staleness_seconds() == 2.5 and s.versions_behind() == 0


def pofmkl_fleet(n_clients: int = 3, n_steps: int = 300, seed: int = 3):
    """Real POF-MKL clients and server in lock-step on a synthetic fleet; stats fed as the runtime would."""
    fleet = synthetic_fleet(n_clients, n_steps, 2, seed=seed)
    bank = RFFBank(gaussian_dictionary(6), n_features=16, n_inputs=2, seed=seed)
    server = POFMKLServer(bank.n_kernels, bank.dim)
    clients = [POFMKLClient(bank, eta=0.05, xi=0.2, bin_size=2, rng=100 + c) for c in range(n_clients)]
    stats = [AgentStats.from_learner(POFMKLLearner(cl, "lockstep"), fleet.names[c], fleet="syn", algorithm="pofmkl")
             for c, cl in enumerate(clients)]
    for t in range(n_steps):
        for c, (cl, st_) in enumerate(zip(clients, stats, strict=True)):
            x, y = fleet[c].X[t], float(fleet[c].y[t])
            t0 = time.perf_counter()
            yhat, upd = cl.step(x, y)
            st_.observe_prediction(y, yhat, time.perf_counter() - t0)
            st_.uploaded(upd.delta.nbytes + upd.kernels.nbytes)
            server.add(upd)
        version = server.finish_round()
        g = server.global_params()
        for cl, st_ in zip(clients, stats, strict=True):
            cl.set_global(g, version)
            st_.global_received(version)
            st_.update_from_learner(POFMKLLearner(cl, "lockstep"))
    return fleet, clients, stats


def test_regret_and_losses_after_real_pofmkl_steps() -> None:
    fleet, clients, stats = pofmkl_fleet()
    for cl, s in zip(clients, stats, strict=True):
        assert s.algorithm == "pofmkl"
        assert s.learner_steps == cl.n_steps == 300 == s.samples
        assert s.regret == cl.regret
        assert s.learner_loss == cl.cumulative_loss
        assert s.best_kernel_loss == float(cl.kernel_losses.min())
        assert s.regret == s.learner_loss - s.best_kernel_loss  # R(T) = learner − min_p kernel loss
        assert s.regret != 0.0  # the global θ moved: kernels disagree
        assert s.kernel_names == tuple(cl.bank.kernel_names)
        assert s.kernel_weights == cl.kernel_weights.tolist()
        assert sum(s.kernel_weights) == pytest.approx(1.0)
        # our own running MSE is the learner's cumulative loss over T, up to summation rounding
        assert s.mse == pytest.approx(cl.cumulative_loss / cl.n_steps, rel=1e-9)
        assert s.global_version == cl.global_version == 300 and s.versions_behind() == 0
        assert s.upload_messages == 300 and s.upload_bytes == 300 * (2 * 32 * 8 + 2 * 8)


def test_update_from_learner_records_a_changed_global_version() -> None:
    bank = RFFBank(gaussian_dictionary(3), n_features=4, n_inputs=1, seed=0)
    cl = POFMKLClient(bank, rng=0)
    s = AgentStats.from_learner(POFMKLLearner(cl), "a")
    assert s.global_version is None  # version 0 is the initial model, not a received global
    cl.set_global(np.zeros((3, 8)), 4)
    s.update_from_learner(POFMKLLearner(cl))
    assert s.global_version == 4 and s.global_received_at is not None


def test_fedbnr_learner() -> None:
    fleet = synthetic_fleet(1, 200, 2, seed=5)
    cl = FedBNRClient(n_inputs=2, n_features=12, bandwidth=[0.5, 1.0, 2.0], sigma=0.2, client_id="bayes")
    s = AgentStats.from_learner(StatsLearner(cl), "bayes", fleet="f", algorithm="fedbnr")
    assert (s.client, s.algorithm, s.kernel_names) == ("bayes", "fedbnr", tuple(cl.kernel_names))
    for x, y in zip(fleet[0].X, fleet[0].y, strict=True):
        mu, var = cl.predict(x)
        cl.learn(x, float(y))
        s.observe_prediction(float(y), mu, None, var)
    s.update_from_learner(StatsLearner(cl))
    r = cl.regret()
    assert (s.learner_steps, s.learner_loss, s.best_kernel_loss, s.regret) == (200, r["loss"], r["ridge_loss"],
                                                                               r["regret"])
    assert s.interval_hits == cl.metrics.covered and s.interval_total == cl.metrics.count
    assert s.mse == pytest.approx(cl.metrics.mse, rel=1e-12)
    assert s.kernel_weights == pytest.approx(cl.kernel_weights().tolist())
    s2 = AgentStats("b")
    s2.update_from_learner(StatsLearner(cl), regret=False)  # the cheap read: weights and version, no O(K·F³) regret
    assert (s2.learner_steps, s2.learner_loss, s2.regret) == (None, None, None)
    assert s2.kernel_weights == s.kernel_weights


def test_from_learner_needs_a_client_id() -> None:
    bank = RFFBank(gaussian_dictionary(2), n_features=4, n_inputs=1, seed=0)
    with pytest.raises(ValueError, match="client id"):
        AgentStats.from_learner(POFMKLLearner(POFMKLClient(bank, rng=0)))


def test_default_reasons_cover_the_runtime_s() -> None:
    # pre-created at zero so that rate() sees a first skip or rejection (see the module's comment)
    skip_reasons = {v for k, v in vars(SkipReason).items() if k.isupper()}
    assert skip_reasons and skip_reasons <= set(DEFAULT_SKIP_REASONS)
    assert {r.value for r in Reason} <= set(DEFAULT_REJECT_REASONS)
    assert set(AgentStats("a").skipped) == set(DEFAULT_SKIP_REASONS)
    assert set(AggregatorStats().rejected_by_reason) == set(DEFAULT_REJECT_REASONS)


# --------------------------------------------------------------------------- aggregator stats


def test_aggregator_stats() -> None:
    t = [0.0]
    a = AggregatorStats("f", active_window_s=10, clock=lambda: t[0], wall_clock=lambda: 1.7e9 + t[0])
    assert a.rejected_by_reason["stale_seq"] == 0 and a.last_round_wall is None
    a.accepted("c1")
    a.accepted("c2", n=3)
    a.rejected("wrong_shape")
    a.rejected("custom", 2)
    t[0] = 5.0
    a.heard("c3")
    a.round_completed(version=7, duration_s=0.003)
    t[0] = 12.0
    assert a.active_clients() == 1  # only c3 within the last 10 s
    assert a.active_clients(now=9.0) == 3
    assert (a.updates_accepted, a.rounds, a.global_version, a.last_round_wall) == (4, 1, 7, 1.7e9 + 5.0)
    assert a.rejected_by_reason["wrong_shape"] == 1 and a.rejected_by_reason["custom"] == 2
    assert a.aggregation.count == 1
    a.set_global_version(9)
    assert a.global_version == 9 and a.rounds == 1
    with pytest.raises(ValueError):
        AggregatorStats(active_window_s=0)


# --------------------------------------------------------------------------- collector


def test_collector_exposes_the_stats_values() -> None:
    t = [50.0]
    agent = AgentStats("c1", fleet="f", algorithm="pofmkl", clock=lambda: t[0], window=2)
    agent.observe_prediction(1.0, 0.0, 0.0002)
    agent.observe_prediction(0.0, 0.5, 0.003, var=1.0)
    agent.skip("malformed")
    agent.uploaded(128)
    agent.set_learner_losses(2, 1.25, 1.0)
    agent.set_kernel_weights([0.25, 0.75], ["gaussian:1.0", "laplacian:2.0"])
    agent.global_received(2)
    t[0] = 53.0
    agg = AggregatorStats("f", clock=lambda: t[0])
    agg.accepted("c1")
    agg.rejected("stale_seq")
    agg.round_completed(version=4, duration_s=0.02)
    reg = make_registry(StreamfedCollector([agent], [agg]))
    got = samples(reg)
    a = lab(fleet="f", client="c1")
    expected = {
        ("streamfed_agent_info", lab(fleet="f", client="c1", algorithm="pofmkl")): 1.0,
        ("streamfed_agent_samples_total", a): 2.0,
        ("streamfed_agent_samples_skipped_total", lab(fleet="f", client="c1", reason="malformed")): 1.0,
        ("streamfed_agent_samples_skipped_total", lab(fleet="f", client="c1", reason="non_finite")): 0.0,
        ("streamfed_agent_learner_steps_total", a): 2.0,
        ("streamfed_agent_cumulative_loss", a): 1.25,
        ("streamfed_agent_best_kernel_cumulative_loss", a): 1.0,
        ("streamfed_agent_regret", a): 0.25,
        ("streamfed_agent_mse", a): 0.625,
        ("streamfed_agent_windowed_mse", a): 0.625,
        ("streamfed_agent_interval_hits_total", a): 1.0,
        ("streamfed_agent_interval_predictions_total", a): 1.0,
        ("streamfed_agent_interval_coverage_ratio", a): 1.0,
        ("streamfed_agent_kernel_weight", lab(fleet="f", client="c1", kernel="gaussian:1.0")): 0.25,
        ("streamfed_agent_kernel_weight", lab(fleet="f", client="c1", kernel="laplacian:2.0")): 0.75,
        ("streamfed_agent_upload_bytes_total", a): 128.0,
        ("streamfed_agent_upload_messages_total", a): 1.0,
        ("streamfed_agent_global_version", a): 2.0,
        ("streamfed_agent_global_staleness_seconds", a): 3.0,
        ("streamfed_agent_global_versions_behind", a): 2.0,  # the aggregator of its fleet published 4
        ("streamfed_aggregator_updates_accepted_total", lab(fleet="f")): 1.0,
        ("streamfed_aggregator_updates_rejected_total", lab(fleet="f", reason="stale_seq")): 1.0,
        ("streamfed_aggregator_active_clients", lab(fleet="f")): 1.0,
        ("streamfed_aggregator_rounds_total", lab(fleet="f")): 1.0,
        ("streamfed_aggregator_global_version", lab(fleet="f")): 4.0,
    }
    for key, value in expected.items():
        assert got[key] == value, key
    assert got[("streamfed_aggregator_last_round_timestamp_seconds", lab(fleet="f"))] == pytest.approx(time.time(),
                                                                                                      abs=60)
    # histograms: per-client (a fleet of one is small) and fleet-wide agree; `le` inclusive
    for name, labels in (("streamfed_agent_prediction_duration_seconds", a),
                         ("streamfed_prediction_duration_seconds", lab(fleet="f"))):
        assert got[(f"{name}_count", labels)] == 2.0
        assert got[(f"{name}_sum", labels)] == pytest.approx(0.0032)
        assert got[(f"{name}_bucket", labels + (("le", "0.00025"),))] == 1.0
        assert got[(f"{name}_bucket", labels + (("le", "0.0025"),))] == 1.0
        assert got[(f"{name}_bucket", labels + (("le", "0.005"),))] == 2.0
        assert got[(f"{name}_bucket", labels + (("le", "+Inf"),))] == 2.0
    bucket = ("streamfed_aggregator_aggregation_duration_seconds_bucket", (("fleet", "f"), ("le", "0.025")))
    assert got[bucket] == 1.0


def test_unknown_values_are_omitted_not_nan() -> None:
    reg = make_registry(StreamfedCollector([AgentStats("fresh")], [AggregatorStats()]))
    got = samples(reg)
    names = {name for name, _ in got}
    assert all(not math.isnan(v) for v in got.values())
    for absent in ("streamfed_agent_regret", "streamfed_agent_mse", "streamfed_agent_interval_coverage_ratio",
                   "streamfed_agent_global_staleness_seconds", "streamfed_aggregator_last_round_timestamp_seconds",
                   "streamfed_aggregator_global_version"):
        assert absent not in names
    assert "streamfed_agent_samples_total" in names and "streamfed_aggregator_rounds_total" in names


def test_per_client_histograms_only_for_small_fleets() -> None:
    agents = [AgentStats(f"c{i}", fleet="f") for i in range(5)]
    for i, a in enumerate(agents):
        for _ in range(i + 1):
            a.observe_prediction(0.0, 0.0, 0.001 * (i + 1))
    collector = StreamfedCollector(agents, per_client_histograms_max=5)
    got = samples(make_registry(collector))
    assert got[("streamfed_agent_prediction_duration_seconds_count", lab(fleet="f", client="c4"))] == 5
    assert got[("streamfed_prediction_duration_seconds_count", lab(fleet="f"))] == 15  # 1 + 2 + ... + 5
    collector.add(AgentStats("c5", fleet="f"))
    got = samples(make_registry(collector))
    assert not any(name.startswith("streamfed_agent_prediction_duration") for name, _ in got)
    assert got[("streamfed_prediction_duration_seconds_count", lab(fleet="f"))] == 15


def test_collector_live_set() -> None:
    a, b = AgentStats("a", fleet="f"), AgentStats("b", fleet="f")
    collector = StreamfedCollector([a])
    reg = make_registry(collector)
    assert reg is not REGISTRY and collector not in REGISTRY._collector_to_names  # explicit registry only
    collector.add(b, AggregatorStats("f"))
    clients = {dict(k[1]).get("client") for k in samples(reg) if k[0] == "streamfed_agent_samples_total"}
    assert clients == {"a", "b"}
    collector.remove(a)
    assert [s.client for s in collector.agents] == ["b"] and len(collector.aggregators) == 1
    with pytest.raises(ValueError, match="already collected"):
        collector.add(AgentStats("b", fleet="f"))
    collector.add(b)  # the same object again is fine
    with pytest.raises(TypeError):
        collector.add(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # a second collector exporting the same names is refused
        reg.register(StreamfedCollector())


def test_a_large_demo_fleet_scrapes_cheaply() -> None:
    rng = np.random.default_rng(0)
    agents = []
    for i in range(500):
        s = AgentStats(f"agent-{i:03d}", fleet="demo", algorithm="pofmkl")
        for y in rng.standard_normal(20):
            s.observe_prediction(float(y), 0.0, 1e-4)
        s.set_learner_losses(20, 10.0, 9.0)
        s.set_kernel_weights(np.full(8, 1 / 8))
        agents.append(s)
    reg = make_registry(StreamfedCollector(agents, [AggregatorStats("demo")]))
    generate_latest(reg)
    t0 = time.perf_counter()
    text = generate_latest(reg)
    elapsed = time.perf_counter() - t0
    assert b"streamfed_agent_prediction_duration_seconds" not in text  # 500 > 50: fleet-wide only
    assert b'streamfed_prediction_duration_seconds_count{fleet="demo"} 10000.0' in text
    assert elapsed < 2.0, f"a scrape of 500 agents took {elapsed:.2f} s"


def test_hot_path_is_cheap() -> None:
    s = AgentStats("a", window=100)
    n = 50_000
    t0 = time.perf_counter()
    for i in range(n):
        s.observe_prediction(0.5, 0.25, 1e-4, 1.0 if i & 1 else None)
    per_call = (time.perf_counter() - t0) / n
    assert s.samples == n
    assert per_call < 20e-6, f"observe_prediction took {per_call * 1e6:.1f} µs"


# --------------------------------------------------------------------------- HTTP


def test_serve_metrics_on_a_free_port_and_shut_down() -> None:
    agent = AgentStats("c1", fleet="f")
    agent.observe_prediction(1.0, 0.0)
    server, port = serve_metrics(make_registry(StreamfedCollector([agent])))
    with server:
        assert port > 0 and server.port == port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert 'streamfed_agent_samples_total{client="c1",fleet="f"} 1.0' in body
        agent.observe_prediction(1.0, 0.0)  # read at scrape time: the next scrape sees it
        with urllib.request.urlopen(server.url, timeout=5) as r:
            assert 'streamfed_agent_samples_total{client="c1",fleet="f"} 2.0' in r.read().decode()
    server.close()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
