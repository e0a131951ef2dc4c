"""Personalisation that never costs (streamfed.algorithms.fedbnr_personal.experts): each expert is its exact
posterior, the mixture is fixed share over their predictive densities, the fleet sees the personal expert only, and
the weights reach Prometheus."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters
from streamfed.algorithms.fedbnr_personal.evidence import marginal_contribution
from streamfed.algorithms.fedbnr_personal.experts import EXPERTS, FedBNRExpertsClient
from streamfed.algorithms.fedbnr_personal.fixed_share import gaussian_log_density
from streamfed.algorithms.fedbnr_personal.server import FedBNRHierServer
from tests.personal_fleet import run_personal_fleet

F_IN, D = 2, 3


def stream(n: int, seed: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, F_IN))
    return x, np.sin(x.sum(axis=1)) + shift * x[:, 0] + 0.15 * rng.standard_normal(n)


def run_fleet(switch_rate: float = 0.05, join_after: int = 96, n_new: int = 96):
    """Three clients from the start, a fourth (another relation: the fleet's prior misleads it) joining later;
    every upload published at once. Returns the clients, the server and the newcomer's row-by-row record
    (each expert's prediction, the mixture's, the target)."""
    kw = dict(n_inputs=F_IN, n_features=D, bandwidth=1.2, sigma=0.5, lam=1.0, tau=0.5, min_upload=16)
    old = [FedBNRExpertsClient(client_id=f"c{i}", switch_rate=switch_rate, **kw) for i in range(3)]
    new = FedBNRExpertsClient(client_id="new", switch_rate=switch_rate, **kw)
    server = FedBNRHierServer.for_client(new.personal)

    def sync(c: FedBNRExpertsClient) -> None:
        up = c.make_upload()
        if up is not None and server.apply(up):
            g = server.publish()
            for other in [*old, new]:
                other.apply_global(g)

    for t in range(join_after):
        for i, c in enumerate(old):
            x, y = stream(1, 1000 * i + t, 0.0)
            c.learn_many(x, y)
            sync(c)
    x_new, y_new = stream(n_new, 77, 1.5)
    record = []
    for t in range(n_new):
        xt, yt = x_new[t:t + 1], y_new[t:t + 1]
        experts = np.array([e.predict(xt[0]) for e in new.experts])
        before = new.predict(xt[0])
        learned = new.learn_many(xt, yt)
        record.append((experts, before, (float(learned[0][0]), float(learned[1][0])), float(yt[0])))
        sync(new)
    return old, new, server, record


def test_the_mixture_is_fixed_share_over_the_experts_gaussian_densities() -> None:
    alpha = 0.05
    _, new, _, record = run_fleet(alpha)
    w = np.full(3, 1.0 / 3.0)  # fixed share written out (tests/test_fixed_share.py checks it by hand)
    for experts, before, learned, y in record:
        mu, var = experts[:, 0], experts[:, 1]
        mean = float(w @ mu)
        assert before == pytest.approx((mean, float(w @ (var + mu**2)) - mean**2), rel=1e-9)
        assert learned == pytest.approx(before, rel=1e-9)  # learning returns the prediction made before it
        p = np.exp(gaussian_log_density(y, mu, var))
        w = (1 - alpha) * w * p / float(w @ p) + alpha / 3
    np.testing.assert_allclose(new.weights(), w, rtol=1e-9)


def test_its_log_loss_is_within_the_fixed_share_bound_of_each_expert() -> None:
    alpha = 0.05
    _, new, _, record = run_fleet(alpha)
    t_steps = len(record)
    expert_loss = -sum(gaussian_log_density(y, e[:, 0], e[:, 1]) for e, _, _, y in record)
    assert new.share.loss <= expert_loss.min() + math.log(3) + t_steps * -math.log1p(-alpha) + 1e-9
    # the joining client's relation differs from the fleet's: by the end the local expert leads
    assert EXPERTS[int(np.argmax(new.weights()))] == "local"


def test_each_expert_is_its_exact_posterior() -> None:
    old, new, server, _ = run_fleet()
    c = old[0]
    assert c.n_pending == 0 and new.n_pending == 0  # 96 rows, uploads of 16: everything is in the last global
    g = c.installed_global
    own_in, _ = server.clients[c.client_id]
    own = c.personal.working_own_stats()
    np.testing.assert_allclose(own.S, own_in.S, rtol=1e-12)

    # pooled: the prior of its weights is the shared posterior without its own (marginalised) contribution, with
    # a negligible personal scale; then all its own samples
    p, r, _ = marginal_contribution(own_in, g.sigma, g.tau)
    a_cav, h_cav = g.A - p, g.h - r
    mu_cav = np.linalg.solve(a_cav, h_cav)
    c0 = np.linalg.inv(a_cav) + c.pooled.prior_tau**2 * np.eye(a_cav.shape[0])
    prec = np.linalg.inv(c0) + own.S / g.sigma**2
    mean = np.linalg.solve(prec, np.linalg.solve(c0, mu_cav) + own.b / g.sigma**2)
    m_pool, cov_pool = c.pooled.posterior()
    np.testing.assert_allclose(m_pool, mean, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(cov_pool, np.linalg.inv(prec), rtol=1e-6, atol=1e-9)

    # personal: the same with the fitted τ (the plain client's posterior)
    c0 = np.linalg.inv(a_cav) + g.tau**2 * np.eye(a_cav.shape[0])
    prec = np.linalg.inv(c0) + own.S / g.sigma**2
    mean = np.linalg.solve(prec, np.linalg.solve(c0, mu_cav) + own.b / g.sigma**2)
    np.testing.assert_allclose(c.personal.posterior()[0], mean, rtol=1e-7, atol=1e-9)

    # local: Bayesian linear regression on its own samples alone, σ and the prior scale by their own evidence
    loc = c.local.installed_global
    s_prior = math.hypot(loc.lam, loc.tau)
    sig, lam, _ = fit_hyperparameters(own.S, own.b, own.n, own.q)
    assert loc.sigma == pytest.approx(sig, rel=2e-3) and s_prior == pytest.approx(lam, rel=2e-2)
    prec = np.eye(own.S.shape[0]) / s_prior**2 + own.S / loc.sigma**2
    np.testing.assert_allclose(c.local.posterior()[0], np.linalg.solve(prec, own.b / loc.sigma**2),
                               rtol=1e-7, atol=1e-9)


def test_bad_input_changes_no_expert() -> None:
    c = FedBNRExpertsClient(n_inputs=2, n_features=3, min_upload=4)
    x, y = stream(8, 0, 0.0)
    c.learn_many(x, y)
    before = [e.posterior()[0].copy() for e in c.experts], c.weights().copy()
    for bad in (np.array([[np.nan, 0.0]]), np.zeros((1, 3))):
        with pytest.raises(ValueError):
            c.learn_many(bad, np.zeros(1))
    with pytest.raises(ValueError):
        c.learn_many(x[:1], np.array([np.inf]))
    for e, m in zip(c.experts, before[0], strict=True):
        np.testing.assert_array_equal(e.posterior()[0], m)
    np.testing.assert_array_equal(c.weights(), before[1])
    with pytest.raises(ValueError, match="pooled_tau"):
        FedBNRExpertsClient(n_inputs=2, pooled_tau=0.0)


# =========================================================================== in the fleet


def test_the_fleet_sees_the_same_uploads_and_globals_with_or_without_the_mixture() -> None:
    """A client-side concern: with the experts' mixture (the default) every global is bit for bit the one of
    personalised FedBNR without it."""
    _, _, with_mix = run_personal_fleet({})
    _, _, without = run_personal_fleet({"experts": False})
    assert len(with_mix) == len(without) > 3
    for g, h in zip(with_mix, without, strict=True):
        assert all(np.array_equal(g.arrays[k], h.arrays[k]) for k in g.arrays)


def test_mixture_weights_reach_prometheus_and_the_dashboard() -> None:
    import json
    from pathlib import Path

    from prometheus_client import generate_latest

    from streamfed.runtime.exporter import StreamfedCollector, make_registry

    _, agents, _ = run_personal_fleet({})
    for a in agents:
        a.stats.update_from_learner(a.learner)
        w = [a.stats.learner_values[f"mixture_weight_{e}"] for e in EXPERTS]
        assert min(w) > 0 and sum(w) == pytest.approx(1.0, abs=1e-12)
    text = generate_latest(make_registry(StreamfedCollector([a.stats for a in agents]))).decode()
    for e in EXPERTS:
        assert f'streamfed_agent_learner_value{{client="a0",fleet="mix",name="mixture_weight_{e}"}}' in text
    dash = json.loads((Path(__file__).parents[1] / "broker_config/grafana/dashboards/streamfed.json").read_text())
    exprs = [t.get("expr", "") for p in dash["panels"] for t in p.get("targets", [])]
    assert any("mixture_weight_" in e for e in exprs)


def test_an_agent_with_the_mixture_resumes_from_its_snapshot_exactly() -> None:
    from streamfed.core import durable
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.sources import Reading

    _, agents, _ = run_personal_fleet({}, steps=40)
    a = agents[0]
    twin = AgentCore(a.cfg, a.client_id, a.index)
    twin.restore(durable.decode(durable.encode(a.snapshot())))
    rng = np.random.default_rng(3)
    for t in range(24):
        x, y = rng.normal(size=2), float(rng.normal())
        (p1, m1), (p2, m2) = (core.on_reading(Reading(f"n{t}", x, 100.0 + t, y)) for core in (a, twin))
        assert (p1.mean, p1.var) == (p2.mean, p2.var)
        for m, n in zip(m1, m2, strict=True):
            assert m.seq == n.seq and all(np.array_equal(m.arrays[k], n.arrays[k]) for k in m.arrays)
    assert a.learner.diagnostics() == twin.learner.diagnostics()


def test_cold_start_scores_each_expert_as_the_learner_alone_would_score() -> None:
    """`leave_one_out` with `trace_experts`: the personal expert's row is the plain personalised learner's (same
    globals, same samples: its MSE exactly), and the mixture's own row sits beside it."""
    from streamfed.evaluation.coldstart import leave_one_out
    from streamfed.evaluation.datasets import synthetic_fleet
    from streamfed.evaluation.replay import AlgorithmConfig

    fleet = synthetic_fleet(n_clients=3, n_steps=90, n_inputs=2, seed=1)
    kw = dict(n_kernels=1, n_features=4, kernels=("gaussian:1.0",))
    args = dict(join_step=50, windows=(10, 40), seeds=(0,), clients=("client-1",))
    mix = leave_one_out(fleet, ["fedbnr-personal"], AlgorithmConfig(
        **kw, params={"fedbnr-personal": {"min_upload": 8, "trace_experts": True}}), **args)
    alone = leave_one_out(fleet, ["fedbnr-personal"], AlgorithmConfig(
        **kw, params={"fedbnr-personal": {"min_upload": 8, "experts": False}}), **args)
    rows = {(r.algorithm, r.window): r for r in mix.rows}
    assert {a for a, _ in rows} == {"fedbnr-personal", *(f"fedbnr-personal:{e}" for e in EXPERTS)}
    for r in alone.rows:
        assert rows[("fedbnr-personal:personal", r.window)].mse == pytest.approx(r.mse, rel=1e-12)
        assert rows[("fedbnr-personal:personal", r.window)].n == r.n == r.window
