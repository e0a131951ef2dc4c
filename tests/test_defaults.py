"""The learners' defaults on a stream they have never seen (issue: a user's own stream).

- Online standardisation is the replay's `"online"` normalisation one sample at a time, and a default
  estimator equals its plain client fed hand-standardised data, mapped back by hand.
- POF-MKL's step is capped (no `η` diverges), a runaway kernel is counted and reset, never a stall.
- FedBNR's evidence fit stays where its Cholesky factor is trustworthy.
- On River's bundled streams the defaults beat the running mean.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from river import datasets, dummy, stats

from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.estimator import FedBNRRegressor
from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters
from streamfed.algorithms.pofmkl.client import POFMKLClient
from streamfed.algorithms.pofmkl.estimator import POFMKLRegressor
from streamfed.algorithms.pofmkl.messages import KernelUpdate
from streamfed.algorithms.pofmkl.server import POFMKLServer
from streamfed.core.features import RFFBank, gaussian_dictionary, standardised_dictionary
from streamfed.core.standardise import OnlineStandardiser
from streamfed.core.stats import SufficientStats
from streamfed.evaluation.datasets.normalise import online_standardise


def _stream(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.normal(1000.0, 8.0, n), rng.normal(-3.0, 0.01, n), np.full(n, 7.0)])
    y = 40.0 + 3.0 * np.sin((x[:, 0] - 1000.0) / 4.0) + 2.0 * (x[:, 1] + 3.0) / 0.01 + rng.normal(0, 0.3, n)
    return x, y


def test_standardiser_equals_the_replays_online_normalisation() -> None:
    x, y = _stream(300, seed=1)
    v = np.column_stack([x, y])
    z_ref, off_ref, scale_ref = online_standardise(v)  # the replay's implementation (numba, arrays)
    s = OnlineStandardiser(v.shape[1])
    for t in range(v.shape[0]):
        if t >= 2:
            np.testing.assert_allclose(s.transform(v[t]), z_ref[t], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(s.mean, off_ref[t], rtol=1e-13)
            np.testing.assert_allclose(s.scale, scale_ref[t], rtol=1e-12)
        s.update(v[t])
    # the constant column falls back to |mean| (7), as the replay does
    assert s.scale[2] == 7.0


def test_standardiser_refuses_an_overflowing_value_and_changes_nothing() -> None:
    s = OnlineStandardiser(2)
    s.update(np.array([1.0, 2.0]))
    before = s.state()
    with pytest.raises(ValueError, match="too large"):
        s.update(np.array([1e300, 2.0]))
    assert s.state() == before
    with pytest.raises(ValueError, match="row 1"):
        s.transform_many(np.array([[1.0, 2.0], [1e300, 0.0]]))
    assert s.state() == before


def _by_hand(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Past-only z-scores of inputs (winsorised at ±5) and target, and the target's offset and scale, by plain
    loops."""
    n, d = x.shape
    zx, zy, off, sc = np.full((n, d), np.nan), np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    for t in range(2, n):
        for j in range(d):
            past = x[:t, j]
            m, sd = past.mean(), past.std(ddof=1)
            sd = sd if sd > 0 else (abs(m) if m != 0 else 1.0)
            zx[t, j] = min(max((x[t, j] - m) / sd, -5.0), 5.0)  # inputs winsorised at ±5 σ (INPUT_CLIP)
        m, sd = y[:t].mean(), y[:t].std(ddof=1)
        off[t], sc[t] = m, sd
        zy[t] = (y[t] - m) / sd
    return zx, zy, off, sc


def test_default_fedbnr_equals_a_plain_client_on_hand_standardised_data() -> None:
    x, y = _stream(120, seed=2)
    zx, zy, off, sc = _by_hand(x, y)
    # the model's own variance (no conformal scale): the standardisation is what is checked here
    model = FedBNRRegressor(n_features=10, sync_every=10**9, fit_hyperparameters=False, calibrate=False)
    bws = [s.bandwidth for s in standardised_dictionary(8, 3)]
    ref = FedBNRClient(n_inputs=3, n_features=10, bandwidth=bws, min_upload=10**9)
    for t in range(len(y)):
        d = {"a": x[t, 0], "b": x[t, 1], "c": x[t, 2]}
        got = model.predict_one(d, with_dist=True)
        if t >= 2:
            m, v = ref.predict(zx[t])
            assert got.mu == pytest.approx(off[t] + sc[t] * m, rel=1e-9)
            assert got.sigma == pytest.approx(sc[t] * math.sqrt(v), rel=1e-9)
            ref.learn(zx[t], zy[t])
        else:  # no scale yet: the running mean (0 before any sample)
            assert got.mu == pytest.approx(y[:t].mean() if t else 0.0)
        model.learn_one(d, y[t])


def test_default_pofmkl_equals_a_plain_client_on_hand_standardised_data() -> None:
    x, y = _stream(200, seed=3)
    zx, zy, off, sc = _by_hand(x, y)
    model = POFMKLRegressor(n_kernels=4, n_features=8, seed=5)
    bank = RFFBank(standardised_dictionary(4, 3), 8, 3, seed=5)
    ref = POFMKLClient(bank, rng=np.random.default_rng([5, 0x50F]))
    server = POFMKLServer(4, bank.dim)
    for t in range(len(y)):
        d = {"a": x[t, 0], "b": x[t, 1], "c": x[t, 2]}
        got = model.predict_one(d)
        if t >= 2:
            assert got == pytest.approx(off[t] + sc[t] * ref.predict(zx[t]), rel=1e-9, abs=1e-9)
            _, up = ref.step(zx[t], zy[t])
            server.add(up)
            version = server.finish_round()
            ref.set_global(server.theta, version)
        model.learn_one(d, y[t])


def test_pofmkl_step_is_capped_so_a_large_eta_cannot_diverge() -> None:
    """η = 0.05 is 4× the stability bound ξ/B = 0.1/8 of the default dictionary: uncapped, the step
    η/q_J ≥ 1 on low-weight kernels over-corrects and grows; capped at 1/2 it fits, never diverges."""
    rng = np.random.default_rng(4)
    model = POFMKLRegressor(eta=0.05)
    for _ in range(20_000):
        v = rng.normal(size=3)
        model.learn_one({"a": v[0], "b": v[1], "c": v[2]}, float(np.sin(v).sum() + 0.1 * rng.normal()))
    c = model.client
    assert c is not None and np.all(np.isfinite(c.theta))
    assert float(np.abs(c.theta).max()) < 50.0
    assert c.kernel_overflows == 0


def test_a_runaway_kernel_is_counted_and_reset_never_a_stall() -> None:
    bank = RFFBank(gaussian_dictionary(4), 8, 2, seed=0)
    client = POFMKLClient(bank, rng=0)
    theta = np.zeros((4, bank.dim))
    theta[2] = 1e153  # finite, but its loss (f_p - y)² overflows float64
    client.set_global(theta, 1)
    for t in range(20):  # before: every step refused with NonFiniteError, for good
        yhat, up = client.step(np.array([0.1 * t, -0.2]), 0.5)
        assert math.isfinite(yhat)
    assert client.kernel_overflows >= 20
    assert client.kernel_weights[2] < 1e-100
    server = POFMKLServer(4, bank.dim)
    server.theta[1] = 1e200
    server.add(KernelUpdate(np.array([1]), np.full((1, bank.dim), -1e200)))  # ‖θ_1‖² overflows
    server.add(KernelUpdate(np.array([0]), np.ones((1, bank.dim))))
    assert server.finish_round() == 1
    assert server.last_resets == [1] and server.kernel_resets == 1
    assert not server.theta[1].any() and np.all(server.theta[0] == -0.5)  # the rest of the round applied


def test_fedbnr_refuses_a_huge_target_and_keeps_its_model() -> None:
    model = FedBNRRegressor(n_features=6)
    for t in range(40):
        model.learn_one({"a": float(t)}, float(t % 7))
    before = pickle.dumps(model)
    for bad in (1e300, 1e200):
        with pytest.raises(ValueError):
            model.learn_one({"a": 1.0}, bad)
    assert pickle.dumps(model) == before
    assert math.isfinite(model.predict_one({"a": 3.0}))


def test_evidence_fit_keeps_the_precision_well_conditioned() -> None:
    """A target that repeats exactly drives the evidence towards σ → 0; the fit stops where the
    precision's condition number is MAX_CONDITION, and a Cholesky factor of it exists."""
    rng = np.random.default_rng(5)
    phi = rng.standard_normal((200, 6))
    phi[:, 5] = phi[:, 4]  # a rank-deficient S
    st = SufficientStats.from_samples(phi, phi @ np.arange(6.0))  # noise-free
    sigma, lam, _ = fit_hyperparameters(st.S, st.b, st.n, st.q)
    a = st.S / sigma**2 + np.eye(6) / lam**2
    assert np.linalg.cond(a) <= 1.01e11
    np.linalg.cholesky(a)


@pytest.mark.parametrize(("name", "stream"), [
    ("TrumpApproval", lambda: datasets.TrumpApproval()),
    ("ChickWeights", lambda: datasets.ChickWeights()),
    ("Friedman", lambda: datasets.synth.Friedman(seed=7).take(2000)),
])
@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
def test_defaults_beat_the_running_mean_on_river_streams(name: str, stream) -> None:
    models = {"running mean": dummy.StatisticRegressor(stats.Mean()),
              "pofmkl": POFMKLRegressor(), "fedbnr": FedBNRRegressor()}
    err = dict.fromkeys(models, 0.0)
    for x, y in stream():
        for k, m in models.items():
            p = m.predict_one(x)
            assert math.isfinite(p), (name, k)
            err[k] += abs(p - y)
            m.learn_one(x, y)
    assert err["pofmkl"] < err["running mean"], (name, err)
    assert err["fedbnr"] < err["running mean"], (name, err)


# ----------------------------------------------------------------------------- the agent


def _agent_pair(algorithm: str, **kw):
    from streamfed import algorithms
    from streamfed.algorithms.dictionary import KernelDictionary
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import FleetConfig

    # a dictionary of two kernels for the families that learn over one: the agent's (standardised inputs)
    has_one = issubclass(algorithms.get(algorithm).Params, KernelDictionary)
    dictionary: dict = {"n_kernels": 2, "n_features": 6} if has_one else {}
    on = FleetConfig(fleet="f", algorithm=algorithm, n_inputs=3, **dictionary, **kw)
    assert on.standardise == "online"  # the default
    if dictionary:
        dictionary["kernels"] = on.params.kernel_specs(on.n_inputs, on.standardise)
    off = FleetConfig(fleet="f", algorithm=algorithm, n_inputs=3, standardise="none", **dictionary, **kw)
    return AgentCore(on, "a", 0), algorithms.get(algorithm).learner(off, "a", 0)


@pytest.mark.parametrize("algorithm", ["fedbnr", "pofmkl"])
def test_agent_standardises_like_the_replays_online_normalisation(algorithm: str) -> None:
    """An agent on the raw stream = the bare learner on the replay's `online`-normalised stream (rows from
    the third on), its predictions mapped back by hand, and the same updates leave it."""
    from streamfed.fleet.sources import Reading

    x, y = _stream(150, seed=6)
    zx, _, _ = online_standardise(x)
    zx = np.clip(zx, -5.0, 5.0)  # the agents winsorise standardised inputs at ±5 σ (INPUT_CLIP), not the target
    zy, oy, sy = online_standardise(y)
    agent, bare = _agent_pair(algorithm)
    sent, expected = [], []
    for t in range(len(y)):
        pred, msgs = agent.on_reading(Reading(f"r{t}", x[t], float(t), y=float(y[t])))
        sent += [m.arrays for m in msgs]
        if t < 2:
            assert pred.mean == pytest.approx(y[:t].mean() if t else 0.0)
            continue
        mean, var = bare.learn(zx[t], float(zy[t]))
        assert pred.mean == pytest.approx(oy[t] + sy[t] * mean, rel=1e-9, abs=1e-9)
        if var is not None:
            assert pred.var == pytest.approx(sy[t] ** 2 * var, rel=1e-9)
        up = bare.take_update()
        if up is not None:
            expected.append(up.arrays)
    assert len(sent) == len(expected) > 0
    for a, b in zip(sent, expected, strict=True):
        for k in b:
            np.testing.assert_array_equal(a[k], b[k])


def test_stream_end_says_what_stays_below_the_privacy_floor() -> None:
    from streamfed.fleet.sources import Reading

    x, y = _stream(40, seed=8)
    agent, _ = _agent_pair("fedbnr", fedbnr={"min_upload": 32})
    n_msgs = 0
    for t in range(len(y)):
        n_msgs += len(agent.on_reading(Reading(f"r{t}", x[t], float(t), y=float(y[t])))[1])
    assert n_msgs == 1  # 38 samples learned (2 set the scales): one upload of 32, 6 left
    msgs, held = agent.end_of_stream(durable=True)
    assert (msgs, held) == ([], 6) and "below_privacy_floor" not in agent.counters.skipped
    msgs, held = agent.end_of_stream(durable=False)
    assert held == 6 and agent.counters.skipped["below_privacy_floor"] == 6


def test_an_agent_says_when_a_kernel_overflows(caplog: pytest.LogCaptureFixture) -> None:
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading

    cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=3, n_features=4, standardise="none")
    agent = AgentCore(cfg, "a", 0)
    theta = np.zeros((3, 8))
    theta[1] = 1e153
    agent.learner.client.set_global(theta, 1)
    with caplog.at_level("WARNING", logger="streamfed.algorithms.pofmkl"):
        for t in range(5):
            pred, _ = agent.on_reading(Reading(f"r{t}", np.array([0.1, 0.2 * t]), float(t), y=0.3))
            assert pred is not None and math.isfinite(pred.mean)
    assert sum("overflowed" in r.getMessage() for r in caplog.records) == 3  # rate-limited
    agent.stats.update_from_learner(agent.learner)
    assert agent.stats.learner_values["kernel_overflows"] == 5


def test_an_input_far_outside_the_past_is_winsorised() -> None:
    """One reading 75 σ out must not make a random-feature model extrapolate wildly: inputs are clipped at
    ±5 σ (the target never is), so the prediction is the model's answer at the edge of what it has seen."""
    rng = np.random.default_rng(9)
    model, edge = FedBNRRegressor(n_features=20), FedBNRRegressor(n_features=20)
    for _ in range(300):
        v = float(rng.normal())
        y = 2.0 * math.tanh(v) + 0.1 * float(rng.normal())
        for m in (model, edge):
            m.learn_one({"rain": v}, y)
    s = model._scales.x if model._scales is not None else None
    assert s is not None
    at_edge = float(s.mean[0] + 5.0 * s.scale[0])
    assert model.predict_one({"rain": float(s.mean[0] + 75.0 * s.scale[0])}) == edge.predict_one({"rain": at_edge})
    with pytest.raises(ValueError, match="clip"):
        OnlineStandardiser(1, clip=0.0)



@pytest.mark.parametrize("algorithm", ["fedbnr", "fedbnr-personal", "fsgp"])
def test_every_summing_learner_says_what_stays_below_its_floor(algorithm: str) -> None:
    """The learners with a privacy floor report their pending samples, which a finite stream's end counts."""
    from streamfed.fleet.sources import Reading

    x, y = _stream(40, seed=10)
    agent, _ = _agent_pair(algorithm, **{algorithm: {"min_upload": 32}})
    for t in range(len(y)):
        agent.on_reading(Reading(f"r{t}", x[t], float(t), y=float(y[t])))
    _, held = agent.end_of_stream(durable=False)
    assert held == 6 and agent.counters.skipped["below_privacy_floor"] == 6


def test_an_agent_standardises_a_classifiers_inputs_but_never_its_class_labels():
    """On the agents' default (`standardise = "online"`) a classifier (Algorithm.task) gets its inputs in
    standard units and its labels as they are: every labelled reading is learned, none refused, and the
    predictions are class indices — not a label mapped through a target scale."""
    import numpy as np

    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading

    cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2,
                      params={"n_classes": 2, "learn_kernel": False, "budget": 8, "chains": 2, "burn_in": 2})
    assert cfg.standardise == "online"
    agent = AgentCore(cfg, "a", 0)
    rng = np.random.default_rng(0)
    means = []
    for t in range(120):
        x = rng.normal(0, 1, 2) * 1000.0 + 5000.0  # raw units far from the unit scale
        pred, _ = agent.on_reading(Reading(f"{t}", x, float(t), float(x[0] > 5000.0)), now=float(t))
        means.append(pred.mean)
    assert sum(agent.counters.skipped.values()) == 0 and agent.counters.learned == 120
    assert set(means[-60:]) <= {0.0, 1.0}
    # it learned the rule from standardised inputs: the last half mostly right
    xs = rng.normal(0, 1, (40, 2)) * 1000.0 + 5000.0
    hits = [agent.learner.predict(x)[0] == float(x[0] > 5000.0) for x in xs]
    assert np.mean(hits) > 0.8
