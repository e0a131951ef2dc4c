"""Replay: lock-step semantics, schedules, determinism, conservation of update mass."""

import dataclasses

import numpy as np
import pytest

from streamfed.algorithms import variant
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.server import POFMKLServer, run_lockstep
from streamfed.core.features import RFFBank
from streamfed.evaluation.datasets import synthetic_fleet
from streamfed.evaluation.replay import AlgorithmConfig, Schedule, algorithm_titles, build_arrangement, replay

ETA, LAM, XI = 0.05, 1e-4, 0.2
CFG = AlgorithmConfig(n_kernels=4, n_features=10, eta=ETA, xi=XI, bin_size=1)


@pytest.fixture(scope="module")
def fleet():
    return synthetic_fleet(n_clients=4, n_steps=400, n_inputs=3, seed=3)


def test_lockstep_replay_equals_reference_protocol(fleet):
    r = replay(fleet, "pofmkl", CFG, seed=5)
    bank = RFFBank(CFG.specs(), CFG.n_features, 3, seed=5)
    clients = [POFMKLClient(bank, ETA, LAM, XI, CFG.bin_size, rng=np.random.default_rng([5, c]))
               for c in range(4)]
    preds = run_lockstep(clients, POFMKLServer(4, bank.dim), [s.X for s in fleet.streams],
                         [s.y for s in fleet.streams])
    expected = [(preds[:, c] - fleet.streams[c].y) * (preds[:, c] - fleet.streams[c].y) for c in range(4)]
    for c in range(4):
        np.testing.assert_array_equal(r.sq_errors[c], expected[c])
    assert r.uploaded_per_client_step == CFG.bin_size * 2 * CFG.n_features
    assert r.rounds == 400


@pytest.fixture(scope="module")
def class_fleet(fleet):
    """The same inputs with class labels 0, 1, 2 (the sign pattern of two inputs): a classifier's stream."""
    streams = [dataclasses.replace(s, y=(s.X[:, 0] > 0).astype(float) + (s.X[:, 1] > 0.5)) for s in fleet.streams]
    return dataclasses.replace(fleet, streams=tuple(streams))


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("algorithm", sorted(algorithm_titles()))
def test_every_algorithm_runs_deterministically(fleet, class_fleet, algorithm):
    if variant(algorithm)[0].task == "classification":
        fleet = class_fleet
    a = replay(fleet, algorithm, CFG, seed=1, steps=150)
    b = replay(fleet, algorithm, CFG, seed=1, steps=150)
    assert np.isfinite(a.mse) and a.mse == b.mse and a.avg_regret == b.avg_regret
    assert replay(fleet, algorithm, CFG, seed=2, steps=150).mse != a.mse or algorithm == "ofskl"
    assert a.regret.shape[1] == 4 and a.weights.shape[1] == len(a.kernel_names)
    if algorithm in ("local-only", "centralised"):
        assert a.uploaded_per_client_step == 0


def test_every_k_delays_the_global_only(fleet):
    """With k = 1 'every' is the lock-step run; with k > 1 clients see θ only every k steps."""
    step = replay(fleet, "pofmkl", CFG, Schedule.every_step(), seed=0)
    every1 = replay(fleet, "pofmkl", CFG, Schedule.every(1), seed=0)
    every10 = replay(fleet, "pofmkl", CFG, Schedule.every(10), seed=0)
    assert step.mse == every1.mse
    # during the first 10 steps nobody has received a global: predictions are exactly 0
    for c, s in enumerate(fleet.streams):
        np.testing.assert_array_equal(every10.sq_errors[c][:10], s.y[:10] ** 2)
    assert every10.mse != step.mse


def test_async_applies_every_update_exactly_once(fleet, monkeypatch):
    """Whatever the delays, the server receives the sum of everything the clients produced."""
    produced, applied = [], []
    orig_step, orig_add = POFMKLClient.step, POFMKLServer.add

    def spy_step(self, x, y):
        out = orig_step(self, x, y)
        produced.append(out[1].delta.sum())
        return out

    def spy_add(self, update):
        applied.append(update.delta.sum())
        return orig_add(self, update)

    monkeypatch.setattr(POFMKLClient, "step", spy_step)
    monkeypatch.setattr(POFMKLServer, "add", spy_add)
    r = replay(fleet, "pofmkl", CFG, Schedule.asynchronous(window=3, max_delay=6), seed=0)
    assert np.isclose(sum(produced), sum(applied), rtol=1e-12, atol=1e-12)
    assert len(applied) < len(produced)  # a client's uploads within a window are merged
    assert r.staleness_mean > 0
    assert np.isfinite(r.mse)


def test_schedule_parse():
    assert Schedule.parse("every:5") == Schedule.every(5)
    assert Schedule.parse("async:2:7") == Schedule.asynchronous(2, 7)
    with pytest.raises(ValueError):
        Schedule.parse("sometimes")


def test_a_huge_learning_rate_cannot_diverge(fleet):
    """η = 1e3 is 10⁵ times the stability bound: the step cap (docs/algorithms.md §3.5) keeps every step
    finite, so nothing is rejected (before the cap, this run diverged and steps were refused)."""
    r = replay(fleet, "local-only", AlgorithmConfig(n_kernels=4, n_features=10, eta=1e3, xi=0.0), seed=0)
    assert r.rejected.sum() == 0
    assert np.isfinite(r.mse)


def test_a_sample_that_cannot_be_learned_is_counted_not_fatal(fleet):
    """A label whose squared error overflows float64 is refused and counted; the run and its MSE go on."""
    from dataclasses import replace as dc_replace

    y = fleet.streams[0].y.copy()
    y[50] = 1e200
    bad = dc_replace(fleet, streams=(dc_replace(fleet.streams[0], y=y), *fleet.streams[1:]))
    r = replay(bad, "local-only", AlgorithmConfig(n_kernels=4, n_features=10), seed=0)
    assert r.rejected.tolist() == [1, 0, 0, 0]
    assert np.isfinite(r.mse)


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="unknown algorithm"):
        build_arrangement("magic", 2, 3, CFG, 0)


def test_a_joining_client_starts_from_the_fleets_global_and_scores_from_its_join(fleet):
    """A client joining at step J takes no sample before J, yet its first prediction uses the global of round J
    (as a late agent reading the retained global); from-scratch (local-only) it predicts 0 first."""
    join = {fleet.streams[1].name: 100}
    r = replay(fleet, "pofmkl", CFG, seed=4, steps=200, join=join)
    assert np.isnan(r.sq_errors[1][:100]).all() and not np.isnan(r.sq_errors[1][100:]).any()
    assert r.active.tolist() == [200, 100, 200, 200] and r.first(1, 10)["n"] == 10
    y = fleet.streams[1].y
    assert r.sq_errors[1][100] != y[100] ** 2  # not the zero model: the fleet's θ after 100 rounds
    scratch = replay(fleet, "local-only", CFG, seed=4, steps=200, join=join)
    assert scratch.sq_errors[1][100] == y[100] ** 2  # θ = 0 at its first sample
    with pytest.raises(ValueError, match="no client named"):
        replay(fleet, "pofmkl", CFG, steps=50, join={"nobody": 3})


def test_bayesian_replays_record_predictive_variances(fleet):
    r = replay(fleet, "fedbnr", AlgorithmConfig(n_kernels=1, n_features=8, params={"fedbnr": {"min_upload": 8}}),
               seed=0, steps=120)
    f = r.first(0)
    assert f["n"] == 120 and np.isfinite(f["nlpd"]) and 0.5 < f["coverage"] <= 1.0
    assert np.isnan(replay(fleet, "pofmkl", CFG, steps=50).first(0)["nlpd"])  # no variance: no NLPD
