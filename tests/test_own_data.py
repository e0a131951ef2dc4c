"""A user's own data: values no learner or standardiser can represent safely, missing-value markers, too many
skipped rows, the agent's end-of-run account — a counted skip with its reason or one line and a non-zero exit,
never a traceback and never a silent wrong answer (docs/reliability.md § Bad input)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from streamfed.cli import app
from streamfed.core.stats import check_labelled_scatter
from streamfed.evaluation.datasets import csv_fleet_with_report
from streamfed.evaluation.datasets.normalise import online_standardise, online_standardise_rows
from streamfed.fleet.columns import Column, ColumnSpec
from streamfed.fleet.sources import Reading, ReadingParser, Skip, csv_source, parse_na_values
from streamfed.runtime.agent.summary import RunSummary


def _rows(n: int = 120, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    y = np.sin(x[:, 0]) + 0.3 * x[:, 1] + 0.1 * rng.normal(size=n)
    return np.column_stack([x, y])


def _write(path, rows, header="a,b,y") -> None:
    path.write_text(header + "\n" + "".join(",".join(repr(float(v)) for v in r) + "\n" for r in rows))


def _replay(tmp_path, csv, *extra):
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["replay", "--dataset", str(csv), "--target", "y", "--out", str(out),
                                   "--no-plots", "--n-kernels", "2", "--n-features", "8", *extra])
    return res, out


def _mse(out, algorithm):
    return json.loads((out / "results.json").read_text())["algorithms"][algorithm]["mse_mean"]


# =========================================================================== 1. values too large to square


@pytest.mark.slow
@pytest.mark.parametrize(("column", "value", "algorithm"), [
    (0, 1e308, "pofmkl"), (2, 1e308, "pofmkl"), (2, 1e300, "fedbnr"), (0, 1e300, "fedbnr")])
def test_a_huge_cell_is_a_counted_skip_as_if_the_row_were_absent(tmp_path, column, value, algorithm):
    """Before: a 1e308 input made the online standardiser's variance infinite and that column 0 for every later
    row (POF-MKL MSE 0.000000, exit 0); a 1e300 target ended FedBNR in an OverflowError. Now the row is skipped
    and counted, and the replay is exactly the replay of the file without it."""
    rows = _rows()
    bad = rows.copy()
    bad[60, column] = value
    _write(tmp_path / "bad.csv", bad)
    _write(tmp_path / "without.csv", np.delete(rows, 60, axis=0))
    res, out = _replay(tmp_path, tmp_path / "bad.csv", "-a", algorithm)
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    name = "aby"[column]
    assert f"1 skipped ({name} too large 1)" in res.output
    ref, ref_out = _replay(tmp_path / "ref", tmp_path / "without.csv", "-a", algorithm)
    assert ref.exit_code == 0, ref.output
    assert _mse(out, algorithm) == _mse(ref_out, algorithm)
    assert _mse(out, algorithm) > 0.01


@given(st.integers(2, 30), st.sampled_from([1e300, -1e308, 1.7e308]), st.integers(0, 2))
@settings(max_examples=30, deadline=None)
def test_the_standardiser_refuses_a_row_whose_statistics_overflow(at, value, column):
    """Rows are standardised as if the refused one had never come (the agents' OnlineStandardiser rule)."""
    v = _rows(32)
    bad = v.copy()
    bad[at, column] = value
    z, _, _, refused = online_standardise_rows(bad)
    assert refused.tolist() == [t == at for t in range(32)]
    ref, _, _ = online_standardise(np.delete(v, at, axis=0))
    np.testing.assert_array_equal(np.delete(z, at, axis=0), ref)
    assert np.all(np.isnan(z[at]))


def test_the_scatter_check_does_not_overflow_on_a_huge_label_bound():
    phi, y = np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([1.0, -1.0])
    check_labelled_scatter(phi.T @ phi, phi.T @ y, float(y @ y), 2.0, label_bound=1e300)  # was OverflowError
    with pytest.raises(ValueError, match="label bound"):
        check_labelled_scatter(phi.T @ phi, phi.T @ y, 1e300, 2.0, label_bound=1e100)


def test_a_raw_replay_of_a_huge_target_counts_a_rejected_step(tmp_path):
    """With --max-abs raised and no normalisation, the learner itself meets 1e300: a counted rejected step."""
    rows = _rows(60)
    rows[30, 2] = 1e300
    _write(tmp_path / "d.csv", rows)
    res, out = _replay(tmp_path, tmp_path / "d.csv", "-a", "fedbnr", "--normalisation", "none",
                       "--max-abs", "1e301")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "results.json").read_text())["algorithms"]["fedbnr"]["rejected_steps"] >= 1


def test_the_agent_skips_a_huge_number_as_too_large(tmp_path):
    rows = _rows(10)
    rows[3, 0], rows[5, 2] = 1e308, -1e200
    _write(tmp_path / "d.csv", rows)

    async def drain():
        return [item async for item in csv_source(tmp_path / "d.csv", "y", ["a", "b"])]

    import asyncio

    items = asyncio.run(drain())
    skips = [(i, it) for i, it in enumerate(items) if isinstance(it, Skip)]
    assert [(i, s.reason) for i, s in skips] == [(3, "too_large"), (5, "too_large")]
    assert skips[0][1].detail.startswith("line 5: ")  # data row 3 is file line 5 (the header is line 1)
    assert sum(isinstance(it, Reading) for it in items) == 8
    p = ReadingParser(["a"], max_abs=100.0)
    assert p.parse(b'{"id": 1, "x": [101]}').reason == "too_large"
    assert p.parse(b'{"id": 2, "x": [1], "y": -1000}').reason == "too_large"
    assert isinstance(p.parse(b'{"id": 3, "x": [100], "y": 100}'), Reading)


# =========================================================================== 2. NA markers, suggestions, skip share


def _traffic(path, n=400):
    """A public traffic file's shape: a holiday column that is the text `None` on almost every row."""
    rng = np.random.default_rng(1)
    lines = ["holiday,temp,weather,y"]
    for i in range(n):
        h = "None" if i % 100 else "Xmas Day"
        w = ["Clouds", "Clear", "Rain"][i % 3]
        t = rng.normal(280, 10)
        lines.append(f"{h},{t:.2f},{w},{3000 + 50 * (t - 280) + (500 if w == 'Clear' else 0):.0f}")
    path.write_text("\n".join(lines) + "\n")


def test_the_replays_column_suggestion_works_when_pasted(tmp_path):
    _traffic(tmp_path / "t.csv")
    res, _ = _replay(tmp_path, tmp_path / "t.csv", "-a", "pofmkl")
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "--columns" in ln)
    suggested = line.split("--columns ", 1)[1].strip().strip("'")
    assert "holiday:category=" in suggested and "None" in suggested.split("holiday:category=")[1]
    res, _ = _replay(tmp_path, tmp_path / "t.csv", "-a", "pofmkl", "--columns", suggested)
    assert res.exit_code == 0, res.output
    assert "400 rows read, 400 samples" in res.output and "; 0 skipped" in res.output


def test_a_skip_share_above_the_limit_ends_the_replay_with_one_line(tmp_path):
    """Before: 61 of 48,204 rows learned, exit 0. The level the file uses but the declaration lacks is missing."""
    _traffic(tmp_path / "t.csv")
    res, _ = _replay(tmp_path, tmp_path / "t.csv", "-a", "pofmkl", "--columns", "temp,holiday:category=Xmas Day")
    assert res.exit_code == 5, res.output
    err = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "396 of 400 rows skipped (99% > --max-skip-share 50%" in err[0]
    assert "--na-values" in err[0]
    assert "Traceback" not in res.output and "replay results" not in res.output
    # declaring the level, or saying that only empty cells are missing, learns every row
    for extra in (["--columns", "temp,holiday:category=Xmas Day|None"],
                  ["--columns", "temp,holiday:category=Xmas Day|*", "--na-values", ""]):
        res, _ = _replay(tmp_path, tmp_path / "t.csv", "-a", "pofmkl", *extra)
        assert res.exit_code == 0, (extra, res.output)
        assert "; 0 skipped" in res.output
    res, _ = _replay(tmp_path, tmp_path / "t.csv", "-a", "pofmkl", "--columns", "temp,holiday:category=Xmas Day",
                     "--max-skip-share", "1")
    assert res.exit_code == 0, res.output


def test_na_values_replace_the_default_markers(tmp_path):
    (tmp_path / "d.csv").write_text("a,y\n1,2\n-,3\nmissing,4\n5,NA\n6,7\n8,9\n")
    _, r = csv_fleet_with_report(tmp_path / "d.csv", "y", normalisation="none", na_values=parse_na_values("missing"))
    assert dict(r.missing) == {"a": 1, "y": 0} and dict(r.non_numeric) == {"a": 1, "y": 1}
    _, r = csv_fleet_with_report(tmp_path / "d.csv", "y", normalisation="none")
    assert dict(r.missing) == {"a": 1, "y": 1} and dict(r.non_numeric) == {"a": 1, "y": 0}
    assert Column("h", "category", levels=("None",)).missing("None", parse_na_values("None")) is False


def test_the_agent_reads_na_values_and_declared_levels(tmp_path, monkeypatch):
    from streamfed.runtime.agent import AgentService

    seen: list = []

    async def fake_run(self):
        seen.extend([item async for item in self.source])

    monkeypatch.setattr(AgentService, "run", fake_run)
    _traffic(tmp_path / "t.csv", n=100)
    cfg = tmp_path / "fleet.toml"
    cfg.write_text('[fleet]\nfleet = "f"\nalgorithm = "pofmkl"\nn_inputs = 3\nn_kernels = 2\nn_features = 4\n'
                   '[broker]\nport = 1\n[inputs]\nna_values = ["n/a"]\n'
                   '[[inputs.columns]]\nname = "temp"\n[[inputs.columns]]\nname = "holiday"\nkind = "category"\n'
                   'levels = ["Xmas Day"]\nother = true\n')
    res = CliRunner().invoke(app, ["agent", "--config", str(cfg), "--client", "a", "--source",
                                   f"csv:{tmp_path / 't.csv'}", "--target", "y"])
    assert res.exit_code == 0, res.output
    assert len(seen) == 100 and all(isinstance(it, Reading) for it in seen)  # `None` is not missing here
    seen.clear()
    cfg.write_text(cfg.read_text().replace('na_values = ["n/a"]\n', ""))
    res = CliRunner().invoke(app, ["agent", "--config", str(cfg), "--client", "a", "--source",
                                   f"csv:{tmp_path / 't.csv'}", "--target", "y"])
    assert sum(isinstance(it, Skip) and it.reason == "missing_feature" for it in seen) == 99


# =========================================================================== the agent's end of a finite run


def test_run_summary_says_what_happened():
    s = RunSummary("a", "csv:x.csv", items=10, learned=6, skipped={"too_large": 1, "non_numeric": 3},
                   mse=2.25, max_skip_share=0.5)
    assert s.line() == ("agent a: csv:x.csv ended: 10 items, 6 learned, 4 skipped (too_large 1, non_numeric 3); "
                        "MSE 2.25 (RMSE 1.5) in the stream's units")
    assert s.problem() is None
    assert "5 of 10 items skipped (50%" not in (RunSummary("a", "s", 10, 5, {"x": 5}, max_skip_share=0.5)
                                                .problem() or "")  # at the limit: fine
    assert RunSummary("a", "s", 10, 4, {"x": 6}, max_skip_share=0.5).problem() == (
        "agent a: s: 6 of 10 items skipped (60% > --max-skip-share 50%): x 6")
    c = RunSummary("a", "s", 4, 4, accuracy=0.75, log_loss=0.5, ece=0.1)
    assert c.line().endswith("; accuracy 0.75, log loss 0.5, ECE 0.1")


def test_an_agent_that_learns_nothing_exits_non_zero(tmp_path, mosquitto_dev):
    """Before: a target column that is all text, exit 0. Now the summary and one error line, exit 5."""
    rows = ["temp,hum,load"] + [f"{i},{i + 1},label{i % 3}" for i in range(30)]
    path = tmp_path / "d.csv"
    path.write_text("\n".join(rows) + "\n")
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[fleet]\nfleet = "own"\nalgorithm = "pofmkl"\nn_inputs = 2\nn_kernels = 2\nn_features = 4\n'
                   f'[broker]\nhost = "127.0.0.1"\nport = {mosquitto_dev.port}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "streamfed.cli", "agent", "--config", str(cfg), "--client", "texty",
         "--source", f"csv:{path}", "--features", "temp,hum", "--target", "load", "--max-skip-share", "1"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert proc.returncode == 5, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    out = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert out[-2] == f"agent texty: csv:{path} ended: 30 items, 0 learned, 30 skipped (non_numeric 30)"
    assert out[-1] == f"error: agent texty: csv:{path}: nothing learned: all 30 items skipped (non_numeric 30)"


def test_a_spec_with_a_none_level(tmp_path):
    spec = ColumnSpec.parse("holiday:category=None|Xmas")
    assert spec.encode(["None"]).tolist() == [1.0, 0.0]


# =========================================================================== 3. figures in the stream's units


def test_replay_reports_the_error_in_the_streams_units(tmp_path):
    """The RMSE in the stream's units is that of the predictions mapped back and compared with the raw file."""
    from streamfed.evaluation.replay import AlgorithmConfig, replay

    rows = _rows(200)
    rows[:, 2] = 1000.0 + 250.0 * rows[:, 2]  # a target far from unit scale
    _write(tmp_path / "d.csv", rows)
    fleet, _ = csv_fleet_with_report(tmp_path / "d.csv", "y", normalisation="online")
    r = replay(fleet, "fedbnr", AlgorithmConfig(n_kernels=2, n_features=8))
    s = fleet.streams[0]
    mapped = s.to_original(r.means[0])  # the predictions in the stream's units
    raw_y = rows[s.row, 2]  # the file's own targets of the emitted rows
    expected = float(np.nanmean((mapped - raw_y) ** 2))
    assert r.mse_stream == pytest.approx(expected, rel=1e-9)
    assert r.mse_stream > 100 * r.mse  # not the standardised figure
    res, out = _replay(tmp_path, tmp_path / "d.csv", "-a", "fedbnr")
    a = json.loads((out / "results.json").read_text())["algorithms"]["fedbnr"]
    assert a["rmse_stream_mean"] == pytest.approx(np.sqrt(a["mse_stream_mean"]))
    assert "RMSE (units)" in res.output and "RMSE in the stream's units" in (out / "results.md").read_text()


# =========================================================================== 4. classification first-class


def _sea_csv(path, n=600, clients=3):
    from river.datasets import synth

    lines = ["client,a,b,c,y"]
    for i, (x, y) in enumerate(synth.SEA(seed=1).take(n)):
        lines.append(f"c{i % clients},{x[0]},{x[1]},{x[2]},{int(y)}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_a_bernoulli_pvi_replay_is_scored_as_a_classifier(tmp_path):
    """Before: the 0/1 label was standardised online, 461 of 559 steps rejected, an MSE printed, exit 0."""
    _sea_csv(tmp_path / "sea.csv")
    res, out = _replay(tmp_path, tmp_path / "sea.csv", "--client-column", "client", "-a", "pvi", "--param",
                       "pvi.likelihood=bernoulli", "--param", "pvi.n_inducing=8", "--param", "pvi.n_pseudo=8",
                       "--param", "pvi.refine_every=32", "--param", "pvi.steps=10")
    assert res.exit_code == 0, res.output
    a = json.loads((out / "results.json").read_text())["algorithms"]["pvi"]
    assert a["rejected_steps"] == 0
    assert a["mse_mean"] is None  # no MSE for a classifier
    assert a["classification"]["accuracy"] > 0.75 and a["classification"]["ece"] < 0.25
    assert "accuracy" in res.output and "| classifier | accuracy | log loss | ECE" in (out / "results.md").read_text()


def test_classifiers_and_regressors_are_replayed_apart(tmp_path):
    _sea_csv(tmp_path / "sea.csv", n=30)
    res, _ = _replay(tmp_path, tmp_path / "sea.csv", "-a", "pfedgp", "-a", "fedbnr")
    assert res.exit_code == 2
    assert res.output.startswith("error: classifiers (pfedgp) and regressors (fedbnr) read the target apart")


def test_reliability_bins_give_the_agents_ece():
    """The reliability diagram's points, weighted by their counts, are the agents' ECE (an independent sum)."""
    from streamfed.evaluation.replay import ReplayResult
    from streamfed.evaluation.report import reliability_bins
    from streamfed.fleet.telemetry import ClassificationStats

    rng = np.random.default_rng(4)
    p1 = rng.uniform(size=300)
    probas = np.column_stack([1 - p1, p1])
    y = (rng.uniform(size=300) < p1 ** 2).astype(float)
    r = ReplayResult("x", ["a"], np.array([300]), [np.zeros(300)], np.array([299]), np.zeros((1, 1)),
                     np.zeros((1, 0)), [], np.zeros(1), 0.0, ys=[y], probas=[probas])
    n, conf, acc = reliability_bins([r])
    stats = ClassificationStats()
    for t in range(300):
        stats.observe(int(y[t]), probas[t])
    ok = n > 0
    assert float(np.sum(n[ok] * np.abs(acc[ok] - conf[ok])) / n.sum()) == pytest.approx(
        stats.expected_calibration_error, abs=1e-12)
    assert r.classification()["accuracy"] == pytest.approx(stats.accuracy)


def test_a_bernoulli_pvi_agent_never_standardises_its_label():
    """Before: with standardise = "online" (the default) 100 of 120 readings were marked unlearnable."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import FleetConfig

    cfg = FleetConfig(fleet="f", algorithm="pvi", n_inputs=2, standardise="online",
                      params={"likelihood": "bernoulli", "n_inducing": 4, "n_pseudo": 4, "refine_every": 1000})
    core = AgentCore(cfg, "a", 0)
    rng = np.random.default_rng(0)
    for i in range(120):
        x = rng.normal(size=2) * 10 + 50
        core.on_reading(Reading(f"r{i}", x, float(i), float(x[0] > 50)))
    assert core.stats.skipped.get("unlearnable", 0) == 0
    assert core.stats.samples == 120


def test_no_mse_metric_for_a_classifier():
    from prometheus_client import generate_latest

    from streamfed.fleet.telemetry import AgentStats
    from streamfed.runtime.exporter import StreamfedCollector, make_registry

    clf, reg = AgentStats("c", fleet="f"), AgentStats("r", fleet="f")
    clf.observe_prediction(1.0, 0.0, proba=np.array([0.3, 0.7]))
    reg.observe_prediction(1.0, 0.5)
    text = generate_latest(make_registry(StreamfedCollector([clf, reg]))).decode()
    mse = [ln for ln in text.splitlines() if ln.startswith("streamfed_agent_mse{")]
    assert mse == ['streamfed_agent_mse{client="r",fleet="f"} 0.25']
    assert 'streamfed_agent_accuracy{client="c",fleet="f"} 1.0' in text


@pytest.mark.slow
def test_pvi_classifier_passes_rivers_checks():
    from river.checks import check_estimator

    from streamfed.algorithms.pvi.estimator import PVIClassifier

    for params in PVIClassifier._unit_test_params():
        check_estimator(PVIClassifier(**params))


@pytest.mark.slow  # ~2.5 s: PVI refinements
def test_pvi_classifier_refuses_a_third_class_and_learns_its_labels_raw():
    from streamfed.algorithms.pvi.estimator import PVIClassifier

    model = PVIClassifier(n_inducing=4, n_pseudo=4, refine_every=16, steps=20, learning_rate=0.05,
                          predict_draws=0)
    rng = np.random.default_rng(1)
    for _ in range(64):
        a = float(rng.normal())
        model.learn_one({"a": a * 100 + 1000}, a > 0)  # inputs far from unit scale; the label as it is
    assert model.predict_proba_one({"a": 1200.0})[True] > 0.6 > model.predict_proba_one({"a": 800.0})[True]
    before = model._scales.count
    with pytest.raises(ValueError, match="binary"):
        model.learn_one({"a": 1.0}, "maybe")
    assert model._scales.count == before


@pytest.mark.parametrize("normalisation", ["online", "paper"])
def test_a_class_label_is_never_normalised(tmp_path, normalisation):
    _sea_csv(tmp_path / "sea.csv", n=40, clients=2)
    fleet, _ = csv_fleet_with_report(tmp_path / "sea.csv", "y", client_column="client",
                                     normalisation=normalisation, label=True)
    raw = np.loadtxt(tmp_path / "sea.csv", delimiter=",", skiprows=1, usecols=(1, 2, 3, 4))
    for s in fleet.streams:
        rows = raw[int(s.name[1:])::2]
        np.testing.assert_array_equal(s.y, rows[s.row // 2, 3])  # the file's 0/1, as they are
        np.testing.assert_array_equal(s.to_original(s.y), s.y)
        assert not np.allclose(s.X, rows[s.row // 2, :3])  # while the inputs are normalised
