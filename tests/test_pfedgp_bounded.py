"""pFedGP at a bounded cost (issue 34, part 5): a budget bounded as a whole, a work credit that bounds refreshes
and local updates per sample, probabilities strictly inside (0, 1) computed in the log domain, no class cap.

Costs are asserted on the client's work counters (cost.py's units), never on the clock."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.pfedgp.budget import ClassBudget
from streamfed.algorithms.pfedgp.client import PFedGPClient
from streamfed.algorithms.pfedgp.cost import NODE_OVERHEAD, WorkCredit, fit_work, refresh_work
from streamfed.algorithms.pfedgp.estimator import PFedGPClassifier
from streamfed.algorithms.pfedgp.messages import PFedGPGlobal
from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of
from streamfed.algorithms.pfedgp.personal import NODE_FLOOR, GPTree
from streamfed.algorithms.pfedgp.quadrature import chain_log_probs, log_sigmoid_gauss
from streamfed.algorithms.pfedgp.tree import build_tree
from streamfed.algorithms.urk.network import URKArch


def blobs(n: int, k: int, seed: int, d: int = 2, spread: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """`n` samples of `k` classes, each class a Gaussian blob on a circle of radius 3."""
    rng = np.random.default_rng(seed)
    y = rng.integers(k, size=n)
    angle = 2 * math.pi * y / k
    centres = np.stack([3 * np.cos(angle), 3 * np.sin(angle)] + [np.zeros(n)] * (d - 2), axis=1)
    return centres + rng.normal(0, spread, (n, d)), y


def client(n_classes: int, **kw: object) -> PFedGPClient:
    layout = Layout(URKArch(n_inputs=2, widths=(4,), n_omega=8))
    args = {"budget": 16, "chains": 4, "learn_kernel": False, "lengthscale": 0.5, "seed": 0, **kw}
    return PFedGPClient(layout, initial_theta(layout, 0), omega_of(layout, 0), n_classes=n_classes,
                        **args)  # type: ignore[arg-type]


# =========================================================================== the log-domain probabilities


@pytest.mark.parametrize(("mu", "var"), [(0.0, 1.0), (2.5, 0.3), (-3.0, 7.5), (-40.0, 1.0), (60.0, 2.0), (-25.0, 1e-9)])
def test_log_sigmoid_gauss_against_arbitrary_precision(mu: float, var: float) -> None:
    """`log ∫ σ(f) N(f; μ, v) df` by 50-digit quadrature: the log-domain sum keeps what rounds to 0 or 1."""
    mpmath.mp.dps = 50
    if var < 1e-6:
        exact = -mpmath.log1p(mpmath.exp(-mu))
    else:
        def integrand(f: mpmath.mpf) -> mpmath.mpf:
            log_sigma = -mpmath.log1p(mpmath.exp(-f))
            return mpmath.exp(log_sigma - (f - mu) ** 2 / (2 * var)) / mpmath.sqrt(2 * mpmath.pi * var)

        s = 12 * math.sqrt(var)
        exact = mpmath.log(mpmath.quad(integrand, [mu - s, mu - s / 3, mu, mu + s / 3, mu + s]))
    got = float(log_sigmoid_gauss(np.array(mu), np.array(var)))
    assert got == pytest.approx(float(exact), rel=1e-6, abs=1e-9)
    # the other side, at −μ: the two probabilities sum to one
    other = float(log_sigmoid_gauss(np.array(-mu), np.array(var)))
    assert math.exp(got) + math.exp(other) == pytest.approx(1.0, abs=1e-7)


def test_chain_average_in_the_log_domain_is_the_plain_average() -> None:
    rng = np.random.default_rng(0)
    mu, var = rng.normal(0, 3, (5, 7)), rng.uniform(0.1, 4, (5, 7))
    left, right = chain_log_probs(mu, var)
    plain = np.mean(np.exp(log_sigmoid_gauss(mu, var)), axis=0)
    assert np.allclose(np.exp(left), plain, rtol=1e-12) and np.allclose(np.exp(right), 1 - plain, rtol=1e-9)


@settings(max_examples=30, deadline=None)
@given(n_classes=st.integers(2, 9), seed=st.integers(0, 10_000))
def test_tree_log_probabilities_are_the_product_form(n_classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tree = build_tree(range(n_classes), rng.normal(size=(n_classes, 3)), rng)
    p_left = rng.uniform(0.01, 0.99, (4, len(tree.nodes)))
    lp = tree.class_log_probabilities(np.log(p_left), np.log1p(-p_left))
    assert np.allclose(np.exp(lp), tree.class_probabilities(p_left), rtol=1e-12)


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), k=st.integers(2, 5), far=st.floats(0.0, 1e3))
def test_probabilities_strictly_inside_zero_one(seed: int, k: int, far: float) -> None:
    """Well-separated classes and a large output scale push the GP's probabilities to round to 0 and 1 in float64;
    every class probability stays strictly inside (0, 1), also at points far from the data, and they sum to 1."""
    X, y = blobs(12 * k, k, seed, spread=0.05)
    c = client(k + 2, outputscale=64.0, lengthscale=0.2)
    for xi, yi in zip(X, y, strict=True):
        p = c.learn(xi, float(yi))
        assert np.all(p > 0) and np.all(p < 1) and abs(p.sum() - 1) < 1e-9
    P = c.predict_many(np.concatenate([X, X + far]))
    assert np.all(P > 0) and np.all(P < 1) and np.allclose(P.sum(1), 1.0)
    # without the mixture the tree alone still never reaches 0 or 1 (the node floor)
    lp = c.model.log_proba(c.embed(X))
    assert np.all(lp < 0) and np.all(lp >= len(c.model.tree.nodes) * math.log(NODE_FLOOR) - 1e-9)


def test_the_mixture_is_the_stated_one() -> None:
    c = client(5, smoothing=0.01)
    X, y = blobs(30, 3, seed=1)
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, float(yi))
    tree = np.exp(c.model.log_proba(c.embed(X[:4])))
    plain = np.full((4, 5), 0.01 / 5)
    plain[:, list(c.model.classes)] += 0.99 * tree
    assert np.allclose(c.predict_many(X[:4]), plain, rtol=1e-12)


# =========================================================================== the budget, bounded as a whole


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 8), total=st.integers(1, 20),
       labels=st.lists(st.integers(0, 12), min_size=1, max_size=120), seed=st.integers(0, 99))
def test_budget_total_bounds_every_class(capacity: int, total: int, labels: list[int], seed: int) -> None:
    b = ClassBudget(n_inputs=1, capacity=capacity, seed=seed, total=total)
    for t, c in enumerate(labels):
        b.add(np.array([float(t)]), c)
        k = len(set(labels[: t + 1]))
        assert len(b) <= max(total, k)
    X, y, ids = b.arrays()
    k = len(set(labels))
    cap = max(1, min(capacity, total // k))
    for c in set(labels):
        assert np.sum(y == c) == min(cap, labels.count(c))
    assert np.array_equal(X[:, 0], ids.astype(float)) and all(labels[i] == c for i, c in zip(ids, y, strict=True))


def test_budget_shrunk_by_a_new_class_stays_uniform() -> None:
    """Class 0's 20 samples, kept 10 at a time, then a second class halves the share: each of the 20 is kept
    with probability 5/20 (a uniform subset of a uniform sample)."""
    counts = np.zeros(20)
    runs = 3000
    for seed in range(runs):
        b = ClassBudget(n_inputs=1, capacity=10, seed=seed, total=10)
        for t in range(20):
            b.add(np.array([float(t)]), 0)
        b.add(np.array([-1.0]), 1)
        X, y, ids = b.arrays()
        counts[ids[y == 0]] += 1
    expected = runs * 5 / 20
    assert np.all(np.abs(counts - expected) < 5 * math.sqrt(expected))


# =========================================================================== the work credit


def test_refresh_work_is_the_model_on_the_nodes() -> None:
    """A refresh's charged units against the model written out from the tree's nodes: fresh chains `burn_in`
    sweeps, continued ones `steps`, plus the posterior's factorisation."""
    X, y = blobs(40, 5, seed=3)
    m = GPTree(lengthscale=1.0, outputscale=4.0, chains=3, steps=2, burn_in=7, seed=0)
    w1 = m.fit(X, y, np.arange(40))
    sizes = [int(np.isin(y, node.classes).sum()) for node in m.tree.nodes]
    assert w1 == pytest.approx(3 * (7 + 1) * sum(n**3 + NODE_OVERHEAD for n in sizes))
    w2 = m.fit(X, y, np.arange(40))  # the same samples: every chain continues
    assert w2 == pytest.approx(3 * (2 + 1) * sum(n**3 + NODE_OVERHEAD for n in sizes))
    assert refresh_work(sizes, chains=3, sweeps=2) == w2


@settings(max_examples=20, deadline=None)
@given(per_sample=st.floats(1.0, 1e6), costs=st.lists(st.floats(0.0, 1e7), min_size=1, max_size=50))
def test_credit_bounds_the_work(per_sample: float, costs: list[float]) -> None:
    """Whatever the steps cost, what was spent after n samples is at most n · per_sample plus one step."""
    credit, n = WorkCredit(per_sample), 0
    for cost in costs:
        credit.earn()
        n += 1
        if credit.allows():
            credit.charge(cost)
        assert credit.spent <= n * per_sample + credit.largest + 1e-6 * credit.spent


@pytest.mark.slow  # over 2 s
@pytest.mark.parametrize("k", [2, 26])
def test_work_per_sample_is_bounded_whatever_the_classes(k: int) -> None:
    """A 26-class stream and a 2-class one under the same credit: the refresh work per sample stays within the
    allowance (plus the one refresh in debt), the budget within its total, so the classes seen change nothing."""
    per_sample = 5.0e5  # below a full refresh at either number of classes: the credit binds
    c = client(k, budget=64, max_budget=48, work_per_sample=per_sample)
    X, y = blobs(600, k, seed=k)
    for t, (xi, yi) in enumerate(zip(X, y, strict=True)):
        c.learn(xi, float(yi))
        assert len(c.budget) <= max(48, len(c.budget.classes))
        assert c.refresh_units <= (t + 1) * per_sample + c.credit.largest
    largest_possible = refresh_work([48] * 25, chains=4, sweeps=10)  # a fresh tree of the whole budget, deepest
    assert c.credit.largest <= largest_possible
    assert c.refresh_units / c.n <= per_sample + largest_possible / c.n
    # the same stream without a credit refreshes at every kept sample: far more work
    free = client(k, budget=64, max_budget=48)
    for xi, yi in zip(X, y, strict=True):
        free.learn(xi, float(yi))
    assert free.refreshes > c.refreshes and free.refresh_units > c.refresh_units


def test_local_updates_draw_on_their_own_credit() -> None:
    pytest.importorskip("torch")
    per_sample = 4.0e6
    c = client(8, budget=16, max_budget=64, work_per_sample=per_sample, learn_kernel=True, fit_every=10,
               fit_steps=1)
    X, y = blobs(200, 8, seed=5)
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, float(yi))
        while c.take_update() is not None:
            pass
    one_fit = fit_work([64] * 7, chains=c.train_chains, steps=1)
    assert 0 < c.n_fits < 200 // 10  # due 20 times; the credit allowed fewer
    assert c.fit_units <= c.n * per_sample / 2 + one_fit
    assert c.refresh_units <= c.n * per_sample / 2 + c.credit.largest


def test_a_new_network_waits_for_the_credit_and_predictions_keep_the_old_one() -> None:
    c = client(3, work_per_sample=1e3)  # far below one refresh: in debt after the first
    X, y = blobs(6, 3, seed=7)
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, float(yi))
    assert c.credit.balance < 0
    before = c.predict(X[0])
    theta = c.theta + 0.3 * np.random.default_rng(0).standard_normal(c.theta.size)
    assert c.apply_global(PFedGPGlobal(1, 1, theta, {}))
    assert np.array_equal(c.theta, theta) and not np.array_equal(c.model_theta, theta)
    assert np.array_equal(c.predict(X[0]), before)  # the GP and its network stay together
    refreshes = c.refreshes
    while c.refreshes == refreshes:  # the credit pays its debt, then the re-embedding runs
        c.learn(X[1], float(y[1]))
    assert np.array_equal(c.model_theta, theta)


# =========================================================================== the River estimator


def test_estimator_accepts_a_17th_class_and_more() -> None:
    model = PFedGPClassifier(widths=(4,), n_omega=8, chains=3, learn_kernel=False)
    X, y = blobs(120, 30, seed=11)
    labels = [f"class-{int(v)}" for v in y]
    for xi, yi in zip(X, labels, strict=True):
        model.learn_one({"u": xi[0], "v": xi[1]}, yi)
    seen = set(labels)
    assert len(seen) > 17
    p = model.predict_proba_one({"u": 0.1, "v": 0.2})
    assert set(p) == seen and sum(p.values()) == pytest.approx(1.0)
    assert all(0.0 < v < 1.0 for v in p.values())
    assert len(model.client.budget) <= max(512, len(seen))
    with pytest.raises(ValueError, match="max_classes"):
        capped = PFedGPClassifier(widths=(4,), n_omega=8, chains=3, learn_kernel=False, max_classes=2)
        for i in range(3):
            capped.learn_one({"u": float(i)}, i)


def test_estimator_predict_then_learn_reuses_the_prediction() -> None:
    """River's prequential loop predicts, then learns the same x: the client's prediction is not made twice."""
    model = PFedGPClassifier(widths=(4,), n_omega=8, chains=3, learn_kernel=False)
    X, y = blobs(30, 3, seed=12)
    reused = 0
    for xi, yi in zip(X, y, strict=True):
        p = model.predict_proba_one({"u": xi[0], "v": xi[1]})
        c = model.client
        before = (c.predict_units, c.n_classes) if c is not None else (0.0, 0)
        model.learn_one({"u": xi[0], "v": xi[1]}, int(yi))
        if p and int(yi) in p:  # a known label: the staged prediction is the one learnt with
            assert model.client.predict_units == before[0]
            reused += 1
    assert reused >= 25


def test_fleet_params_reach_the_client() -> None:
    from streamfed.algorithms.pfedgp import ALGORITHM
    from streamfed.fleet.config import FleetConfig

    cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2,
                      params={"n_classes": 40, "widths": [4], "n_omega": 8, "budget": 8, "chains": 3,
                              "learn_kernel": False, "max_budget": 24, "work_per_sample": 1e5, "smoothing": 1e-3})
    learner = ALGORITHM.learner(cfg, "a", 0)
    X, y = blobs(120, 40, seed=21)
    for xi, yi in zip(X, y, strict=True):
        learner.learn(xi, float(yi))
    c = learner.client
    assert len(c.budget) <= max(24, len(c.budget.classes)) and c.refresh_units <= c.n * 1e5 + c.credit.largest
    p = learner.class_probabilities(X[0])
    assert p.shape == (40,) and np.all(p >= 1e-3 / 40 * (1 - 1e-9)) and np.all(p < 1)


def test_a_stored_client_continues_with_its_credit_and_budget() -> None:
    """The state format carries the credit, the counters and the total: a restored client learns exactly on."""
    from streamfed.core.durable import decode, encode

    c = client(5, max_budget=20, work_per_sample=3e5)
    X, y = blobs(120, 5, seed=31)
    for xi, yi in zip(X[:100], y[:100], strict=True):
        c.learn(xi, float(yi))
    restored = decode(encode(c))
    assert restored.credit.balance == c.credit.balance and restored.budget.total == 20
    for xi, yi in zip(X[100:], y[100:], strict=True):
        assert np.array_equal(c.learn(xi, float(yi)), restored.learn(xi, float(yi)))
    assert (restored.refreshes, restored.refresh_units) == (c.refreshes, c.refresh_units)
