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
