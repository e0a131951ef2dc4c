"""The fleet shell of a classifier (issue 20): class probabilities in published predictions, checked on the
wire; a regressor's predictions unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.runtime.subscribe import PredictionDecoder, _row
from streamfed.wire.message import ProtocolError, decode, encode, prediction_message

PFEDGP = {"n_classes": 3, "learn_kernel": False, "budget": 8, "chains": 2, "burn_in": 2}


def pfedgp_cfg(**kw: object) -> FleetConfig:
    return FleetConfig(fleet="f", algorithm="pfedgp", n_inputs=2, params=PFEDGP, **kw)


def class_stream(n: int, seed: int = 0) -> list[Reading]:
    """Three classes by the sign pattern of two inputs far from unit scale (the agent standardises them)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.normal(size=2)
        y = 0.0 if x[0] < 0 else (1.0 if x[1] < 0 else 2.0)
        out.append(Reading(f"r{i}", 100.0 + 10.0 * x, float(i), y))
    return out


@pytest.mark.parametrize("standardise", ["online", "none"])
def test_classifier_predictions_carry_the_learners_probabilities_on_the_wire(standardise: str) -> None:
    cfg = pfedgp_cfg(standardise=standardise)
    agent = AgentCore(cfg, "a", 0, mode="async")
    inner = agent.learner.inner if standardise == "online" else agent.learner
    sub = PredictionDecoder("f")
    seen = 0
    for reading in class_stream(12):
        pred, pending = agent.begin_reading(reading)
        assert pred is not None and pred.proba is not None
        if inner.last_probabilities is not None and pending is not None and pending.proba is not None:
            # taken at begin_learn, not predicted again: the very vector the learner staged
            if standardise == "none" or seen >= 2:
                np.testing.assert_array_equal(pred.proba, inner.last_probabilities)
        msg = decode(encode(agent.prediction_message(pred), cfg), cfg)
        np.testing.assert_array_equal(msg.arrays["proba"], pred.proba[None, :])
        assert msg.arrays["proba"].shape == (1, 3)
        assert int(np.argmax(msg.arrays["proba"][0])) == int(msg.arrays["mean"][0]) == int(pred.mean)
        row = _row(sub.decode(encode(agent.prediction_message(pred))))
        assert row["class"] == int(pred.mean) and row["p"] == pytest.approx(float(pred.proba.max()))
        assert row["proba"] == pytest.approx(pred.proba.tolist())  # `subscribe --json`: the whole vector
        agent.finish_reading(pending)
        seen += 1
    # an unlabelled reading: one prediction, through the standardiser when there is one
    x = np.array([95.0, 108.0])
    pred, _ = agent.on_reading(Reading("u", x, 99.0))
    assert pred is not None and pred.proba is not None
    np.testing.assert_allclose(pred.proba, agent.learner.class_probabilities(x))
    assert pred.mean == float(np.argmax(pred.proba))
    assert agent.learner.predict(x)[0] == pred.mean


def test_private_classifier_passes_its_probabilities_through() -> None:
    cfg = pfedgp_cfg(dp_epsilon=4.0, dp_delta=1e-5, public_scales={"x_mean": [0.0, 0.0], "x_scale": [1.0, 1.0]})
    agent = AgentCore(cfg, "a", 0, mode="async")
    for reading in class_stream(6):
        pred, msgs = agent.on_reading(reading)
        assert pred is not None and pred.proba is not None
        decode(encode(agent.prediction_message(pred), cfg), cfg)


def test_regressor_predictions_have_no_probabilities() -> None:
    cfg = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_features=4, kernels=["gaussian:1.0"])
    agent = AgentCore(cfg, "a", 0, mode="async")
    for reading in class_stream(4):
        pred, _ = agent.on_reading(reading)
        assert pred is not None and pred.proba is None
        msg = decode(encode(agent.prediction_message(pred), cfg), cfg)
        assert "proba" not in msg.arrays
        assert "class" not in _row(PredictionDecoder("f").decode(encode(agent.prediction_message(pred))))


@pytest.mark.parametrize("proba, reason", [
    ([[-0.1, 0.6, 0.5]], "outside [0, 1]"),
    ([[0.2, 0.3, 0.4]], "do not sum to 1"),
    ([[0.5, 0.5 + 1e-8, 0.0]], "do not sum to 1"),
    ([[0.25, 0.25, 0.25, 0.25]], "allowed 1..3"),
    ([[np.nan, 0.5, 0.5]], "non-finite"),
    ([[1.5, -0.5, 0.0]], "outside [0, 1]"),
])
def test_a_malformed_probability_vector_is_refused_with_a_reason(proba: list[list[float]], reason: str) -> None:
    cfg = pfedgp_cfg()
    bad = prediction_message("f", "a", 1, np.array([1.0]), proba=np.array(proba))
    with pytest.raises(ProtocolError) as e:
        decode(encode(bad), cfg)
    assert reason in str(e.value)
    if "allowed" not in reason:  # the subscriber knows no class count: a bad value, not a length, is refused
        with pytest.raises(ProtocolError):
            PredictionDecoder("f").decode(encode(bad))
    ok = prediction_message("f", "a", 1, np.array([1.0]), proba=np.array([[0.1, 0.6, 0.3]]))
    assert decode(encode(ok), cfg).arrays["proba"].shape == (1, 3)
    with pytest.raises(ProtocolError):  # a classifier's prediction must carry its probabilities
        decode(encode(prediction_message("f", "a", 1, np.array([1.0]))), cfg)


# ---------------------------------------------------------------------------------------------- metrics


def _plain_scores(ys: list[int], probas: list[np.ndarray], bins: int = 15) -> tuple[float, float, float]:
    """Accuracy, log loss and ECE transcribed from their definitions, one bin at a time."""
    n = len(ys)
    acc = sum(int(np.argmax(p)) == y for y, p in zip(ys, probas, strict=True)) / n
    ll = -sum(np.log(max(p[y] if y < len(p) else 0.0, 1e-12)) for y, p in zip(ys, probas, strict=True)) / n
    ece = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [(y, p) for y, p in zip(ys, probas, strict=True)
                   if lo <= p.max() < hi or (b == bins - 1 and p.max() == 1.0)]
        if members:
            acc_b = np.mean([int(np.argmax(p)) == y for y, p in members])
            conf_b = np.mean([p.max() for _, p in members])
            ece += len(members) / n * abs(acc_b - conf_b)
    return acc, ll, ece


def test_accuracy_log_loss_and_calibration_match_their_definitions() -> None:
    from streamfed.fleet.telemetry import AgentStats

    rng = np.random.default_rng(3)
    ys, probas = [], []
    for i in range(400):
        p = rng.dirichlet(np.full(4, 0.3 if i % 3 else 3.0))
        if i % 50 == 0:
            p = np.array([1.0, 0.0, 0.0, 0.0])  # confidence exactly 1: the top bin; a true class at p = 0
        ys.append(int(rng.integers(0, 4)) if i % 5 else int(np.argmax(p)))
        probas.append(p)
    stats = AgentStats("a", algorithm="pfedgp")
    for y, p in zip(ys, probas, strict=True):
        stats.observe_prediction(float(y), float(np.argmax(p)), 0.001, None, p)
    c = stats.classification
    assert c is not None and c.n == 400
    acc, ll, ece = _plain_scores(ys, probas)
    assert c.accuracy == pytest.approx(acc, abs=1e-12)
    assert c.log_loss == pytest.approx(ll, rel=1e-12)
    assert c.expected_calibration_error == pytest.approx(ece, abs=1e-12)
    assert ll > 1.0  # the floored zeros weigh in: -log(1e-12) ≈ 27.6
    # known small case: two predictions, one right at 0.9, one wrong at 0.8
    s2 = AgentStats("b")
    s2.observe_prediction(0.0, 0.0, proba=np.array([0.9, 0.1]))
    s2.observe_prediction(1.0, 0.0, proba=np.array([0.8, 0.2]))
    assert s2.classification is not None
    assert s2.classification.expected_calibration_error == pytest.approx((0.1 + 0.8) / 2)
    assert s2.classification.log_loss == pytest.approx(-(np.log(0.9) + np.log(0.2)) / 2)


def test_exporter_emits_classification_metrics_for_a_classifier_only() -> None:
    from streamfed.runtime.exporter import StreamfedCollector

    clf = AgentCore(pfedgp_cfg(), "c", 0, mode="async")
    reg = AgentCore(FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, n_features=4, kernels=["gaussian:1.0"]),
                    "r", 1, mode="async")
    for reading in class_stream(8):
        clf.on_reading(reading)
        reg.on_reading(reading)
    samples = [s for fam in StreamfedCollector([clf.stats, reg.stats]).collect() for s in fam.samples]
    names = ("streamfed_agent_accuracy", "streamfed_agent_log_loss", "streamfed_agent_expected_calibration_error")
    for name in names:
        got = {s.labels["client"]: s.value for s in samples if s.name == name}
        assert set(got) == {"c"}, name
        assert np.isfinite(got["c"])
    c = clf.stats.classification
    assert c is not None and c.n == clf.stats.samples == 8
    got = {s.name: s.value for s in samples if s.labels.get("client") == "c"}
    assert got["streamfed_agent_accuracy"] == c.accuracy
    assert reg.stats.classification is None


# ---------------------------------------------------------------------------------------------- demo


def test_demo_runs_a_classifier_fleet_on_the_aqi_bands(tmp_path) -> None:
    """`streamfed demo --algorithm pfedgp`: the stations' PM2.5 AQI bands over real MQTT; the table and the
    summary score classes (accuracy, log loss), the endpoint exports the classifier metrics."""
    import asyncio
    import io
    import urllib.request

    from rich.console import Console

    from streamfed import demo as demo_mod
    from streamfed.demo import DemoOptions, run_demo

    scraped: dict[str, str] = {}
    real_serve = demo_mod.serve_metrics

    def serve_and_remember(registry, host, port):  # type: ignore[no-untyped-def]
        server, bound = real_serve(registry, host=host, port=port)
        scraped["url"] = server.url
        return server, bound

    out = io.StringIO()
    console = Console(file=out, width=140)

    async def main() -> tuple[dict, str]:
        opts = DemoOptions(duration=4.0, agents=2, rate=50.0, algorithm="pfedgp", out_dir=str(tmp_path))
        task = asyncio.create_task(run_demo(opts, console))
        while "url" not in scraped or "ready" not in out.getvalue():
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.5)
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(scraped["url"], timeout=5).read().decode())
        return await task, body

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo_mod, "serve_metrics", serve_and_remember)
        summary, body = asyncio.run(main())
    text = out.getvalue()
    assert summary["agents"] == 2 and summary["samples"] > 20
    assert 0.0 <= summary["fleet_accuracy"] <= 1.0 and summary["fleet_log_loss"] > 0
    assert "fleet accuracy" in text and "AQI band" in text and "ECE" in text
    assert 'streamfed_agent_accuracy{client="Aotizhongxin",fleet="demo"}' in body
    assert "streamfed_agent_expected_calibration_error" in body
    assert set(summary["rejected_by_reason"]) <= {"stale_seq"}, summary["rejected_by_reason"]
