"""The conformal variance scale shared by the Bayesian learners (streamfed.algorithms.calibration): the scale against a
plain transcription of its definition, the mean and the uploads never changed by it, and the prequential coverage it
gives on streams where the models' own intervals miss [0.90, 0.98] (docs/results.md, "Calibration")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed import algorithms
from streamfed.algorithms.calibration import CalibratedLearner, PrequentialCalibration, VarianceCalibration
from streamfed.core.durable import decode, encode
from streamfed.evaluation.replay import AlgorithmConfig
from streamfed.fleet.config import FleetConfig

Z95 = 1.959963984540054


def test_the_scale_is_the_conformal_95_percent_quantile_of_the_last_window() -> None:
    """|residual| / sd = 1, 2, …, 100 in a window of 100: split conformal's quantile is the ⌈101 · 0.95⌉ = 96th
    smallest, 96, so the scale is (96 / 1.96)²; 4 more push the first 4 out; 100 of 1 give (1 / 1.96)²; a scale
    beyond 10⁴ is held there."""
    c = VarianceCalibration(window=100, min_samples=10, every=1, rate=0.0)  # the window alone
    for k in range(1, 101):
        c.update(residual=-k * 3.0, var=9.0)  # |y − μ| / √v = k
    assert c.scale == pytest.approx((96 / Z95) ** 2, rel=1e-12)
    for _ in range(4):
        c.update(residual=300.0, var=4.0)  # |y − μ| / √v = 150
    # the window: 5, …, 100 and four 150s (1–4 pushed out): the 96th smallest is 100
    assert c.scale == pytest.approx((100 / Z95) ** 2, rel=1e-12)
    for _ in range(100):
        c.update(residual=2.0, var=4.0)  # all 1: (1 / 1.96)²
    assert c.scale == pytest.approx(Z95**-2, rel=1e-12)
    for _ in range(100):
        c.update(residual=1e6, var=1.0)
    assert c.scale == 1e4


def test_the_scale_waits_for_min_samples_and_refreshes_every_few() -> None:
    c = VarianceCalibration(window=256, min_samples=32, every=8, rate=0.0)
    for _ in range(31):
        c.update(4.0, 1.0)
    assert c.scale == 1.0  # fewer than min_samples residuals
    c.update(4.0, 1.0)
    assert c.scale == pytest.approx((4.0 / Z95) ** 2)
    c.update(0.0, 1.0)  # not yet a refresh: 1 of every = 8
    assert c.scale == pytest.approx((4.0 / Z95) ** 2)
    c.update(float("nan"), 1.0)  # nothing to learn from: ignored
    c.update(1.0, 0.0)
    assert len(c._z) == 33


def plain_tracked_scales(residuals: list[float], variances: list[float], window: int, min_samples: int,
                         rate: float) -> list[float]:
    """The scale after each residual, transcribed from the definition with `every = 1`: `z = |r|/√v`; once
    `min_samples` are in, `miss = z > 1.96·√scale` (the interval just reported) moves `log c` by
    `rate · (miss − 0.05)`; the scale is `(q · e^{log c} / 1.96)²`, `q` the ⌈(n+1)·0.95⌉-th smallest of the last
    `window` z (no bound is reached in the streams used here)."""
    import math

    zs: list[float] = []
    log_c, scale, out = 0.0, 1.0, []
    for r, v in zip(residuals, variances, strict=True):
        z = abs(r) / math.sqrt(v)
        if len(zs) >= min_samples:
            miss = 1.0 if z > Z95 * math.sqrt(scale) else 0.0
            log_c += rate * (miss - 0.05)
        zs = (zs + [z])[-window:]
        if len(zs) >= min_samples:
            q = sorted(zs)[min(math.ceil((len(zs) + 1) * 0.95), len(zs)) - 1]
            scale = (q * math.exp(log_c) / Z95) ** 2
        out.append(scale)
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rate=st.sampled_from([0.0, 0.005, 0.02, 0.1]),
       drift=st.floats(-0.01, 0.01), n=st.integers(1, 400))
def test_the_tracked_scale_is_the_plain_transcription(seed: int, rate: float, drift: float, n: int) -> None:
    rng = np.random.default_rng(seed)
    residuals = list(rng.standard_t(3, size=n) * np.exp(drift * np.arange(n)))
    variances = list(rng.uniform(0.5, 2.0, size=n))
    c = VarianceCalibration(window=64, min_samples=16, every=1, rate=rate)
    got = []
    for r, v in zip(residuals, variances, strict=True):
        c.update(r, v)
        got.append(c.scale)
    assert got == pytest.approx(plain_tracked_scales(residuals, variances, 64, 16, rate), rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), shrink=st.floats(0.0, 0.001), n=st.integers(200, 3000))
def test_the_misses_add_up_to_five_percent_up_to_the_tracking_term(seed: int, shrink: float, n: int) -> None:
    """The invariant of quantile tracking, on any stream (here: residuals whose sd shrinks or not while the model's
    variance says 1 — the lag a window alone cannot follow): Σ (miss − 0.05) over the tracked samples equals
    Δ log c / rate exactly, so the miss rate is within |Δ log c| / (rate · T) of 5%."""
    rng = np.random.default_rng(seed)
    c = VarianceCalibration(min_samples=32, every=8, rate=0.02)
    misses, tracked = 0, 0
    for i in range(n):
        r = float(rng.normal() * np.exp(-shrink * i))
        if len(c._z) >= c.min_samples:
            misses += abs(r) > c.threshold
            tracked += 1
        c.update(r, 1.0)
    log_c = np.log(np.sqrt(c.scale) * Z95 / c._q)
    assert misses - 0.05 * tracked == pytest.approx(log_c / 0.02, abs=1e-6)
    if tracked >= 1000:
        assert abs(misses / tracked - 0.05) <= 2.0 / (0.02 * tracked) + 1e-12


def test_the_learner_wrapper_scales_what_it_reports_and_survives_the_durable_format() -> None:
    cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_kernels=2, n_features=5, standardise="none")
    learner = algorithms.get("fedbnr").learner(cfg, "a", 0)
    assert isinstance(learner, CalibratedLearner)
    rng = np.random.default_rng(0)
    for _ in range(100):
        x = rng.normal(size=2)
        learner.learn(x, 10.0 * rng.normal())  # noise far above the prior σ = 1: the model's interval is too narrow
    scale = learner.calibration.scale
    assert scale > 2.0
    x = np.array([0.1, 0.2])
    mean, var = learner.predict(x)
    assert (mean, var) == (learner.inner.predict(x)[0], learner.inner.predict(x)[1] * scale)
    assert learner.diagnostics()["variance_scale"] == scale
    twin = decode(encode(learner))
    assert twin.predict(x) == (mean, var) and twin.calibration.scale == scale


def fedbnr_pair(seed: int) -> tuple:
    cfgs = [AlgorithmConfig(n_kernels=2, n_features=4, params={"fedbnr": {"calibrate": c, "min_upload": 8}})
            .fleet_config("fedbnr", n_inputs=2, seed=seed) for c in (False, True)]
    return tuple(algorithms.get("fedbnr").learner(c, "a", 0) for c in cfgs)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), noise=st.floats(0.01, 100.0), n=st.integers(1, 120))
def test_calibration_never_changes_the_mean_nor_the_uploads(seed: int, noise: float, n: int) -> None:
    """Same stream into a FedBNR learner with and without calibration: every prediction's mean, every upload's
    arrays bit for bit; only the variance differs, by the calibration's scale."""
    plain, calibrated = fedbnr_pair(seed)
    assert isinstance(calibrated, CalibratedLearner) and not isinstance(plain, CalibratedLearner)
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x, y = rng.uniform(-2, 2, size=2), noise * rng.standard_normal()
        scale = calibrated.calibration.scale
        (m0, v0), (m1, v1) = plain.learn(x, y), calibrated.learn(x, y)
        assert m0 == m1 and v1 == pytest.approx(v0 * scale, rel=1e-15)
        u0, u1 = plain.take_update(), calibrated.take_update()
        assert (u0 is None) == (u1 is None)
        if u0 is not None:
            assert all(np.array_equal(u0.arrays[k], u1.arrays[k]) for k in u0.arrays)


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), noise=st.floats(0.01, 100.0))
def test_an_estimators_mean_is_the_same_with_and_without(seed: int, noise: float) -> None:
    est = [algorithms.get("fedbnr").estimator(n_features=4, n_kernels=2, calibrate=c) for c in (False, True)]
    rng = np.random.default_rng(seed)
    for _ in range(80):
        x = {"a": float(rng.normal()), "b": float(rng.normal())}
        y = noise * float(rng.standard_normal())
        d0, d1 = (e.predict_one(x, with_dist=True) for e in est)
        assert d0.mu == d1.mu
        for e in est:
            e.learn_one(x, y)
    xs = rng.normal(size=(5, 2))
    (m0, v0), (m1, v1) = (e.predict_dist_many(xs) for e in est)
    assert np.array_equal(m0, m1) and np.allclose(v1, v0 * est[1]._calibration.calibration.scale, rtol=1e-14)


def test_a_prediction_for_another_input_is_not_taken_as_the_learned_ones() -> None:
    p = PrequentialCalibration(VarianceCalibration(window=10, min_samples=1, every=1))
    p.predicted({"a": 1.0}, 0.0, 1.0)
    p.learned({"a": 2.0}, 100.0)  # not the input predicted: nothing folded in
    assert len(p.calibration._z) == 0
    p.predicted({"a": 1.0}, 0.0, 1.0)
    p.learned({"a": 1.0}, 3.0)
    assert list(p.calibration._z) == [3.0]


def coverage(est: object, xs: list[dict], ys: list[float]) -> float:
    hit = 0
    for x, y in zip(xs, ys, strict=True):
        g = est.predict_one(x, with_dist=True)  # type: ignore[attr-defined]
        hit += abs(y - g.mu) <= Z95 * g.sigma
        est.learn_one(x, y)  # type: ignore[attr-defined]
    return hit / len(ys)


def friedman(n: int, seed: int) -> tuple[list[dict], list[float]]:
    from river import datasets

    pairs = list(datasets.synth.Friedman(seed=seed).take(n))
    return [dict(x) for x, _ in pairs], [float(y) for _, y in pairs]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["urk-fedbnr", "fsgp", "fedbnr", "pvi"])
def test_calibrated_coverage_is_within_the_contract(name: str) -> None:
    """Friedman (seed 0, 3,000 samples) and ChickWeights: URK's own intervals cover ~0.74 of Friedman and FSGP's
    0.84 of ChickWeights' first 200 (docs/results.md); calibrated, every learner's are within [0.90, 0.98]."""
    from river import datasets

    if name in ("urk-fedbnr", "pvi"):
        pytest.importorskip("torch")
    xs, ys = friedman(3000, 0)
    chick = [(dict(x), float(y)) for x, y in datasets.ChickWeights()]
    for stream in ((xs, ys), ([x for x, _ in chick], [y for _, y in chick])):
        cov = coverage(algorithms.get(name).estimator(), *stream)
        assert 0.90 <= cov <= 0.98, (name, cov)
    if name == "urk-fedbnr":  # the test can fail: without the scale, URK misses the contract on Friedman
        assert coverage(algorithms.get(name).estimator(calibrate=False), xs, ys) < 0.90

