"""Robust POF-MKL with asynchronous windows (issue 30 part 2): an attacker whose uploads land in windows of their
own was the whole window's trimmed mean (in process, ×5.6e7 on the honest MSE with the *reverse* attacker below);
robust mode now judges each window against a sliding reference set — per kernel, the latest row of each recent
client — so a lone row is clipped to the fleet's recent norms and clamped to the span of its recent rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from streamfed.algorithms import get
from streamfed.algorithms.pofmkl.aggregation import POFMKLAggregation, RobustRule, StepBound
from streamfed.algorithms.pofmkl.messages import KernelUpdate
from streamfed.algorithms.pofmkl.wire import update_message
from streamfed.evaluation.datasets import load_beijing
from tests.test_robust_pofmkl import ATTACKS, fig_cfg

ALG = get("pofmkl")
STEPS = 200


def test_a_lone_row_is_clamped_to_the_span_of_the_recent_rows():
    """By hand: kernel 0's recent rows from four clients are 1, 2, 3, 4; a fifth client alone in its window sends
    100 (no clipping here: clip_factor 1e9): the step is clamped to the 75% quantile of {1, 2, 3, 4, 100}, 4."""
    agg = POFMKLAggregation(1, 1, bound=StepBound(1e9, 1e-6, 0.0), robust=RobustRule(0.25, 1e9))
    for i, v in enumerate([1.0, 2.0, 3.0, 4.0]):
        agg.take(f"c{i}", 1, KernelUpdate(np.array([0]), np.array([[v]])))
        agg.close_window({}, lambda c: 1)
    before = float(agg.server.theta[0, 0])
    agg.take("evil", 1, KernelUpdate(np.array([0]), np.array([[100.0]])))
    agg.close_window({}, lambda c: 1)
    step = before - float(agg.server.theta[0, 0])
    assert step == pytest.approx(float(np.quantile([1.0, 2.0, 3.0, 4.0, 100.0], 0.75)))  # 4.0, not 100


def test_a_window_of_several_clients_with_no_history_is_the_plain_rule():
    """The first window (no reference rows yet) is the lock-step rule: the trimmed mean of its rows."""
    agg = POFMKLAggregation(1, 2, bound=StepBound(1e9, 1e-6, 0.0), robust=RobustRule(0.0, 1e9))
    for c, v in [("a", 1.0), ("b", 3.0)]:
        agg.take(c, 1, KernelUpdate(np.array([0]), np.full((1, 2), v)))
    agg.close_window({}, lambda c: 1)
    np.testing.assert_allclose(agg.server.theta[0], [-2.0, -2.0])  # θ − (1 + 3)/2 = −2 (eq. 10, |C| = 2)


def _run(streams, cfg, n_attackers, attack):
    """Every client alone in its window: honest lock-step learners' one-step updates, then each attacker's row."""
    names = [s.name for s in streams]
    nh = len(names) - n_attackers
    learners = [ALG.learner(cfg, n, i, "lockstep") for i, n in enumerate(names)]
    agg = ALG.aggregation(cfg)
    core = SimpleNamespace(aggregation=agg, cfg=cfg)
    order = {n: i for i, n in enumerate(names)}
    sq: list[list[float]] = [[] for _ in range(nh)]
    for t in range(STEPS):
        honest = []
        for c in range(nh):
            s = streams[c]
            yhat, _ = learners[c].learn(s.X[t], float(s.y[t]))
            sq[c].append((yhat - float(s.y[t])) ** 2)
            honest.append(learners[c].take_update())
        sends = [(names[c], up.arrays["kernels"], up.arrays["delta"]) for c, up in enumerate(honest)]
        if attack is not None:
            sends += [(names[c], *attack(t + 1, honest, core)) for c in range(nh, len(names))]
        for name, kernels, delta in sends:
            msg = update_message(cfg.fleet, name, t + 1, kernels, delta, global_version=agg.version,
                                 kernel_version="k", n_samples=1)
            agg.take(name, t + 1, agg.check(msg))  # every attacker row is within the declared bound
            agg.close_window(order, lambda c, t=t: t + 1)
        g = agg.global_message(cfg.fleet, "aggregator", "k")
        for learner in learners[:nh]:
            learner.install_global(g)
    return np.array([np.mean(s) for s in sq])


@pytest.fixture(scope="module")
def streams():
    return load_beijing(normalisation="paper", split="station", steps=STEPS).streams


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
def test_one_attacker_alone_in_its_windows_is_held_near_the_honest_runs(streams):
    """Issue 30's POF-MKL figure, 1 of 12 ≤ ×1.25, with the attacker alone in every window it sends in: measured
    ×1.07 (reverse), ×1.20 (grow), ×1.18 (little) against ×5.6e7, ×2.1e6, ×1.52 before the reference set (3 of 12:
    ×5.2–7.8 — colluders are a quarter of the reference set; docs/reliability.md)."""
    calm = _run(streams, fig_cfg("robust"), 1, None)
    worst = {name: float((_run(streams, fig_cfg("robust"), 1, attack) / calm).max())
             for name, attack in ATTACKS.items()}
    print("robust async, 1 of 12, worst honest MSE ratio:", worst)
    assert max(worst.values()) <= 1.3, worst
