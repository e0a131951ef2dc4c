"""FSGP's personalised predictive (issue 34; docs/algorithms.md, "FSGP"): the fixed-share mixture of the fleet's
posterior and the client's own samples' posterior, checked against a plain NumPy transcription (dense sparse-GP
predictives from the raw samples, fixed share written out); uploads and globals unchanged by it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.base import NonFiniteError
from streamfed.algorithms.fsgp import ALGORITHM
from streamfed.algorithms.fsgp.client import FSGPClient
from streamfed.algorithms.fsgp.kernels import Hyper
from streamfed.algorithms.fsgp.messages import GlobalModel
from streamfed.algorithms.fsgp.posterior import Stats
from streamfed.algorithms.fsgp.server import FSGPServer
from streamfed.fleet.config import FleetConfig

JITTER = 1e-6


def plain_cov(h: Hyper, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """SE covariance, entry by entry."""
    amp, ls = math.exp(h.log_amp), np.exp(h.log_ls)
    return np.array([[amp * amp * math.exp(-0.5 * float(np.sum(((a - b) / ls) ** 2))) for b in B] for a in A])


def plain_predictive(h: Hyper, X: np.ndarray, y: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """Titsias' sparse-GP predictive from all the samples at once (dense inverses)."""
    amp2, s2 = math.exp(2 * h.log_amp), math.exp(2 * h.log_sigma)
    Kmm = plain_cov(h, h.Z, h.Z) + JITTER * amp2 * np.eye(h.m)
    k = plain_cov(h, h.Z, x[None, :])[:, 0]
    if len(y) == 0:
        return 0.0, amp2 + s2
    Kmn = plain_cov(h, h.Z, X)
    A = Kmm + Kmn @ Kmn.T / s2
    mean = float(k @ np.linalg.inv(A) @ Kmn @ y) / s2
    var = amp2 + s2 - float(k @ (np.linalg.inv(Kmm) - np.linalg.inv(A)) @ k)
    return mean, max(var, s2)


def gauss_logpdf(y: float, m: float, v: float) -> float:
    return -0.5 * math.log(2 * math.pi * v) - 0.5 * (y - m) ** 2 / v


def make_hyper(m: int = 6, d: int = 2, seed: int = 0) -> Hyper:
    rng = np.random.default_rng(seed)
    return Hyper("se", math.log(1.3), np.log(rng.uniform(0.6, 1.5, d)), math.log(0.3), rng.uniform(-1.5, 1.5, (m, d)))


def station(n: int, shift: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Heterogeneous clients: the same inputs' law, a client-specific offset and slope."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, 2))
    return X, np.sin(2 * X[:, 0]) + shift * (1.0 + X[:, 1]) + 0.1 * rng.normal(size=n)


def run_two_clients(personal: bool, alpha: float = 0.05, n_a: int = 48, check=None):
    """Client B uploads 40 samples; the server publishes; client A (personalised or not) installs that global,
    then streams `n_a` samples (predict, then learn with that prediction), uploading every 8 and installing each
    new global. Returns A, the server, A's uploads, the globals."""
    h = make_hyper()
    server = FSGPServer(h, min_samples=4, learn_hyperparameters=False)
    b = FSGPClient(h, min_upload=4, client_id="b", learn_hyperparameters=False)
    Xb, yb = station(40, -0.8, 1)
    for x, y in zip(Xb, yb, strict=True):
        b.learn(x, float(y))
    assert server.apply(b.make_upload())
    globals_ = [server.publish()]
    a = FSGPClient(h, min_upload=4, client_id="a", learn_hyperparameters=False, personal=personal, switch_rate=alpha)
    a.apply_global(globals_[0])
    Xa, ya = station(n_a, 0.8, 2)
    uploads = []
    for t, (x, y) in enumerate(zip(Xa, ya, strict=True)):
        pred = a.predict(x)
        if check is not None:
            check(a, t, Xb, yb, Xa[:t], ya[:t], x, pred)
        a.learn(x, float(y), pred)
        if (t + 1) % 8 == 0:
            up = a.make_upload()
            uploads.append(up)
            assert server.apply(up)
            globals_.append(server.publish())
            a.apply_global(globals_[-1])
    return a, server, uploads, globals_, (Xb, yb, Xa, ya)


def test_the_prediction_is_fixed_share_over_the_fleet_and_own_posteriors_written_out() -> None:
    alpha = 0.05
    log_w = [math.log(0.9), math.log(0.1)]  # the plain fixed share, from the own expert's prior weight 0.1
    prev: list[tuple[tuple[float, float], tuple[float, float]]] = []

    def check(a, t, Xb, yb, Xa_t, ya_t, x, pred):
        if prev:  # fold the last step's densities of its target: Bayes, then share
            (g, o), y = prev.pop(), float(ya_t[-1])
            joint = [log_w[0] + gauss_logpdf(y, *g), log_w[1] + gauss_logpdf(y, *o)]
            top = max(joint)
            mix = top + math.log(sum(math.exp(j - top) for j in joint))
            log_w[:] = [math.log((1 - alpha) * math.exp(j - mix) + alpha / 2) for j in joint]
        h = a.hyper
        # the fleet's expert: every sample B uploaded and every sample A has learned (included or not yet)
        g = plain_predictive(h, np.vstack([Xb, Xa_t]), np.concatenate([yb, ya_t]), x)
        o = plain_predictive(h, Xa_t, ya_t, x)  # A's own samples alone
        w = np.exp(np.array(log_w) - max(log_w))
        w /= w.sum()
        mean = w[0] * g[0] + w[1] * o[0]
        var = w[0] * (g[1] + (g[0] - mean) ** 2) + w[1] * (o[1] + (o[0] - mean) ** 2)
        assert pred[0] == pytest.approx(mean, rel=1e-7, abs=1e-9)
        assert pred[1] == pytest.approx(var, rel=1e-7)
        assert a.mixture_weights() == pytest.approx(tuple(w), rel=1e-9)
        prev.append((g, o))

    a, *_ = run_two_clients(True, alpha, check=check)
    assert a.n == 48
    assert a.mixture_weights()[1] > 0.5  # A's offset is not the fleet's: its own posterior earns the weight


def test_uploads_and_globals_are_the_same_with_and_without_personalisation() -> None:
    a1, s1, ups1, gs1, _ = run_two_clients(True)
    a0, s0, ups0, gs0, (Xb, yb, Xa, ya) = run_two_clients(False)
    assert len(ups1) == len(ups0) == 6
    for u1, u0 in zip(ups1, ups0, strict=True):
        assert (u1.seq, u1.base_version, u1.stats.n) == (u0.seq, u0.base_version, u0.stats.n)
        np.testing.assert_array_equal(u1.stats.P, u0.stats.P)
        np.testing.assert_array_equal(u1.stats.r, u0.stats.r)
    for g1, g0 in zip(gs1, gs0, strict=True):
        np.testing.assert_array_equal(g1.stats.P, g0.stats.P)
        np.testing.assert_array_equal(g1.stats.r, g0.stats.r)
    # the global is the fleet's exact aggregate: the statistics of every sample of both clients, at once
    h = s1.hyper
    X, y = np.vstack([Xb, Xa]), np.concatenate([yb, ya])
    K = plain_cov(h, X, h.Z)
    exact = Stats.from_samples(K, y)
    np.testing.assert_allclose(s1.stats.P, exact.P, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(s1.stats.r, exact.r, rtol=1e-10, atol=1e-12)
    assert (s1.stats.n, s1.stats.q) == (exact.n, pytest.approx(exact.q, rel=1e-12))
    # and a non-personalised client predicts with the fleet's posterior alone
    assert a0.mixture_weights() == (1.0, 0.0)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), alpha=st.sampled_from([0.0, 0.01, 0.2]), shift=st.floats(-2.0, 2.0))
def test_mixture_log_loss_is_within_the_fixed_share_bound_of_either_expert(seed: int, alpha: float,
                                                                          shift: float) -> None:
    """Fixed share's regret bound, measured on the client's own experts: `L_mix ≤ L_i + log 2 + T log 1/(1-α)`."""
    h = make_hyper(seed=seed % 7)
    c = FSGPClient(h, min_upload=4, learn_hyperparameters=False, personal=True, switch_rate=alpha)
    other = Stats.from_samples(plain_cov(h, *station(30, -shift, seed + 1)[:1], h.Z), station(30, -shift, seed + 1)[1])
    c.apply_global(GlobalModel(1, 0, h, other, {}))
    X, y = station(40, shift, seed)
    loss = [0.0, 0.0]
    for x, t in zip(X, y, strict=True):
        g, o = c.expert_predictions(x)
        loss[0] -= gauss_logpdf(float(t), *g)
        loss[1] -= gauss_logpdf(float(t), *o)
        c.learn(x, float(t))
    wg, wo = c.mixture_weights()
    assert wg + wo == pytest.approx(1.0) and min(wg, wo) >= alpha / 2 * (1 - 1e-9)
    # from weights (0.9, 0.1): log(1/w₁) of each expert in place of log 2
    assert c.mix.loss <= loss[0] + math.log(1 / 0.9) + len(y) * -math.log1p(-alpha) + 1e-9
    assert c.mix.loss <= loss[1] + math.log(1 / 0.1) + len(y) * -math.log1p(-alpha) + 1e-9


def test_a_client_joining_a_running_fleet_predicts_mostly_with_the_fleets_posterior() -> None:
    h = make_hyper()
    X, y = station(60, 0.0, 5)
    g = GlobalModel(1, 0, h, Stats.from_samples(plain_cov(h, X, h.Z), y), {})
    c = FSGPClient(h, learn_hyperparameters=False, personal=True)
    c.apply_global(g)
    x = np.array([0.3, -0.2])
    fleet = plain_predictive(h, X, y, x)
    assert c.mixture_weights() == pytest.approx((0.9, 0.1))
    assert c.predict(x)[0] == pytest.approx(0.9 * fleet[0], rel=1e-9)  # the own expert: the prior's mean 0


def test_a_bad_sample_changes_nothing_in_a_personalised_client() -> None:
    h = make_hyper()
    c = FSGPClient(h, min_upload=4, learn_hyperparameters=False, personal=True)
    X, y = station(20, 0.5, 3)
    for x, t in zip(X, y, strict=True):
        c.learn(x, float(t))
    _ = c.pending  # the staged rows into the sums
    before = (c.mixture_weights(), c.own_post.stats.P.copy(), c.predict(X[0]), c.n, c.mix.loss)
    for bad_x, bad_y in [(np.array([np.nan, 0.0]), 1.0), (X[0], float("inf")), (X[0], 1e200)]:
        with pytest.raises(ValueError):
            c.learn(bad_x, bad_y)
    after = (c.mixture_weights(), c.own_post.stats.P, c.predict(X[0]), c.n, c.mix.loss)
    assert before[0] == after[0] and before[2:] == after[2:]
    np.testing.assert_array_equal(before[1], after[1])
    assert issubclass(NonFiniteError, ValueError)


def test_the_default_learner_is_personalised_and_reports_its_weights() -> None:
    cfg = FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2, params={"n_inducing": 6, "min_upload": 4})
    lr = ALGORITHM.learner(cfg, "a", 0)
    X, y = station(30, 0.5, 4)
    for x, t in zip(X, y, strict=True):
        lr.learn(x, float(t))
    d = lr.diagnostics()
    assert d["mixture_weight_global"] + d["mixture_weight_own"] == pytest.approx(1.0)
    assert d["expert_mse_global"] > 0 and d["expert_mse_own"] > 0
    off = ALGORITHM.learner(FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2,
                                        params={"n_inducing": 6, "personal": False}), "a", 0)
    assert "mixture_weight_own" not in off.diagnostics()


def test_local_fits_run_at_doubling_intervals_up_to_the_cap() -> None:
    h = make_hyper()
    c = FSGPClient(h, min_upload=4, fit_every=4, fit_every_max=16, fit_steps=1)
    X, y = station(70, 0.0, 6)
    at = []
    for t, (x, v) in enumerate(zip(X, y, strict=True), start=1):
        before = c.n_fits
        c.learn(x, float(v))
        if c.n_fits > before:
            at.append(t)
    assert at == [4, 12, 28, 44, 60]  # intervals 4, 8, 16, then 16 (the cap)
    const = FSGPClient(h, min_upload=4, fit_every=4, fit_steps=1)  # no cap given: every fit_every samples
    for x, v in zip(X[:20], y[:20], strict=True):
        const.learn(x, float(v))
    assert const.n_fits == 5


def test_mixture_weights_reach_prometheus_as_learner_values() -> None:
    from prometheus_client import generate_latest

    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.sources import Reading
    from streamfed.runtime.exporter import StreamfedCollector, make_registry

    cfg = FleetConfig(fleet="fs", algorithm="fsgp", n_inputs=2, standardise="none",
                      params={"n_inducing": 6, "min_upload": 4, "learn_hyperparameters": False})
    agent = AgentCore(cfg, "a0", 0)
    X, y = station(40, 0.5, 7)
    for t, (x, v) in enumerate(zip(X, y, strict=True)):
        agent.on_reading(Reading(f"r{t}", x, float(t), float(v)), now=0.0)
    agent.stats.update_from_learner(agent.learner)
    w = agent.stats.learner_values
    assert w["mixture_weight_global"] + w["mixture_weight_own"] == pytest.approx(1.0, abs=1e-12)
    text = generate_latest(make_registry(StreamfedCollector([agent.stats]))).decode()
    for name in ("mixture_weight_global", "mixture_weight_own", "expert_mse_own"):
        assert f'streamfed_agent_learner_value{{client="a0",fleet="fs",name="{name}"}}' in text


def test_batch_predictions_are_the_per_sample_mixture() -> None:
    h = make_hyper()
    c = FSGPClient(h, min_upload=4, learn_hyperparameters=False, personal=True)
    X, y = station(45, 0.7, 8)
    for x, t in zip(X, y, strict=True):
        c.learn(x, float(t))
    Xs = np.random.default_rng(9).uniform(-2, 2, (5, 2))
    mean, var = c.predict_many(Xs)
    one = np.array([c.predict(x) for x in Xs])
    np.testing.assert_allclose(mean, one[:, 0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(var, one[:, 1], rtol=1e-9)
