"""Differential privacy (streamfed.privacy.dp, accountant): calibration against closed forms and
dp_accounting, clipping bounds each sample's influence, the noisy posterior stays positive definite and
its predictive variance accounts for the noise."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr import feature_maps
from streamfed.fleet.config import FleetConfig
from streamfed.privacy import dp
from streamfed.privacy.accountant import PrivacyAccountant, calibrate_noise_multiplier, dp_event

# --------------------------------------------------------------------------- the Gaussian mechanism


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _delta_oracle(eps: float, sigma: float, sens: float) -> float:
    """Balle & Wang (2018), Theorem 8, transcribed: the Gaussian mechanism with noise std `sigma` and L2
    sensitivity `sens` is (ε, δ)-DP iff δ >= Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ)."""
    a, b = sens / (2 * sigma), eps * sigma / sens
    return _phi(a - b) - math.exp(eps) * _phi(-a - b)


@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0, 8.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_noise_multiplier_is_the_closed_form_and_dp_accountings(eps: float, delta: float) -> None:
    z = dp.noise_multiplier(eps, delta)
    assert _delta_oracle(eps, z, 1.0) == pytest.approx(delta, rel=1e-6)
    assert _delta_oracle(eps, z * 0.99, 1.0) > delta  # the smallest such z
    assert z == pytest.approx(dp_accounting.get_sigma_gaussian(eps, delta), rel=1e-6)
    # scaling: noise std z·Δ at sensitivity Δ gives the same guarantee
    assert _delta_oracle(eps, 3.0 * z, 3.0) == pytest.approx(delta, rel=1e-6)


def test_one_mechanism_accounted_matches_the_closed_form() -> None:
    for z in (0.7, 1.5, 4.0):
        acc = PrivacyAccountant(1e-5, method="pld")
        acc.spend(z)
        exact = dp_accounting.get_epsilon_gaussian(z, 1e-5)
        # the PLD is tight up to its discretisation, and never below the truth
        assert exact <= acc.epsilon() <= exact + 0.02
        assert _delta_oracle(acc.epsilon(), z, 1.0) <= 1e-5 * 1.0001
        rdp_acc = PrivacyAccountant(1e-5, method="rdp")
        rdp_acc.spend(z)
        assert rdp_acc.epsilon() >= exact  # RDP is an upper bound


@pytest.mark.parametrize("method", ["rdp", "pld"])
def test_accountant_equals_a_direct_dp_accounting_computation(method: str) -> None:
    acc = PrivacyAccountant(1e-5, method=method)  # type: ignore[arg-type]
    for z, c in ((1.1, 30), (2.0, 5), (1.1, 20)):
        acc.spend(z, c)
    ref = pld.PLDAccountant(value_discretization_interval=1e-3) if method == "pld" else rdp.RdpAccountant()
    for _ in range(50):  # one upload at a time, as an agent spends them
        ref.compose(dp_accounting.GaussianDpEvent(1.1))
    ref.compose(dp_accounting.GaussianDpEvent(2.0), 5)
    eps_ref = ref.get_epsilon(1e-5)
    if method == "pld":
        assert acc.epsilon() == pytest.approx(eps_ref, rel=1e-3)
    else:  # our orders are denser than dp_accounting's defaults: never worse, close
        assert eps_ref * 0.97 <= acc.epsilon() <= eps_ref * (1 + 1e-9)
    # closed form for RDP: U Gaussian mechanisms of multiplier z are (α, Σ α/(2z²))-RDP; the classical
    # conversion ε = min_α RDP(α) + log(1/δ)/(α − 1) is an upper bound of dp_accounting's (improved) one
    alphas = np.linspace(1.01, 200, 20_000)
    classical = np.min(alphas * (50 / (2 * 1.1**2) + 5 / (2 * 2.0**2)) + math.log(1e5) / (alphas - 1))
    assert acc.epsilon() <= classical + 1e-6


def test_accountant_budget_and_calibration() -> None:
    z = calibrate_noise_multiplier(4.0, 1e-5, uploads=100)
    acc = PrivacyAccountant(1e-5)
    acc.spend(z, 99)
    assert acc.can_spend(z, budget=4.0)
    acc.spend(z)
    assert acc.epsilon() <= 4.0
    assert acc.epsilon() > 3.9  # calibrated, not merely safe
    assert not acc.can_spend(z, budget=4.0)
    acc.spend(0.0)
    assert acc.epsilon() == math.inf
    assert PrivacyAccountant(1e-5).uploads == 0
    assert isinstance(dp_event({1.0: 2}), dp_accounting.ComposedDpEvent)
    with pytest.raises(ValueError):
        acc.spend(float("nan"))


# --------------------------------------------------------------------------- clipping bounds influence


def _stats_vector(phis: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Plain transcription of a FedBNR upload's noised part: per kernel the upper triangle of Σφφᵀ and
    Σφy, then Σy² (docs/algorithms.md §4)."""
    k, f = phis.shape[1], phis.shape[2]
    iu = np.triu_indices(f)
    parts = []
    for j in range(k):
        S = phis[:, j, :].T @ phis[:, j, :]
        parts += [S[iu], phis[:, j, :].T @ ys]
    return np.concatenate([*parts, [ys @ ys]])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 12), st.floats(0.1, 5.0), st.integers(0, 10_000),
       st.floats(-1e3, 1e3), st.floats(-30, 30))
def test_clipping_bounds_each_samples_influence_on_statistics(k: int, n: int, c_y: float, seed: int,
                                                              y_new: float, x_scale: float) -> None:
    cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=3, n_features=6,
                      kernels=[f"gaussian:{0.5 + i}" for i in range(k)])
    maps = feature_maps(cfg)
    rng = np.random.default_rng(seed)
    xs = rng.normal(0, 1, (n + 1, 3)) * np.array([1.0, x_scale, 1.0])
    ys = np.array([dp.clip_label(y, c_y) for y in rng.normal(0, 10, n + 1)])
    ys[-1] = dp.clip_label(y_new, c_y)
    phis = np.stack([np.stack([m.transform_one(x) for m in maps]) for x in xs])
    phi_sq = float(np.max(np.sum(phis**2, axis=-1)))
    assert phi_sq <= 2.0 + 1e-12  # RFF (‖φ‖ = 1) plus the bias feature
    bound = dp.stats_sensitivity(2.0, c_y, k)
    with_it = _stats_vector(phis, ys)
    without = _stats_vector(phis[:-1], ys[:-1])
    assert np.linalg.norm(with_it - without) <= bound * (1 + 1e-12)
    # replacing one sample moves it by at most twice the bound
    other = phis.copy()
    other[-1] = np.stack([m.transform_one(-xs[-1] * 3) for m in maps])
    assert np.linalg.norm(with_it - _stats_vector(other, -ys)) <= 2 * n * bound + 2 * bound


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=20), st.floats(0.01, 10.0))
def test_gradient_clipping_bounds_an_upload(v: list[float], c: float) -> None:
    a = dp.clip_l2(v, c)
    assert np.linalg.norm(a) <= c * (1 + 1e-12)
    b = dp.clip_l2([-x * 7 for x in v], c)
    assert np.linalg.norm(a - b) <= 2 * c * (1 + 1e-12)
    if np.linalg.norm(v) <= c:
        assert a.tolist() == [float(x) for x in v]


def test_clip_refuses_non_finite() -> None:
    with pytest.raises(ValueError):
        dp.clip_label(float("nan"), 1.0)
    with pytest.raises(ValueError):
        dp.clip_l2([float("inf")], 1.0)


# --------------------------------------------------------------------------- the noisy posterior


def _mirror(upper: np.ndarray, f: int) -> np.ndarray:
    m = np.zeros((f, f))
    m[np.triu_indices(f)] = upper
    return m + np.triu(m, 1).T


@pytest.mark.parametrize("f", [5, 33, 101])
def test_shifted_noisy_scatter_stays_positive_definite(f: int) -> None:
    rng = np.random.default_rng(f)
    s = 1.7
    tau = dp.psd_shift(f, s)
    worst = math.inf
    for uploads in (1, 2, 10, 50):
        for _ in range(60 if f < 101 else 15):
            E = sum(_mirror(dp.symmetric_noise_upper(f, s, rng)[0], f) for _ in range(uploads))
            # the noise of the summed uploads plus their summed shifts, with no data at all (S = 0)
            worst = min(worst, float(np.linalg.eigvalsh(E + uploads * tau * np.eye(f))[0]))
    assert worst > 0
    # and the shift is not absurdly large: the noise's spectral norm reaches a good part of it
    E = _mirror(dp.symmetric_noise_upper(f, s, rng)[0], f)
    assert np.linalg.norm(E, 2) > 0.2 * tau


def test_predictive_variance_formula_matches_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    f, sigma, lam = 6, 0.5, 1.0
    phis = rng.normal(0, 0.4, (200, f))
    ys = phis @ rng.normal(0, 1, f) + rng.normal(0, sigma, 200)
    S, b = phis.T @ phis, phis.T @ ys
    A = S / sigma**2 + np.eye(f) / lam**2
    m = np.linalg.solve(A, b) / sigma**2
    x = rng.normal(0, 0.4, f)
    a = np.linalg.solve(A, x)
    s_S, s_b = 0.05, 0.3
    formula = dp.noise_variance_of_mean(a, m, sigma, s_S, s_b)
    draws = []
    for _ in range(20_000):
        E = _mirror(rng.normal(0, s_S, f * (f + 1) // 2), f)
        A_n = (S + E) / sigma**2 + np.eye(f) / lam**2
        draws.append(x @ np.linalg.solve(A_n, b + rng.normal(0, s_b, f)) / sigma**2)
    assert np.var(draws) == pytest.approx(formula, rel=0.05)
    assert formula > 0


def test_noise_is_added_only_to_the_named_arrays() -> None:
    rng = np.random.default_rng(0)
    arrays = {"S_upper": np.zeros((1, 3)), "b": np.zeros((1, 2)), "n": np.asarray(4.0), "q": np.asarray(0.0)}
    out = dp.add_gaussian_noise(arrays, ("S_upper", "b", "q"), 1.0, rng)
    assert float(out["n"]) == 4.0
    assert np.all(out["S_upper"] != 0) and np.all(out["b"] != 0) and float(out["q"]) != 0
    assert np.all(arrays["S_upper"] == 0)  # a copy
