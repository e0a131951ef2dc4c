"""Personalised FedBNR's evidence fit (issue 29): the gradient of the hierarchical evidence against finite
differences of the plain transcription, the gradient searches against each other and Nelder-Mead, and the refit
schedule (`refit_growth`): counted refits, and at 0 the refit-every-global loop bit for bit."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest

from streamfed.algorithms.fedbnr_personal import server as server_module
from streamfed.algorithms.fedbnr_personal.evidence import (
    SEARCHES,
    _Spectra,
    fit_hierarchical,
    hierarchical_log_evidence,
)
from streamfed.algorithms.fedbnr_personal.messages import HierUpload
from streamfed.algorithms.fedbnr_personal.server import FedBNRHierServer
from streamfed.core.stats import SufficientStats
from tests.personal_fleet import run_personal_fleet

F = 5


def _samples(rng: np.random.Generator, w: np.ndarray, n: int, spread: float = 0.4) -> SufficientStats:
    phi = rng.standard_normal((n, F)) * np.linspace(0.3, 1.5, F)
    y = phi @ (w + spread * rng.standard_normal(F)) + 0.2 * rng.standard_normal(n)
    return SufficientStats.from_samples(phi, y)


def _fleet(seed: int, k: int = 4, n: int = 50) -> list[SufficientStats]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(F)
    return [_samples(rng, w, n) for _ in range(k)]


@pytest.mark.parametrize("point", [(0.3, 1.5, 0.2), (1.0, 0.1, 2.0), (0.05, 3.0, 1e-3), (0.2, 0.7, 0.4)])
def test_the_gradient_is_the_derivative_of_the_plain_evidence(point: tuple[float, float, float]) -> None:
    stats = _fleet(1)
    x = np.log(point)
    value, grad = _Spectra(stats).log_evidence_and_grad(*x)
    assert value == pytest.approx(hierarchical_log_evidence(stats, *point)[0], rel=1e-10)
    h = 1e-5
    for i in range(3):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        fd = (hierarchical_log_evidence(stats, *np.exp(up))[0]
              - hierarchical_log_evidence(stats, *np.exp(down))[0]) / (2 * h)
        assert grad[i] == pytest.approx(fd, rel=1e-5, abs=1e-5 * max(1.0, abs(value)))


def test_the_gradient_searches_find_one_optimum_and_nelder_mead_is_near_it() -> None:
    stats = _fleet(2, k=5)
    lbfgs = fit_hierarchical(stats, method="l-bfgs-b")
    newton = fit_hierarchical(stats, method="newton", memory={})
    nm = fit_hierarchical(stats, method="nelder-mead")
    assert np.allclose(np.log(lbfgs[:3]), np.log(newton[:3]), atol=1e-4)
    assert np.allclose(np.log(nm[:3]), np.log(newton[:3]), atol=2e-2)
    assert newton[3] >= nm[3] - 1e-6
    assert newton[3] == pytest.approx(hierarchical_log_evidence(stats, *newton[:3])[0], rel=1e-10)
    # a maximum: no neighbour in the logs is better, and the gradient vanishes there
    for d in np.vstack([np.eye(3), -np.eye(3)]) * 1e-2:
        assert hierarchical_log_evidence(stats, *np.exp(np.log(newton[:3]) + d))[0] <= newton[3]
    grad = _Spectra(stats).log_evidence_and_grad(*np.log(newton[:3]))[1]
    assert np.abs(grad).max() < 1e-6 * sum(st.n for st in stats)


def test_newton_warm_started_by_the_last_curvature_and_with_tau_fixed() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal(F)
    stats = [_samples(rng, w, 40) for _ in range(4)]
    memory: dict = {}
    start = None
    for _ in range(4):  # a chain of fits, each on a little more data, warm-started as the server does
        stats = [st + _samples(rng, w, 10) for st in stats]
        newton = fit_hierarchical(stats, start, method="newton", memory=memory)
        lbfgs = fit_hierarchical(stats, start, method="l-bfgs-b")
        assert np.allclose(np.log(newton[:3]), np.log(lbfgs[:3]), atol=1e-4)
        assert memory["hessian"].shape == (3, 3)
        start = newton[:3]
    fixed = fit_hierarchical(stats, start, method="newton", memory=memory, fixed_tau=0.3)
    assert fixed[2] == 0.3 and memory["hessian"].shape == (2, 2)
    assert np.allclose(np.log(fixed[:2]), np.log(fit_hierarchical(stats, method="l-bfgs-b", fixed_tau=0.3)[:2]),
                       atol=1e-4)
    with pytest.raises(ValueError, match="method"):
        fit_hierarchical(stats, method="simplex")


def _upload(client: str, seq: int, stats: SufficientStats) -> HierUpload:
    return HierUpload(client, seq, float(seq), int(stats.n), stats)


def test_the_schedule_refits_once_the_samples_added_reach_the_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    fits: list[float] = []
    fit = server_module.fit_hierarchical

    def counted(client_stats: list[SufficientStats], *args: object, **kwargs: object) -> tuple:
        fits.append(sum(st.n for st in client_stats))
        return fit(client_stats, *args, **kwargs)

    monkeypatch.setattr(server_module, "fit_hierarchical", counted)
    rng = np.random.default_rng(4)
    w = rng.standard_normal(F)
    server = FedBNRHierServer(dim=F, min_samples=1, refit_growth=0.5)
    seq = {"a": 0, "b": 0}

    def send(client: str, n: int) -> None:
        seq[client] += 1
        assert server.apply(_upload(client, seq[client], _samples(rng, w, n)))

    send("a", 10)
    send("b", 10)
    server.publish()  # the first global: always fitted
    assert fits == [20]
    for client, n, due in (("a", 4, False), ("b", 5, False), ("a", 1, True), ("b", 14, False), ("a", 1, True)):
        send(client, n)
        before = (server.sigma, server.lam, server.tau)
        g = server.publish()
        assert server.refit_due() is False  # just fitted, or still short of the fraction
        assert (len(fits) > 0 and fits[-1] == sum(st.n for st in server.stats_at(g.time).values())) is due
        if not due:  # σ, λ, τ held; the published evidence is the exact one at them
            assert (g.sigma, g.lam, g.tau) == before
            assert g.log_evidence == hierarchical_log_evidence(list(server.stats_at(g.time).values()), *before)[0]
    assert fits == [20, 30, 45]  # 10 ≥ 0.5 × 20 added; then 15 ≥ 0.5 × 30 (14 short of it, 15 reach it)


def test_the_schedule_counts_samples_added_under_forgetting() -> None:
    """With forgetting the held total can shrink: the schedule counts what was added, so refits keep coming."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal(F)
    server = FedBNRHierServer(dim=F, min_samples=1, refit_growth=0.5, forgetting=0.9)
    refits = 0
    for step in range(1, 13):
        for c in ("a", "b"):
            st = _samples(rng, w, 8)
            server.apply(HierUpload(c, step, 8.0 * step, 8, st))
        due = server.refit_due()
        server.publish()
        refits += due
    # the discounted total stays below 2 × 8 / (1 - 0.9^8) ≈ 28 samples, so the 16 added each round always reach
    # half of it: a refit every round (a schedule on the total would stop after the third: it never grows 1.5×)
    assert refits == 12


@pytest.mark.parametrize("search", SEARCHES)
def test_the_schedule_at_zero_is_the_refit_at_every_global_bit_for_bit(search: str) -> None:
    rng = np.random.default_rng(6)
    w = rng.standard_normal(F)
    server = FedBNRHierServer(dim=F, min_samples=1, refit_growth=0.0, search=search)
    held: dict[str, SufficientStats] = {}
    start, memory, seq = None, {}, {"a": 0, "b": 0, "c": 0}
    for step in range(1, 7):
        for c in ("a", "b", "c")[: 2 + step % 2]:  # "c" uploads every other round
            st = _samples(rng, w, 6 + step)
            seq[c] += 1
            server.apply(_upload(c, seq[c], st))
            held[c] = held[c] + st if c in held else st.copy()
        g = server.publish()
        # the refit-every-global loop as it was: fit from the last optimum, then the exact posterior there
        usable = [held[c] for c in sorted(held)]
        sig, lam, tau, _ = fit_hierarchical(usable, start, method=search, memory=memory)
        start = (sig, lam, tau)
        lev, a, h = hierarchical_log_evidence(usable, sig, lam, tau)
        assert (g.sigma, g.lam, g.tau, g.log_evidence) == (sig, lam, tau, lev)
        assert np.array_equal(g.A, a) and np.array_equal(g.h, h)


def test_a_bad_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="refit_growth"):
        FedBNRHierServer(dim=2, refit_growth=-0.1)
    with pytest.raises(ValueError, match="refit_growth"):
        FedBNRHierServer(dim=2, refit_growth=math.inf)
    with pytest.raises(ValueError, match="search"):
        FedBNRHierServer(dim=2, search="grid")


def _fleet_globals(params: dict, steps: int = 120) -> tuple[object, list[tuple[float, float, float]]]:
    """Two agents and an aggregator of `fedbnr-personal` through the real codec; the `(σ, λ, τ)` of every global."""
    agg, _, globals_ = run_personal_fleet(params, steps=steps)
    return agg.aggregation.server, [tuple(float(g.arrays[k][0]) for k in ("sigma", "lam", "tau")) for g in globals_]


def test_the_fleet_takes_the_schedule_from_its_parameters() -> None:
    server, every = _fleet_globals({"refit_growth": 0.0, "evidence_search": "nelder-mead"})
    assert (server.refit_growth, server.search) == (0.0, "nelder-mead")
    lazy_server, lazy = _fleet_globals({"refit_growth": 1.0})
    assert (lazy_server.refit_growth, lazy_server.search) == (1.0, "newton")
    assert len(every) == len(lazy) > 10
    changes = sum(a != b for a, b in pairwise(lazy))
    # the samples double between refits: 16 → 480 samples over the 30 globals is ~5 doublings, against a refit at
    # every global (σ, λ, τ change at each)
    assert 3 <= changes <= 5 and sum(a != b for a, b in pairwise(every)) == len(every) - 1
    from pydantic import ValidationError

    from streamfed.algorithms.fedbnr_personal import PersonalParams
    with pytest.raises(ValidationError):
        PersonalParams(refit_growth=-1.0)
    with pytest.raises(ValidationError):
        PersonalParams(evidence_search="grid")
