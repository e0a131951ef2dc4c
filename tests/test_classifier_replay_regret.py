"""A classifier's replay reports no learner's regret (each classifier's is in its own loss) but its regret in log
loss against each client's class frequencies in hindsight: results.json, results.md and the table (issue 33)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from streamfed.cli import app
from streamfed.evaluation.replay import ReplayResult


def _plain_regret(probas: list[np.ndarray], ys: list[np.ndarray]) -> float:
    """Mean over clients of (Σ_t −log p_t(y_t) − Σ_t −log f(y_t)) / T, f the client's class frequencies."""
    per_client = []
    for p, y in zip(probas, ys, strict=True):
        rows = [t for t in range(len(y)) if not math.isnan(p[t][0])]
        labels = [int(y[t]) for t in rows]
        freq = {k: labels.count(k) / len(labels) for k in set(labels)}
        loss = sum(-math.log(max(p[t][int(y[t])], 1e-12)) for t in rows)
        best = sum(-math.log(freq[k]) for k in labels)
        per_client.append((loss - best) / len(rows))
    return sum(per_client) / len(per_client)


def test_the_log_loss_regret_is_that_of_the_class_frequencies_in_hindsight():
    rng = np.random.default_rng(7)
    probas, ys = [], []
    for n, k in ((50, 2), (80, 3)):
        p = rng.dirichlet(np.ones(k), size=n)
        p[:3] = np.nan  # steps not scored (before a client joined)
        probas.append(p)
        ys.append(rng.integers(0, k, size=n).astype(float))
    r = ReplayResult("x", ["a", "b"], np.array([50, 80]), [np.zeros(50), np.zeros(80)], np.array([79]),
                     np.zeros((1, 2)), np.zeros((1, 0)), [], np.zeros(2), 0.0, ys=ys, probas=probas)
    assert r.classification()["log_loss_regret"] == pytest.approx(_plain_regret(probas, ys), rel=1e-12)
    # predicting the frequencies themselves has no regret; a confident wrong guess has plenty
    y = np.array([0.0, 1.0, 1.0, 1.0])
    freq = np.tile([0.25, 0.75], (4, 1))
    r0 = ReplayResult("x", ["a"], np.array([4]), [np.zeros(4)], np.array([3]), np.zeros((1, 1)),
                      np.zeros((1, 0)), [], np.zeros(1), 0.0, ys=[y], probas=[freq])
    assert r0.classification()["log_loss_regret"] == pytest.approx(0.0, abs=1e-15)


@pytest.mark.slow
def test_a_classifier_replay_gives_its_regret_in_log_loss_not_the_learners(tmp_path):
    from river.datasets import synth

    lines = ["client,a,b,c,y"]
    for i, (x, y) in enumerate(synth.SEA(seed=1).take(120)):
        lines.append(f"c{i % 2},{x[0]},{x[1]},{x[2]},{int(y)}")
    (tmp_path / "sea.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["replay", "--dataset", str(tmp_path / "sea.csv"), "--target", "y", "--out",
                                   str(out), "--no-plots", "--client-column", "client", "-a", "pfedgp"])
    assert res.exit_code == 0, res.output
    a = json.loads((out / "results.json").read_text())["algorithms"]["pfedgp"]
    assert a["avg_regret"] is None and a["avg_regret_std"] is None  # the learner's own: not a classifier's figure
    regret = a["classification"]["log_loss_regret"]
    assert math.isfinite(regret)
    assert "R/T (log loss)" in res.output and f"{regret:.2e}" in res.output
    assert f"{regret:.3e}" in (out / "results.md").read_text()
