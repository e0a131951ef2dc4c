"""pFedGP's kernel with a linear part (`Layout.linear`, :mod:`streamfed.algorithms.pfedgp.kernels`) against
plain NumPy transcriptions kept here: `k(x, x') = s·exp(−‖g(x) − g(x')‖²/(2ℓ²)) + c/(d + 1)·(1 + xᵀx')`,
the predictive (eq. 17–18) with that kernel, the local objective (eq. 16) with it, and the learned scale `c`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import multivariate_normal

from streamfed.algorithms.pfedgp.client import PFedGPClient
from streamfed.algorithms.pfedgp.estimator import PFedGPClassifier
from streamfed.algorithms.pfedgp.gibbs import gibbs
from streamfed.algorithms.pfedgp.kernels import gp_kernel, gp_kernel_diag
from streamfed.algorithms.pfedgp.network import (
    LINEAR_BOUNDS,
    Layout,
    embed,
    gp_inputs,
    initial_theta,
    linear_scale_of,
    omega_of,
)
from streamfed.algorithms.pfedgp.personal import GPTree
from streamfed.algorithms.urk.network import URKArch

LS, S = 0.5, 8.0


def kernel_plain(g: np.ndarray, x: np.ndarray, g2: np.ndarray, x2: np.ndarray, c: float) -> np.ndarray:
    """The sum kernel, one pair at a time, from the embeddings `g` and the inputs `x`."""
    d = x.shape[1]
    out = np.empty((g.shape[0], g2.shape[0]))
    for i in range(g.shape[0]):
        for j in range(g2.shape[0]):
            out[i, j] = S * math.exp(-0.5 * float(np.sum((g[i] - g2[j]) ** 2)) / LS**2) \
                + c / (d + 1) * (1.0 + float(x[i] @ x2[j]))
    return out


def layout3() -> Layout:
    return Layout(URKArch(n_inputs=3, widths=(4,), n_omega=5), linear=True)


@settings(max_examples=20, deadline=None)
@given(st.floats(1e-3, 1e3), st.integers(0, 10**6))
def test_gp_kernel_is_the_sum_kernel(c: float, seed: int) -> None:
    lay = layout3()
    theta, om = initial_theta(lay, 0, linear_scale=c), omega_of(lay, 0)
    rng = np.random.default_rng(seed)
    X, X2 = rng.normal(size=(4, 3)), rng.normal(size=(3, 3))
    A, B = gp_inputs(lay, theta, om, X), gp_inputs(lay, theta, om, X2)
    plain = kernel_plain(embed(lay, theta, om, X), X, embed(lay, theta, om, X2), X2, c)
    K = gp_kernel(A, B, dim=lay.gp_dim, lengthscale=LS, outputscale=S)
    np.testing.assert_allclose(K, plain, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gp_kernel_diag(A, dim=lay.gp_dim, outputscale=S),
                               np.diag(kernel_plain(embed(lay, theta, om, X), X, embed(lay, theta, om, X), X, c)),
                               rtol=1e-10)
    assert linear_scale_of(lay, theta) == pytest.approx(c, rel=1e-12)


def test_torch_kernel_equals_numpy() -> None:
    torch = pytest.importorskip("torch")
    from streamfed.algorithms.pfedgp.objectives import gp_kernel_t

    A, B = np.random.default_rng(1).normal(size=(5, 7)), np.random.default_rng(2).normal(size=(4, 7))
    for dim in (None, 3):
        np.testing.assert_allclose(gp_kernel_t(torch.tensor(A), torch.tensor(B), dim, LS, S).numpy(),
                                   gp_kernel(A, B, dim=dim, lengthscale=LS, outputscale=S), rtol=1e-12)


def test_linear_part_needs_the_full_gp() -> None:
    with pytest.raises(ValueError):
        Layout(URKArch(n_inputs=3, widths=(), n_omega=4), n_inducing=2, linear=True)
    with pytest.raises(ValueError):
        PFedGPClassifier(inducing=4)  # the default linear part: refused with FITC, not ignored
    with pytest.raises(ValueError):
        PFedGPClassifier(linear=0.0)
    PFedGPClassifier(inducing=4, linear=None)


def test_predictive_with_the_linear_part_is_eq_17_18() -> None:
    """One node: the GP-Tree's class probability is the chains' average of ∫σ(f) N(f; μ*, Σ*) df with μ*, Σ* of
    eq. 17 under the sum kernel (the prior variance k** includes the linear part)."""
    lay = layout3()
    theta, om = initial_theta(lay, 0, linear_scale=3.0), omega_of(lay, 0)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(12, 3))
    y = (X[:, 0] + 0.3 * rng.normal(size=12) > 0).astype(int)
    xs = rng.normal(size=(2, 3)) * 2
    model = GPTree(lengthscale=LS, outputscale=S, chains=3, steps=5, seed=0, dim=lay.gp_dim)
    model.fit(gp_inputs(lay, theta, om, X), y, np.arange(12))
    got = model.proba(gp_inputs(lay, theta, om, xs))
    g, gs = embed(lay, theta, om, X), embed(lay, theta, om, xs)
    K, ks, kss = kernel_plain(g, X, g, X, 3.0), kernel_plain(g, X, gs, xs, 3.0), kernel_plain(gs, xs, gs, xs, 3.0)
    left = model.tree.nodes[0].left  # type: ignore[union-attr]
    kappa = np.isin(y, left).astype(float) - 0.5
    p_left = np.zeros(2)
    for o in model.posteriors[0].omega:
        A = np.linalg.inv(np.diag(1.0 / o) + K)
        for t in range(2):
            mu, var = ks[:, t] @ A @ (kappa / o), kss[t, t] - ks[:, t] @ A @ ks[:, t]
            p_left[t] += integrate.quad(lambda f, m=mu, v=var: 1.0 / (1.0 + math.exp(-f))
                                        * math.exp(-0.5 * (f - m) ** 2 / v) / math.sqrt(2 * math.pi * v),
                                        mu - 12 * math.sqrt(var), mu + 12 * math.sqrt(var))[0]
    p_left /= model.posteriors[0].omega.shape[0]
    j = model.classes.index(left[0])
    np.testing.assert_allclose(got[:, j], p_left, atol=2e-6)


def test_the_linear_part_extrapolates_a_linear_boundary() -> None:
    """Far outside the data the RBF part reverts to its prior (p ≈ ½); with a linear part the boundary
    continues (a test that fails without the linear part)."""
    lay_lin, lay_rbf = layout3(), Layout(URKArch(n_inputs=3, widths=(4,), n_omega=5))
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, size=(60, 3))
    y = (X[:, 0] > 0).astype(int)
    far = np.array([[8.0, 0.0, 0.0], [-8.0, 0.0, 0.0]])
    probs = {}
    for name, lay in (("lin", lay_lin), ("rbf", lay_rbf)):
        theta, om = initial_theta(lay, 0, linear_scale=8.0), omega_of(lay, 0)
        model = GPTree(lengthscale=LS, outputscale=S, chains=4, steps=20, seed=0, dim=lay.gp_dim)
        model.fit(gp_inputs(lay, theta, om, X), y, np.arange(60))
        p = model.proba(gp_inputs(lay, theta, om, far))
        probs[name] = p[:, list(model.classes).index(1)]
    assert probs["lin"][0] > 0.97 and probs["lin"][1] < 0.03
    assert abs(probs["rbf"][0] - 0.5) < 0.3 and abs(probs["rbf"][1] - 0.5) < 0.3


def test_local_objective_is_eq_16_with_the_sum_kernel() -> None:
    """The marginal objective at fixed Gibbs draws equals the plain `log N(Ω⁻¹κ | 0, K + Ω⁻¹)` under the sum
    kernel (scipy's density), per sample; its gradient in `log c` is finite and not zero."""
    torch = pytest.importorskip("torch")
    from streamfed.algorithms.pfedgp.training import local_objective
    from streamfed.algorithms.pfedgp.tree import build_tree

    lay = layout3()
    theta, om = initial_theta(lay, 0, linear_scale=2.0), omega_of(lay, 0)
    rng = np.random.default_rng(5)
    X = rng.normal(size=(10, 3))
    y = (X[:, 1] > 0).astype(np.int64)
    tree = build_tree((0, 1), np.eye(2), np.random.default_rng(0))
    v = torch.tensor(theta, requires_grad=True)
    val = local_objective(lay, v, torch.tensor(om), torch.tensor(X), y, np.random.default_rng(9),
                          objective="marginal", lengthscale=LS, outputscale=S, chains=3, gibbs_steps=4, tree=tree)
    g = embed(lay, theta, om, X)
    K = kernel_plain(g, X, g, X, 2.0)
    yl = np.isin(y, tree.nodes[0].left).astype(float)
    draws = gibbs(gp_kernel(gp_inputs(lay, theta, om, X), gp_inputs(lay, theta, om, X), dim=lay.gp_dim,
                            lengthscale=LS, outputscale=S), yl, chains=3, steps=4, rng=np.random.default_rng(9)).omega
    plain = np.mean([multivariate_normal(np.zeros(10), K + np.diag(1 / o)).logpdf((yl - 0.5) / o) for o in draws])
    assert float(val.detach()) == pytest.approx(plain / 10, rel=1e-8)
    val.backward()
    assert v.grad is not None
    grad_c = float(v.grad[lay.linear_index])
    assert math.isfinite(grad_c) and grad_c != 0.0


def test_a_local_update_learns_c_within_its_bounds() -> None:
    pytest.importorskip("torch")
    from streamfed.algorithms.pfedgp.training import fit_local

    lay = layout3()
    theta, om = initial_theta(lay, 0, linear_scale=1e3), omega_of(lay, 0)
    rng = np.random.default_rng(6)
    X = rng.normal(size=(30, 3))
    y = (X[:, 0] > 0).astype(np.int64)
    new = fit_local(lay, theta, om, X, y, rng=rng, steps=3, learning_rate=0.5, lengthscale=LS, outputscale=S)
    assert new is not None and new[lay.linear_index] != theta[lay.linear_index]
    assert LINEAR_BOUNDS[0] <= new[lay.linear_index] <= LINEAR_BOUNDS[1]


def test_client_and_estimator_use_the_linear_part() -> None:
    lay = layout3()
    c = PFedGPClient(lay, initial_theta(lay, 0), omega_of(lay, 0), n_classes=2, learn_kernel=False, chains=3)
    for t in range(10):
        c.learn(np.array([t - 4.5, 0.0, 1.0]), int(t >= 5))
    assert c.model.dim == lay.embed_dim and c.model.E.shape[1] == lay.embed_dim + 4
    model = PFedGPClassifier(widths=(4,), n_omega=8, budget=16, learn_kernel=False)
    for t in range(20):
        model.learn_one({"a": float(t % 5), "b": 1.0}, t % 5 > 2)
    assert model.client is not None and model.client.layout.linear
    p = model.predict_proba_one({"a": 30.0, "b": 1.0})
    assert 0.0 < p[False] < p[True] < 1.0
