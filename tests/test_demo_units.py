"""The demo's errors in the stream's units next to standardised ones (issue 33): its agents read the readings as
the sensors gave them and standardise them online themselves; `DemoStats` scores each prediction in the stream's
units and divided by the scale of the targets before it. No broker: the agents' core, reading by reading."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamfed.demo import DemoStats, fleet_errors, public_scales
from streamfed.evaluation.datasets import load_beijing
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading


def _stream(n: int = 300, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) * [5.0, 20.0] + [15.0, 1000.0]
    y = 40.0 + 3.0 * np.sin(X[:, 0] / 5.0) + 0.05 * (X[:, 1] - 1000.0) + 0.3 * rng.normal(size=n)
    return X, y


def _run(X: np.ndarray, y: np.ndarray) -> tuple[DemoStats, np.ndarray, AgentCore]:
    cfg = FleetConfig(fleet="demo", algorithm="pofmkl", n_inputs=X.shape[1], n_kernels=4, n_features=16)
    stats = DemoStats("a", fleet="demo", algorithm="pofmkl")
    core = AgentCore(cfg, "a", 0, stats=stats)
    means = []
    for i in range(len(y)):
        pred, _ = core.on_reading(Reading(f"r{i}", X[i], float(i), float(y[i])))
        means.append(pred.mean)
    return stats, np.array(means), core


def test_the_demo_scores_in_the_streams_units_and_in_the_learners():
    X, y = _stream()
    stats, yhat, core = _run(X, y)
    assert core.learner.diagnostics()["targets_winsorised"] == 0  # every label learned as read
    e = y - yhat
    # plain transcriptions: the MSE of the published predictions; each error over the sample standard deviation
    # of the targets before it (from the third on: the first two only set the scales)
    assert stats.mse == pytest.approx(float(np.mean(e ** 2)), rel=1e-12)
    z = [e[t] / np.std(y[:t], ddof=1) for t in range(2, len(y))]
    assert stats.z_samples == len(y) - 2
    assert stats.z_mse == pytest.approx(float(np.mean(np.square(z))), rel=1e-9)
    # in other units (mg instead of µg: ×1000) the learner sees the same numbers: the standardised error is
    # unchanged, the stream's is 10⁶ times larger
    milli, _, _ = _run(X, y * 1000.0)
    assert milli.z_mse == pytest.approx(stats.z_mse, rel=1e-6)
    assert milli.mse == pytest.approx(stats.mse * 1e6, rel=1e-6)
    fleet = fleet_errors([stats, milli])
    assert fleet["mse_stream"] == pytest.approx((stats.sq_error_sum + milli.sq_error_sum) / (2 * len(y)))
    assert fleet["rmse_stream"] == pytest.approx(math.sqrt(fleet["mse_stream"]))
    assert fleet["mse"] == pytest.approx(stats.z_mse, rel=1e-6)


def test_a_declared_scale_divides_every_error():
    stats = DemoStats("a", y_scale=4.0)
    for y, yhat in ((1.0, 3.0), (0.0, 4.0), (2.0, 2.0)):
        stats.observe_prediction(y, yhat)
    assert stats.z_samples == 3 and stats.z_mse == pytest.approx((4 + 16 + 0) / 16 / 3)


def test_the_dp_demos_declared_scales_are_the_papers_normalisation():
    """Under DP the demo declares the paper's constants (whole dataset): standardising with them gives the
    dataset's own "paper" normalisation of every station."""
    raw, paper = load_beijing("none", steps=50), load_beijing("paper", steps=50)
    p = public_scales(load_beijing("none").streams)
    for r, q in zip(raw.streams, paper.streams, strict=True):
        np.testing.assert_allclose((r.X - p.x_mean) / p.x_scale, q.X, rtol=1e-12)
        np.testing.assert_allclose((r.y - p.y_mean) / p.y_scale, q.y, rtol=1e-12, atol=1e-15)
