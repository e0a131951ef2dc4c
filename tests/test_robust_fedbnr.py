"""FedBNR's bounded influence (issue 15): the declared bounds on an upload's statistics, always on, and the
robust aggregation (per-client share cap, residual screening) of `[fleet.robust] aggregation = "robust"`."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fedbnr import ALGORITHM, FedBNRParams
from streamfed.algorithms.fedbnr.aggregation import check_statistics
from streamfed.algorithms.fedbnr.wire import stats_update_message
from streamfed.core.stats import SufficientStats
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness

B = 10.0  # Robustness().label_bound


def cfg_of(**robust):
    return FleetConfig(standardise="none", fleet="t", algorithm="fedbnr", n_inputs=3, n_features=4,
                       kernels=["gaussian:1.0", "gaussian:3.0"], robust=Robustness(**robust),
                       fedbnr=FedBNRParams(min_upload=8, fit_hyperparameters=False))


def features(cfg, X):
    return ALGORITHM.learner(cfg, "probe", 0).client.features_many(X)  # (n, K, F)


def upload(cfg, agg, X, y, *, client="a", seq=1, n=None, n_samples=None):
    st_ = SufficientStats.from_samples(features(cfg, X), y, kernel_version=agg.server.kernel_version)
    packed = st_.to_packed()
    nn = float(packed["n"]) if n is None else float(n)
    return stats_update_message("t", client, seq, packed["S_upper"], packed["b"], nn, float(packed["q"]),
                                global_version=0, kernel_version=agg.server.kernel_version, created=0.0,
                                n_samples=n_samples)


# ------------------------------------------------------------------ declared bounds (always on)
def test_claimed_n_of_2_53_is_refused():
    """The issue's upload: real statistics of 32 samples claiming n = 2^53 (MSE 0.001 → 1e12, permanently).
    RFF features have ‖φ‖² = 2 for every input, so tr S = 2n pins n."""
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    rng = np.random.default_rng(0)
    X, y = rng.uniform(-1, 1, (32, 3)), rng.uniform(-1, 1, 32)
    agg.check(upload(cfg, agg, X, y))  # the honest one passes
    with pytest.raises(ValueError, match="tr S"):
        agg.check(upload(cfg, agg, X, y, n=2.0**53, n_samples=2**53))


def test_n_samples_must_be_the_statistics_n():
    """The core's token bucket charges `msg.n_samples`: it bounds the real n only if the two agree."""
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    rng = np.random.default_rng(1)
    X, y = rng.uniform(-1, 1, (32, 3)), rng.uniform(-1, 1, 32)
    with pytest.raises(ValueError, match="n_samples"):
        agg.check(upload(cfg, agg, X, y, n_samples=8))
    # also where the statistics themselves cannot be checked (DP noise, masks): n is public there
    with pytest.raises(ValueError, match="n_samples"):
        ALGORITHM.aggregation(cfg, check_stats=False).check(upload(cfg, agg, X, y, n_samples=8))


def test_labels_beyond_the_bound_are_refused():
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, (32, 3))
    agg.check(upload(cfg, agg, X, np.full(32, B)))  # at the bound: an honest agent's clipped labels
    with pytest.raises(ValueError, match="label bound"):
        agg.check(upload(cfg, agg, X, np.full(32, 1e3)))
    y = np.zeros(32)
    y[0] = 1e3  # one bad reading the agent did not clip
    with pytest.raises(ValueError, match="label bound"):
        agg.check(upload(cfg, agg, X, y))


def test_b_inconsistent_with_s_and_q_is_refused():
    """|b_i| ≤ √(S_ii q) and ‖b‖² ≤ tr S · q (Cauchy–Schwarz over the samples), checked explicitly."""
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    rng = np.random.default_rng(3)
    X, y = rng.uniform(-1, 1, (32, 3)), rng.uniform(-1, 1, 32)
    msg = upload(cfg, agg, X, y)
    msg.arrays["b"] = msg.arrays["b"] * 1e3
    with pytest.raises(ValueError):
        agg.check(msg)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([0.0, 1e-12, 1.0, B]),
       at_bound=st.booleans())
def test_honest_statistics_always_pass(n, seed, scale, at_bound):
    """Statistics of any samples with |y| ≤ B (labels at ±B exactly included) pass every declared bound."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-50, 50, (n, 3)) * rng.choice([1e-6, 1.0, 1e3])
    y = np.clip(rng.standard_normal(n) * scale * 3, -B, B)
    if at_bound:
        y = np.where(rng.random(n) < 0.5, -B, B)
    phi = features(CFG, X)
    s = SufficientStats.from_samples(phi, y)
    check_statistics(s, max_abs=1e100, phi_sq=AGG.phi_sq, label_bound=B, phi_sq_min=AGG.phi_sq_min)


CFG = cfg_of()
AGG = ALGORITHM.aggregation(CFG)
