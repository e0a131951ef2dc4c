"""pFedGP (streamfed.algorithms.pfedgp) against plain NumPy transcriptions of the paper's equations kept in
this file (explicit inverses, no shared code with the package's factorised forms).

1. Pólya–Gamma draws: the known mean `tanh(c/2)/(2c)` and variance of PG(1, c), exact and series samplers.
2. The Gibbs conditional `f | ω ~ N(Σκ, Σ)`, `Σ = (K⁻¹ + Ω)⁻¹` (eq. 14) and the predictive (eq. 17–18) for a
   given `ω`; FITC (eq. 21–23) against its definition, and FITC with `X̄ = X` equals the full model.
3. The objectives in torch against scipy's Gaussian log-density / numerical integration.
4. A binary classifier on a toy problem against scikit-learn's Laplace GaussianProcessClassifier with the
   same fixed kernel.
5. GP-Tree properties (hypothesis): one leaf per class, probabilities sum to one, separated clusters split.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import multivariate_normal

from streamfed.algorithms.pfedgp.fitc import FITCPosterior, fitc_gibbs
from streamfed.algorithms.pfedgp.gibbs import FullPosterior, gibbs, sample_f
from streamfed.algorithms.pfedgp.personal import GPTree
from streamfed.algorithms.pfedgp.polya_gamma import pg_mean, sample_pg, sample_pg_series
from streamfed.algorithms.pfedgp.quadrature import sigmoid_gauss
from streamfed.algorithms.pfedgp.tree import build_tree

# =========================================================================== plain transcriptions (oracles)


def sig(f: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-f))


def rbf_plain(A: np.ndarray, B: np.ndarray, ls: float = 1.0, s: float = 1.0) -> np.ndarray:
    out = np.empty((A.shape[0], B.shape[0]))
    for i in range(A.shape[0]):
        for j in range(B.shape[0]):
            out[i, j] = s * math.exp(-0.5 * float(np.sum((A[i] - B[j]) ** 2)) / ls**2)
    return out


def pg_var(c: float) -> float:
    """Var PG(1, c) = (sinh c − c) / (4 c³ cosh²(c/2)), 1/24 at c = 0."""
    if abs(c) < 1e-8:
        return 1.0 / 24.0
    return (math.sinh(c) - c) / (4.0 * c**3 * math.cosh(c / 2.0) ** 2)


def conditional_plain(K: np.ndarray, y: np.ndarray, om: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 14: mean Σκ, covariance Σ = (K⁻¹ + Ω)⁻¹."""
    S = np.linalg.inv(np.linalg.inv(K) + np.diag(om))
    return S @ (y - 0.5), S


def predictive_plain(K: np.ndarray, ks: np.ndarray, kss: float, y: np.ndarray, om: np.ndarray) -> tuple[float, float]:
    """Eq. 17 for one ω and one test input."""
    Oi = np.diag(1.0 / om)
    M = np.linalg.inv(Oi + K)
    return float(ks @ M @ Oi @ (y - 0.5)), float(kss - ks @ M @ ks)


def bernoulli_gauss(mu: float, var: float) -> float:
    """Eq. 18 by adaptive quadrature."""
    sd = math.sqrt(var)
    val, _ = integrate.quad(lambda f: sig(f) * math.exp(-0.5 * (f - mu) ** 2 / var) / (sd * math.sqrt(2 * math.pi)),
                            mu - 12 * sd, mu + 12 * sd, epsabs=1e-12)
    return val


def fitc_plain(Kmm: np.ndarray, Knm: np.ndarray, kdiag: np.ndarray, y: np.ndarray, om: np.ndarray
               ) -> dict[str, np.ndarray]:
    """Appendix B, eq. 19–23, with explicit inverses."""
    kappa = y - 0.5
    Oi = np.diag(1.0 / om)
    Kmm_i = np.linalg.inv(Kmm)
    Q = Knm @ Kmm_i @ Knm.T
    Lam = Oi + np.diag(kdiag - np.diag(Q))
    Li = np.linalg.inv(Lam)
    B = Kmm + Knm.T @ Li @ Knm
    Bi = np.linalg.inv(B)
    mean_f = Knm @ Bi @ Knm.T @ Li @ Oi @ kappa
    cov_f = np.diag(kdiag) - Knm @ (Kmm_i - Bi) @ Knm.T
    return {"mean_f": mean_f, "var_f": np.diag(cov_f), "c": Bi @ Knm.T @ Li @ Oi @ kappa, "Kmm_i": Kmm_i, "Bi": Bi,
            "z": Oi @ kappa, "marg_cov": Lam + Q}


def toy(n: int = 30, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 1))
    y = (rng.uniform(size=n) < sig(2.0 * np.sin(X[:, 0]))).astype(float)
    return X, y


# =========================================================================== 1. Pólya–Gamma


@pytest.mark.parametrize("sampler", ["exact", "series"])
@pytest.mark.parametrize("c", [0.0, 0.7, 3.0, 12.0])
def test_pg_moments(sampler: str, c: float) -> None:
    rng = np.random.default_rng(5)
    n = 100_000
    w = sample_pg(np.full(n, c), rng) if sampler == "exact" else sample_pg_series(np.full(n, c), rng)
    mean = math.tanh(c / 2) / (2 * c) if c else 0.25
    assert abs(w.mean() - mean) < 5 * math.sqrt(pg_var(c) / n)
    assert w.var() == pytest.approx(pg_var(c), rel=0.05)
    assert float(pg_mean(np.array(c))) == pytest.approx(mean, rel=1e-12)
    assert np.all(w > 0)


def test_pg_refuses_non_finite_tilts() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        sample_pg(np.array([0.0, np.nan]), np.random.default_rng(0))


def test_quadrature_against_adaptive_integration() -> None:
    for mu, var in [(0.3, 0.01), (-2.0, 1.0), (1.5, 4.0), (-0.7, 8.0)]:  # up to the default output scale
        assert float(sigmoid_gauss(np.array(mu), np.array(var))) == pytest.approx(bernoulli_gauss(mu, var), abs=1e-6)
    assert float(sigmoid_gauss(np.array(1.5), np.array(25.0))) == pytest.approx(bernoulli_gauss(1.5, 25.0), abs=1e-4)


# =========================================================================== 2. the conditionals


def test_f_given_omega_matches_eq14_in_distribution() -> None:
    X, y = toy(6)
    K = rbf_plain(X, X, 1.0, 2.0)
    rng = np.random.default_rng(1)
    om = rng.uniform(0.05, 0.5, 6)
    mean, S = conditional_plain(K, y, om)
    C = 40_000
    Lk = np.linalg.cholesky(K + 1e-8 * 2.0 * np.eye(6))
    f = sample_f(K, Lk, y - 0.5, np.tile(om, (C, 1)), rng)
    se = np.sqrt(np.diag(S) / C)
    assert np.all(np.abs(f.mean(0) - mean) < 5 * se)
    assert np.allclose(np.cov(f.T), S, atol=0.03 * np.max(np.abs(S)))


def test_predictive_for_given_omega_matches_eq17_18() -> None:
    X, y = toy(12, seed=2)
    K = rbf_plain(X, X, 0.8, 3.0)
    rng = np.random.default_rng(2)
    om = rng.uniform(0.02, 1.0, (3, 12))
    post = FullPosterior.of(K, y - 0.5, om)
    xs = np.array([[-2.5], [0.1], [2.9]])
    ks = rbf_plain(X, xs, 0.8, 3.0)
    mu, var = post.moments(ks, np.full(3, 3.0))
    probs = post.prob(ks, np.full(3, 3.0))
    for t in range(3):
        plain = [predictive_plain(K, ks[:, t], 3.0, y, om[c]) for c in range(3)]
        assert mu[:, t] == pytest.approx([p[0] for p in plain], abs=1e-9)
        assert var[:, t] == pytest.approx([p[1] for p in plain], abs=1e-9)
        assert probs[t] == pytest.approx(np.mean([bernoulli_gauss(*p) for p in plain]), abs=1e-6)


def test_fitc_against_its_definition() -> None:
    X, y = toy(10, seed=3)
    Z = np.array([[-2.0], [-0.5], [1.0], [2.5]])
    Kmm, Knm = rbf_plain(Z, Z, 1.0, 2.0), rbf_plain(X, Z, 1.0, 2.0)
    kdiag = np.full(10, 2.0)
    om = np.random.default_rng(3).uniform(0.05, 0.6, (2, 10))
    post = FITCPosterior.of(Kmm, Knm, kdiag, y - 0.5, om)
    xs = np.array([[0.3], [-2.9]])
    ks = rbf_plain(Z, xs, 1.0, 2.0)
    mu, var = post.moments(ks, np.full(2, 2.0))
    for c in range(2):
        p = fitc_plain(Kmm, Knm, kdiag, y, om[c])
        assert post.c[c] == pytest.approx(p["c"], abs=1e-7)
        assert mu[c] == pytest.approx(ks.T @ p["c"], abs=1e-7)  # eq. 22
        assert var[c] == pytest.approx(2.0 - np.einsum("it,ij,jt->t", ks, p["Kmm_i"] - p["Bi"], ks), abs=1e-7)


def test_fitc_with_inducing_inputs_at_the_data_is_the_full_model() -> None:
    X, y = toy(8, seed=4)
    K = rbf_plain(X, X, 1.0, 2.0)
    om = np.random.default_rng(4).uniform(0.05, 0.6, (2, 8))
    full, fitc = FullPosterior.of(K, y - 0.5, om), FITCPosterior.of(K, K, np.full(8, 2.0), y - 0.5, om)
    xs = np.linspace(-3, 3, 5)[:, None]
    ks = rbf_plain(X, xs, 1.0, 2.0)
    for a, b in zip(full.moments(ks, np.full(5, 2.0)), fitc.moments(ks, np.full(5, 2.0)), strict=True):
        assert np.allclose(a, b, atol=1e-5)


# =========================================================================== 3. objectives (torch)


def test_objectives_against_scipy() -> None:
    torch = pytest.importorskip("torch")
    from streamfed.algorithms.pfedgp.objectives import (
        log_marginal_fitc,
        log_marginal_full,
        log_predictive_fitc,
        log_predictive_full,
    )

    X, y = toy(9, seed=6)
    Z = np.array([[-1.5], [0.0], [1.5]])
    K, Knm, Kmm = rbf_plain(X, X, 1.0, 2.0), rbf_plain(X, Z, 1.0, 2.0), rbf_plain(Z, Z, 1.0, 2.0)
    om = np.random.default_rng(6).uniform(0.05, 0.6, (2, 9))
    T = torch.tensor
    # eq. 16: log N(Ω⁻¹κ | 0, K + Ω⁻¹)
    plain = np.mean([multivariate_normal(np.zeros(9), K + np.diag(1 / o)).logpdf((y - 0.5) / o) for o in om])
    assert float(log_marginal_full(T(K), T(y), T(om))) == pytest.approx(plain, rel=1e-10)
    # eq. 23: log N(Ω⁻¹κ | 0, Λ + Q)
    plain = np.mean([multivariate_normal(np.zeros(9), (p := fitc_plain(Kmm, Knm, np.full(9, 2.0), y, o))["marg_cov"])
                     .logpdf(p["z"]) for o in om])
    assert float(log_marginal_fitc(T(Kmm), T(Knm), T(np.full(9, 2.0)), T(y), T(om))) == pytest.approx(plain, rel=1e-7)
    # eq. 3–4 / 17–18: mean over ω of Σ_t log p(y*_t | ω)
    xs, ys = np.array([[0.5], [-2.0]]), np.array([1.0, 0.0])
    ks = rbf_plain(X, xs, 1.0, 2.0)
    plain = 0.0
    for o in om:
        for t in range(2):
            m, v = predictive_plain(K, ks[:, t], 2.0, y, o)
            p1 = bernoulli_gauss(m, v)
            plain += math.log(p1 if ys[t] == 1 else 1 - p1) / 2
    got = log_predictive_full(T(K), T(ks), T(np.full(2, 2.0)), T(y), T(ys), T(om))
    assert float(got) == pytest.approx(plain, abs=1e-6)
    kms = rbf_plain(Z, xs, 1.0, 2.0)
    plain = 0.0
    for o in om:
        p = fitc_plain(Kmm, Knm, np.full(9, 2.0), y, o)
        for t in range(2):
            m = float(kms[:, t] @ p["c"])
            v = float(2.0 - kms[:, t] @ (p["Kmm_i"] - p["Bi"]) @ kms[:, t])
            p1 = bernoulli_gauss(m, v)
            plain += math.log(p1 if ys[t] == 1 else 1 - p1) / 2
    got = log_predictive_fitc(T(Kmm), T(Knm), T(np.full(9, 2.0)), T(kms), T(np.full(2, 2.0)), T(y), T(ys), T(om))
    assert float(got) == pytest.approx(plain, abs=1e-6)


# =========================================================================== 4. against scikit-learn


@pytest.mark.parametrize("seed", [0, 1])
def test_binary_classifier_agrees_with_laplace(seed: int) -> None:
    """Gibbs is exact in the limit; Laplace (scikit-learn) approximates the posterior by a Gaussian at its mode
    and the predictive by a probit: on a smooth toy problem the two agree to within 0.06 in probability."""
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    X, y = toy(40, seed=seed)
    xs = np.linspace(-3, 3, 25)[:, None]
    ref = GaussianProcessClassifier(ConstantKernel(2.0, "fixed") * RBF(1.0, "fixed"), optimizer=None).fit(X, y)
    p_ref = ref.predict_proba(xs)[:, 1]
    post = gibbs(rbf_plain(X, X, 1.0, 2.0), y, chains=60, steps=40, rng=np.random.default_rng(seed))
    p = post.prob(rbf_plain(X, xs, 1.0, 2.0), np.full(25, 2.0))
    assert np.max(np.abs(p - p_ref)) < 0.06
    fitc = fitc_gibbs(rbf_plain(X, X, 1.0, 2.0), rbf_plain(X, X, 1.0, 2.0), np.full(40, 2.0), y, chains=60,
                      steps=40, rng=np.random.default_rng(seed))
    assert np.max(np.abs(fitc.prob(rbf_plain(X, xs, 1.0, 2.0), np.full(25, 2.0)) - p_ref)) < 0.06


# =========================================================================== 5. GP-Tree


@settings(max_examples=40, deadline=None)
@given(n_classes=st.integers(1, 9), seed=st.integers(0, 10_000))
def test_tree_properties(n_classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    classes = list(rng.choice(50, n_classes, replace=False))
    protos = rng.normal(size=(n_classes, 3))
    tree = build_tree(classes, protos, rng)
    assert len(tree.nodes) == n_classes - 1  # a full binary tree with one leaf per class
    paths = {c: tuple(tree.paths[c]) for c in classes}
    assert len(set(paths.values())) == n_classes
    for v, node in enumerate(tree.nodes):
        assert node.left and node.right and not set(node.left) & set(node.right)
        assert {c for c in classes if any(u == v for u, _ in tree.paths[c])} == set(node.classes)
        for c in node.left:
            assert (v, True) in tree.paths[c]
    p_left = rng.uniform(size=(5, max(len(tree.nodes), 1)))[:, : len(tree.nodes)]
    probs = tree.class_probabilities(p_left)
    assert probs.shape == (5, n_classes) and np.allclose(probs.sum(1), 1.0) and np.all(probs >= 0)


def test_tree_splits_separated_clusters_at_the_root() -> None:
    rng = np.random.default_rng(0)
    protos = np.concatenate([rng.normal(0, 0.1, (3, 2)), rng.normal(10, 0.1, (4, 2))])
    tree = build_tree(range(7), protos, rng)
    assert sorted(map(sorted, (tree.nodes[0].left, tree.nodes[0].right))) == [[0, 1, 2], [3, 4, 5, 6]]


def test_gp_tree_classifies_and_sums_to_one() -> None:
    rng = np.random.default_rng(1)
    centres = np.array([[0, 0], [3, 0], [0, 3], [3, 3]], dtype=float)
    y = np.repeat([2, 5, 6, 9], 12)
    E = centres[np.repeat(np.arange(4), 12)] + rng.normal(0, 0.4, (48, 2))
    for inducing in (None, centres + 0.1):
        model = GPTree(lengthscale=1.0, outputscale=4.0, chains=6, steps=5, inducing=inducing, seed=0)
        model.fit(E, y, np.arange(48))
        p = model.proba(centres)
        assert model.classes == (2, 5, 6, 9) and np.allclose(p.sum(1), 1.0)
        assert [model.classes[i] for i in p.argmax(1)] == [2, 5, 6, 9]


# =========================================================================== 6. streaming: budget, client, server

from river import checks  # noqa: E402

from streamfed import algorithms  # noqa: E402
from streamfed.algorithms.base import Aggregation, Learner  # noqa: E402
from streamfed.algorithms.chunks import split_vector  # noqa: E402
from streamfed.algorithms.pfedgp import ALGORITHM, layout_of  # noqa: E402
from streamfed.algorithms.pfedgp.budget import ClassBudget  # noqa: E402
from streamfed.algorithms.pfedgp.client import PFedGPClient  # noqa: E402
from streamfed.algorithms.pfedgp.estimator import PFedGPClassifier  # noqa: E402
from streamfed.algorithms.pfedgp.messages import ChunkItem, PFedGPGlobal  # noqa: E402
from streamfed.algorithms.pfedgp.network import Layout, initial_theta, omega_of  # noqa: E402
from streamfed.algorithms.pfedgp.server import PFedGPServer  # noqa: E402
from streamfed.algorithms.urk.network import URKArch  # noqa: E402
from streamfed.fleet.config import FleetConfig  # noqa: E402


def urk_embedding_plain(theta: np.ndarray, arch: URKArch, om: np.ndarray, X: np.ndarray) -> np.ndarray:
    """URK's features written out: MLP (tanh between layers), u = f(x)·(ω/ℓ)ᵀ, [cos u, sin u]/√(m−1)."""
    i, h = 0, X.copy()
    sizes = (arch.n_inputs, *arch.widths)
    for layer in range(len(arch.widths)):
        W = theta[i:i + sizes[layer + 1] * sizes[layer]].reshape(sizes[layer + 1], sizes[layer])
        i += W.size
        c = theta[i:i + sizes[layer + 1]]
        i += c.size
        h = h @ W.T + c
        if layer < len(arch.widths) - 1:
            h = np.tanh(h)
    log_ls = theta[i:i + arch.latent]
    u = h @ (om / np.exp(log_ls)).T
    return np.concatenate([np.cos(u), np.sin(u)], axis=1) / math.sqrt(arch.n_omega - 1)


def blobs(n_per: int, classes: list[int], seed: int, d: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = {c: np.array([math.cos(c), math.sin(c)] + [0.0] * (d - 2)) * 2.5 for c in classes}
    y = np.array([classes[i % len(classes)] for i in range(n_per * len(classes))])
    rng.shuffle(y)
    return np.stack([centres[c] + rng.normal(0, 0.4, d) for c in y]), y


def small_client(**kw: object) -> PFedGPClient:
    layout = Layout(URKArch(n_inputs=2, widths=(4,), n_omega=8), int(kw.pop("inducing", 0)))  # type: ignore[call-overload]
    args = {"n_classes": 6, "budget": 8, "chains": 4, "learn_kernel": False, "lengthscale": 0.5, "seed": 0, **kw}
    return PFedGPClient(layout, initial_theta(layout, 0), omega_of(layout, 0), **args)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 6), labels=st.lists(st.integers(0, 3), min_size=1, max_size=60), seed=st.integers(0, 99))
def test_budget_is_bounded_per_class_and_keeps_ids(capacity: int, labels: list[int], seed: int) -> None:
    b = ClassBudget(n_inputs=1, capacity=capacity, seed=seed)
    for t, c in enumerate(labels):
        b.add(np.array([float(t)]), c)
    X, y, ids = b.arrays()
    for c in set(labels):
        assert np.sum(y == c) == min(capacity, labels.count(c))
    assert np.array_equal(X[:, 0], ids.astype(float))  # a kept row is the sample its id names
    assert all(labels[i] == c for i, c in zip(ids, y, strict=True)) and len(set(ids.tolist())) == len(ids)


def test_budget_reservoir_is_uniform() -> None:
    counts = np.zeros(20)
    for seed in range(3000):
        b = ClassBudget(n_inputs=1, capacity=5, seed=seed)
        for t in range(20):
            b.add(np.array([float(t)]), 0)
        counts[b.arrays()[2]] += 1
    expected = 3000 * 5 / 20
    assert np.all(np.abs(counts - expected) < 5 * math.sqrt(expected))


def test_client_streams_probabilities_and_rebuilds_for_a_new_class() -> None:
    c = small_client()
    X, y = blobs(10, [1, 4], seed=0)
    for xi, yi in zip(X, y, strict=True):
        p = c.learn(xi, float(yi))
        assert p.shape == (6,) and abs(p.sum() - 1) < 1e-12 and np.all(p >= 0)
    assert c.model.classes == (1, 4) and len(c.model.tree.nodes) == 1
    tree_before = c.model.tree
    X3, _ = blobs(1, [5], seed=1)
    c.learn(X3[0], 5.0)
    assert c.model.classes == (1, 4, 5) and c.model.tree is not tree_before and len(c.model.tree.nodes) == 2
    p = c.predict(X3[0])
    assert np.allclose(p[[0, 2, 3]], c.smoothing / 6, rtol=1e-9, atol=0)  # unseen classes: the mixture's floor only
    Xt, yt = blobs(10, [1, 4], seed=9)
    assert np.mean(np.argmax(c.predict_many(Xt), axis=1) == yt) > 0.9


def test_client_refuses_bad_labels_and_inputs_without_changing() -> None:
    c = small_client()
    c.learn(np.array([1.0, 0.0]), 1.0)
    n, seen = c.n, c.budget.seen
    for y in (0.5, -1.0, 6.0, math.nan):
        with pytest.raises(ValueError):
            c.learn(np.array([1.0, 0.0]), y)
    with pytest.raises(ValueError):
        c.learn(np.array([math.inf, 0.0]), 1.0)
    assert (c.n, c.budget.seen) == (n, seen)


def test_chains_continue_for_kept_samples() -> None:
    c = small_client(budget=50)
    X, y = blobs(5, [0, 3], seed=2)
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, float(yi))
    before = {i: w.copy() for i, w in c.model._omega[0].items()}
    c.learn(X[0], float(y[0]))
    after = c.model._omega[0]
    assert set(before) < set(after)  # one more sample, the others kept their chains (then moved on)
    assert len(after) == len(before) + 1


def test_new_network_version_reembeds_the_budget() -> None:
    c = small_client(budget=6)
    X, y = blobs(8, [0, 2], seed=3)
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, float(yi))
    rng = np.random.default_rng(3)
    theta = c.theta + 0.1 * rng.standard_normal(c.theta.size)
    assert c.apply_global(PFedGPGlobal(1, 1, theta, {})) and c.epoch == 1
    Xb, _, _ = c.budget.arrays()
    assert np.allclose(c.model.E, urk_embedding_plain(theta, c.layout.arch, c.omega, Xb), atol=1e-12)
    assert not c.apply_global(PFedGPGlobal(1, 1, theta, {}))  # not newer
    with pytest.raises(ValueError, match="without a new network version"):
        c.apply_global(PFedGPGlobal(2, 1, theta + 1.0, {}))
    with pytest.raises(ValueError):
        c.apply_global(PFedGPGlobal(3, 2, np.full_like(theta, np.nan), {}))
    assert c.epoch == 1 and np.array_equal(c.theta, theta)


def test_local_update_is_chunked_and_bounded() -> None:
    pytest.importorskip("torch")
    c = small_client(learn_kernel=True, fit_every=20, fit_steps=2, max_chunk_numbers=7)
    X, y = blobs(10, [0, 3], seed=4)
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, float(yi))
    ups = []
    while (up := c.take_update()) is not None:
        ups.append(up)
    assert ups and all(u.arrays["chunk"].size <= 7 and u.n_samples == 0 for u in ups)
    assert [u.seq for u in ups] == list(range(1, len(ups) + 1))
    whole = np.concatenate([u.arrays["chunk"] for u in ups])
    assert whole.size == c.layout.n_params and np.any(whole != 0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n_clients=st.integers(1, 4), chunk=st.integers(1, 5))
def test_server_fedavg_from_chunks_in_any_order(seed: int, n_clients: int, chunk: int) -> None:
    """θ₀ + Σ w δ / Σ w, whatever the order and however often pieces are repeated."""
    rng = np.random.default_rng(seed)
    theta0 = rng.normal(size=9)
    deltas = {f"c{i}": rng.normal(size=9) for i in range(n_clients)}
    weights = {f"c{i}": float(rng.integers(1, 50)) for i in range(n_clients)}
    server = PFedGPServer(theta0, min_proposal_weight=1.0, proposal_quorum=1.0)
    items = []
    for name, d in deltas.items():
        for k, ch in enumerate(split_vector(1, d, chunk)):
            items.append(ChunkItem(name, k + 1, 0, 0, ch, weights[name]))
    order = list(rng.permutation(len(items))) + list(rng.integers(0, len(items), 5))  # with repeats
    for i in order:
        server.apply(items[int(i)])
    g = server.publish()
    expected = theta0 + sum(weights[n] * deltas[n] for n in deltas) / sum(weights.values())
    assert g.epoch == 1 and np.allclose(g.theta, expected, atol=1e-12)
    assert g.included == {n: len(split_vector(1, deltas[n], chunk)) for n in deltas}


def test_server_quorum_stale_and_refusals() -> None:
    server = PFedGPServer(np.zeros(4), min_proposal_weight=10.0, proposal_quorum=1.0)
    one = split_vector(1, np.ones(4), 4)[0]
    server.apply(ChunkItem("a", 1, 0, 0, one, 20.0))
    server.heard.add("b")  # b was heard but proposed nothing: the quorum (all heard) is not met
    assert server.publish().epoch == 0
    server.apply(ChunkItem("b", 1, 0, 0, one, 5.0))
    g = server.publish()
    assert g.epoch == 1 and np.allclose(g.theta, np.ones(4))
    server.apply(ChunkItem("a", 2, 0, 0, split_vector(2, np.ones(4), 4)[0], 20.0))  # computed on version 0
    assert server.stale_chunks == 1 and server.prop_weight == 0.0
    for bad in (ChunkItem("a", 3, 0, 2, one, 1.0), ChunkItem("a", 3, 0, 1, split_vector(3, np.ones(5), 5)[0], 1.0),
                ChunkItem("a", 3, 0, 1, one, math.inf), ChunkItem("a", 0, 0, 1, one, 1.0)):
        with pytest.raises(ValueError):
            server.validate(bad)


def test_contract_learner_and_aggregation() -> None:
    cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2,
                      params={"n_classes": 3, "widths": [4], "n_omega": 8, "budget": 8, "chains": 4})
    learner, agg = ALGORITHM.learner(cfg, "a", 0), ALGORITHM.aggregation(cfg)
    assert isinstance(learner, Learner) and isinstance(agg, Aggregation)
    assert "pfedgp" in algorithms.names() and algorithms.get("pfedgp") is ALGORITHM
    assert learner.predict(np.zeros(2)) == (0.0, None)
    with pytest.raises(ValueError):
        learner.learn(np.zeros(2), 3.0)
    assert learner.regret().n == 0
    X, y = blobs(6, [0, 2], seed=5)
    for xi, yi in zip(X, y, strict=True):
        cls, var = learner.learn(xi, float(yi))
        assert var is None and cls in (0.0, 1.0, 2.0)
    r = learner.regret()
    assert r.n == 12 and math.isfinite(r.loss) and r.best_loss == pytest.approx(12 * math.log(2))
    assert layout_of(cfg).n_params == agg.server.theta.size


def test_agent_without_torch_predicts_and_learns() -> None:
    import subprocess
    import sys

    code = """
import sys
sys.modules["torch"] = None
sys.modules["polyagamma"] = None  # the series sampler takes over
import numpy as np
from streamfed.algorithms import get
from streamfed.fleet.config import FleetConfig
cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2, params={"n_classes": 3, "widths": [4], "n_omega": 8,
                  "budget": 6, "chains": 3, "fit_every": 4})
learner = get("pfedgp").learner(cfg, "a", 0)
for t in range(12):
    learner.learn(np.array([t % 2 * 2.0 - 1.0, 0.5]), float(t % 2))
assert learner.predict(np.array([1.0, 0.5]))[0] == 1.0 and learner.take_update() is None
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize("params", list(PFedGPClassifier._unit_test_params()))
def test_river_check_estimator(params: dict) -> None:
    checks.check_estimator(PFedGPClassifier(**params))


def test_river_classifier_learns_blobs() -> None:
    model = PFedGPClassifier(widths=(4,), n_omega=8, budget=16, chains=4, learn_kernel=False)
    X, y = blobs(20, [0, 1, 2], seed=6)
    names = {0: "a", 1: "b", 2: "c"}
    for xi, yi in zip(X, y, strict=True):
        model.learn_one({"u": xi[0], "v": xi[1]}, names[int(yi)])
    Xt, yt = blobs(10, [0, 1, 2], seed=7)
    preds = [model.predict_one({"u": a, "v": b}) for a, b in Xt]
    assert np.mean([p == names[int(t)] for p, t in zip(preds, yt, strict=True)]) > 0.85
    proba = model.predict_proba_one({"u": 0.0, "v": 0.0})
    assert set(proba) == {"a", "b", "c"} and sum(proba.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        model.learn_one({"u": None, "v": 1.0}, "a")


# =========================================================================== 7. in the replay and over MQTT


def blob_fleet(n_clients: int, n_per: int, seed: int):  # noqa: ANN201
    from streamfed.evaluation.datasets.base import ClientStream, Fleet

    streams = []
    for c in range(n_clients):
        X, y = blobs(n_per, [c % 4, (c + 1) % 4], seed=seed + c)
        streams.append(ClientStream(f"c{c}", X, y.astype(float), ("u", "v")))
    return Fleet(tuple(streams), dataset="blobs", normalisation="none", split="custom")


def small_params(**kw: object) -> dict:
    return {"n_classes": 4, "widths": [4], "n_omega": 8, "budget": 8, "chains": 4, "fit_every": 10, "fit_steps": 2,
            "min_proposal_weight": 8.0, "max_chunk_bytes": 256, **kw}


def test_replay_moves_versions_and_classifies() -> None:
    pytest.importorskip("torch")
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    fleet = blob_fleet(3, 20, seed=30)
    r = replay(fleet, "pfedgp", AlgorithmConfig(params={"pfedgp": small_params()}), seed=0)
    learners = r.arrangement.learners
    assert r.rejected.sum() == 0 and r.uploaded_numbers.sum() > 0
    assert min(lr.client.epoch for lr in learners) >= 1  # a new network version reached every client
    assert len({lr.client.theta.tobytes() for lr in learners}) == 1
    hits = [np.mean(m[20:] == y[20:]) for m, y in zip(r.means, r.ys, strict=True)]
    assert np.mean(hits) > 0.8


def test_over_mosquitto(mosquitto_dev) -> None:
    pytest.importorskip("torch")
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.aggregator import AggregatorCore
    from streamfed.fleet.sources import array_source
    from streamfed.runtime.agent import AgentService, AgentSettings
    from streamfed.runtime.aggregator import AggregatorService

    fleet = blob_fleet(3, 20, seed=40)
    names = [s.name for s in fleet.streams]
    # the agents must not standardise the target: it is a class index (docs/algorithms.md §9.3)
    cfg = FleetConfig(fleet="pfedgp-mqtt", algorithm="pfedgp", n_inputs=2, standardise="none",
                      params=small_params())

    async def main():  # noqa: ANN202
        agg = AggregatorService(AggregatorCore(cfg, clients=names, mode="async", window=0.05),
                                mosquitto_dev.broker_config())
        agents = [AgentService(AgentCore(cfg, n, i), mosquitto_dev.broker_config(),
                               array_source(s.X, s.y, rate_hz=200.0), settings=AgentSettings(linger=2.0))
                  for i, (n, s) in enumerate(zip(names, fleet.streams, strict=True))]
        agg_task = asyncio.create_task(agg.run())
        await asyncio.wait_for(agg.connected.wait(), 10)
        tasks = [asyncio.create_task(a.run()) for a in agents]
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            agg.stop()
            for a in agents:
                a.stop()
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(agg_task, 5)
        return agg, agents

    agg, agents = asyncio.run(main())
    server = agg.core.aggregation.server
    assert agg.core.rejected == {} and server.epoch >= 1
    for a in agents:
        learner = a.core.learner
        assert learner.global_version == agg.core.version and learner.client.epoch == server.epoch
        assert np.array_equal(learner.client.theta, server.theta)
        p = learner.class_probabilities(np.zeros(2))
        assert abs(p.sum() - 1) < 1e-12


def test_shards_and_reducer_average_like_one_aggregator() -> None:
    from streamfed.wire.message import Message

    cfg = FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2,
                      params={"n_classes": 3, "widths": [3], "n_omega": 4, "min_proposal_weight": 1.0,
                              "proposal_quorum": 1.0})
    theta0 = ALGORITHM.aggregation(cfg).server.theta
    rng = np.random.default_rng(11)
    deltas = {"a": rng.normal(size=theta0.size), "b": rng.normal(size=theta0.size)}
    weights = {"a": 10.0, "b": 30.0}
    shards = [ALGORITHM.aggregation(cfg), ALGORITHM.aggregation(cfg)]
    reducer = ALGORITHM.aggregation(cfg)
    total = None
    for shard, name in zip(shards, deltas, strict=True):
        pieces = split_vector(1, deltas[name], 5)
        items = [ChunkItem(name, k + 1, 0, 0, ch, weights[name]) for k, ch in enumerate(pieces)]
        arrays, n, epoch = shard.partial(items)
        part = reducer.read_partial(Message("f", "shard", "pfedgp.partial", 1, 0, "", n, 0.0, arrays, epoch=epoch))
        total = part if total is None else total + part
    reducer.apply_partial(total, 2, {"a": 1, "b": 1})
    expected = theta0 + (10 * deltas["a"] + 30 * deltas["b"]) / 40
    assert reducer.server.epoch == 1 and np.allclose(reducer.server.theta, expected, atol=1e-12)


def test_objective_gradients_against_finite_differences() -> None:
    """Fisher's identity: the gradient for fixed ω. Autograd through the embedding's scale against central
    differences of the plain transcriptions (scipy's log-density for eq. 16 and eq. 23)."""
    torch = pytest.importorskip("torch")
    from streamfed.algorithms.pfedgp.objectives import log_marginal_fitc, log_marginal_full, rbf_t

    X, y = toy(8, seed=12)
    Z = np.array([[-1.0], [0.5], [2.0]])
    om = np.random.default_rng(12).uniform(0.05, 0.6, (2, 8))

    def plain(a: float, fitc: bool) -> float:
        Xa, Za = a * X, a * Z
        if fitc:
            return float(np.mean([multivariate_normal(np.zeros(8), (p := fitc_plain(
                rbf_plain(Za, Za, 1.0, 2.0), rbf_plain(Xa, Za, 1.0, 2.0), np.full(8, 2.0), y, o))["marg_cov"])
                .logpdf(p["z"]) for o in om]))
        return float(np.mean([multivariate_normal(np.zeros(8), rbf_plain(Xa, Xa, 1.0, 2.0) + np.diag(1 / o))
                              .logpdf((y - 0.5) / o) for o in om]))

    for fitc in (False, True):
        a = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
        Xt, Zt, yt, omt = (torch.tensor(v) for v in (X, Z, y, om))
        if fitc:
            val = log_marginal_fitc(rbf_t(a * Zt, a * Zt, 1.0, 2.0), rbf_t(a * Xt, a * Zt, 1.0, 2.0),
                                    torch.full((8,), 2.0, dtype=torch.float64), yt, omt)
        else:
            val = log_marginal_full(rbf_t(a * Xt, a * Xt, 1.0, 2.0), yt, omt)
        val.backward()
        h = 1e-5
        fd = (plain(0.8 + h, fitc) - plain(0.8 - h, fitc)) / (2 * h)
        assert float(a.grad) == pytest.approx(fd, rel=1e-4, abs=1e-6)


def test_a_failed_refresh_changes_nothing(monkeypatch) -> None:
    c = small_client()
    X, y = blobs(4, [1, 4], seed=13)
    for xi, yi in zip(X, y, strict=True):
        c.learn(xi, float(yi))
    before = (c.n, c.loss, c.correct, c.budget.arrays(), c.model.tree, c.model.posteriors, c.counts.copy())

    def boom(*args: object, **kw: object) -> None:
        raise ValueError("not finite")

    monkeypatch.setattr("streamfed.algorithms.pfedgp.personal.gibbs", boom)
    with pytest.raises(ValueError, match="not finite"):
        c.learn(X[0], float(y[0]))
    after = (c.n, c.loss, c.correct, c.budget.arrays(), c.model.tree, c.model.posteriors, c.counts)
    assert after[:3] == before[:3] and after[4] is before[4] and after[5] is before[5]
    assert all(np.array_equal(a, b) for a, b in zip(after[3], before[3], strict=True))
    assert np.array_equal(after[6], before[6])


@pytest.mark.parametrize("objective", ["marginal", "predictive"])
@pytest.mark.parametrize("inducing", [0, 3])
def test_local_update_runs_for_every_objective_and_variant(objective: str, inducing: int) -> None:
    pytest.importorskip("torch")
    from streamfed.algorithms.pfedgp.training import fit_local

    layout = Layout(URKArch(n_inputs=2, widths=(4,), n_omega=8), inducing)
    theta = initial_theta(layout, 0)
    X, y = blobs(8, [0, 2, 5], seed=14)
    new = fit_local(layout, theta, omega_of(layout, 0), X, y, rng=np.random.default_rng(0), steps=3,
                    objective=objective, lengthscale=0.5)
    assert new is not None and new.shape == theta.shape and np.all(np.isfinite(new))
    moved = new - theta
    assert np.any(moved[: layout.n_net] != 0) and (inducing == 0 or np.any(moved[layout.n_net:] != 0))
    assert fit_local(layout, theta, omega_of(layout, 0), X, np.zeros_like(y), rng=np.random.default_rng(0)) is None
