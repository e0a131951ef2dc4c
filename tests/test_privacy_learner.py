"""Differential privacy through the plug-in contract (streamfed.fleet.private_learner) and in the fleet cores:
each sample's influence on a real learner's upload is bounded by the declared sensitivity, the noisy
FedBNR global stays installable, and an agent past its budget stops uploading, keeps predicting, and
says so in its metrics and status."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from streamfed import algorithms
from streamfed.algorithms.fedbnr import FedBNRParams
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.private_learner import PrivateLearner
from streamfed.fleet.sources import Reading
from streamfed.privacy import dp
from streamfed.runtime.exporter import StreamfedCollector, make_registry
from streamfed.wire.message import decode, encode

PUBLIC3 = {"x_mean": [0.0, 0.0, 0.0], "x_scale": [1.0, 1.0, 1.0], "y_mean": 0.0, "y_scale": 1.0}


def fedbnr_cfg(**kw: object) -> FleetConfig:
    kw.setdefault("standardise", "none")
    return FleetConfig(fleet="t", algorithm="fedbnr", n_inputs=3, n_features=5,
                       kernels=["gaussian:1.0", "gaussian:2.0"],
                       fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=False), **kw)


def pof_cfg(**kw: object) -> FleetConfig:
    return FleetConfig(standardise="none", fleet="t", algorithm="pofmkl", n_inputs=3, n_kernels=4, n_features=5,
                       bin_size=2, seed=3, pofmkl=POFMKLParams(eta=0.05, lam=1e-4, xi=0.2), **kw)


def _flat(arrays: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], dtype=np.float64).ravel() for k in names])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.integers(0, 7), st.floats(-1e4, 1e4), st.floats(0.2, 5.0))
def test_one_sample_moves_a_fedbnr_upload_by_at_most_the_sensitivity(seed: int, which: int, y_other: float,
                                                                      c_y: float) -> None:
    cfg = fedbnr_cfg()
    rng = np.random.default_rng(seed)
    xs, ys = rng.normal(0, 2, (8, 3)), rng.normal(0, 20, 8)
    ups = []
    for replace in (False, True):
        learner = PrivateLearner(algorithms.get("fedbnr").learner(cfg, "a", 0), epsilon=1.0, delta=1e-5,
                                 label_bound=c_y, rng=seed)  # the same noise draws: differences are the data's
        for i in range(8):
            x, y = (-3 * xs[i], y_other) if (replace and i == which) else (xs[i], ys[i])
            learner.learn(x, y)
        up = learner.take_update()
        assert up is not None and up.n_samples == 8
        ups.append(up)
    sens = ups[0]
    names = ("S_upper", "b", "q")
    delta = np.linalg.norm(_flat(ups[0].arrays, names) - _flat(ups[1].arrays, names))
    bound = learner.sensitivity.l2
    assert bound == pytest.approx(dp.stats_sensitivity(2.0, c_y, 2))
    assert delta <= 2 * bound * (1 + 1e-9)  # replace one = remove one, add one
    assert float(sens.arrays["n"]) == 8.0  # the count is public: not noised


def test_gradient_learners_are_clipped_per_upload() -> None:
    cfg = pof_cfg()
    outs = []
    for scale in (1.0, -500.0):
        inner = algorithms.get("pofmkl").learner(cfg, "a", 0, "lockstep")
        learner = PrivateLearner(inner, epsilon=2.0, delta=1e-5, clip_norm=0.05, label_bound=1e6, rng=1)
        assert learner.sensitivity.l2 is None and learner.l2 == pytest.approx(0.1)
        rows = []
        for t in range(20):
            learner.learn(np.full(3, 0.1 * t), scale * np.sin(t))
            up = learner.take_update()
            assert up is not None and up.arrays["kernels"].dtype.kind == "i"  # indices pass through
            rows.append(np.asarray(up.arrays["delta"]))
        outs.append(rows)
    for a, b in zip(*outs, strict=True):
        if a.shape == b.shape:  # the same kernels drawn: the same noise, so the difference is the data's
            assert np.linalg.norm(a - b) <= 2 * 0.05 * (1 + 1e-9)


def test_noise_has_the_calibrated_scale() -> None:
    cfg = pof_cfg()
    learner = PrivateLearner(algorithms.get("pofmkl").learner(cfg, "a", 0, "lockstep"), epsilon=1.0,
                             delta=1e-5, clip_norm=1e-12, rng=2)
    draws = []
    for t in range(400):
        learner.learn(np.full(3, 0.01 * t), 0.0)
        draws.append(np.asarray(learner.take_update().arrays["delta"]).ravel())  # type: ignore[union-attr]
    std = float(np.std(np.concatenate(draws)))
    assert std == pytest.approx(dp.noise_multiplier(1.0, 1e-5) * 2e-12, rel=0.05)
    assert learner.accountant.uploads == 400


def _run(agents: list[AgentCore], agg: AggregatorCore, cfg: FleetConfig, steps: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, cfg.n_inputs)
    preds = []
    for t in range(steps):
        msgs = []
        for a in agents:
            x = rng.normal(0, 1, cfg.n_inputs)
            pred, out = a.on_reading(Reading(f"{t}", x, float(t), float(np.tanh(x @ w))))
            preds.append(pred)
            msgs += out
        queue = list(msgs)
        while queue:
            m = queue.pop(0)
            payload = encode(m, cfg)
            if m.kind.endswith(".update"):
                queue += agg.on_update(m.client, payload, now=0.0)
            elif m.kind.endswith(".global"):
                for a in agents:
                    result = a.install_global(decode(payload, cfg, kernel_version=a.kernel_version), now=0.0)
                    assert result.reason is None, result  # the noisy global stays positive definite
    return preds


def test_noisy_fedbnr_fleet_installs_every_global_and_stops_at_its_budget(caplog: pytest.LogCaptureFixture) -> None:
    cfg = fedbnr_cfg(dp_epsilon=2.0, dp_budget=6.0)
    names = ["a", "b", "c"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.0)
    with caplog.at_level(logging.WARNING, logger="streamfed.fleet.private_learner"):
        preds = _run(agents, agg, cfg, 200)
    assert all(p is not None and np.isfinite(p.mean) and p.var > 0 for p in preds)  # predicting throughout
    assert agg.rejected == {}
    for a in agents:
        p = a.privacy
        assert p is not None and p.exhausted and p.epsilon <= 6.0
        assert p.accountant.epsilon_after(p.z) > 6.0
        assert len(a.outbox) + agg.included().get(a.client_id, 0) == p.accountant.uploads
        meta = a.status_meta()
        assert meta["dp_exhausted"] is True and meta["dp_epsilon"] == pytest.approx(p.epsilon)
        assert a.status_changed
        assert a.stats.dp_exhausted and a.stats.dp_epsilon == pytest.approx(p.epsilon)
    assert "stops uploading" in caplog.text
    uploads = agg.counters.accepted
    _run(agents, agg, cfg, 50, seed=1)  # no more uploads past the budget
    assert agg.counters.accepted == uploads
    text = generate_latest(make_registry(StreamfedCollector([a.stats for a in agents]))).decode()
    assert 'streamfed_agent_dp_budget_exhausted{client="a",fleet="t"} 1.0' in text
    assert 'streamfed_agent_dp_delta{client="a",fleet="t"} 1e-05' in text
    assert "streamfed_agent_dp_epsilon{" in text and 'streamfed_agent_dp_budget{client="a",fleet="t"} 6.0' in text


def test_a_fleet_without_dp_still_refuses_statistics_that_are_not_of_samples() -> None:
    noisy = fedbnr_cfg(dp_epsilon=1.0)
    plain = fedbnr_cfg()
    agent = AgentCore(noisy, "a", 0)
    msgs = []
    rng = np.random.default_rng(0)
    for t in range(8):
        msgs += agent.on_reading(Reading(f"{t}", rng.normal(0, 1, 3), float(t), 0.1))[1]
    assert len(msgs) == 1
    payload = encode(msgs[0], noisy)
    assert AggregatorCore(plain, clients=["a"], window=0.0).on_update("a", payload, now=0.0) == []
    strict = AggregatorCore(plain, clients=["a"], window=0.0)
    strict.on_update("a", payload, now=0.0)
    assert strict.rejected == {"invalid_update": 1}
    lenient = AggregatorCore(noisy, clients=["a"], window=0.0)
    assert [m.kind for m in lenient.on_update("a", payload, now=0.0)] == ["fedbnr.global"]


def test_the_accountant_survives_a_restart() -> None:
    cfg = fedbnr_cfg(dp_epsilon=1.0, standardise="online", public_scales=PUBLIC3)
    agent = AgentCore(cfg, "a", 0)
    rng = np.random.default_rng(0)
    for t in range(40):
        agent.on_reading(Reading(f"{t}", rng.normal(0, 1, 3), float(t), float(rng.normal())))
    spent = agent.privacy.epsilon  # type: ignore[union-attr]
    assert spent > 0
    state = pickle.loads(pickle.dumps(agent.snapshot()))
    again = AgentCore(cfg, "a", 0)
    assert again.privacy is not None and again.privacy.epsilon == 0.0
    again.restore(state)
    assert again.privacy is not None and again.privacy.epsilon == pytest.approx(spent)
    assert again.stats.dp_epsilon == pytest.approx(spent)


def test_bad_privacy_settings_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="dp_epsilon"):
        fedbnr_cfg(dp_epsilon=float("inf"))
    with pytest.raises(ValueError, match="dp_delta"):
        fedbnr_cfg(dp_epsilon=1.0, dp_delta=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        PrivateLearner(algorithms.get("fedbnr").learner(fedbnr_cfg(), "a", 0), epsilon=0.0, delta=1e-5)


def test_replay_with_dp_noises_the_federated_rows_only() -> None:
    from streamfed.evaluation.datasets import load_beijing
    from streamfed.evaluation.datasets.public_scales import beijing_public_scales
    from streamfed.evaluation.replay import AlgorithmConfig, build_arrangement, replay

    fleet = load_beijing("none", steps=96)
    public = {"public_scales": beijing_public_scales()}
    plain = AlgorithmConfig(n_kernels=1, n_features=5, params={"fedbnr": {"min_upload": 16}}, privacy=public)
    noisy = AlgorithmConfig(n_kernels=1, n_features=5, params={"fedbnr": {"min_upload": 16}},
                            privacy={"dp_epsilon": 1.0, "clip_label": 1.0, **public})
    a = replay(fleet, "fedbnr", plain, steps=96)
    b = replay(fleet, "fedbnr", noisy, steps=96)
    assert np.isfinite(b.mse) and b.mse != a.mse
    arr = build_arrangement("fedbnr", 2, fleet.n_inputs, noisy, seed=0)
    assert all(isinstance(p, PrivateLearner) for p in arr.privates) and len(arr.privates) == 2
    local = build_arrangement("fedbnr-local", 2, fleet.n_inputs, noisy, seed=0)
    assert not local.privates  # nothing leaves a local learner
    assert noisy.as_dict()["privacy"]["dp_epsilon"] == 1.0


def test_replay_under_dp_keeps_the_agents_privacy_boundary() -> None:
    """The replay's private rows are the agent's: declared scales (none: refused, the dataset's own normalisation is
    a data statistic), and one upload per window of arrivals — a refused reading still counts — so neighbouring
    streams (a label made unreadable) upload alike."""
    from streamfed.evaluation.datasets import load_beijing
    from streamfed.evaluation.datasets.base import Fleet
    from streamfed.evaluation.datasets.public_scales import beijing_public_scales
    from streamfed.evaluation.replay import NEEDS_DECLARED_SCALES, AlgorithmConfig, build_arrangement, replay

    with pytest.raises(ValueError, match="declared public scales"):
        build_arrangement("fedbnr", 2, 10, AlgorithmConfig(n_kernels=1, privacy={"dp_epsilon": 1.0}), seed=0)
    assert "public_scales" in NEEDS_DECLARED_SCALES
    base = load_beijing("none", steps=64)
    cfg = AlgorithmConfig(n_kernels=1, n_features=5, params={"fedbnr": {"min_upload": 16}},
                          privacy={"dp_epsilon": 1.0, "public_scales": beijing_public_scales()})
    s0 = base.streams[0]
    y = s0.y.copy()
    y[5] = np.nan  # the neighbour: arrival 5 carries no sample (refused)
    neighbour = Fleet((type(s0)(s0.name, s0.X, y, s0.feature_names), *base.streams[1:]), dataset="x",
                      normalisation="none", split="station")
    r1, r0 = replay(base, "fedbnr", cfg, steps=64), replay(neighbour, "fedbnr", cfg, steps=64)
    assert r0.rejected[0] == 1 and r1.rejected[0] == 0
    np.testing.assert_array_equal(r0.uploaded_numbers, r1.uploaded_numbers)  # 4 windows of 16 each, both
    assert [p.accountant.uploads for p in r0.arrangement.privates] == [4] * len(base.streams)
    assert [p.accountant.uploads for p in r1.arrangement.privates] == [4] * len(base.streams)


def test_predictive_variance_accounts_for_the_globals_noise() -> None:
    cfg = fedbnr_cfg(dp_epsilon=2.0)
    names = ["a", "b", "c"]
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, window=0.0)
    _run(agents, agg, cfg, 40)
    p = agents[0].privacy
    assert p is not None and agg.version > 0
    uploads = sum(a.privacy.accountant.uploads for a in agents)  # type: ignore[union-attr]
    assert p.global_uploads == sum(agg.included().values()) == uploads  # every noised upload is in the global
    x = np.array([0.3, -0.2, 0.5])
    mean, var = p.predict(x)
    inner_mean, inner_var = p.inner.predict(x)
    extra = p.inner.noise_variance(x, p.std * np.sqrt(uploads))  # type: ignore[attr-defined]
    assert mean == inner_mean and extra > 0
    assert var == pytest.approx(inner_var + extra, rel=1e-12)
    # the oracle: the first-order formula on each kernel's posterior, mixed by the weights squared
    client = p.inner.client  # type: ignore[attr-defined]
    w = client.kernel_weights()
    want = 0.0
    for k in range(client.n_kernels):
        m, cov = client.posterior(k)
        a = cov @ client.features(x)[k]
        s2 = (p.std**2) * uploads
        quad = a @ a + (a @ a) * (m @ m) + (a @ m) ** 2 - np.sum(a * a * m * m)
        want += w[k] ** 2 * s2 * quad / client.sigma[k] ** 4
    assert extra == pytest.approx(want, rel=1e-9)


def test_a_private_classifier_learns_its_class_labels_unclipped():
    """DP clips a regression target to `clip_label`; a classifier's label is a class index and passes as it is
    (class 5 stays 5 with clip_label = 3): the agent's classifier gives class 5 probability once it saw it."""
    import numpy as np

    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading

    cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2, standardise="none", dp_epsilon=8.0,
                      params={"n_classes": 6, "learn_kernel": False, "budget": 8, "chains": 2, "burn_in": 2})
    assert cfg.clip_label < 5
    agent = AgentCore(cfg, "a", 0)
    rng = np.random.default_rng(1)
    for t in range(40):
        label = 5 if t % 2 else 0
        agent.on_reading(Reading(f"{t}", rng.normal(label, 0.3, 2), float(t), float(label)), now=float(t))
    assert sum(agent.counters.skipped.values()) == 0
    assert agent.learner.classifier  # declared by the family, read through the wrappers
    p = agent.learner.class_probabilities(np.full(2, 5.0))
    # class 5 learned as 5, nothing clipped to 3 (an unseen class holds only the smoothing floor, 1e-6 / 6)
    assert p is not None and p[5] > 0.5 and p[3] < 1e-6


def test_no_metric_publishes_the_streams_own_statistics_under_dp() -> None:
    """The online standardiser's target mean and scale are the stream's data: exported without DP (a user watching
    the scales), never with it (they left the device in clear through Prometheus before)."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading

    def names(dp: float | None) -> set[str]:
        cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_kernels=1, n_features=4,
                          kernels=["gaussian:1.0"], dp_epsilon=dp,
                          public_scales=None if dp is None else {"x_mean": [0.0, 0.0], "x_scale": [1.0, 1.0],
                                                                 "y_mean": 50.0, "y_scale": 5.0})
        core = AgentCore(cfg, "a", 0)
        rng = np.random.default_rng(0)
        for i in range(40):
            core.on_reading(Reading(f"r{i}", rng.normal(size=2), 0.0, float(rng.normal(50.0, 5.0))))
        core.stats.update_from_learner(core.learner)
        return set(core.learner.diagnostics())

    assert {"target_mean", "target_scale"} <= names(None)
    assert not {"target_mean", "target_scale"} & names(1.0)


# ---------------------------------------------------------------- the privacy boundary (issue 31)
class _ZeroNoise:
    """A generator whose Gaussian draws are zero: the noiseless release, to compare neighbouring streams."""

    def normal(self, loc: float, scale: float, size: object = None) -> np.ndarray:
        return np.zeros(size)  # type: ignore[arg-type]


def _scheduled_uploads(cfg: FleetConfig, ys: list[float]) -> list[tuple[int, int, int, np.ndarray]]:
    """(arrival, seq, n_samples, noised numbers) of every upload an agent makes over the stream, noise zero."""
    agent = AgentCore(cfg, "a", 0)
    assert agent.privacy is not None
    agent.privacy.rng = _ZeroNoise()  # type: ignore[assignment]
    names = agent.privacy.sensitivity.arrays or ("delta",)
    rng = np.random.default_rng(7)
    out = []
    for t, y in enumerate(ys):
        for m in agent.on_reading(Reading(f"{t}", rng.normal(0, 1, 3), float(t), y))[1]:
            out.append((t, m.seq, m.n_samples, _flat(m.arrays, names)))
    return out


def test_dp_on_running_scales_is_refused_at_start_up_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"needs \[fleet.public_scales\]") as e:
        AgentCore(fedbnr_cfg(dp_epsilon=1.0, standardise="online"), "a", 0)
    assert "\n" not in str(e.value)
    AgentCore(fedbnr_cfg(dp_epsilon=1.0, standardise="none"), "a", 0)  # unit-scale streams: no scales to declare
    AgentCore(fedbnr_cfg(standardise="online"), "a", 0)  # without DP the running scales stay the default
    with pytest.raises(ValueError, match="public_scales declares 1 inputs"):
        fedbnr_cfg(public_scales={"x_mean": [0.0], "x_scale": [1.0]})
    with pytest.raises(ValueError, match="x_scale"):
        fedbnr_cfg(public_scales={"x_mean": [0.0] * 3, "x_scale": [1.0, 0.0, 1.0]})
    with pytest.raises(ValueError, match="dp_window"):
        fedbnr_cfg(dp_epsilon=1.0, dp_window=4)  # below the aggregator's floor min_upload = 8


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 23), st.floats(-1e3, 1e3), st.sampled_from(["none", "online"]))
def test_neighbouring_streams_make_the_same_uploads_and_differ_in_one_by_at_most_the_sensitivity(
        which: int, y_target: float, standardise: str) -> None:
    """One sample present (`y_target` at arrival `which`) or absent (that reading refused): the same uploads at the
    same arrivals with the same seq and n; noiseless, they differ in the target's window only, by <= Δ₂."""
    cfg = fedbnr_cfg(dp_epsilon=1.0, standardise=standardise,
                     public_scales=PUBLIC3 if standardise == "online" else None)
    ys = [float(np.sin(t)) for t in range(24)]
    with_target = _scheduled_uploads(cfg, [y_target if t == which else y for t, y in enumerate(ys)])
    without = _scheduled_uploads(cfg, [float("nan") if t == which else y for t, y in enumerate(ys)])
    assert [u[:3] for u in with_target] == [u[:3] for u in without] == [(7, 1, 8), (15, 2, 8), (23, 3, 8)]
    l2 = AgentCore(cfg, "a", 0).privacy.l2  # type: ignore[union-attr]
    for (t, _, _, a), (_, _, _, b) in zip(with_target, without, strict=True):
        moved = float(np.linalg.norm(a - b))
        if t - 7 <= which <= t:
            assert moved <= l2 * (1 + 1e-12)
        else:
            assert moved == 0.0


def test_a_window_without_a_sample_sends_a_dummy_of_the_same_shape() -> None:
    cfg = fedbnr_cfg(dp_epsilon=1.0)
    ys = [float("nan")] * 8 + [0.5] * 8  # the first window: every reading refused
    ups = _scheduled_uploads(cfg, ys)
    assert [u[:3] for u in ups] == [(7, 1, 8), (15, 2, 8)]
    dummy, real = ups[0][3], ups[1][3]
    p = AgentCore(cfg, "a", 0).privacy
    assert p is not None
    shift = dp.psd_shift(int(p.sensitivity.scatter["S_upper"]), p.std)  # public, on the scatter's diagonal
    assert dummy.shape == real.shape and set(np.unique(dummy).tolist()) == {0.0, shift}
    assert len(set(np.unique(real).tolist()) - {0.0, shift}) > 10  # the real one carries statistics


def test_scheduled_uploads_and_dummies_install_as_globals_and_count_once() -> None:
    """Uploads are numbered by the private learner (dummies included): the aggregator sums each once and FedBNR's
    own numbering follows through the translated marks (its working posterior is global + what it has not seen)."""
    cfg = fedbnr_cfg(dp_epsilon=4.0)
    agents = [AgentCore(cfg, n, i) for i, n in enumerate(["a", "b"])]
    agg = AggregatorCore(cfg, clients=["a", "b"], window=0.0)
    rng = np.random.default_rng(1)
    last = None
    for t in range(48):
        for a in agents:
            y = float("nan") if (a.client_id == "a" and t < 8) else float(rng.normal())
            for m in a.on_reading(Reading(f"{t}", rng.normal(0, 1, 3), float(t), y))[1]:
                for g in agg.on_update(m.client, encode(m, cfg), now=0.0):
                    if g.kind.endswith(".global"):
                        last = g
                        for b in agents:
                            assert b.install_global(g, now=0.0).reason is None
    assert agg.rejected == {}
    for a in agents:
        assert a.privacy is not None and a.privacy.accountant.uploads == 6 == agg.included()[a.client_id]
        assert a.outbox == {}
    # the last global counts the schedule's n (6 uploads of 8 per agent), the dummy's window included
    assert last is not None and float(np.ravel(last.arrays["n"])[0]) == 96.0


def test_lockstep_rounds_under_dp_go_on_through_refused_readings() -> None:
    """Lock-step under DP: one upload per arrival, a dummy for a refused reading, so every round closes with every
    member and the number of rounds says nothing of which readings were learned."""
    cfg = pof_cfg(dp_epsilon=4.0)
    names = ["a", "b"]
    agents = [AgentCore(cfg, n, i, mode="lockstep") for i, n in enumerate(names)]
    agg = AggregatorCore(cfg, clients=names, mode="lockstep", window=0.0)
    rng = np.random.default_rng(0)
    for t in range(10):
        queue = []
        for a in agents:
            y = float("nan") if (a.client_id == "a" and t in (3, 4)) else float(rng.normal())
            queue += a.on_reading(Reading(f"{t}", rng.normal(size=3), float(t), y))[1]
        assert len(queue) == 2  # a refused reading uploads too
        while queue:
            m = queue.pop(0)
            if m.kind.endswith(".update"):
                queue += agg.on_update(m.client, encode(m, cfg), now=float(t))
            elif m.kind.endswith(".global"):
                for a in agents:
                    assert a.install_global(decode(encode(m, cfg), cfg, kernel_version=a.kernel_version)).installed
    assert agg.version == 10 and agg.rejected == {}
    assert [a.seq for a in agents] == [10, 10] and [a.privacy.accountant.uploads for a in agents] == [10, 10]


# ---------------------------------------------------------------- every DP upload is sendable
@pytest.mark.parametrize("algorithm", ["fsgp", "urk-fedbnr"])
def test_a_private_agent_never_makes_an_upload_its_codec_refuses(algorithm: str) -> None:
    """Learners clipped whole have every float array noised, among them arrays the wire declares nonnegative
    (FSGP's `n`, `q`; URK's `weight`, `q`): noise made most of their uploads unsendable ("negative value"). The
    noised values are now projected onto the declared signs (post-processing): every upload encodes and decodes.
    FSGP's count `n` is named as such (not noised, the schedule's): its aggregator takes every upload. (URK's
    chunked uploads are refused by its aggregator under DP — a separate matter, counted, never raised.)"""
    cfg = FleetConfig(fleet="q", algorithm=algorithm, n_inputs=1, standardise="none", dp_epsilon=1.0)
    agent = AgentCore(cfg, "a1", 0, mode="async")
    agent.privacy.rng = np.random.default_rng(3)  # type: ignore[union-attr]
    agg = AggregatorCore(cfg, clients=["a1"], mode="async", window=0.0, check_stats=False)
    sent = 0
    for t in range(400):
        _, msgs = agent.on_reading(Reading(f"r{t}", np.array([np.sin(t)]), float(t), y=0.1 * np.cos(t)))
        for m in msgs:
            payload = encode(m, cfg)  # raised ProtocolError(bad_array) before
            decode(payload, cfg, kernel_version=agent.kernel_version, kinds=(cfg.update_kind,))
            if algorithm == "fsgp":
                agg.on_update("a1", payload, now=float(t))
            sent += 1
    assert sent >= 10
    if algorithm == "fsgp":  # its count `n` is the schedule's, so the aggregator takes every upload
        assert sum(agg.rejected.values()) == 0, agg.rejected
    spec = {a.name: a for a in cfg.message_schema(cfg.update_kind).arrays}
    assert any(spec[k].nonnegative for k in agent.privacy.constraints)  # type: ignore[union-attr]
