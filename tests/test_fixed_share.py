"""Fixed share (streamfed.algorithms.fixed_share) against a plain transcription of its equations and
hand-computed weights, and its regret bounds as properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fixed_share import FixedShare, gaussian_log_density, mixture_moments


def plain_fixed_share(densities: np.ndarray, alpha: float) -> tuple[list[np.ndarray], float]:
    """Herbster & Warmuth's fixed share, written out in the linear domain: the weights before every step and after
    the last, and the mixture's cumulative log loss."""
    t_steps, k = densities.shape
    w = np.full(k, 1.0 / k)
    history, loss = [w.copy()], 0.0
    for t in range(t_steps):
        p = densities[t]
        mix = float(np.sum(w * p))
        loss += -math.log(mix)
        v = w * p / mix
        w = (1.0 - alpha) * v + alpha / k
        history.append(w.copy())
    return history, loss


def test_weights_after_each_step_are_the_hand_computed_ones() -> None:
    fs = FixedShare(3, switch_rate=0.3)
    # step 1: densities (0.2, 0.4, 0.4), w = (1/3, 1/3, 1/3): mixture 1/3; Bayes v = (0.2, 0.4, 0.4);
    # share: 0.7·v + 0.1 = (0.24, 0.38, 0.38)
    loss = fs.update(np.log([0.2, 0.4, 0.4]))
    np.testing.assert_allclose(fs.weights, [0.24, 0.38, 0.38], rtol=1e-14)
    assert loss == pytest.approx(math.log(3.0), rel=1e-14)
    # step 2: densities (1, 0.5, 0): mixture 0.24 + 0.19 = 0.43; v = (0.24/0.43, 0.19/0.43, 0);
    # share: (0.7·0.24/0.43 + 0.1, 0.7·0.19/0.43 + 0.1, 0.1) — the expert of density 0 keeps α/K
    loss = fs.update(np.array([0.0, math.log(0.5), -np.inf]))  # log 1, log 0.5, log 0
    np.testing.assert_allclose(fs.weights, [0.7 * 0.24 / 0.43 + 0.1, 0.7 * 0.19 / 0.43 + 0.1, 0.1], rtol=1e-13)
    assert loss == pytest.approx(-math.log(0.43), rel=1e-14)
    assert fs.loss == pytest.approx(math.log(3.0) - math.log(0.43), rel=1e-14)


def test_without_sharing_it_is_bayes_rule() -> None:
    fs = FixedShare(2, switch_rate=0.0)
    for p in ([0.5, 0.1], [0.3, 0.6], [2.0, 0.2]):
        fs.update(np.log(p))
    post = np.array([0.5 * 0.3 * 2.0, 0.1 * 0.6 * 0.2])  # the product of each expert's densities
    np.testing.assert_allclose(fs.weights, post / post.sum(), rtol=1e-13)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 5), st.integers(1, 60),
       st.sampled_from([0.0, 0.001, 0.02, 0.2, 0.7]))
def test_log_domain_weights_equal_the_plain_transcription(seed: int, k: int, t_steps: int, alpha: float) -> None:
    rng = np.random.default_rng(seed)
    dens = np.exp(rng.normal(0.0, 2.0, (t_steps, k)))
    history, loss = plain_fixed_share(dens, alpha)
    fs = FixedShare(k, alpha)
    for t in range(t_steps):
        np.testing.assert_allclose(fs.weights, history[t], rtol=1e-10, atol=1e-300)
        fs.update(np.log(dens[t]))
    np.testing.assert_allclose(fs.weights, history[-1], rtol=1e-10, atol=1e-300)
    assert fs.loss == pytest.approx(loss, rel=1e-10, abs=1e-10)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(1, 200), st.floats(0.0, 0.5))
def test_regret_to_the_best_expert_is_at_most_log_k_plus_t_log_one_over_one_minus_alpha(
        seed: int, k: int, t_steps: int, alpha: float) -> None:
    rng = np.random.default_rng(seed)
    # log densities of any size: experts far apart, some densities underflowing
    log_p = rng.normal(0.0, 1.0, (t_steps, k)) * rng.choice([1.0, 30.0, 400.0], size=(1, k))
    fs = FixedShare(k, alpha)
    for t in range(t_steps):
        fs.update(log_p[t])
    best = float(-log_p.sum(axis=0).max())
    assert fs.loss <= best + math.log(k) + t_steps * -math.log1p(-alpha) + 1e-9 * max(1.0, abs(best))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 5), st.integers(2, 200), st.floats(1e-4, 0.5),
       st.integers(0, 6))
def test_regret_to_any_switching_sequence_is_the_fixed_share_bound(seed: int, k: int, t_steps: int, alpha: float,
                                                                     n_switches: int) -> None:
    rng = np.random.default_rng(seed)
    log_p = rng.normal(0.0, 3.0, (t_steps, k))
    m = min(n_switches, t_steps - 1)
    switch_at = np.sort(rng.choice(np.arange(1, t_steps), size=m, replace=False))
    seq = np.empty(t_steps, dtype=int)
    current, start = int(rng.integers(k)), 0
    for s in [*switch_at.tolist(), t_steps]:
        seq[start:s] = current
        current = int((current + 1 + rng.integers(k - 1)) % k)  # a different expert
        start = s
    switches = int(np.count_nonzero(seq[1:] != seq[:-1]))
    fs = FixedShare(k, alpha)
    for t in range(t_steps):
        fs.update(log_p[t])
    l_seq = float(-log_p[np.arange(t_steps), seq].sum())
    bound = l_seq + math.log(k) + switches * math.log(k / alpha) + (t_steps - 1 - switches) * -math.log1p(-alpha)
    assert fs.loss <= bound + 1e-9 * max(1.0, abs(l_seq))


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="switch_rate"):
        FixedShare(3, 1.0)
    with pytest.raises(ValueError, match="n_experts"):
        FixedShare(0)
    fs = FixedShare(2, 0.1)
    with pytest.raises(ValueError, match="expected 2"):
        fs.update(np.zeros(3))
    with pytest.raises(ValueError, match="no expert"):
        fs.update(np.array([-np.inf, np.nan]))
    assert np.all(np.isfinite(fs.log_weights))  # nothing changed by a refused step


def test_mixture_moments_are_the_mixture_mean_and_variance() -> None:
    rng = np.random.default_rng(1)
    w = rng.dirichlet(np.ones(3))
    mu, var = rng.normal(size=3), rng.uniform(0.1, 2.0, 3)
    mean, v = mixture_moments(w, mu, var)
    # E[y] and E[y²] − E[y]² of the mixture, each component's second moment being v + μ²
    assert mean == pytest.approx(float(np.sum(w * mu)), rel=1e-14)
    assert v == pytest.approx(float(np.sum(w * (var + mu**2)) - np.sum(w * mu) ** 2), rel=1e-12)
    # and by quadrature of the mixture density
    y = np.linspace(-30, 30, 600_001)
    dens = sum(wi * np.exp(gaussian_log_density(y, m, s)) for wi, m, s in zip(w, mu, var, strict=True))
    dy = y[1] - y[0]
    assert float(np.sum(dens) * dy) == pytest.approx(1.0, abs=1e-9)
    assert float(np.sum(y * dens) * dy) == pytest.approx(mean, abs=1e-9)
    assert float(np.sum((y - mean) ** 2 * dens) * dy) == pytest.approx(v, abs=1e-8)


def test_a_switch_rate_whose_share_underflows_still_gives_finite_weights() -> None:
    fs = FixedShare(2, 5e-324)  # α/K underflows to 0; log α does not
    fs.update(np.array([0.0, -800.0]))
    assert np.all(np.isfinite(fs.log_weights)) and fs.weights[1] > 0.0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 4), alpha=st.sampled_from([0.0, 0.01, 0.3, 0.9]))
def test_update_floats_is_update_in_python_floats(seed: int, k: int, alpha: float) -> None:
    rng = np.random.default_rng(seed)
    prior = rng.uniform(0.1, 1.0, k)
    a, b = FixedShare(k, alpha, prior=prior), FixedShare(k, alpha, prior=prior)
    for _ in range(50):
        lp = rng.normal(0.0, 20.0, k)
        if k > 1 and rng.random() < 0.1:
            lp[rng.integers(k)] = -np.inf  # an expert with density 0
        assert a.update(lp) == pytest.approx(b.update_floats(list(lp)), rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(np.exp(a.log_weights), np.exp(b.log_weights), rtol=1e-12, atol=1e-300)
    with pytest.raises(ValueError):
        b.update_floats([-np.inf] * k)
