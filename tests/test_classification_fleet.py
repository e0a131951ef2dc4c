"""The fleet shell of a classifier (issue 20): class probabilities in published predictions, checked on the
wire; a regressor's predictions unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.protocol import ProtocolError, decode, encode, prediction_message
from streamfed.fleet.sources import Reading
from streamfed.runtime.subscribe import PredictionDecoder, _row

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
    cfg = pfedgp_cfg(dp_epsilon=4.0, dp_delta=1e-5)
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
