"""Defaults that defend (issue 30 part 3): `[fleet.robust] aggregation = "auto"` is robust on a production broker
for the families whose robust rule costs nothing without attackers, exact elsewhere, and says which; a robust
fleet smaller than 1/share_cap members still takes every honest member's samples."""

from types import SimpleNamespace

import numpy as np
import pytest

from streamfed.algorithms.fedbnr.wire import stats_update_message
from streamfed.algorithms.shares import effective_cap, share_allowance
from streamfed.core.stats import SufficientStats
from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.aggregation_mode import resolve_aggregation
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.robustness import Robustness
from tests.attacked_fleet import run_attacked_fleet


def cfg(algorithm="fedbnr", **kw):
    return FleetConfig(fleet="f", algorithm=algorithm, n_inputs=3, **kw)


@pytest.mark.parametrize(("algorithm", "kw", "authenticated", "sharded", "expected", "words"), [
    ("fedbnr", {}, True, False, "robust", "a production broker"),
    ("fedbnr", {}, False, False, "exact", "development broker"),
    ("fedbnr", {"secure_aggregation": True}, True, False, "exact", "secure aggregation"),
    ("fedbnr", {}, True, True, "exact", "partial sums"),
    ("pofmkl", {}, True, False, "exact", "explicit choice"),
    ("fedbnr-personal", {}, True, False, "exact", "explicit choice"),
    ("fedbnr", {"robust": Robustness(aggregation="exact")}, True, False, "exact", "as configured"),
    ("pofmkl", {"robust": Robustness(aggregation="robust")}, False, False, "robust", "as configured"),
])
def test_auto_resolves_by_broker_family_and_privacy(algorithm, kw, authenticated, sharded, expected, words):
    resolved, line = resolve_aggregation(cfg(algorithm, **kw), authenticated=authenticated, sharded=sharded)
    assert resolved.robust.aggregation == expected
    assert line.startswith(f"{expected} aggregation:") and words in line
    if expected == "exact":  # exact mode is never silent about whom it trusts
        assert "trusted within the declared bounds" in line
    # nothing else of the configuration moves
    assert resolved.model_dump(exclude={"robust"}) == cfg(algorithm, **kw).model_dump(exclude={"robust"})


def test_a_family_default_is_a_class_attribute_not_a_name():
    from streamfed import algorithms

    defaults = {n: algorithms.get(n).robust_by_default for n in algorithms.names()}
    assert defaults["fedbnr"] and defaults["fsgp"] and not defaults["pofmkl"] and not defaults["fedbnr-personal"]


@pytest.mark.parametrize(("members", "cap"), [(1, 1.0), (2, 0.75), (3, 0.5), (4, 0.375), (6, 0.25), (12, 0.25),
                                              (100, 0.25)])
def test_effective_cap_leaves_room_for_a_fair_share(members, cap):
    assert effective_cap(0.25, members) == pytest.approx(cap)
    # k equal members each holding 1/k of the sums may each still add samples
    assert share_allowance(1.0, float(members), effective_cap(0.25, members), 0.0) > 0.0


def _upload(agg, client, seq, X, y):
    from streamfed.algorithms.fedbnr import ALGORITHM

    c = ALGORITHM.learner(agg_cfg(), "probe", 0).client
    st = SufficientStats.from_samples(c.features_many(X), y, kernel_version=agg.server.kernel_version).to_packed()
    return stats_update_message("f", client, seq, st["S_upper"], st["b"], float(st["n"]), float(st["q"]),
                                global_version=0, kernel_version=agg.server.kernel_version, created=0.0)


def agg_cfg():
    return FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=3, standardise="none", n_features=4,
                       kernels=["gaussian:1.0"], clients=("a", "b"), robust=Robustness(aggregation="robust"),
                       fedbnr={"min_upload": 8, "fit_hyperparameters": False})


def test_a_robust_fleet_of_two_takes_every_honest_sample():
    """Before the fair-share floor, two honest members of a robust fleet (cap 0.25) could add nothing once both
    had their cold-start floor: every later upload was tempered to weight 0."""
    from streamfed.algorithms.fedbnr import ALGORITHM

    c = agg_cfg()
    agg = ALGORITHM.aggregation(c)
    rng = np.random.default_rng(0)
    w = rng.normal(size=3)
    for seq in range(1, 41):
        for client in ("a", "b"):
            X = rng.normal(size=(8, 3))
            agg.take(client, seq, agg.check(_upload(agg, client, seq, X, X @ w + 0.1 * rng.normal(size=8))))
        agg.close_window({}, lambda c: 0)
    assert agg.server.stats.n == pytest.approx(2 * 40 * 8)
    assert agg.tempered == 0 and agg.screened == 0


@pytest.fixture(scope="module")
def beijing():
    return load_beijing("paper", steps=300)


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize(("family", "k"), [("fedbnr", 3), ("fedbnr", 12), ("fsgp", 12)])
def test_robust_default_costs_at_most_one_percent_without_attackers(beijing, family, k):
    """The figure behind `robust_by_default`: honest fleets of `k` Beijing stations on the family's default
    settings, exact against the resolved auto mode of a production broker: the fleet's mean prequential MSE within
    1%, no station worse by more than 3% (docs/reliability.md §7.2.1: robust FedBNR is ~29% *better* than exact over
    1,000 steps with the systematic screen (~9% with the soft screen alone): down-weighting pollution episodes and the
    members whose sums sit far from the fleet's centre; FSGP +0.3%)."""
    fleet = SimpleNamespace(names=list(beijing.names[:k]), streams=list(beijing.streams[:k]))
    base = FleetConfig(fleet="t", algorithm=family, n_inputs=10, standardise="none", clients=tuple(fleet.names))
    robust, _ = resolve_aggregation(base, authenticated=True)
    exact = base.model_copy(update={"robust": Robustness(aggregation="exact")})
    assert robust.robust.aggregation == "robust"

    def upload(*_):  # no attackers: never called
        raise AssertionError

    mse_exact, _ = run_attacked_fleet(fleet, exact, upload, 300)
    mse_robust, core = run_attacked_fleet(fleet, robust, upload, 300)
    ratios = {n: mse_robust[n] / mse_exact[n] for n in fleet.names}
    fleet_ratio = np.mean(list(mse_robust.values())) / np.mean(list(mse_exact.values()))
    print(f"{k} stations: fleet robust/exact MSE {fleet_ratio:.4f}, stations {min(ratios.values()):.4f}.."
          f"{max(ratios.values()):.4f}, {core.aggregation.diagnostics()}")
    assert fleet_ratio <= 1.01
    assert max(ratios.values()) <= 1.03


def _adaptive_upload(agent, core, client, seq, X, y):
    st = SufficientStats.from_samples(agent.learner.client.features_many(X), y,
                                      kernel_version=core.kernel_version).to_packed()
    return stats_update_message("t", client, seq, st["S_upper"], st["b"], float(st["n"]), float(st["q"]),
                                global_version=core.version, kernel_version=core.kernel_version, created=0.0)


def adaptive_labels(streams, factor):
    """An omniscient attacker that echoes the global's prediction shifted by `sqrt(factor · median · v)` per row
    (`v` its predictive variance): its residual ratio is `factor` times the median honest station's (the honest
    stations' last 32 rows under the same global), so it sits under any screen above `factor`."""
    def labels(agent, core, s, rows):
        c = agent.learner.client
        t = int(rows.max())
        lo = max(0, t - 31)
        ratios = []
        for st in streams:
            m, v = c.predict_many(st.X[lo:t + 1])
            ratios.append(float(np.mean((st.y[lo:t + 1] - m) ** 2 / v)))
        mean, var = c.predict_many(s.X[rows])
        return mean + np.sqrt(factor * max(float(np.median(ratios)), 1e-6) * var)
    return labels


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
@pytest.mark.parametrize(("k", "bound"), [(1, 1.45), (3, 1.85)])
def test_an_adaptive_attacker_against_the_robust_default(beijing, k, bound):
    """Issue 30's adaptive attacker on FedBNR's production default (robust, every setting at its default but a
    declared 1 Hz sensor rate): `k` of 12 stations send biased labels whose residual ratio is 4× the honest
    median (under the 50× screen; the ratio that did most harm of 1.5, 4 and 30), as many samples as their rate
    allows. Before the fair-share cap, the one-upload floor and the soft screen: ×2.86 (1 of 12), ×11.6 (3 of 12).
    Measured now ×1.30 and ×1.60 — over the issue's ×1.10 / ×1.25 (docs/reliability.md §7.2.1 says so)."""
    names = list(beijing.names)
    base = FleetConfig(fleet="t", algorithm="fedbnr", n_inputs=10, standardise="none", clients=tuple(names),
                       robust=Robustness(sensor_rate=1.0))
    cfg, _ = resolve_aggregation(base, authenticated=True)
    attackers = tuple(names[:k])
    labels = adaptive_labels(beijing.streams[k:], 4.0)
    calm, _ = run_attacked_fleet(beijing, cfg, _adaptive_upload, 300, attackers, silent=True)
    hit, core = run_attacked_fleet(beijing, cfg, _adaptive_upload, 300, attackers, labels=labels)
    worst = max(hit[n] / calm[n] for n in hit)
    shares = core.aggregation.client_shares()
    print(f"adaptive, {k} of 12: worst honest MSE ratio {worst:.4f}, attackers' shares "
          f"{[round(shares.get(a, 0.0), 4) for a in attackers]}, {core.aggregation.diagnostics()}")
    assert worst <= bound
    assert all(shares.get(a, 0.0) <= 1.5 / 12 + 1e-9 for a in attackers)  # the fair-share cap holds
