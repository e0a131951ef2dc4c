"""FSGP's bounded influence (issue 15): the declared bounds on an upload (statistics and proposal), always
on, and the robust aggregation (per-client share cap, residual screening) of `[fleet.robust] aggregation =
"robust"` (docs/algorithms.md §6.13)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.algorithms.fsgp import ALGORITHM, initial_hyper
from streamfed.algorithms.fsgp.aggregation import check_statistics, residual_ratio
from streamfed.algorithms.fsgp.declared import clamp_to_declared, feature_sq_bound
from streamfed.algorithms.fsgp.elbo import fit_hyper
from streamfed.algorithms.fsgp.kernels import Hyper, cov
from streamfed.algorithms.fsgp.messages import Upload
from streamfed.algorithms.fsgp.posterior import SparsePosterior, Stats
from streamfed.algorithms.fsgp.projection import project
from streamfed.algorithms.fsgp.server import FSGPServer
from streamfed.algorithms.fsgp.wire import UPDATE, update_arrays
from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from streamfed.wire.message import Message
from tests.attacked_fleet import run_attacked_fleet

B = 10.0  # Robustness().label_bound


def cfg_of(d=3, **robust):
    return FleetConfig(fleet="t", algorithm="fsgp", n_inputs=d, standardise="none", robust=Robustness(**robust),
                       params={"n_inducing": 6, "min_upload": 8, "learn_hyperparameters": False})


def message(up: Upload, d: int, *, n_samples=None, version=0) -> Message:
    return Message("t", up.client, UPDATE, up.seq, version, "kv", int(up.stats.n if n_samples is None else n_samples),
                   0.0, update_arrays(up, d), epoch=up.epoch)


def stats_of(h, X, y, epoch=0):
    return Stats.from_samples(cov(h, np.asarray(X), h.Z), np.asarray(y, dtype=np.float64), epoch)


# ------------------------------------------------------------------ declared bounds (always on)
def test_huge_label_upload_is_refused_and_moves_no_one():
    """The attack: 64 real inputs with every label 1e6 (far beyond ±B) — its statistics are those of real
    samples, [[P, r], [rᵀ, q]] is positive semi-definite, so before the declared bounds it was accepted and
    every client's prediction moved towards 1e6."""
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    h = initial_hyper(cfg)
    rng = np.random.default_rng(0)
    X, y = rng.uniform(-1, 1, (64, 3)), rng.uniform(-1, 1, 64)
    honest = Upload("a", 1, 0, stats_of(h, X, y))
    agg.take("a", 1, agg.check(message(honest, 3)))
    agg.close_window({}, lambda c: 0)
    Xs = rng.uniform(-1, 1, (5, 3))
    before, _ = SparsePosterior(h, agg.server.stats).predict_many(Xs)
    bad = Upload("m", 1, 0, stats_of(h, X, np.full(64, 1e6)))
    try:
        up = agg.check(message(bad, 3))
    except ValueError as e:
        assert "label bound" in str(e)
    else:
        agg.take("m", 1, up)
        agg.close_window({}, lambda c: 0)
    after, _ = SparsePosterior(h, agg.server.stats).predict_many(Xs)
    assert np.max(np.abs(after - before)) == 0.0, f"predictions moved by {np.max(np.abs(after - before)):.3g}"


def test_features_beyond_the_covariance_are_refused():
    """Real labels (within ±B) but every feature ×1e5: `tr P` = 1e10 × that of real samples — as if 1e10
    times as many samples, which outweighs every honest client. Every covariance is at most `a²`, so
    `tr P ≤ n·M·a⁴`."""
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    h = initial_hyper(cfg)
    rng = np.random.default_rng(1)
    X, y = rng.uniform(-1, 1, (32, 3)), rng.uniform(-B, B, 32)
    agg.check(message(Upload("a", 1, 0, stats_of(h, X, y)), 3))
    big = Stats.from_samples(1e5 * cov(h, X, h.Z), y)
    with pytest.raises(ValueError, match="exceeds n·M·a⁴"):
        agg.check(message(Upload("m", 1, 0, big), 3))


def test_n_samples_must_be_the_statistics_n():
    """The core's token bucket charges `msg.n_samples`: it bounds the real n only if the two agree."""
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    h = initial_hyper(cfg)
    rng = np.random.default_rng(2)
    up = Upload("a", 1, 0, stats_of(h, rng.uniform(-1, 1, (32, 3)), rng.uniform(-1, 1, 32)))
    with pytest.raises(ValueError, match="n_samples"):
        agg.check(message(up, 3, n_samples=8))
    with pytest.raises(ValueError, match="n_samples"):
        ALGORITHM.aggregation(cfg, check_stats=False).check(message(up, 3, n_samples=8))


def test_r_inconsistent_with_p_and_q_is_refused():
    cfg = cfg_of()
    agg = ALGORITHM.aggregation(cfg)
    h = initial_hyper(cfg)
    rng = np.random.default_rng(3)
    st_ = stats_of(h, rng.uniform(-1, 1, (32, 3)), rng.uniform(-1, 1, 32))
    st_.r = st_.r * 1e3
    with pytest.raises(ValueError):
        agg.check(message(Upload("a", 1, 0, st_), 3))


def test_a_proposal_beyond_what_a_local_fit_makes_is_refused():
    """A proposal weighs at most the reservoir its local fit ran on; `a, ℓ, σ` in [1e-3, 1e3]; `Z` within the
    box of standardised inputs (±10 by default: inputs are winsorised at ±5)."""
    cfg = FleetConfig(fleet="t", algorithm="fsgp", n_inputs=2, params={"n_inducing": 4, "min_upload": 8})
    agg = ALGORITHM.aggregation(cfg)
    h = initial_hyper(cfg)
    assert agg.z_box == 10.0 and agg.max_weight == 256.0
    rng = np.random.default_rng(4)
    st_ = stats_of(h, rng.uniform(-1, 1, (32, 2)), rng.uniform(-1, 1, 32))
    agg.check(message(Upload("a", 1, 0, st_, h, 256.0), 2))
    with pytest.raises(ValueError, match="reservoir"):
        agg.check(message(Upload("a", 1, 0, st_, h, 1e9), 2))
    far = type(h)(h.kind, h.log_amp, h.log_ls, h.log_sigma, h.Z + 1e6)
    with pytest.raises(ValueError, match="inducing inputs beyond"):
        agg.check(message(Upload("a", 1, 0, st_, far, 10.0), 2))
    wild = type(h)(h.kind, h.log_amp + 20.0, h.log_ls, h.log_sigma, h.Z)
    with pytest.raises(ValueError, match="outside"):
        agg.check(message(Upload("a", 1, 0, st_, wild, 10.0), 2))
    # the local fit keeps Z in the box, so an honest proposal always passes
    X = rng.uniform(-5, 5, (64, 2))
    out = fit_hyper(type(h)(h.kind, h.log_amp, h.log_ls, h.log_sigma, np.full_like(h.Z, 9.99)), X,
                    np.sin(X[:, 0]), steps=20, learning_rate=0.5, z_box=10.0)
    assert out is not None and np.max(np.abs(out.Z)) <= 10.0


kinds = st.sampled_from(["se", "matern32", "matern52"])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), seed=st.integers(0, 2**32 - 1), kind=kinds, scale=st.sampled_from([1e-3, 1.0, 1e3]),
       at_bound=st.booleans())
def test_honest_statistics_always_pass(n, seed, kind, scale, at_bound):
    """Statistics of any samples (any inputs, any covariance and hyperparameters a local fit can reach) with
    |y| ≤ B pass every declared bound — fresh, and carried to another version by the projection after the
    client's clamp."""
    rng = np.random.default_rng(seed)
    m, d = int(rng.integers(1, 8)), int(rng.integers(1, 4))
    h = Hyper(kind, rng.uniform(-3, 3), rng.uniform(-3, 3, d), rng.uniform(-3, 2), rng.normal(0, 2, (m, d)))
    X = rng.uniform(-5, 5, (n, d)) * scale
    y = np.clip(rng.standard_normal(n) * 3, -B, B)
    if at_bound:
        y = np.where(rng.random(n) < 0.5, -B, B)
    s = stats_of(h, X, y)
    check_statistics(s, max_abs=1e100, label_bound=B, feat_sq=feature_sq_bound(h))
    new = Hyper(kind, h.log_amp + rng.normal(0, 1), h.log_ls + rng.normal(0, 1, d), h.log_sigma + rng.normal(0, 1),
                h.Z + rng.normal(0, 1, (m, d)))
    try:
        carried = project(s, h, new, 1)
    except ValueError:
        return  # an ill-conditioned C: the server would not move there either
    check_statistics(clamp_to_declared(carried, new, B), max_abs=1e100, label_bound=B,
                     feat_sq=feature_sq_bound(new))


def test_the_clamp_changes_honest_carried_statistics_rarely_and_only_down():
    """Bui et al.'s projection can amplify (W = c_b(Z_b, Z_a) C_a⁻¹): what it carries beyond the fresh bounds is
    scaled down to them, never up; statistics within them are returned unchanged (the same object)."""
    rng = np.random.default_rng(5)
    h = Hyper.initial("se", rng.normal(0, 1, (6, 2)), sigma=0.3)
    X, y = rng.uniform(-2, 2, (20, 2)), rng.uniform(-B, B, 20)
    s = stats_of(h, X, y)
    new = Hyper(h.kind, h.log_amp, h.log_ls - 0.2, h.log_sigma + 0.1, h.Z + 0.1)
    carried = project(s, h, new, 1)
    assert clamp_to_declared(carried, new, B) is carried  # a realistic move: far inside the bounds
    loud = Stats(carried.P * 1e6, carried.r * 1e3, carried.n, carried.q, 1)
    c = clamp_to_declared(loud, new, B)
    assert np.trace(c.P) <= c.n * feature_sq_bound(new) * (1 + 1e-12) and c.q <= loud.q


def test_exact_mode_sums_whole_and_has_no_robust_state():
    agg = ALGORITHM.aggregation(cfg_of())
    assert agg.robust is None and type(agg.server) is FSGPServer
    assert "screened_uploads" not in agg.diagnostics() and agg.client_shares() == {}


# ------------------------------------------------------------------ robust aggregation: the formulas
def test_residual_ratio_equals_the_raw_samples_residual():
    """(q − 2wᵀr + wᵀPw)/n over the mean predictive variance equals Σ(y − mean(x))²/n over mean(var(x) of the
    plain predictive), to 1e-10."""
    rng = np.random.default_rng(6)
    h = Hyper.initial("matern52", rng.normal(0, 1, (7, 2)), sigma=0.4, lengthscale=1.3)
    Xg, yg = rng.uniform(-2, 2, (80, 2)), rng.standard_normal(80)
    post = SparsePosterior(h, stats_of(h, Xg, yg))
    X, y = rng.uniform(-2, 2, (30, 2)), rng.standard_normal(30) * 2
    mean, var = post.predict_many(X)
    np.testing.assert_allclose(residual_ratio(stats_of(h, X, y), post), np.mean((y - mean) ** 2) / np.mean(var),
                               rtol=1e-10)


# ------------------------------------------------------------------ the figure: 12 Beijing stations
STEPS, LB, RATE, BURST = 300, 1.0, 2.0, 64.0  # labels in [0, 1]: ±1 bounds every honest one
PARAMS = {"n_inducing": 16, "min_upload": 16, "sigma": 0.1, "lengthscale": 1.0, "amplitude": 0.5,
          "inducing_scale": 0.5, "learn_hyperparameters": False}


@pytest.fixture(scope="module")
def beijing():
    return load_beijing("paper", steps=STEPS)


def fleet_cfg(names, mode, params=None, **robust):
    robust = {"label_bound": LB, "max_sample_rate": RATE, "sample_burst": BURST, **robust}
    return FleetConfig(standardise="none", fleet="t", algorithm="fsgp", n_inputs=10, clients=names,
                       robust=Robustness(aggregation=mode, **robust), params={**PARAMS, **(params or {})})


def run_fleet(fleet, mode, attackers=(), silent=False, flooder=None, probe=None, params=None, **robust):
    """The figure's fleet (tests/attacked_fleet.py), its forged uploads built as FSGP's statistics under the current
    version."""
    names = list(fleet.names)
    cfg = fleet_cfg(names, mode, params, **robust)

    def upload(agent, core, n, seq, X, y):
        client = agent.learner.client
        st_ = Stats.from_samples(cov(client.hyper, X, client.hyper.Z), y, client.epoch)
        return Message("t", n, UPDATE, seq, core.version, core.kernel_version, y.size, 0.0,
                       update_arrays(Upload(n, seq, core.version, st_), 10), epoch=client.epoch)

    return run_attacked_fleet(fleet, cfg, upload, STEPS, attackers, silent, flooder, probe)


@pytest.mark.parametrize("k", [1, 3])
def test_robust_mode_keeps_every_honest_client_within_10_percent(beijing, k):
    names = list(beijing.names)
    attackers = tuple(names[:k])
    calm, _ = run_fleet(beijing, "robust", attackers, silent=True)
    hit, core = run_fleet(beijing, "robust", attackers)
    worst = max(hit[n] / calm[n] for n in hit)
    print(f"robust, {k} of 12 attackers: worst honest MSE ratio {worst:.4f}, mean MSE "
          f"{np.mean(list(calm.values())):.5f} → {np.mean(list(hit.values())):.5f}, {core.aggregation.diagnostics()}, "
          f"refused {core.rejected}")
    assert worst <= 1.10
    shares = core.aggregation.client_shares()
    print("attackers' shares of the global's samples:", {a: round(shares.get(a, 0.0), 5) for a in attackers})
    # every forged upload after the cold start is screened out. Under the first global (the prior: mean 0,
    # variance a² + σ²) a forged upload's residual ratio is only ~4× the honest median — below the 50× screen —
    # so an attacker may land its cold-start upload, at most the floor's samples
    agg = core.aggregation
    assert all(shares.get(a, 0.0) * agg.server.stats.n <= agg.robust.floor * (1 + 1e-12) for a in attackers)
    assert agg.screened >= 10 * k
    assert set(core.rejected) <= {"invalid_update"} and core.rejected.get("invalid_update", 0) <= k


def test_exact_mode_damage_is_bounded_by_the_rate_and_the_label_bound(beijing):
    """Exact mode sums the attacker's valid statistics whole: what bounds the damage is the rate (its n at most
    burst + rate × elapsed) and the declared bounds (labels within ±B, features within the covariance)."""
    names = list(beijing.names)
    calm, _ = run_fleet(beijing, "exact", names[:1], silent=True)
    hit, core = run_fleet(beijing, "exact", names[:1])
    g = core.aggregation.server.stats
    honest_n = sum(16 * (STEPS // 16) for _ in names[1:])
    attacker_n = g.n - honest_n
    assert 0 < attacker_n <= BURST + RATE * (STEPS - 1)
    worst = max(hit[n] / calm[n] for n in hit)
    print(f"exact, 1 of 12 attackers: attacker {attacker_n:g} of {g.n:g} samples, worst honest MSE ratio "
          f"{worst:.1f}, mean MSE {np.mean(list(calm.values())):.5f} → {np.mean(list(hit.values())):.5f}")
    assert all(np.isfinite(v) for v in hit.values())
    assert worst > 2.0  # the damage is real (exact mode does not defend, it bounds)


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize(("fair_share", "cap"), [(None, 0.25), (1.5, 1.5 / 12)])
def test_a_flood_keeps_its_share_at_or_below_the_cap(beijing, fair_share, cap):
    """A 20 s flood (t = 100..119) of one client sending 50 valid uploads of 32 real samples a second (its rate
    allows 1000 samples/s, a 2000-sample burst): its share of the global's samples stays at or below the cap (a
    fixed share_cap, or the default 1.5 × a fair share of the 12 members)."""
    _, core = run_fleet(beijing, "robust", flooder=beijing.names[1], max_sample_rate=1000.0, sample_burst=2000.0,
                        share_cap=0.25, fair_share=fair_share, probe=119)
    flood = core.probed[beijing.names[1]]
    after = core.aggregation.client_shares()[beijing.names[1]]
    print(f"flood: share {flood:.4f} at its end, {after:.4f} at t = {STEPS} (cap {cap}), "
          f"{core.aggregation.diagnostics()}, refused {core.rejected}")
    assert flood <= cap * (1 + 1e-12)
    assert flood > 0.96 * cap  # it was capped, not screened: its data is honest
    assert core.rejected == {}


@pytest.mark.parametrize("mode", ["exact", "robust"])
def test_an_honest_fleet_learning_its_hyperparameters_is_never_refused(beijing, mode):
    """Twelve honest stations with learned (θ, σ, Z): versions move, pending statistics are carried (and clamped
    to the declared bounds), proposals are bounded by the local fits — and no upload is ever refused."""
    _, core = run_fleet(beijing, mode, params={"learn_hyperparameters": True, "fit_every": 32,
                                               "min_proposal_weight": 64.0, "reservoir": 64})
    d = core.aggregation.diagnostics()
    print(f"{mode}, learned hyperparameters: {d}, refused {core.rejected}, carried pending statistics clamped "
          f"{sum(a.learner.diagnostics()['carried_clamped'] for a in core.agents)} times")
    assert d["epoch"] >= 3 and core.rejected == {}
