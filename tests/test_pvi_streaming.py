"""PVI between refinements (streamfed.algorithms.pvi.streaming): every sample absorbed into the client's local
factor, against plain dense NumPy transcriptions kept in this file.

1. Gaussian likelihood: after `n` samples without a refinement, each predictive draw's `q(u | Z, β)` is the batch
   conjugate posterior `Λ = Λ₀ + K⁻¹ K_{ZX} K_{XZ} K⁻¹ / σ²`, `η = η₀ + K⁻¹ K_{ZX} y / σ²` (`Λ₀, η₀` of the
   state's factors), in any order of the samples; with no factor it is FSGP's exact sparse GP.
2. Bernoulli likelihood: each sample is one Newton step on `log sigmoid((2y - 1) kᵀK⁻¹u)` at the current mean.
3. The client: samples since its last refinement are re-absorbed under a new global, dropped by a refinement.
4. The conformal variance scale: the 95% quantile of the window's studentised residuals, transcribed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fsgp.kernels import Hyper, cov
from streamfed.algorithms.fsgp.posterior import SparsePosterior, Stats
from streamfed.algorithms.pvi.calibration import VarianceCalibration
from streamfed.algorithms.pvi.client import PVIClient
from streamfed.algorithms.pvi.factors import DiagGauss, Factor
from streamfed.algorithms.pvi.posterior import beta_hyper
from streamfed.algorithms.pvi.settings import RefineSettings
from streamfed.algorithms.pvi.state import GlobalQ
from streamfed.algorithms.pvi.streaming import StreamedPredictor

JITTER = 1e-6


# =========================================================================== dense transcriptions


def dense_prior_naturals(h: Hyper, factors: list[Factor]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`K`, and `Λ₀ = K⁻¹ + Σ A_kᵀ S_k⁻¹ A_k`, `η₀ = Σ A_kᵀ S_k⁻¹ m_k` (`A_k = K_{V_k Z} K⁻¹`) with explicit
    inverses."""
    K = cov(h, h.Z, h.Z) + JITTER * h.amplitude ** 2 * np.eye(h.m)
    Ki = np.linalg.inv(K)
    Lam, eta = Ki.copy(), np.zeros(h.m)
    for f in factors:
        A = cov(h, f.V, h.Z) @ Ki
        Si = np.diag(np.exp(-f.log_s))
        Lam += A.T @ Si @ A
        eta += A.T @ Si @ f.m
    return K, Lam, eta


def dense_conjugate(h: Hyper, factors: list[Factor], X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The batch conjugate posterior of `u` after the samples `(X, y)`: mean and covariance."""
    K, Lam, eta = dense_prior_naturals(h, factors)
    A = np.linalg.inv(K) @ cov(h, h.Z, X)  # column n: K⁻¹ k(Z, x_n)
    Lam = Lam + A @ A.T / h.noise_var
    eta = eta + A @ y / h.noise_var
    S = np.linalg.inv(Lam)
    return S @ eta, S


def dense_newton(h: Hyper, factors: list[Factor], X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One Newton step per sample, in order, on `log sigmoid((2y - 1) aᵀu)`, `a = K⁻¹k(Z, x)`: at the current mean
    `μ = aᵀu₀`, `p = sigmoid(μ)`: `Λ ← Λ + p(1 - p) a aᵀ`, `u₀ ← u₀ + Λ⁻¹ a (y - p)`."""
    K, Lam, eta = dense_prior_naturals(h, factors)
    u = np.linalg.solve(Lam, eta)
    Ki = np.linalg.inv(K)
    for x, t in zip(X, y, strict=True):
        a = Ki @ cov(h, h.Z, x[None, :])[:, 0]
        p = 1.0 / (1.0 + math.exp(-float(a @ u)))
        Lam = Lam + p * (1.0 - p) * np.outer(a, a)
        u = u + np.linalg.solve(Lam, a) * (t - p)
    return u, np.linalg.inv(Lam)


# =========================================================================== helpers


def a_state(rng: np.random.Generator, m: int, d: int, n_factors: int, inducing: str = "fixed",
            learn_beta: bool = False) -> GlobalQ:
    Z = rng.normal(size=(m, d))
    beta = np.concatenate(([rng.normal(0, 0.2)], rng.normal(0, 0.2, d), [math.log(0.3)]))
    g = GlobalQ.initial("se", Z, beta, inducing, learn_beta)
    for i in range(n_factors):
        phi = None
        if g.phi_size:  # a proper t_k(φ) around the design, so the draws of (Z, β) are near it
            mean = np.concatenate((Z.ravel() if g.n_z else np.zeros(0), beta if learn_beta else np.zeros(0)))
            phi = DiagGauss.from_moments(mean, np.full(g.phi_size, 0.01))
        f = Factor(f"o{i}", 1, 10.0, rng.normal(size=(4, d)), rng.normal(size=4), rng.normal(-1.0, 0.5, size=4),
                   phi)
        g = g.with_factor(f)
    return g


def draw_hypers(p: StreamedPredictor, g: GlobalQ) -> list[Hyper]:
    return [beta_hyper(g.kind, beta, Z) for Z, beta in p.base.points]


def close(a: np.ndarray, b: np.ndarray, rel: float = 1e-8) -> bool:
    return float(np.max(np.abs(a - b))) <= rel * max(1.0, float(np.max(np.abs(b))))


# =========================================================================== 1. Gaussian: the conjugate posterior


@pytest.mark.parametrize(("inducing", "learn_beta", "n_factors"),
                         [("fixed", False, 0), ("fixed", False, 3), ("hvm", False, 2), ("hvm", True, 2)])
def test_streamed_gaussian_factor_is_the_batch_conjugate_posterior(inducing: str, learn_beta: bool,
                                                                   n_factors: int) -> None:
    rng = np.random.default_rng(7)
    g = a_state(rng, 6, 2, n_factors, inducing, learn_beta)
    X = rng.normal(size=(40, 2))
    y = np.sin(X[:, 0]) + 0.3 * rng.normal(size=40)
    p = StreamedPredictor(g, "gaussian", n_draws=3, seed=1, jitter=JITTER)
    for x, t in zip(X, y, strict=True):
        p.absorb(x, t)
    factors = g.others(None)
    for h, (mean, C) in zip(draw_hypers(p, g), p.u_moments(), strict=True):
        want_mean, want_C = dense_conjugate(h, factors, X, y)
        assert close(mean, want_mean) and close(C, want_C)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 30))
def test_streamed_gaussian_factor_is_the_same_in_any_order(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    g = a_state(rng, 5, 1, 1)
    X = rng.normal(size=(n, 1))
    y = rng.normal(size=n)
    ps = [StreamedPredictor(g, "gaussian", 0, jitter=JITTER) for _ in range(2)]
    for p, order in zip(ps, (np.arange(n), rng.permutation(n)), strict=True):
        for i in order:
            p.absorb(X[i], y[i])
    Xs = rng.normal(size=(4, 1))
    (m0, v0), (m1, v1) = (p.predict_many(Xs) for p in ps)
    assert close(m0, m1, 1e-7) and close(v0, v1, 1e-7)  # rounding: K's condition number reaches ~1e7 here
    want_mean, want_C = dense_conjugate(draw_hypers(ps[0], g)[0], g.others(None), X, y)
    got_mean, got_C = ps[1].u_moments()[0]
    assert close(got_mean, want_mean, 1e-7) and close(got_C, want_C, 1e-7)


def test_from_the_prior_it_is_fsgps_exact_sparse_gp() -> None:
    """No factor, fixed `Z` and `β`: the streamed predictive is FSGP's exact sparse-GP predictive (noise
    included) on the same samples."""
    rng = np.random.default_rng(3)
    g = a_state(rng, 8, 2, 0)
    h = beta_hyper(g.kind, g.beta, g.Z)
    X = rng.normal(size=(60, 2))
    y = np.cos(X[:, 1]) + 0.3 * rng.normal(size=60)
    p = StreamedPredictor(g, "gaussian", 8, jitter=JITTER)
    for x, t in zip(X, y, strict=True):
        p.absorb(x, t)
    Xs = rng.normal(size=(7, 2))
    got = p.predict_many(Xs)
    ref = SparsePosterior(h, Stats.from_samples(cov(h, X, h.Z), y), JITTER).predict_many(Xs)
    assert close(got[0], ref[0], 1e-9) and close(got[1], ref[1], 1e-9)
    one = p.predict_local(p.local(Xs[0]))  # the per-sample path agrees with the batch one
    assert one == pytest.approx((got[0][0], got[1][0]), rel=1e-12, abs=1e-12)


# =========================================================================== 2. Bernoulli: one Newton step


@pytest.mark.parametrize("n_factors", [0, 2])
def test_streamed_bernoulli_factor_is_one_newton_step_per_sample(n_factors: int) -> None:
    rng = np.random.default_rng(11)
    g = a_state(rng, 5, 2, n_factors)
    X = rng.normal(size=(25, 2))
    y = (X[:, 0] + 0.5 * rng.normal(size=25) > 0).astype(float)
    p = StreamedPredictor(g, "bernoulli", 0, jitter=JITTER)
    for x, t in zip(X, y, strict=True):
        p.absorb(x, t)
    want_mean, want_C = dense_newton(draw_hypers(p, g)[0], g.others(None), X, y)
    got_mean, got_C = p.u_moments()[0]
    assert close(got_mean, want_mean, 1e-7) and close(got_C, want_C, 1e-7)
    prob, _ = p.predict_many(X)
    assert np.all((prob > 0) & (prob < 1))
    if n_factors == 0:  # from the prior (not against random factors) it learned the sign of x₀
        assert np.mean((prob > 0.5) == (y > 0.5)) > 0.7


def test_a_non_finite_result_is_refused_and_changes_nothing() -> None:
    g = a_state(np.random.default_rng(0), 3, 1, 0)
    p = StreamedPredictor(g, "gaussian", 0, jitter=JITTER)
    p.absorb(np.array([0.1]), 1.0)
    before = (p.w.copy(), p.Sigma.copy(), p.n_absorbed)
    with pytest.raises(ValueError, match="non-finite"):
        p.absorb(np.array([0.1]), 1e308 * 10)
    assert np.array_equal(p.w, before[0]) and np.array_equal(p.Sigma, before[1]) and p.n_absorbed == before[2]


# =========================================================================== 3. the client


@pytest.mark.slow  # torch's import and a refinement: over 2 s
def test_client_reabsorbs_its_pending_samples_under_a_new_global_and_drops_them_at_a_refinement() -> None:
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    g0 = a_state(rng, 5, 1, 0)
    c = PVIClient(g0, RefineSettings(n_pseudo=3, steps=3), client_id="a", refine_every=20, predict_draws=0,
                  jitter=JITTER)
    X = rng.normal(size=(27, 1))
    y = np.sin(2 * X[:, 0])
    for x, t in zip(X[:7], y[:7], strict=True):
        c.learn(x, t)
    other = Factor("b", 1, 5.0, rng.normal(size=(3, 1)), rng.normal(size=3), np.full(3, -1.0))
    g1 = GlobalQ(1, g0.kind, g0.Z, g0.beta, g0.inducing, g0.learn_beta, {"b": other})
    assert c.install(g1)
    h = beta_hyper(g0.kind, g0.beta, g0.Z)
    probe = np.array([[0.4]])
    want_mean, want_C = dense_conjugate(h, [other], X[:7], y[:7])
    A = np.linalg.solve(cov(h, h.Z, h.Z) + JITTER * h.amplitude ** 2 * np.eye(5), cov(h, h.Z, probe))[:, 0]
    m, _ = c.predict(probe[0])
    assert m == pytest.approx(float(A @ want_mean), abs=1e-9)  # the global's factor and the 7 samples
    for x, t in zip(X[7:], y[7:], strict=True):
        c.learn(x, t)
    assert c.n_refined == 1 and c.n == 27  # refined at 20: 7 samples pending since
    f = c.take_factor()
    assert f is not None and f.n == 20.0
    fresh = StreamedPredictor(c.view(), "gaussian", 0, jitter=JITTER)
    for x, t in zip(X[20:], y[20:], strict=True):
        fresh.absorb(x, t)
    assert c.predict(probe[0]) == pytest.approx(fresh.predict_local(fresh.local(probe[0])), abs=1e-12)


# =========================================================================== 4. the conformal variance scale


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 400))
def test_calibration_scale_is_the_windows_95_percent_quantile(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    res = rng.standard_t(3, size=n) * rng.uniform(0.1, 3.0)
    var = rng.uniform(0.01, 4.0, size=n)
    c = VarianceCalibration(window=256, min_samples=32, every=1, rate=0.0)  # the window alone (the tracking:
    for r, v in zip(res, var, strict=True):                                 # tests/test_calibration.py)
        c.update(float(r), float(v))
    z = np.abs(res / np.sqrt(var))[-256:]
    # split conformal's finite-sample 95% quantile: the ⌈(n + 1) · 0.95⌉-th smallest of the window's n
    q = sorted(z)[min(math.ceil((z.size + 1) * 0.95), z.size) - 1] if n >= 32 else 0.0
    want = 1.0 if n < 32 else min(max((q / 1.959963984540054) ** 2, 1e-4), 1e4)
    assert c.scale == pytest.approx(want, rel=1e-12)


def test_a_client_whose_sigma_is_wrong_covers_95_percent_once_calibrated() -> None:
    """σ configured at 0.1 on a stream of noise sd 0.6: the model's own intervals are far too narrow; the
    calibrated ones cover ~95% of the later samples (prequentially: each prediction before its sample)."""
    rng = np.random.default_rng(2)
    g = GlobalQ.initial("se", np.linspace(-2, 2, 8)[:, None], np.array([0.0, 0.0, math.log(0.1)]), "fixed")
    covered = {}
    for calibrate in (False, True):
        c = PVIClient(g, RefineSettings(), client_id="a", refine_every=10**9, predict_draws=0, calibrate=calibrate)
        hits = []
        for _ in range(1500):
            x = rng.uniform(-2, 2, 1)
            y = math.sin(2 * x[0]) + 0.6 * rng.standard_normal()
            m, v = c.learn(x, y)
            hits.append(abs(y - m) <= 1.959963984540054 * math.sqrt(v))
        covered[calibrate] = float(np.mean(hits[300:]))
    assert covered[False] < 0.5 and 0.92 <= covered[True] <= 0.98, covered
