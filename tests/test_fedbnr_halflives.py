"""FedBNR over a dictionary of half-lives, mixed by fixed share (`fedbnr-halflives`, docs/algorithms.md §4.15).

The transcriptions, written here with numpy from the definitions:

* each component's global: the centralised statistics of every uploaded sample, a sample observed at `t_i` weighing
  `w_i = 2^(−(T − t_i)/h)` at the component's reference time `T` (`w_i = 1` without forgetting), and each client's
  installed posterior per component the weighted Bayesian linear regression of every sample it knows of;
* the mixture: `w ← w·p / Σ w·p`, then `w ← (1 − α) w + α/J` in the linear domain over the components' Gaussian
  predictive densities, the mixture predicting `Σ w μ` with variance `Σ w (v + (μ − μ̄)²)`.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from pydantic import ValidationError

from streamfed.algorithms import fedbnr
from streamfed.algorithms.fedbnr_halflives import ALGORITHM, HalfLivesParams, component_fleets
from streamfed.algorithms.fedbnr_halflives.learner import HalfLifeLearner
from streamfed.algorithms.fedbnr_halflives.wire import UPDATE
from streamfed.fleet.config import FleetConfig
from streamfed.wire.message import Message, decode, encode

H = 3600.0
HALF_LIVES = (None, 4 * H, H)
SIGMA, LAM = 0.3, 1.2


def _cfg(names: tuple[str, ...] = ("a", "b", "c"), **params: object) -> FleetConfig:
    p = {"half_lives_s": list(HALF_LIVES), "min_upload": 4, "sigma": SIGMA, "lam": LAM,
         "fit_hyperparameters": False, "calibrate": False} | params
    return FleetConfig(fleet="f", algorithm="fedbnr-halflives", n_inputs=2, n_features=4, kernels=["gaussian:1.0"],
                       standardise="none", clients=names, params=p)


def _stream(rng: np.random.Generator, n: int, start: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs = rng.uniform(-2, 2, (n, 2))
    ys = np.sin(xs[:, 0]) + 0.5 * xs[:, 1] + 0.1 * rng.standard_normal(n)
    times = start + np.cumsum(rng.choice([0.0, 60.0, 1800.0, 7200.0], n))  # irregular clocks
    return xs, ys, times


def _weights(h: float | None, times: np.ndarray, t_ref: float) -> np.ndarray:
    return np.ones_like(times) if h is None else 0.5 ** ((t_ref - times) / h)


def _central(h: float | None, phis: np.ndarray, ys: np.ndarray, times: np.ndarray, t_ref: float) -> tuple:
    """Statistics and posterior of the samples weighted for half-life `h` at `t_ref`, from the definitions."""
    w = _weights(h, times, t_ref)
    s = (phis * w[:, None]).T @ phis
    b = phis.T @ (w * ys)
    cov = np.linalg.inv(s / SIGMA**2 + np.eye(phis.shape[1]) / LAM**2)
    return s, b, w.sum(), w @ ys**2, cov @ b / SIGMA**2, cov


@pytest.mark.slow  # agents and the aggregator core warm up their compiled paths (~3 s on a loaded machine)
def test_agents_and_aggregator_give_each_half_life_the_centralised_discounted_statistics() -> None:
    """Real agents and the aggregator core through the codec, readings stamped in 2013 on irregular clocks: each
    component's global equals the centralised statistics of every uploaded sample for its half-life, at its time."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.sources import Reading

    names = ("a", "b", "c")
    cfg = _cfg(names)
    agents = {n: AgentCore(cfg, n, i) for i, n in enumerate(names)}
    core = AggregatorCore(cfg, clients=list(names), mode="async", window=0.0)
    rng = np.random.default_rng(5)
    streams = {n: _stream(rng, 25 + 6 * i, start=1.36e9 + 900.0 * i) for i, n in enumerate(names)}
    uploaded = dict.fromkeys(names, 0)
    stamps: list[float] = []
    for _t, n, j in sorted((t, n, j) for n, (_, _, ts) in streams.items() for j, t in enumerate(ts)):
        xs, ys, ts = streams[n]
        _, msgs = agents[n].on_reading(Reading(f"{n}{j}", xs[j], float(ts[j]), float(ys[j])), now=1.8e9)
        for m in msgs:
            if m.kind == UPDATE:
                uploaded[n] += int(m.n_samples)
                times = m.arrays["time"]
                assert times.tolist() == [0.0, float(ts[uploaded[n] - 1]), float(ts[uploaded[n] - 1])]
                stamps.append(float(times[1]))
                for g in core.on_update(n, encode(m, cfg), now=1.8e9):
                    if g.kind.endswith(".global"):
                        for a in agents.values():
                            a.on_global(decode(encode(g, cfg), cfg, kernel_version=a.kernel_version), now=1.8e9)
    assert all(uploaded.values())
    learner = agents["a"].learner
    while not isinstance(learner, HalfLifeLearner):  # the agent's wrappers (bounded labels)
        learner = learner.inner
    feats = learner.components[0].client
    rows = [(np.array([feats.features(x)[0] for x in streams[n][0][:k]]), streams[n][1][:k], streams[n][2][:k])
            for n, k in uploaded.items()]
    phis, ys, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
    servers = core.aggregation.server.servers
    for h, server in zip(HALF_LIVES, servers, strict=True):
        t_ref = server.time if h is not None else 0.0
        if h is not None:
            assert server.time == max(stamps)
        s, b, nw, q, _, _ = _central(h, phis, ys, ts, t_ref)
        np.testing.assert_allclose(server.stats.S[0], s, rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(server.stats.b[0], b, rtol=1e-11, atol=1e-11)
        assert float(server.stats.n) == pytest.approx(nw, rel=1e-12)
        assert float(server.stats.q) == pytest.approx(q, rel=1e-12)
    assert float(servers[0].stats.n) == len(ys) > float(servers[1].stats.n) > float(servers[2].stats.n)


@pytest.mark.parametrize("seed", [0, 1])
def test_each_installed_component_is_the_centralised_posterior_of_its_half_life(seed: int) -> None:
    """Three learners, every upload checked, summed and its global installed at once (windows out of the clients'
    order): after the last global, each client's component `j` is the weighted posterior of its own samples and
    every other client's uploaded ones, at the component's clock."""
    names = ("a", "b", "c")
    cfg = _cfg(names)
    learners = {n: ALGORITHM.learner(cfg, n, i) for i, n in enumerate(names)}
    agg = ALGORITHM.aggregation(cfg)
    kv = ALGORITHM.kernel_version(cfg)
    rng = np.random.default_rng(seed)
    # whole uploads only: every sample is followed by a global installed everywhere (between globals a discounted
    # working posterior is the heuristic of §4.8; each global makes it exact again)
    streams = {n: _stream(rng, 20 + 4 * i, start=1.7e9 + 700.0 * i) for i, n in enumerate(names)}
    uploaded = dict.fromkeys(names, 0)
    for _t, n, j in sorted((t, n, j) for n, (_, _, ts) in streams.items() for j, t in enumerate(ts)):
        xs, ys, ts = streams[n]
        lr = learners[n]
        lr.observe_time(float(ts[j]))
        lr.learn(xs[j], float(ys[j]))
        up = lr.take_update()
        if up is None:
            continue
        uploaded[n] += up.n_samples
        msg = decode(encode(Message("f", n, UPDATE, up.seq, up.global_version, kv, up.n_samples, 0.0,
                                    dict(up.arrays)), cfg), cfg)
        agg.take(n, msg.seq, agg.check(msg))
        assert agg.close_window({}, lambda _: 0)
        g = decode(encode(agg.global_message("f", "agg", kv), cfg), cfg)
        for other in learners.values():
            assert other.install_global(g)
    assert agg.included() == {n: uploaded[n] // 4 for n in names}
    for n, lr in learners.items():
        feats = lr.components[0].client
        rows = []
        for m, (xs, ys, ts) in streams.items():
            k = len(ys) if m == n else uploaded[m]
            rows.append((np.array([feats.features(x)[0] for x in xs[:k]]), ys[:k], ts[:k]))
        phis, ys, ts = (np.concatenate(r) for r in zip(*rows, strict=True))
        for h, comp in zip(HALF_LIVES, lr.components, strict=True):
            t_ref = comp.client.clock if h is not None else 0.0
            *_, mean, cov = _central(h, phis, ys, ts, t_ref)
            m_j, cov_j = comp.client.posterior(0)
            np.testing.assert_allclose(m_j, mean, rtol=1e-9, atol=1e-10)
            np.testing.assert_allclose(cov_j, cov, rtol=1e-9, atol=1e-12)


def test_the_mixture_weights_follow_the_fixed_share_recursion() -> None:
    """The mixture's prediction and weights, step by step, against fixed share written out in the linear domain
    over the predictions of the same components run alone (ordinary FedBNR learners with one half-life each)."""
    alpha = 0.05
    cfg = _cfg(("a",), switch_rate=alpha, min_upload=1000)
    mix = ALGORITHM.learner(cfg, "a", 0)
    alone = [fedbnr.ALGORITHM.learner(c, "a", 0) for c in component_fleets(cfg)]
    rng = np.random.default_rng(3)
    xs, ys, ts = _stream(rng, 120, start=1.7e9)
    ys[60:] = -2.0 * ys[60:] + 1.0  # a change of regime: the short half-life should take over
    j_n = len(HALF_LIVES)
    w = np.full(j_n, 1.0 / j_n)
    for x, y, t in zip(xs, ys, ts, strict=True):
        preds = []
        for c in alone:
            c.observe_time(float(t))
            preds.append(c.learn(x, float(y)))
        mu, var = np.array(preds).T
        mean = w @ mu
        mix.observe_time(float(t))
        got_mean, got_var = mix.learn(x, float(y))
        assert got_mean == pytest.approx(mean, rel=1e-12, abs=1e-12)
        assert got_var == pytest.approx(w @ (var + (mu - mean) ** 2), rel=1e-12)
        p = np.exp(-0.5 * (y - mu) ** 2 / var) / np.sqrt(2 * np.pi * var)
        w = (1 - alpha) * (w * p / (w @ p)) + alpha / j_n
        np.testing.assert_allclose(mix.kernel_weights, w, rtol=1e-10, atol=1e-14)
    # after the change the data chose forgetting; fixed share keeps every weight ≥ α/J
    assert w[0] < 0.05 < 0.9 < w[1] + w[2] and w.min() >= alpha / j_n
    d = mix.diagnostics()
    assert [d[f"mixture_weight_{k}"] for k in ("none", "4h", "1h")] == pytest.approx(w.tolist(), rel=1e-10)
    assert list(mix.kernel_names) == ["half_life=none", "half_life=4h", "half_life=1h"]


@pytest.mark.parametrize(("half_lives", "says"), [
    ([0], "> 0"), ([-3600], "> 0"), ([float("nan")], "> 0"), ([3600, 3600.0], "repeated"),
    (["none", None], "repeated"), ([], "1 to"), (["soon"], "half_lives_s"), ("3600", "list"),
])
def test_a_bad_dictionary_is_a_one_line_error(half_lives: object, says: str) -> None:
    from streamfed.cli.common import validation_problem

    with pytest.raises(ValidationError) as e:
        _cfg(half_lives_s=half_lives)
    line = validation_problem(e.value)
    assert "\n" not in line and says in line and "half_lives_s" in line, line


def test_a_single_half_life_or_forgetting_is_refused_beside_the_dictionary() -> None:
    from streamfed.cli.common import validation_problem

    for extra in ({"half_life_s": H}, {"forgetting": 0.99}):
        with pytest.raises(ValidationError) as e:
            _cfg(**extra)
        line = validation_problem(e.value)
        assert "\n" not in line and "leave them unset" in line
    assert HalfLivesParams(half_lives_s=[math.inf, "none"][:1]).half_lives_s == (None,)  # inf: no forgetting


def _one_update(cfg: FleetConfig, n: int = 4) -> Message:
    lr = ALGORITHM.learner(cfg, "a", 0)
    xs, ys, ts = _stream(np.random.default_rng(1), n, start=1.7e9)
    for x, y, t in zip(xs, ys, ts, strict=True):
        lr.observe_time(float(t))
        lr.learn(x, float(y))
    up = lr.take_update()
    assert up is not None
    return Message("f", "a", UPDATE, up.seq, 0, ALGORITHM.kernel_version(cfg), up.n_samples, 0.0, dict(up.arrays))


@pytest.mark.parametrize(("row", "name", "value", "says"), [
    (0, "n", 5.0, "claims more samples"),  # the undiscounted row: more samples than its scatter holds
    (0, "n", 3.0, "exceeds n·max"),  # ... or fewer (its scatter then holds more than n can)
    (2, "n", 4.5, "claims more samples"),  # a discounted row weighs at most its raw count
    ([1, 2], "time", time.time() + 1e6, "ahead"),  # one clock, far ahead of the aggregator's
    (2, "S_upper", 10.0, "n·max‖φ‖²"),  # FedBNR's bounds on the statistics, per row
    (2, "time", 1.0e9, "one clock"),  # one half-life's row held at an older time than the others
    (0, "time", 1.7e9, "one clock"),  # a time on the row without forgetting
])
def test_one_bad_row_refuses_the_whole_update_and_nothing_is_taken(row: int | list[int], name: str, value: float,
                                                                   says: str) -> None:
    cfg = _cfg(("a",))
    msg = _one_update(cfg)
    agg = ALGORITHM.aggregation(cfg)
    agg.take("a", msg.seq, agg.check(msg))  # the honest update passes
    arrays = {k: np.array(v) for k, v in msg.arrays.items()}
    if name == "S_upper":
        arrays[name][row] *= value
    else:
        arrays[name][row] = value
    bad = Message("f", "a", UPDATE, 2, 0, msg.kernel_version, msg.n_samples, 0.0, arrays)
    with pytest.raises(ValueError, match=says):
        agg.check(bad)
    assert agg.close_window({}, lambda _: 0)
    assert agg.included() == {"a": 1} and all(p.server.included == {"a": 1} for p in agg.parts)


def test_one_sample_moves_the_stacked_upload_by_at_most_the_declared_sensitivity() -> None:
    """Differential privacy's bound: one sample (label at the bound) moves each component's `(S_upper, b, q)` by at
    most FedBNR's per-sample bound `Δ` (its weight is ≤ 1), so the stacked arrays by at most `√J·Δ` — and by
    nearly that when the sample is the latest (weight 1 in every component): the bound is not loose."""
    cfg = _cfg(("a",), min_upload=1)
    bound = 2.0
    xs, ys, ts = _stream(np.random.default_rng(4), 6, start=1.7e9)
    ys[-1], ts[-1] = bound, ts[-2]  # the extra sample at the previous one's time: both uploads at one time

    def upload(n: int) -> dict[str, np.ndarray]:
        lr = ALGORITHM.learner(cfg, "a", 0)
        for x, y, t in zip(xs[:n], ys[:n], ts[:n], strict=True):
            lr.observe_time(float(t))
            lr.learn(x, float(y))
        up = lr.take_update()
        assert up is not None
        return dict(up.arrays)

    with_it, without = upload(6), upload(5)
    sens = ALGORITHM.learner(cfg, "a", 0).upload_sensitivity(bound)
    one = fedbnr.ALGORITHM.learner(component_fleets(cfg)[0], "a", 0).upload_sensitivity(bound)
    assert sens.l2 == pytest.approx(math.sqrt(len(HALF_LIVES)) * one.l2, rel=1e-15)
    assert sens.arrays == ("S_upper", "b", "q") and sens.count == "n"
    moved = math.sqrt(sum(float(np.sum((with_it[k] - without[k]) ** 2)) for k in sens.arrays))
    assert 0.5 * sens.l2 < moved <= sens.l2


def test_robust_mode_screens_and_caps_in_every_component() -> None:
    """`[fleet.robust] aggregation = "robust"`: each component runs FedBNR's share cap and residual screening on its
    own discounted sums. A client whose labels are 50 times the others' is screened out of every component, and the
    family's global still holds every client's sequence numbers (a screened upload is taken with weight 0)."""
    names = ("a", "b", "c", "d", "e")
    cfg = _cfg(names).model_copy(update={"robust": _cfg(names).robust.model_copy(
        update={"aggregation": "robust", "label_bound": 1e3})})
    learners = {n: ALGORITHM.learner(cfg, n, i) for i, n in enumerate(names)}
    agg = ALGORITHM.aggregation(cfg)
    kv = ALGORITHM.kernel_version(cfg)
    rng = np.random.default_rng(8)
    streams = {n: _stream(rng, 40, start=1.7e9) for n in names}
    clock = streams["a"][2]  # one clock: the clients take turns, so all have uploaded before any uploads again
    streams = {n: (xs, ys * (50.0 if n == "e" else 1.0), clock) for n, (xs, ys, _) in streams.items()}
    for _t, n, j in sorted((t, n, j) for n, (_, _, ts) in streams.items() for j, t in enumerate(ts)):
        xs, ys, ts = streams[n]
        learners[n].observe_time(float(ts[j]))
        learners[n].learn(xs[j], float(ys[j]))
        up = learners[n].take_update()
        if up is None:
            continue
        agg.take(n, up.seq, agg.check(Message("f", n, UPDATE, up.seq, up.global_version, kv, up.n_samples, 0.0,
                                              dict(up.arrays))))
        agg.close_window({}, lambda _: 0)
        g = agg.global_message("f", "agg", kv)
        for lr in learners.values():
            lr.install_global(g)
    d = agg.diagnostics()
    assert agg.included() == dict.fromkeys(names, 10)
    assert all(p.included() == agg.included() for p in agg.parts)
    for label in ("none", "4h", "1h"):
        assert d[f"{label}_screened_uploads"] >= 8, d  # every upload of e's after the cold start
    # 1.5 times a fair share where the cap binds. With a 1 h half-life the sums hold ~12 discounted samples, each
    # client 2–4: at or under the cold-start floor (`Robust.floor` = min_upload, 4) that any client may hold
    # whatever the total, so that component's shares are not capped yet.
    for label in ("none", "4h"):
        assert d[f"{label}_largest_client_share"] <= 1.5 / len(names) + 1e-12


def test_the_replay_runs_the_family_and_traces_the_weights() -> None:
    """`streamfed replay`'s engine on streams with hourly times (what bench_drift.py runs): every step scored, the
    mixture's weights traced at the checkpoints, a distribution over the default dictionary's half-lives."""
    from streamfed.evaluation.datasets.base import ClientStream, Fleet
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    rng = np.random.default_rng(6)
    hours = np.datetime64("2013-03-01T00", "h") + np.arange(150)
    streams = []
    for c in range(3):
        xs = rng.uniform(-1, 1, (150, 2))
        ys = np.sin(2 * xs[:, 0]) * np.where(np.arange(150) < 75, 1.0, -1.0) + 0.05 * rng.standard_normal(150)
        streams.append(ClientStream(f"s{c}", xs, ys, ("u", "v"), time=hours))
    fleet = Fleet(tuple(streams), dataset="toy", normalisation="none", split="custom")
    res = replay(fleet, "fedbnr-halflives", AlgorithmConfig(n_kernels=2, n_features=8,
                                                            params={"fedbnr-halflives": {"min_upload": 8}}))
    assert all(np.isfinite(np.asarray(m)).all() for m in res.means)
    assert res.kernel_names == ["half_life=none", "half_life=7d", "half_life=1d", "half_life=3h"]
    np.testing.assert_allclose(res.weights.sum(axis=1)[1:], 1.0, rtol=1e-12)
