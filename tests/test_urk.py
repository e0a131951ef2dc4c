"""URK-FedBNR (streamfed.algorithms.urk): the URK features against the Gaussian kernel, torch's gradients
against finite differences, the torch evidence against plain transcriptions of docs/algorithms.md §3 in numpy,
numpy features against torch features."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multivariate_normal

torch = pytest.importorskip("torch")

from streamfed.algorithms.urk.network import URKArch, URKWeights, features, initial_weights, omega  # noqa: E402
from streamfed.algorithms.urk.training import features_t, fit_local, log_evidence  # noqa: E402

torch.set_num_threads(1)


# =========================================================================== oracles: plain transcriptions


def oracle_log_evidence(phi: np.ndarray, y: np.ndarray, sigma: float, lam: float) -> float:
    """docs/algorithms.md §3, line by line: A = σ⁻²S + λ⁻²I;
    log p(y) = −(n/2) log(2πσ²) − ½ log|I + λ²σ⁻²S| − ½ (σ⁻²q − σ⁻⁴ bᵀA⁻¹b)."""
    n, f = phi.shape
    S, b, q = phi.T @ phi, phi.T @ y, y @ y
    A = S / sigma**2 + np.eye(f) / lam**2
    return float(-(n / 2) * np.log(2 * np.pi * sigma**2)
                 - 0.5 * np.log(np.linalg.det(np.eye(f) + lam**2 / sigma**2 * S))
                 - 0.5 * (q / sigma**2 - b @ np.linalg.inv(A) @ b / sigma**4))


def oracle_marginal(phi: np.ndarray, y: np.ndarray, sigma: float, lam: float) -> float:
    """The same evidence by its definition: y ~ N(0, σ²I + λ²ΦΦᵀ) (w ~ N(0, λ²I) integrated out)."""
    cov = sigma**2 * np.eye(len(y)) + lam**2 * phi @ phi.T
    return float(multivariate_normal(np.zeros(len(y)), cov).logpdf(y))


def oracle_features(x: np.ndarray, W: list[np.ndarray], c: list[np.ndarray], ls: np.ndarray, om: np.ndarray
                    ) -> np.ndarray:
    """URK of the thesis eq. 3.2 with g = [cos(h(ω)ᵀf(x)), sin(h(ω)ᵀf(x))], h(ω) = ω/ℓ, one sample at a time."""
    h = x
    for i, (Wi, ci) in enumerate(zip(W, c, strict=True)):
        h = Wi @ h + ci
        if i < len(W) - 1:
            h = np.tanh(h)
    m = om.shape[0]
    z = [np.array([math.cos((om[i] / ls) @ h), math.sin((om[i] / ls) @ h)]) for i in range(m)]
    s = np.concatenate(z)  # s^m_ω(x): m samples of z_ω(x), each (cos, sin)
    return s / math.sqrt(m - 1)


def reorder(s: np.ndarray) -> np.ndarray:
    """The oracle interleaves (cos_i, sin_i); the package lays out all cosines, then all sines."""
    return np.concatenate([s[0::2], s[1::2]])


# =========================================================================== 1. the feature map


def test_features_match_the_oracle_with_an_mlp() -> None:
    arch = URKArch(n_inputs=3, widths=(5, 4), n_omega=6)
    w = initial_weights(arch, seed=3, lengthscale=0.7)
    w.arrays["c0"] = np.random.default_rng(1).standard_normal(5)  # non-zero biases: they must be used
    om = omega(arch, 3)
    X = np.random.default_rng(2).standard_normal((4, 3))
    mine = features(w, om, X)
    for t in range(4):
        ref = reorder(oracle_features(X[t], [w.arrays["W0"], w.arrays["W1"]], [w.arrays["c0"], w.arrays["c1"]],
                                      np.exp(w.arrays["log_ls"]), om))
        assert np.allclose(mine[t], ref, rtol=0, atol=1e-14)


def test_omega_is_derived_from_the_seed_alone() -> None:
    arch = URKArch(n_inputs=2, widths=(), n_omega=8)
    assert np.array_equal(omega(arch, 5), omega(arch, 5))
    assert not np.array_equal(omega(arch, 5), omega(arch, 6))


def gaussian(X: np.ndarray, ell: float) -> np.ndarray:
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return np.exp(-d2 / (2 * ell**2))


def test_identity_extractor_approximates_the_gaussian_kernel_like_one_over_root_m() -> None:
    """Plain RFF as a URK (f = identity, h = ω/ℓ): the error of URK(x, x') against exp(−‖x−x'‖²/2ℓ²) falls
    like m^(−1/2) — the fitted log-log slope over m = 16 … 4096, averaged over seeds."""
    ell = 1.3
    X = np.random.default_rng(0).uniform(-2, 2, (12, 2))
    K = gaussian(X, ell)
    ms = [16, 64, 256, 1024, 4096]
    errs = []
    for m in ms:
        arch = URKArch(n_inputs=2, widths=(), n_omega=m)
        e = []
        for seed in range(12):
            phi = features(initial_weights(arch, seed, lengthscale=ell), omega(arch, seed), X)
            e.append(np.sqrt(np.mean((phi @ phi.T - K) ** 2)))
        errs.append(np.mean(e))
    slope = np.polyfit(np.log(ms), np.log(errs), 1)[0]
    assert -0.62 < slope < -0.38, (slope, errs)
    assert errs[-1] < 0.03


def test_the_normalisation_is_the_theses_m_over_m_minus_one() -> None:
    """With √(m−1) (eq. 3.2) the expectation of URK is m/(m−1)·k: at m = 2 and x = x', exactly 2 (cos² + sin²
    = 1 for each of the two samples, divided by 1); on average over draws, 2k(x, x') off the diagonal."""
    ell, X = 1.0, np.array([[0.0, 0.0], [0.6, -0.3]])
    arch = URKArch(n_inputs=2, widths=(), n_omega=2)
    vals = []
    for seed in range(4000):
        phi = features(initial_weights(arch, seed, lengthscale=ell), omega(arch, seed), X)
        assert phi[0] @ phi[0] == pytest.approx(2.0, abs=1e-12)
        vals.append(phi[0] @ phi[1])
    k = gaussian(X, ell)[0, 1]
    assert np.mean(vals) == pytest.approx(2 * k, abs=4 * np.std(vals) / math.sqrt(len(vals)))


# =========================================================================== 2. evidence and gradients


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_evidence_equals_both_oracles(seed: int) -> None:
    rng = np.random.default_rng(seed)
    phi = rng.standard_normal((15, 6)) * 0.5
    y = rng.standard_normal(15)
    sigma, lam = float(rng.uniform(0.2, 2.0)), float(rng.uniform(0.2, 3.0))
    mine = float(log_evidence(torch.tensor(phi), torch.tensor(y), torch.tensor(math.log(sigma), dtype=torch.float64),
                              torch.tensor(math.log(lam), dtype=torch.float64)))
    assert mine == pytest.approx(oracle_log_evidence(phi, y, sigma, lam), rel=1e-10, abs=1e-10)
    assert mine == pytest.approx(oracle_marginal(phi, y, sigma, lam), rel=1e-10, abs=1e-10)


def test_gradients_match_finite_differences() -> None:
    arch = URKArch(n_inputs=2, widths=(3, 2), n_omega=4, shifter_width=3)
    w = initial_weights(arch, seed=1)
    rng = np.random.default_rng(0)
    v = w.to_vector() + 0.1 * rng.standard_normal(arch.n_params)  # the shifter's residual away from zero
    om = torch.tensor(omega(arch, 1))
    X, y = torch.tensor(rng.standard_normal((7, 2))), torch.tensor(rng.standard_normal(7))

    def ev(p: torch.Tensor) -> torch.Tensor:
        return log_evidence(features_t(p, arch, om, X), y, p[-2], p[-1])

    def feats(p: torch.Tensor) -> torch.Tensor:
        return features_t(p, arch, om, X)

    p = torch.tensor(v, requires_grad=True)
    assert torch.autograd.gradcheck(ev, (p,), eps=1e-6, atol=1e-6, rtol=1e-5)
    assert torch.autograd.gradcheck(feats, (p,), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_numpy_features_equal_torch_features() -> None:
    arch = URKArch(n_inputs=4, widths=(16, 8), n_omega=32, shifter_width=6)
    rng = np.random.default_rng(7)
    w = URKWeights.from_vector(arch, initial_weights(arch, 7).to_vector() + 0.2 * rng.standard_normal(arch.n_params))
    om = omega(arch, 7)
    X = rng.standard_normal((50, 4)) * 2
    ref = features_t(torch.tensor(w.to_vector()), arch, torch.tensor(om), torch.tensor(X)).numpy()
    assert np.max(np.abs(features(w, om, X) - ref)) <= 1e-12


def test_a_local_fit_raises_the_evidence_and_finds_the_noise() -> None:
    """`sin(x/0.3)` plus noise 0.1 on [−3, 3], from ℓ = 0.6, σ = 0.5: the fit raises the evidence (the numpy
    oracle's, not the code under test's) and finds σ near the true 0.1. (From ℓ = 2 it stops in the known
    local optimum that explains the function as noise, σ ≈ 0.67: evidence maximisation is not convex.)"""
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (120, 1))
    y = np.sin(X[:, 0] / 0.3) + 0.1 * rng.standard_normal(120)
    arch = URKArch(n_inputs=1, widths=(), n_omega=32)
    w0 = initial_weights(arch, 0, lengthscale=0.6, sigma=0.5, lam=1.0)
    om = omega(arch, 0)
    w1 = fit_local(w0, om, X, y, steps=150, learning_rate=0.05)
    assert w1 is not None
    before = oracle_log_evidence(features(w0, om, X), y, w0.sigma, w0.lam)
    after = oracle_log_evidence(features(w1, om, X), y, w1.sigma, w1.lam)
    assert after > before + 50
    assert 0.07 < w1.sigma < 0.15
