"""The `streamfed replay` command writes the promised files with the promised fields."""

import json

from typer.testing import CliRunner

from streamfed.cli import app


def test_replay_writes_results_and_plots(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["replay", "--dataset", "beijing-air", "-a", "pofmkl", "-a", "vm-kofl",
                                   "--seeds", "2", "--steps", "120", "--n-kernels", "4", "--n-features", "10",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert set(data["algorithms"]) == {"pofmkl", "vm-kofl"}
    for a in data["algorithms"].values():
        for key in ("mse_mean", "mse_std", "avg_regret", "uploaded_per_client_step", "wall_s"):
            assert key in a
        assert a["seeds"] == 2 and a["mse_std"] > 0
    assert data["algorithms"]["pofmkl"]["uploaded_per_client_step"] == 20  # M · 2D
    assert data["algorithms"]["vm-kofl"]["uploaded_per_client_step"] == 4 * 20 + 4
    assert data["config"]["n_kernels"] == 4 and data["dataset"]["clients"] == 12
    md = (out / "results.md").read_text()
    assert "| pofmkl |" in md and "streamfed replay" in md
    for png in ("regret.png", "mse.png", "weights.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_algorithm_is_refused(tmp_path):
    res = CliRunner().invoke(app, ["replay", "-a", "nope", "--out", str(tmp_path)])
    assert res.exit_code != 0
    assert "unknown algorithm" in res.output


def test_replay_runs_any_csv_and_every_kind_of_algorithm(tmp_path):
    """A user's CSV (two sites), a Bayesian and a personalised algorithm, one parameter of one algorithm."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = ["site,temp,hum,load"]
    for _ in range(120):
        for site, shift in (("north", 0.0), ("south", 0.5)):
            temp, hum = rng.normal(), rng.normal()
            rows.append(f"{site},{temp:.4f},{hum:.4f},{np.sin(temp) + 0.3 * hum + shift + 0.05 * rng.normal():.4f}")
    csv = tmp_path / "sites.csv"
    csv.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["replay", "--dataset", str(csv), "--target", "load", "--client-column", "site",
                                   "-a", "fedbnr", "-a", "fedbnr-personal", "-a", "pofmkl", "--n-kernels", "2",
                                   "--n-features", "8", "--param", "fedbnr.min_upload=8",
                                   "--param", "fedbnr-personal.min_upload=8", "--no-plots", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert set(data["algorithms"]) == {"fedbnr", "fedbnr-personal", "pofmkl"}
    assert data["dataset"]["clients"] == 2 and data["dataset"]["samples"] == 240
    assert data["config"]["params"] == {"fedbnr": {"min_upload": 8}, "fedbnr-personal": {"min_upload": 8}}
    # statistics of 8 samples, F = 2·8 + 1 per kernel: S_upper, b, n, q
    f = 2 * 8 + 1
    assert data["algorithms"]["fedbnr"]["uploaded_per_client_step"] == (2 * (f * (f + 1) // 2 + f) + 2) / 8
    for a in data["algorithms"].values():
        assert np.isfinite(a["mse_mean"]) and a["rejected_steps"] == 0


def test_replay_refuses_bad_input_in_one_line(tmp_path):
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n1,2\n3,4\n")
    res = CliRunner().invoke(app, ["replay", "--dataset", str(csv), "--target", "nope", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "nope" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["replay", "--steps", "10", "-a", "pofmkl", "--param", "pofmkl.etaa=1",
                                   "--out", str(tmp_path)])
    assert res.exit_code != 0 and "etaa" in res.output and "Traceback" not in res.output
