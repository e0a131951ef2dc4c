"""Hierarchical FedBNR (shared w + personal δ_k) against brute-force joint Gaussian inference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr.client import FedBNRClient
from streamfed.algorithms.fedbnr.evidence import log_evidence
from streamfed.algorithms.fedbnr_personal.client import FedBNRHierClient
from streamfed.algorithms.fedbnr_personal.evidence import (
    _Spectra,
    fit_hierarchical,
    hierarchical_log_evidence,
    marginal_contribution,
)
from streamfed.algorithms.fedbnr_personal.messages import HierGlobal, HierUpload
from streamfed.algorithms.fedbnr_personal.server import FedBNRHierServer
from streamfed.core.stats import SufficientStats

SIG, LAM, TAU = 0.4, 1.3, 0.6


def data(n: int, seed: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, 2))
    return x, np.sin(x.sum(axis=1)) + shift + 0.2 * rng.standard_normal(n)


def make_clients(k: int, gamma: float = 1.0, **kw) -> list[FedBNRHierClient]:
    return [FedBNRHierClient(n_inputs=2, n_features=2, bandwidth=1.5, sigma=SIG, lam=LAM, tau=TAU,
                             forgetting=gamma, min_upload=1, client_id=f"c{i}", **kw) for i in range(k)]


def brute_force(phis: list[np.ndarray], ys: list[np.ndarray], weights: list[np.ndarray], sigma: float,
                lam: float, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and covariance of θ = [w, δ_1, …, δ_K] by dense Gaussian algebra (a weight ω on a
    sample is a noise variance σ²/ω)."""
    k, f = len(phis), phis[0].shape[1]
    rows, targets, prec_noise = [], [], []
    for c, (p, y, om) in enumerate(zip(phis, ys, weights, strict=True)):
        x = np.zeros((p.shape[0], (k + 1) * f))
        x[:, :f] = p
        x[:, (c + 1) * f:(c + 2) * f] = p
        rows.append(x)
        targets.append(y)
        prec_noise.append(om / sigma**2)
    x, y, wn = np.vstack(rows), np.concatenate(targets), np.concatenate(prec_noise)
    prior = np.r_[np.full(f, lam**-2), np.full(k * f, tau**-2)]
    prec = np.diag(prior) + x.T @ (wn[:, None] * x)
    cov = np.linalg.inv(prec)
    return cov @ (x.T @ (wn * y)), cov


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ----------------------------------------------------------------------------- maths


def test_marginal_contribution_is_the_likelihood_with_delta_integrated_out() -> None:
    rng = np.random.default_rng(1)
    phi, y = rng.standard_normal((7, 3)), rng.standard_normal(7)
    p, r, log_z = marginal_contribution(SufficientStats.from_samples(phi, y), SIG, TAU)
    c = SIG**2 * np.eye(7) + TAU**2 * phi @ phi.T
    assert rel(p, phi.T @ np.linalg.solve(c, phi)) < 1e-12
    assert rel(r, phi.T @ np.linalg.solve(c, y)) < 1e-12
    direct = -0.5 * (7 * math.log(2 * math.pi) + np.linalg.slogdet(c)[1] + y @ np.linalg.solve(c, y))
    assert log_z == pytest.approx(direct, rel=1e-12)


def test_evidence_equals_the_joint_gaussian_density_of_all_targets() -> None:
    rng = np.random.default_rng(2)
    phis = [rng.standard_normal((n, 3)) for n in (4, 6, 5)]
    ys = [rng.standard_normal(p.shape[0]) for p in phis]
    stats = [SufficientStats.from_samples(p, y) for p, y in zip(phis, ys, strict=True)]
    lev, a, h = hierarchical_log_evidence(stats, SIG, LAM, TAU)
    x = np.vstack(phis)
    blocks = np.zeros((x.shape[0], x.shape[0]))
    start = 0
    for p in phis:
        blocks[start:start + p.shape[0], start:start + p.shape[0]] = p @ p.T
        start += p.shape[0]
    cov = SIG**2 * np.eye(x.shape[0]) + LAM**2 * x @ x.T + TAU**2 * blocks
    y = np.concatenate(ys)
    direct = -0.5 * (y.size * math.log(2 * math.pi) + np.linalg.slogdet(cov)[1] + y @ np.linalg.solve(cov, y))
    assert lev == pytest.approx(direct, rel=1e-11)
    # and the spectral form used by the fit agrees
    assert _Spectra(stats).log_evidence(math.log(SIG), math.log(LAM), math.log(TAU)) == pytest.approx(lev, rel=1e-10)


def test_one_client_is_bayesian_linear_regression_with_prior_variance_lam2_plus_tau2() -> None:
    rng = np.random.default_rng(3)
    phi, y = rng.standard_normal((20, 4)), rng.standard_normal(20)
    st_ = SufficientStats.from_samples(phi, y)
    lev, _, _ = hierarchical_log_evidence([st_], SIG, LAM, TAU)
    assert lev == pytest.approx(float(log_evidence(st_, SIG, math.hypot(LAM, TAU))), rel=1e-11)


# ----------------------------------------------------------------------------- learner vs brute force


def run_fleet(gamma: float, n_extra: int = 3) -> tuple[list[FedBNRHierClient], HierGlobal, list, list, list, float]:
    """Three clients with different offsets, two uploads each (client 0 also has pending samples when
    the global arrives); returns everything needed for the brute-force comparison."""
    clients = make_clients(3, gamma)
    server = FedBNRHierServer.for_client(clients[0], fit_hyperparameters=False)
    phis, ys, ts = [], [], []
    for c, cl in enumerate(clients):
        x, y = data(14, seed=10 + c, shift=0.5 * c)
        t = np.sort(np.random.default_rng(c).choice(np.arange(1, 30), 14, replace=False)).astype(float)
        cl.learn_many(x[:6], y[:6], t[:6])
        server.apply(cl.make_upload())
        cl.learn_many(x[6:11], y[6:11], t[6:11])
        server.apply(cl.make_upload())
        n_own = 11
        if c == 0:  # learned after its last upload: in its own posterior, not in the global
            cl.learn_many(x[11:11 + n_extra], y[11:11 + n_extra], t[11:11 + n_extra])
            n_own += n_extra
        phis.append(cl.features_many(x[:n_own]))
        ys.append(y[:n_own])
        ts.append(t[:n_own])
    g = server.publish(time=30.0)
    for cl in clients:
        assert cl.apply_global(g)
    return clients, g, phis, ys, ts, 30.0


@pytest.mark.parametrize("gamma", [1.0, 0.93])
def test_shared_posterior_is_the_exact_marginal_posterior_of_w(gamma: float) -> None:
    clients, g, phis, ys, ts, t_end = run_fleet(gamma, n_extra=0)
    weights = [gamma ** (t_end - t) for t in ts]
    mean, cov = brute_force(phis, ys, weights, SIG, LAM, TAU)
    f = clients[0].dim
    a_inv = np.linalg.inv(g.A)
    assert rel(a_inv @ g.h, mean[:f]) < 1e-9
    assert rel(a_inv, cov[:f, :f]) < 1e-9


@pytest.mark.parametrize("gamma", [1.0, 0.93])
def test_client_posterior_is_the_exact_posterior_of_w_plus_its_delta(gamma: float) -> None:
    clients, g, phis, ys, ts, t_end = run_fleet(gamma, n_extra=3)
    # The server holds client 0's first 11 samples only; the other 3 are client 0's own pending data.
    f = clients[0].dim
    for c, cl in enumerate(clients):
        weights = [gamma ** (t_end - t) for t in ts]
        if c != 0:  # what client c's posterior is conditioned on: others' uploaded data + its own data
            phis_c = [p[:11] if j == 0 else p for j, p in enumerate(phis)]
            ys_c = [y[:11] if j == 0 else y for j, y in enumerate(ys)]
            w_c = [w[:11] if j == 0 else w for j, w in enumerate(weights)]
        else:
            phis_c, ys_c, w_c = phis, ys, weights
        mean, cov = brute_force(phis_c, ys_c, w_c, SIG, LAM, TAU)
        sel = np.zeros((f, 4 * f))
        sel[:, :f] = np.eye(f)
        sel[:, (c + 1) * f:(c + 2) * f] = np.eye(f)
        m_v, c_v = sel @ mean, sel @ cov @ sel.T
        m, cv = cl.posterior()
        assert rel(m, m_v) < 1e-8, c
        assert rel(cv, c_v) < 1e-8, c
        # and the predictive is N(φᵀm, σ² + φᵀCφ)
        xq = np.array([[0.3, -0.7], [1.0, 1.0]])
        pq = cl.features_many(xq)
        mu, var = cl.predict_many(xq)
        assert np.allclose(mu, pq @ m_v, rtol=1e-8, atol=1e-10)
        assert np.allclose(var, SIG**2 + np.einsum("ti,ij,tj->t", pq, c_v, pq), rtol=1e-8)


def test_samples_after_a_global_are_exact_rank_one_updates_without_forgetting() -> None:
    clients, g, phis, ys, _, _ = run_fleet(1.0, n_extra=0)
    cl = clients[1]
    x, y = data(5, seed=99, shift=0.5)
    means, _ = cl.learn_many(x, y, np.arange(31.0, 36.0))
    phis_c = [p for p in phis]
    ys_c = [yy for yy in ys]
    phis_c[1] = np.vstack([phis[1], cl.features_many(x)])
    ys_c[1] = np.r_[ys[1], y]
    mean, cov = brute_force(phis_c, ys_c, [np.ones(len(yy)) for yy in ys_c], SIG, LAM, TAU)
    f = cl.dim
    m_v = mean[:f] + mean[2 * f:3 * f]
    assert rel(cl.posterior()[0], m_v) < 1e-8


def test_one_client_without_forgetting_equals_fedbnr_with_the_combined_prior() -> None:
    x, y = data(50, seed=7)
    hier = make_clients(1)[0]
    flat = FedBNRClient(n_inputs=2, n_features=2, bandwidth=1.5, sigma=SIG, lam=math.hypot(LAM, TAU))
    m1, v1 = hier.learn_many(x, y)
    m2, v2 = flat.learn_many(x, y)
    assert np.allclose(m1, m2, rtol=1e-9, atol=1e-12) and np.allclose(v1, v2, rtol=1e-9)


# ----------------------------------------------------------------------------- server properties


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_shared_posterior_is_independent_of_partition_and_order(draw: st.DataObject) -> None:
    gamma = draw.draw(st.sampled_from([1.0, 0.9]))
    n = 12
    uploads, reference = [], None
    for c in range(3):
        x, y = data(n, seed=20 + c, shift=c)
        t = np.arange(1.0, n + 1)
        cuts = sorted(draw.draw(st.sets(st.integers(1, n - 1), max_size=4)))
        cl = make_clients(1, gamma)[0]
        cl.client_id = f"c{c}"
        for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
            cl.learn_many(x[lo:hi], y[lo:hi], t[lo:hi])
            uploads.append(cl.make_upload())
    order = draw.draw(st.permutations(range(len(uploads))))
    server = FedBNRHierServer(uploads[0].stats.dim, uploads[0].stats.kernel_version, forgetting=gamma,
                              sigma=SIG, lam=LAM, tau=TAU, fit_hyperparameters=False, min_samples=1)
    for i in order:
        server.apply(uploads[i])
    g = server.publish(time=float(n))
    # reference: each client's statistics in one piece
    ref = FedBNRHierServer(uploads[0].stats.dim, uploads[0].stats.kernel_version, forgetting=gamma,
                           sigma=SIG, lam=LAM, tau=TAU, fit_hyperparameters=False, min_samples=1)
    for c in range(3):
        x, y = data(n, seed=20 + c, shift=c)
        cl = make_clients(1, gamma)[0]
        cl.client_id = f"c{c}"
        cl.learn_many(x, y, np.arange(1.0, n + 1))
        ref.apply(cl.make_upload())
    reference = ref.publish(time=float(n))
    assert rel(g.A, reference.A) < 1e-12 and rel(g.h, reference.h) < 1e-12
    assert g.log_evidence == pytest.approx(reference.log_evidence, rel=1e-10)


def test_duplicates_and_gaps() -> None:
    cl = make_clients(1)[0]
    server = FedBNRHierServer.for_client(cl, fit_hyperparameters=False)
    x, y = data(6, seed=5)
    ups = []
    for i in range(3):
        cl.learn_many(x[2 * i:2 * i + 2], y[2 * i:2 * i + 2])
        ups.append(cl.make_upload())
    assert server.apply(ups[2]) and server.included == {} and server.waiting() == {"c0": [3]}
    assert server.apply(ups[0]) and server.included == {"c0": 1}
    assert server.apply(ups[1]) and server.included == {"c0": 3}
    assert not server.apply(ups[1])
    total = SufficientStats.from_samples(cl.features_many(x), y, cl.kernel_version)
    assert rel(server.clients["c0"][0].S, total.S) < 1e-14
    with pytest.raises(ValueError):
        server.apply(HierUpload("c0", 4, 1.0, 0, ups[0].stats))  # below the privacy floor


def test_fit_maximises_the_evidence_and_tells_similar_from_different_clients() -> None:
    def fleet_stats(spread: float) -> list[SufficientStats]:
        out = []
        for c in range(4):
            cl = make_clients(1)[0]
            x, y = data(150, seed=40 + c)
            y = y + spread * np.sin(3 * x[:, 0] + c)  # client-specific part
            out.append(SufficientStats.from_samples(cl.features_many(x), y))
        return out

    same, diff = fleet_stats(0.0), fleet_stats(1.0)
    s, lam, tau, lev = fit_hierarchical(diff)
    assert lev == pytest.approx(hierarchical_log_evidence(diff, s, lam, tau)[0], rel=1e-8)
    for d in np.vstack([np.eye(3), -np.eye(3)]) * 0.05:
        s2, l2, t2 = np.exp(np.log([s, lam, tau]) + d)
        assert hierarchical_log_evidence(diff, s2, l2, t2)[0] <= lev + 1e-6
    tau_same = fit_hierarchical(same)[2]
    assert tau > 3 * tau_same  # different clients: a larger personal part


def test_bad_inputs_are_refused() -> None:
    cl = make_clients(1)[0]
    with pytest.raises(ValueError):
        cl.learn_many(np.array([[np.nan, 0.0]]), np.array([1.0]))
    with pytest.raises(ValueError):
        cl.learn_many(np.zeros((2, 2)), np.array([1.0, 2.0]), np.array([2.0, 1.0]))  # time going back
    assert cl.n_pending == 0


# ----------------------------------------------------------------------------- τ dictionary


def test_tau_mixture_of_one_model_is_that_model_and_weights_follow_prequential_evidence() -> None:
    from streamfed.algorithms.fedbnr_personal.mixture import FedBNRHierMixClient, FedBNRHierMixServer

    kw = dict(n_inputs=2, n_features=2, bandwidth=1.5, sigma=SIG, lam=LAM, min_upload=1, forgetting=0.95)
    mixes = [FedBNRHierMixClient((0.05, 0.6, 3.0), client_id=f"c{i}", **kw) for i in range(2)]
    singles = [[FedBNRHierClient(tau=t, client_id=f"c{i}", **kw) for t in (0.05, 0.6, 3.0)] for i in range(2)]
    server = FedBNRHierMixServer.for_client(mixes[0], fit_hyperparameters=False)
    ref = [FedBNRHierServer.for_client(s, fit_hyperparameters=False) for s in singles[0]]
    score = np.zeros(3)  # client 0's discounted prequential log evidence per model, recomputed here
    last_t = None
    for r in range(3):
        for i in range(2):
            x, y = data(10, seed=60 + 10 * r + i, shift=i)
            t = np.arange(10.0 * r + 1, 10.0 * r + 11)
            mean, var = mixes[i].learn_many(x, y, t)
            preds = [s.learn_many(x, y, t) for s in singles[i]]
            if i == 0:
                for k in range(10):
                    if last_t is not None:
                        score *= 0.95 ** (t[k] - last_t)
                    last_t = t[k]
                    w_k = np.exp(score - score.max())
                    w_k /= w_k.sum()
                    assert mean[k] == pytest.approx(sum(w_k[j] * preds[j][0][k] for j in range(3)), rel=1e-9)
                    score += [-0.5 * (np.log(2 * np.pi * p[1][k]) + (y[k] - p[0][k]) ** 2 / p[1][k])
                              for p in preds]
            server.apply(mixes[i].make_upload())
            for j, s in enumerate(singles[i]):
                ref[j].apply(s.make_upload())
            # mixture of the single models' predictions with discounted prequential log scores
            assert np.all(np.isfinite(mean)) and np.all(var > 0)
            lo = min(p[0].min() for p in preds)
            hi = max(p[0].max() for p in preds)
            assert np.all(mean >= lo - 1e-12) and np.all(mean <= hi + 1e-12)
        gs = server.publish(time=10.0 * r + 10)
        gr = [s.publish(time=10.0 * r + 10) for s in ref]
        for i in range(2):
            mixes[i].apply_global(gs)
            for s, g in zip(singles[i], gr, strict=True):
                s.apply_global(g)
        for i in range(2):
            for m, s in zip(mixes[i].models, singles[i], strict=True):
                assert np.array_equal(m.posterior()[0], s.posterior()[0])
    assert np.allclose(mixes[0].log_score, score, rtol=1e-10)
    before = [m.posterior()[0] for m in mixes[0].models]
    assert mixes[0].apply_global([None, None, None]) is False  # None: that model keeps what it has
    assert all(np.array_equal(b, m.posterior()[0]) for b, m in zip(before, mixes[0].models, strict=True))


# ----------------------------------------------------------------------------- two memories


def test_client_with_its_own_memory_is_exact_under_the_shared_memory_cavity() -> None:
    """Shared level weighted with γ_s (uploads, server), own data with γ_p in the client's posterior:
    at a global the client's posterior of w + δ_k is the brute-force posterior with the other clients'
    samples weighted γ_s^(T-t) and its own γ_p^(T-t)."""
    gs, gp, t_end = 0.97, 0.9, 30.0
    clients = make_clients(3, gs, own_forgetting=gp)
    server = FedBNRHierServer.for_client(clients[0], fit_hyperparameters=False)
    phis, ys, ts = [], [], []
    for c, cl in enumerate(clients):
        x, y = data(12, seed=70 + c, shift=0.5 * c)
        t = np.sort(np.random.default_rng(c).choice(np.arange(1, 30), 12, replace=False)).astype(float)
        cl.learn_many(x[:7], y[:7], t[:7])
        server.apply(cl.make_upload())
        cl.learn_many(x[7:], y[7:], t[7:])
        server.apply(cl.make_upload())
        phis.append(cl.features_many(x))
        ys.append(y)
        ts.append(t)
    g = server.publish(time=t_end)
    f = clients[0].dim
    for c, cl in enumerate(clients):
        cl.apply_global(g)
        weights = [(gp if j == c else gs) ** (t_end - t) for j, t in enumerate(ts)]
        mean, cov = brute_force(phis, ys, weights, SIG, LAM, TAU)
        sel = np.zeros((f, 4 * f))
        sel[:, :f] = np.eye(f)
        sel[:, (c + 1) * f:(c + 2) * f] = np.eye(f)
        m, cv = cl.posterior()
        assert rel(m, sel @ mean) < 1e-8
        assert rel(cv, sel @ cov @ sel.T) < 1e-8


def test_own_sigma_maximises_the_evidence_of_own_data_under_the_cavity_prior() -> None:
    clients = make_clients(2, fit_sigma=True)
    server = FedBNRHierServer.for_client(clients[0], fit_hyperparameters=False)
    xs = []
    for c, cl in enumerate(clients):
        x, y = data(40, seed=80 + c, shift=c)
        y = y + 0.5 * np.random.default_rng(c).standard_normal(40)  # noisier than σ = 0.4
        cl.learn_many(x, y)
        server.apply(cl.make_upload())
        xs.append((x, y))
    g = server.publish()
    cl = clients[1]
    cl.apply_global(g)
    prec, shift, _ = cl._prior
    mu0, cov0 = np.linalg.solve(prec, shift), np.linalg.inv(prec)
    phi = cl.features_many(xs[1][0])
    y = xs[1][1]

    def log_density(sigma: float) -> float:
        c = sigma**2 * np.eye(len(y)) + phi @ cov0 @ phi.T
        r = y - phi @ mu0
        return -0.5 * (np.linalg.slogdet(2 * np.pi * c)[1] + r @ np.linalg.solve(c, r))

    assert cl.sigma > SIG  # it noticed the extra noise
    best = log_density(cl.sigma)
    assert best >= log_density(cl.sigma * 1.02) - 1e-9 and best >= log_density(cl.sigma / 1.02) - 1e-9
    # and the working posterior uses it: prediction equals the Gaussian conditional with this σ
    xq = np.array([[0.2, 0.1]])
    pq = cl.features_many(xq)[0]
    k = phi @ cov0 @ phi.T + cl.sigma**2 * np.eye(len(y))
    kq = phi @ cov0 @ pq
    mean = pq @ mu0 + kq @ np.linalg.solve(k, y - phi @ mu0)
    assert cl.predict(xq[0])[0] == pytest.approx(mean, rel=1e-8)


# =========================================================================== in the fleet: the τ-mixture


def _run_personal_fleet(params: dict, n_agents: int = 2, steps: int = 80):
    """Agents and an aggregator (every upload its own window) through the real codec."""
    from streamfed.evaluation.datasets import synthetic_fleet
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.config import FleetConfig
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import encode

    data = synthetic_fleet(n_agents, steps, 2, seed=7)
    cfg = FleetConfig(standardise="none",
                      fleet="mix", algorithm="fedbnr-personal", n_inputs=2, n_features=6, kernels=["gaussian:1.0"],
                      params={"min_upload": 8, "fit_hyperparameters": False, **params})
    agg = AggregatorCore(cfg, mode="async", window=0.0)
    agents = [AgentCore(cfg, f"a{i}", i) for i in range(n_agents)]
    for t in range(steps):
        for a, s in zip(agents, data.streams, strict=True):
            for m in a.on_reading(Reading(str(t), s.X[t], float(t), float(s.y[t])))[1]:
                for out in agg.on_update(a.client_id, encode(m), now=0.0):
                    if out.kind.endswith(".global"):
                        for b in agents:
                            b.on_global_payload(encode(out))
    return agg, agents


def test_tau_mixture_fleet_carries_one_exact_shared_posterior_per_tau_and_exports_its_weights():
    """With a τ grid the global stacks one shared posterior per τ: model j's equals that of a fleet run with τ
    fixed at grid[j] on the same data (exactly: same uploads, same order). Agents mix the models by their own
    prequential evidence, and those weights and the shared vs own evidence reach Prometheus."""
    from prometheus_client import generate_latest

    from streamfed.runtime.exporter import StreamfedCollector, make_registry

    grid = [0.01, 0.3, 3.0]
    agg, agents = _run_personal_fleet({"tau_grid": grid})
    g = agg.global_message()
    assert g.arrays["tau"].tolist() == grid and g.arrays["A_upper"].shape[0] == 3
    for j, tau in enumerate(grid):
        single, _ = _run_personal_fleet({"tau": tau, "fit_tau": False})
        s = single.global_message()
        np.testing.assert_array_equal(g.arrays["A_upper"][j], s.arrays["A_upper"][0])
        np.testing.assert_array_equal(g.arrays["h"][j], s.arrays["h"][0])
    for a in agents:
        w = a.learner.kernel_weights
        assert w.shape == (3,) and abs(w.sum() - 1.0) < 1e-12 and a.global_version == agg.version
        a.stats.update_from_learner(a.learner)
        # the learner's own values, and how many labels the agent clipped to the fleet's bound
        # (and the conformal scale of its reported variance, streamfed.algorithms.calibration)
        assert set(a.stats.learner_values) == {"own_log_evidence", "shared_log_evidence", "labels_clipped",
                                               "variance_scale"}
    text = generate_latest(make_registry(StreamfedCollector([a.stats for a in agents]))).decode()
    assert 'streamfed_agent_kernel_weight{client="a0",fleet="mix",kernel="tau=0.3"}' in text
    assert 'streamfed_agent_learner_value{client="a1",fleet="mix",name="shared_log_evidence"}' in text


def test_a_tau_grid_must_be_distinct_positive_values():
    from pydantic import ValidationError

    from streamfed.fleet.config import FleetConfig

    for bad in ([], [0.1, 0.1], [0.0, 1.0], [float("inf")]):
        with pytest.raises(ValidationError, match="tau_grid"):
            FleetConfig(standardise="none",
                        fleet="f", algorithm="fedbnr-personal", n_inputs=2, params={"tau_grid": bad})


def test_tau_mixture_agent_and_aggregator_resume_from_their_snapshots_exactly():
    """Durable state: an agent and an aggregator of the τ-mixture restored from an encoded snapshot continue
    exactly as the originals do."""
    from streamfed.core import durable
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import encode

    agg, agents = _run_personal_fleet({"tau_grid": [0.05, 1.0]}, steps=40)
    a = agents[0]
    twin_a = AgentCore(a.cfg, a.client_id, a.index)
    twin_a.restore(durable.decode(durable.encode(a.snapshot())))
    twin_g = AggregatorCore(agg.cfg, mode="async", window=0.0)
    twin_g.restore(durable.decode(durable.encode(agg.snapshot())))
    rng = np.random.default_rng(3)
    for t in range(24):
        x, y = rng.normal(size=2), float(rng.normal())
        (p1, m1), (p2, m2) = (core.on_reading(Reading(f"n{t}", x, 100.0 + t, y)) for core in (a, twin_a))
        assert (p1.mean, p1.var) == (p2.mean, p2.var)
        for m, n in zip(m1, m2, strict=True):  # the same upload (its creation time aside)
            assert m.seq == n.seq and all(np.array_equal(m.arrays[k], n.arrays[k]) for k in m.arrays)
        for m in m1:
            g1, g2 = agg.on_update(a.client_id, encode(m), now=0.0), twin_g.on_update(a.client_id, encode(m), now=0.0)
            assert [x.arrays["A_upper"].tobytes() for x in g1 if x.kind.endswith(".global")] == \
                   [x.arrays["A_upper"].tobytes() for x in g2 if x.kind.endswith(".global")]
    assert np.array_equal(a.learner.kernel_weights, twin_a.learner.kernel_weights)


def test_personal_fleet_with_forgetting_publishes_globals():
    """With forgetting the uploads' statistics are time-weighted (n not a whole number): the aggregation must
    take them (it used to refuse every one as 'not a count of samples', so no global was ever published)."""
    agg, agents = _run_personal_fleet({"forgetting": 0.99})
    assert agg.version > 0 and agg.rejected == {} and all(a.global_version == agg.version for a in agents)
