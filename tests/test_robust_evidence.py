"""Robust FedBNR against members whose labels are a smooth shift of the truth (issue 30): the systematic screen
(`algorithms/shares.py`, `fedbnr/aggregation.py`), the members' geometric-median centre and the evidence's noise
floor (`fedbnr/robust_evidence.py`), each against a plain transcription."""

import dataclasses
import math

import numpy as np
import pytest

from streamfed.algorithms.fedbnr import ALGORITHM, FedBNRParams
from streamfed.algorithms.fedbnr.evidence import fit_hyperparameters
from streamfed.algorithms.fedbnr.robust_evidence import member_residuals, noise_floored_fit, robust_centre
from streamfed.algorithms.fedbnr.wire import stats_update_message
from streamfed.core.stats import SufficientStats
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness


def test_member_residuals_are_the_raw_samples_mean_squared_residuals():
    rng = np.random.default_rng(3)
    phi, y, mu = rng.standard_normal((40, 5)), rng.standard_normal(40), rng.standard_normal(5)
    st = SufficientStats.from_samples(phi, y)
    assert member_residuals(mu, [(st.S, st.b, st.q, st.n)])[0] == pytest.approx(np.mean((y - phi @ mu) ** 2))


def _weiszfeld(points, metric, iters=2000):
    """The geometric median under `‖v‖² = vᵀ M v`, by plain Weiszfeld iterations from the mean."""
    c = points.mean(axis=0)
    for _ in range(iters):
        d = np.array([math.sqrt(max((p - c) @ metric @ (p - c), 1e-30)) for p in points])
        c = (points / d[:, None]).sum(axis=0) / (1.0 / d).sum()
    return c


def test_robust_centre_is_the_geometric_median_of_the_members_fits_and_ignores_a_minority():
    rng = np.random.default_rng(4)
    f, w_true = 4, np.array([1.0, -0.5, 0.3, 0.0])
    members, fits = [], []
    for i in range(9):
        phi = rng.standard_normal((60, f))
        y = phi @ (w_true + (np.array([5.0, 5.0, 5.0, 5.0]) if i < 3 else 0.0)) + 0.1 * rng.standard_normal(60)
        st = SufficientStats.from_samples(phi, y)
        members.append((st.S, st.b, st.q, st.n))
        fits.append(np.linalg.solve(st.S + 1e-3 * np.eye(f), st.b))
    s_total = sum(m[0] for m in members)
    n_total = sum(m[3] for m in members)
    centre = robust_centre(s_total, members, 1e-3)
    reference = _weiszfeld(np.array(fits), s_total / n_total)
    assert np.allclose(centre, reference, atol=1e-5)
    assert np.linalg.norm(centre - w_true) < 0.3  # 3 of 9 members at +5 barely move it
    assert np.linalg.norm(np.mean(fits, axis=0) - w_true) > 2.0  # the mean they drag by 5/3 per coordinate


def test_a_minority_of_noise_free_members_cannot_pull_the_noise_level_down():
    """Five honest members (noise 0.3), two that send the noise-free truth with three times the samples each:
    the pooled evidence reads σ ≈ 0.2; the floor keeps it at the honest members' 0.3."""
    rng = np.random.default_rng(5)
    freqs = rng.standard_normal((2, 20))

    def phi(x):
        z = x @ freqs
        return np.hstack([np.cos(z), np.sin(z), np.ones((x.shape[0], 1))]) / math.sqrt(20)

    parts = []
    for i in range(7):
        n = 300 if i < 5 else 900
        x = rng.uniform(-2, 2, (n, 2))
        y = np.sin(x[:, 0]) + 0.5 * x[:, 1] + (0.3 * rng.standard_normal(n) if i < 5 else 0.0)
        parts.append(SufficientStats.from_samples(phi(x), y))
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    plain, _, _ = fit_hyperparameters(total.S, total.b, total.n, total.q)
    floored, _, _, floor = noise_floored_fit(total.S, total.b, total.n, total.q,
                                             [(p.S, p.b, p.q, p.n) for p in parts])
    assert plain < 0.22
    assert 0.26 < floored < 0.36 and floored == pytest.approx(math.sqrt(floor), rel=0.2)


def test_the_leave_out_floor_is_the_median_members_residual_under_the_others_fit():
    rng = np.random.default_rng(8)
    raw, parts = [], []
    for _ in range(5):
        phi = rng.standard_normal((50, 6))
        y = phi @ np.array([1.0, 0.5, 0.0, -0.5, 0.2, 0.1]) + 0.4 * rng.standard_normal(50)
        raw.append((phi, y))
        parts.append(SufficientStats.from_samples(phi, y))
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    sigma, lam, _ = fit_hyperparameters(total.S, total.b, total.n, total.q)
    residuals = []
    for (phi, y), p in zip(raw, parts, strict=True):
        mu = np.linalg.solve(total.S - p.S + (sigma / lam) ** 2 * np.eye(6), total.b - p.b)
        residuals.append(np.mean((y - phi @ mu) ** 2))
    *_, floor = noise_floored_fit(total.S, total.b, total.n, total.q, [(p.S, p.b, p.q, p.n) for p in parts],
                                  rounds=1, leave_out=True)
    assert floor == pytest.approx(float(np.median(residuals)), rel=1e-9)


# ------------------------------------------------------------------ the systematic screen in an aggregation
def _cfg(members):
    return FleetConfig(standardise="none", fleet="t", algorithm="fedbnr", n_inputs=3, n_features=6,
                       kernels=["gaussian:1.5"], clients=tuple(members), robust=Robustness(aggregation="robust"),
                       fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=False))


def _truth(x):
    return np.sin(x[:, 0]) + 0.5 * x[:, 1]


def _run(systematic, shift, attackers=2):
    """Ten members (two shifting their labels by `shift`, noise-free: the adaptive attacker's kind), 40 windows
    of 32 samples each; the global's mean absolute error against the truth on fresh inputs."""
    members = [f"m{i}" for i in range(10)]
    cfg = _cfg(members)
    agg = ALGORITHM.aggregation(cfg)
    agg.robust = dataclasses.replace(agg.robust, systematic=systematic)
    client = ALGORITHM.learner(cfg, "probe", 0).client
    rng = np.random.default_rng(6)
    seqs = dict.fromkeys(members, 0)
    for _ in range(40):
        for i, m in enumerate(members):
            x = rng.uniform(-2, 2, (32, 3))
            y = _truth(x) + (shift if i < attackers else 0.1 * rng.standard_normal(32))
            st = SufficientStats.from_samples(client.features_many(x), y, kernel_version=agg.server.kernel_version)
            p = st.to_packed()
            seqs[m] += 1
            msg = stats_update_message("t", m, seqs[m], p["S_upper"], p["b"], float(p["n"]), float(p["q"]),
                                       global_version=agg.version, kernel_version=agg.server.kernel_version,
                                       created=0.0)
            agg.take(m, seqs[m], agg.check(msg))
        agg.close_window({}, lambda c: 0)
    s = agg.server
    mu = np.linalg.solve(s.stats.S[0] + (s.sigma[0] / s.lam[0]) ** 2 * np.eye(s.dim), s.stats.b[0])
    x = np.random.default_rng(7).uniform(-2, 2, (500, 3))
    return client.features_many(x)[:, 0] @ mu, agg


def _pull(systematic, shift):
    """How far the attackers move the global's predictions: mean |attacked − attack-free| on fresh inputs."""
    hit, agg = _run(systematic, shift)
    calm, _ = _run(systematic, shift, attackers=0)
    return float(np.mean(np.abs(hit - calm))), agg


def test_two_members_shifting_their_labels_lose_their_weight_and_the_global_stays_near_the_truth():
    off, _ = _pull(0.0, 0.5)
    on, agg = _pull(2.0, 0.5)
    weights = agg.server.member_weights
    assert max(weights["m0"], weights["m1"]) < 0.2
    assert min(w for c, w in weights.items() if c not in ("m0", "m1")) > 0.5
    assert off > 0.04, off  # without the screen: two of ten at +0.5 (the soft screen tempers them)
    assert on < 0.4 * off, (on, off)


def test_the_systematic_screen_leaves_an_honest_fleet_whole():
    """Every member honest: every weight above one half and the global within 2% of the one without the screen."""
    off, _ = _run(0.0, 0.0, attackers=0)
    on, agg = _run(2.0, 0.0, attackers=0)
    assert min(agg.server.member_weights.values()) > 0.5
    assert float(np.mean(np.abs(on - off))) < 0.02 * float(np.mean(np.abs(off)))
