"""benchmarks/bench_progressive.py: the progressive-validation loop against hand-computed values (no full run)."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_progressive.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_progressive", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


XS = [{"a": 1.0}, {"a": 2.0}, {"a": 3.0}, {"a": 4.0}]
YS = [2.0, 4.0, 6.0, 0.0]


def test_running_mean_matches_hand_computed_mae_and_rmse(bench):
    mean = next(m for m in bench.river_models() if m.label == bench.MEAN)
    r = bench.progressive(mean.make, XS, YS)
    # predictions before each learn: 0 (nothing seen), 2, 3, 4 -> errors 2, 2, 3, 4
    assert r["mae"] == pytest.approx(11 / 4)
    assert r["rmse"] == pytest.approx(math.sqrt(33 / 4))
    assert r["coverage"] is None and not r["diverged"] and r["seen"] == 4


class _Gaussian:
    def __init__(self, mu, sigma):
        self.mu, self.sigma = mu, sigma


class _Fake:
    """Predicts `preds[i]` (σ = 1 when asked for a distribution); `learn_one` raises at sample `fail_at`."""

    def __init__(self, preds, fail_at=None):
        self.preds, self.fail_at, self.i = preds, fail_at, 0

    def predict_one(self, x, with_dist=False):
        p = self.preds[self.i]
        return _Gaussian(p, 1.0) if with_dist else p

    def learn_one(self, x, y):
        if self.i == self.fail_at:
            raise ValueError("boom at sample 2")
        self.i += 1


def test_distribution_gives_coverage_at_1_96_sigma(bench):
    # errors 0, 1.9, 2.0, 0.5 with σ = 1: covered when |y − μ| ≤ 1.96 -> 3 of 4
    r = bench.progressive(lambda: _Fake([2.0, 5.9, 4.0, 0.5]), XS, YS)
    assert r["coverage"] == pytest.approx(0.75)
    assert r["mae"] == pytest.approx((0 + 1.9 + 2.0 + 0.5) / 4)


def test_exception_is_recorded_and_nonfinite_prediction_diverges(bench):
    r = bench.progressive(lambda: _Fake([0.0] * 4, fail_at=2), XS, YS)
    assert r["diverged"] and r["seen"] == 2 and r["error_at"] == 2 and r["mae"] is None
    assert r["error"] == "learn_one: ValueError: boom at sample 2"

    r = bench.progressive(lambda: _Fake([0.0, float("nan"), 1.0, float("inf")]), XS, YS)
    assert r["diverged"] and r["nonfinite"] == 2 and r["first_nonfinite"] == 1 and r["error"] is None
    assert r["mae"] is None and r["seen"] == 4

    def broken():
        raise RuntimeError("no model")

    r = bench.progressive(broken, XS, YS)
    assert r["diverged"] and r["error"] == "constructor: RuntimeError: no model" and r["seen"] == 0


def test_le_running_mean_needs_both_mae_and_rmse(bench):
    mean = {"diverged": False, "mae": 2.0, "rmse": 3.0}
    assert bench.beats_mean({"diverged": False, "mae": 1.0, "rmse": 3.0}, mean) == "yes"
    assert bench.beats_mean({"diverged": False, "mae": 1.0, "rmse": 3.5}, mean) == "RMSE"
    assert bench.beats_mean({"diverged": True, "mae": None, "rmse": None}, mean) is None
    cases = ((bench.REFERENCE, 1.0, 400), (bench.MEAN, 2.0, 40), ("x", 2.5, 800))
    runs = [dict(stream="s", model=lab, diverged=False, mae=m, rmse=m, coverage=None, error=None, nonfinite=0,
                 seen=4, time_ns=t, max_abs_error=2 * m, y_sd=2.0) for lab, m, t in cases]
    rows = {r["model"]: r for r in bench.summarise("d", runs, [bench.REFERENCE, bench.MEAN, "x"])}
    assert rows["x"]["le_mean"] == 0 and rows["x"]["time_ratio"] == pytest.approx(2.0)
    assert rows["x"]["worst_error_sd"] == pytest.approx(2.5)
    assert rows[bench.REFERENCE]["le_mean"] == 1
