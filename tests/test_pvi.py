"""PVI for federated sparse GPs (streamfed.algorithms.pvi) against plain NumPy transcriptions of its
equations kept in this file, and against FSGP's exact sparse-GP posterior.

1. `q(u | Z)` of DPO / CPO factors against dense natural-parameter algebra (explicit inverses).
2. The FSGP oracle: Gaussian likelihood, fixed `Z`, `V_k = X_k`, `m_k = y_k`, `S_k = σ²I`, `ρ = 1` ⇒ the
   PVI predictive is the exact sparse-GP predictive within 1e-8.
3. The local free energy against its dense definition; the FSGP factor is a stationary point of every
   client's free energy whatever the cavity (so any order of updates has the same fixed point: property).
4. Gauss–Hermite expected log-likelihood of the Bernoulli likelihood against scipy quadrature.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from streamfed.algorithms.fsgp.kernels import Hyper, cov
from streamfed.algorithms.fsgp.posterior import SparsePosterior, Stats
from streamfed.algorithms.pvi.factors import DiagGauss, Factor
from streamfed.algorithms.pvi.likelihoods import gauss_hermite, predictive_y
from streamfed.algorithms.pvi.posterior import ConditionalQ, beta_hyper
from streamfed.algorithms.pvi.state import GlobalQ

torch = pytest.importorskip("torch")
from streamfed.algorithms.pvi.free_energy import Cavity, FreeEnergy  # noqa: E402
from streamfed.algorithms.pvi.likelihoods import expected_log_lik  # noqa: E402
from streamfed.algorithms.pvi.refine import RefineSettings, refine  # noqa: E402

JITTER = 1e-6


def t(a) -> torch.Tensor:
    return torch.as_tensor(np.array(a, dtype=np.float64))


# =========================================================================== oracles (NumPy, dense)


def dense_q_u(h: Hyper, factors: list[Factor], jitter: float = JITTER) -> tuple[np.ndarray, np.ndarray]:
    """`q(u) ∝ p(u) Π N(m_k; A_k u, S_k)`: `Λ = K⁻¹ + Σ A_kᵀ S_k⁻¹ A_k`, `η = Σ A_kᵀ S_k⁻¹ m_k`,
    `A_k = K_{V_k Z} K⁻¹` (`A_k = I` for CPO), with explicit inverses."""
    K = cov(h, h.Z, h.Z) + jitter * h.amplitude ** 2 * np.eye(h.m)
    Ki = np.linalg.inv(K)
    Lam, eta = Ki.copy(), np.zeros(h.m)
    for f in factors:
        A = np.eye(h.m) if f.V is None else cov(h, f.V, h.Z) @ Ki
        Si = np.diag(np.exp(-f.log_s))
        Lam += A.T @ Si @ A
        eta += A.T @ Si @ f.m
    S = np.linalg.inv(Lam)
    return S @ eta, S


def dense_predict_f(h: Hyper, factors: list[Factor], Xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`f(x) | u ~ N(k K⁻¹ u, k(x,x) - k K⁻¹ kᵀ)` integrated against `q(u)`."""
    mu, S = dense_q_u(h, factors)
    K = cov(h, h.Z, h.Z) + JITTER * h.amplitude ** 2 * np.eye(h.m)
    A = cov(h, Xs, h.Z) @ np.linalg.inv(K)
    var = h.amplitude ** 2 - np.sum(A * cov(h, Xs, h.Z), 1) + np.sum((A @ S) * A, 1)
    return A @ mu, var


def dense_kl(mu1, S1, mu0, S0) -> float:
    """KL(N(mu1, S1) ‖ N(mu0, S0))."""
    S0i = np.linalg.inv(S0)
    d = mu0 - mu1
    return 0.5 * (np.trace(S0i @ S1) + d @ S0i @ d - len(mu1) + np.linalg.slogdet(S0)[1] - np.linalg.slogdet(S1)[1])


def oracle_sgpr(h: Hyper, X: np.ndarray, y: np.ndarray, Xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The centralised variational sparse-GP predictive (Titsias), dense: `Σ = (K + σ⁻² K_zx K_xz)⁻¹`."""
    K = cov(h, h.Z, h.Z) + JITTER * h.amplitude ** 2 * np.eye(h.m)
    Kzx, Kzs = cov(h, h.Z, X), cov(h, h.Z, Xs)
    Sig = np.linalg.inv(K + Kzx @ Kzx.T / h.noise_var)
    mean = Kzs.T @ Sig @ Kzx @ y / h.noise_var
    var = h.amplitude ** 2 - np.sum(Kzs * (np.linalg.inv(K) @ Kzs), 0) + np.sum(Kzs * (Sig @ Kzs), 0)
    return mean, var + h.noise_var


def random_factor(rng: np.random.Generator, client: str, mk: int, d: int, cpo: bool = False) -> Factor:
    V = None if cpo else rng.normal(size=(mk, d))
    return Factor(client, 1, 10.0, V, rng.normal(size=mk), rng.normal(-1.0, 0.5, size=mk))


def make_hyper(rng: np.random.Generator, m: int, d: int, kind: str = "se") -> Hyper:
    return Hyper(kind, float(rng.normal(0, 0.2)), rng.normal(0, 0.2, d), math.log(0.3), rng.normal(size=(m, d)))


# =========================================================================== 1. q(u | Z)


@pytest.mark.parametrize("kind", ["se", "matern32", "matern52"])
@pytest.mark.parametrize("cpo", [False, True])
def test_conditional_q_equals_dense_natural_parameters(kind: str, cpo: bool) -> None:
    rng = np.random.default_rng(1)
    h = make_hyper(rng, 6, 2, kind)
    fs = [random_factor(rng, f"c{i}", 6 if cpo else 4 + i, 2, cpo) for i in range(3)]
    q = ConditionalQ(h, fs, JITTER)
    mu, S = q.u_moments()
    omu, oS = dense_q_u(h, fs)
    assert np.max(np.abs(mu - omu)) < 1e-8 * max(1.0, np.max(np.abs(omu)))
    assert np.max(np.abs(S - oS)) < 1e-8 * max(1.0, np.max(np.abs(oS)))
    Xs = rng.normal(size=(7, 2))
    m, v = q.predict_f(Xs)
    om, ov = dense_predict_f(h, fs, Xs)
    assert np.max(np.abs(m - om)) < 1e-8 and np.max(np.abs(v - ov)) < 1e-8


# =========================================================================== 2. the FSGP oracle


def fsgp_factors(h: Hyper, X: np.ndarray, y: np.ndarray, owner: np.ndarray) -> list[Factor]:
    return [Factor(f"c{k}", 1, float(np.sum(owner == k)), X[owner == k], y[owner == k],
                   np.full(int(np.sum(owner == k)), math.log(h.noise_var))) for k in np.unique(owner)]


@given(seed=st.integers(0, 10_000), k=st.integers(1, 5))
@settings(max_examples=25, deadline=None)
def test_pvi_with_data_as_pseudo_observations_is_the_exact_sparse_gp(seed: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    h = make_hyper(rng, 5, 2)
    X = rng.normal(size=(30, 2))
    y = np.sin(X[:, 0]) + 0.3 * rng.normal(size=30)
    owner = rng.integers(0, k, 30)
    beta = np.concatenate(([h.log_amp], h.log_ls, [h.log_sigma]))
    q = ConditionalQ(beta_hyper("se", beta, h.Z), fsgp_factors(h, X, y, owner), JITTER)
    Xs = rng.normal(size=(6, 2))
    fm, fv = q.predict_f(Xs)
    pm, pv = predictive_y("gaussian", fm[None], fv[None], np.array([h.log_sigma]))
    ref = SparsePosterior(h, Stats.from_samples(cov(h, X, h.Z), y), JITTER)
    rm, rv = ref.predict_many(Xs)
    assert np.max(np.abs(pm - rm)) <= 1e-8 * max(1.0, np.max(np.abs(rm)))
    assert np.max(np.abs(pv - rv)) <= 1e-8 * max(1.0, np.max(np.abs(rv)))
    om, ov = oracle_sgpr(h, X, y, Xs)  # and both against the dense transcription
    assert np.max(np.abs(pm - om)) < 1e-7 and np.max(np.abs(pv - ov)) < 1e-7


# =========================================================================== 3. the local free energy


def dense_free_energy(h: Hyper, own: Factor, others: list[Factor], X: np.ndarray, y: np.ndarray,
                      scale: float) -> float:
    """`s Σ E log N(y; f, σ²) - KL(q(u) ‖ q_\\k(u))` at one `(Z, β)`, with dense moments."""
    mu, S = dense_q_u(h, others + [own])
    mu0, S0 = dense_q_u(h, others)
    K = cov(h, h.Z, h.Z) + JITTER * h.amplitude ** 2 * np.eye(h.m)
    A = cov(h, X, h.Z) @ np.linalg.inv(K)
    mean = A @ mu
    var = h.amplitude ** 2 - np.sum(A * cov(h, X, h.Z), 1) + np.sum((A @ S) * A, 1)
    s2 = h.noise_var
    ell = np.sum(-0.5 * np.log(2 * np.pi * s2) - ((y - mean) ** 2 + var) / (2 * s2))
    return float(scale * ell - dense_kl(mu, S, mu0, S0))


def energy_at(h: Hyper, others: list[Factor], X: np.ndarray, y: np.ndarray, scale: float) -> FreeEnergy:
    beta = t(np.concatenate(([h.log_amp], h.log_ls, [h.log_sigma])))
    cav = Cavity([(None if f.V is None else t(f.V), t(f.m), t(f.log_s)) for f in others], t([]), t([]))
    return FreeEnergy(h.kind, "gaussian", cav, t(h.Z), beta, n_z=0, learn_beta=False, X=t(X), y=t(y),
                      scale=scale, kl_weights=t([]), jitter=JITTER)


@pytest.mark.parametrize("cpo", [False, True])
def test_free_energy_equals_its_dense_definition(cpo: bool) -> None:
    rng = np.random.default_rng(3)
    h = make_hyper(rng, 5, 2)
    others = [random_factor(rng, f"c{i}", 5 if cpo else 3, 2, cpo) for i in range(2)]
    own = random_factor(rng, "me", 5 if cpo else 4, 2, cpo)
    X, y = rng.normal(size=(9, 2)), rng.normal(size=9)
    fe = energy_at(h, others, X, y, scale=2.5)
    got = float(fe((None if own.V is None else t(own.V), t(own.m), t(own.log_s)), t([]), t([]), t(np.zeros((1, 0)))))
    assert got == pytest.approx(dense_free_energy(h, own, others, X, y, 2.5), rel=1e-9, abs=1e-9)


@given(seed=st.integers(0, 10_000), n_others=st.integers(0, 3))
@settings(max_examples=15, deadline=None)
def test_the_exact_factor_is_a_fixed_point_whatever_the_cavity(seed: int, n_others: int) -> None:
    """With a Gaussian likelihood and fixed `Z, β`, the factor `V = X_k, m = y_k, s = σ²` maximises `L_k`
    for every cavity: the gradient in `(V, m, log s)` is zero, so any order of client updates that reaches
    it stays there (and the fixed point is the exact sparse GP, test 2)."""
    rng = np.random.default_rng(seed)
    h = make_hyper(rng, 4, 1)
    others = [random_factor(rng, f"c{i}", 3, 1) for i in range(n_others)]
    X, y = rng.normal(size=(5, 1)), rng.normal(size=5)
    fe = energy_at(h, others, X, y, scale=1.0)
    V, m = t(X).requires_grad_(True), t(y).requires_grad_(True)
    log_s = t(np.full(5, math.log(h.noise_var))).requires_grad_(True)
    fe((V, m, log_s), t([]), t([]), t(np.zeros((1, 0)))).backward()
    for g in (V.grad, m.grad, log_s.grad):
        assert float(torch.max(torch.abs(g))) < 1e-7
    # ... and a perturbed factor is not stationary (the check can fail)
    m2 = t(y + 0.1).requires_grad_(True)
    fe((t(X), m2, t(np.full(5, math.log(h.noise_var)))), t([]), t([]), t(np.zeros((1, 0)))).backward()
    assert float(torch.max(torch.abs(m2.grad))) > 1e-3


def test_kl_on_phi_is_the_weighted_gaussian_kl() -> None:
    """The `α`-weighted KL on `φ` inside `L_k` equals `DiagGauss.kl` (and the dense formula) with no data."""
    rng = np.random.default_rng(4)
    g = GlobalQ.initial("se", rng.normal(size=(3, 1)), np.array([0.0, 0.0, math.log(0.5)]), "hvm", learn_beta=True)
    cav = DiagGauss.from_moments(rng.normal(size=g.phi_size), rng.uniform(0.5, 2, g.phi_size))
    q = DiagGauss.from_moments(rng.normal(size=g.phi_size), rng.uniform(0.5, 2, g.phi_size))
    w = g.kl_weights(0.1)
    fe = FreeEnergy("se", "gaussian", Cavity([], t(cav.mean), t(cav.var)), t(g.Z), t(g.beta), n_z=g.n_z,
                    learn_beta=True, X=t(np.zeros((0, 1))), y=t(np.zeros(0)), scale=0.0, kl_weights=t(w))
    own = (t(rng.normal(size=(2, 1))), t(np.zeros(2)), t(np.full(2, 50.0 - 1e-9)))  # vanishing precision
    got = -float(fe(own, t(q.mean), t(0.5 * np.log(q.var)), t(np.zeros((0, g.phi_size)))))
    dense = sum(w[i] * 0.5 * (q.var[i] / cav.var[i] + (q.mean[i] - cav.mean[i]) ** 2 / cav.var[i] - 1
                              + math.log(cav.var[i] / q.var[i])) for i in range(g.phi_size))
    assert got == pytest.approx(dense, rel=1e-12) and got == pytest.approx(q.kl(cav, w), rel=1e-12)


# =========================================================================== 4. likelihoods


@pytest.mark.parametrize(("y", "mu", "v"), [(1.0, 0.3, 0.5), (0.0, -2.0, 4.0), (1.0, 3.0, 0.01), (0.0, 1.0, 9.0)])
def test_bernoulli_expected_log_lik_by_gauss_hermite_equals_scipy(y: float, mu: float, v: float) -> None:
    def integrand(f: float) -> float:
        s = 2 * y - 1
        return math.exp(-0.5 * (f - mu) ** 2 / v) / math.sqrt(2 * math.pi * v) * -math.log1p(math.exp(-s * f))

    ref, _ = integrate.quad(integrand, mu - 30 * math.sqrt(v), mu + 30 * math.sqrt(v), limit=200)
    got = float(expected_log_lik("bernoulli", t([y]), t([mu]), t([v]), t(0.0), n_quadrature=40))
    assert got == pytest.approx(ref, rel=1e-6, abs=1e-9)
    p_ref, _ = integrate.quad(lambda f: math.exp(-0.5 * (f - mu) ** 2 / v) / math.sqrt(2 * math.pi * v)
                              / (1 + math.exp(-f)), mu - 30 * math.sqrt(v), mu + 30 * math.sqrt(v), limit=200)
    p, _ = predictive_y("bernoulli", np.array([[mu]]), np.array([[v]]), np.zeros(1), n_quadrature=40)
    # the sigmoid under a wide Gaussian is the hard case for Gauss–Hermite: 40 points give ~1e-5 at v = 9
    assert float(p[0]) == pytest.approx(p_ref, rel=1e-4)


def test_gaussian_expected_log_lik_is_the_closed_form_and_quadrature_agrees() -> None:
    x, w = gauss_hermite(30)
    y, mu, v, ls = 0.7, 0.2, 0.3, math.log(0.4)
    s2 = math.exp(2 * ls)
    quad = sum(wi * (-0.5 * math.log(2 * math.pi) - ls - (y - (mu + math.sqrt(2 * v) * xi)) ** 2 / (2 * s2))
               for xi, wi in zip(x, w, strict=True))
    got = float(expected_log_lik("gaussian", t([y]), t([mu]), t([v]), t(ls)))
    assert got == pytest.approx(quad, rel=1e-12)


# =========================================================================== 5. local refinement


@pytest.mark.parametrize("inducing", ["fixed", "hvm", "fedavg"])
def test_refinement_raises_the_free_energy_and_yields_a_proper_q(inducing: str) -> None:
    rng = np.random.default_rng(6)
    X = rng.uniform(-2, 2, size=(40, 1))
    y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=40)
    g = GlobalQ.initial("se", np.linspace(-2, 2, 6)[:, None], np.array([0.0, math.log(0.7), math.log(0.1)]),
                        inducing, learn_beta=inducing == "hvm")
    s = RefineSettings(n_pseudo=8, steps=150, learning_rate=0.02, n_samples=2)
    f = refine(g, "a", X, y, n_total=40, seq=1, settings=s, seed=1)
    g1 = g.with_factor(f)
    assert (f.phi is not None) == (inducing == "hvm") and (f.Z is not None) == (inducing == "fedavg")
    if f.phi is not None:
        assert g1.q_phi().proper
    Zp = f.Z if f.Z is not None else g.Z
    (Z, beta), = g1.points(0)
    q = ConditionalQ(beta_hyper("se", beta, Zp if inducing == "fedavg" else Z), [f], JITTER)
    m, _ = q.predict_f(X)
    assert np.sqrt(np.mean((m - y) ** 2)) < 0.3  # the data are learned (noise 0.1, signal sd 0.7)
