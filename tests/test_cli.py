"""The `streamfed replay` command writes the promised files with the promised fields."""

import json

import pytest
from typer.testing import CliRunner

from streamfed.cli import app


@pytest.mark.slow  # over 2 s: outside the pure tier, in every full run
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
    # a user's CSV is normalised causally by default (as an agent standardises; 2 warm-up rows per client)
    # and its dictionary is the one for unit-variance inputs (d = 2: bandwidths over [0.25, 8])
    assert data["dataset"]["normalisation"] == "online"
    assert data["dataset"]["clients"] == 2 and data["dataset"]["samples"] == 240 - 2 * 2
    assert (data["config"]["bandwidth_low"], data["config"]["bandwidth_high"]) == (0.25, 8.0)
    assert data["config"]["params"] == {"fedbnr": {"min_upload": 8}, "fedbnr-personal": {"min_upload": 8}}
    # statistics of 8 samples, F = 2·8 + 1 per kernel: S_upper, b, n, q
    f = 2 * 8 + 1
    per_upload = 2 * (f * (f + 1) // 2 + f) + 2
    assert data["algorithms"]["fedbnr"]["uploaded_per_client_step"] == pytest.approx((118 // 8) * per_upload / 118)
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


# =========================================================================== declared input columns

import math  # noqa: E402

import numpy as np  # noqa: E402

DECLARED_CSV = ("time,site,rain,temp,load\n"
                "2024-05-06T06:00:00Z,north,yes,1.5,10\n"   # Monday 06:00
                "2024-05-06T18:00:00Z,west,no,2.5,20\n"     # west: not a level
                "later,south,no,2.5,30\n")                  # not a time
SPEC = "temp,site:category=north|south,rain:boolean,time:timestamp"  # 1 + 2 + 1 + 4 = 8 numbers


def _fleet_toml(tmp_path, n_inputs=8, inputs=""):
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[fleet]\nfleet = "cols"\nalgorithm = "pofmkl"\nn_inputs = {n_inputs}\nn_kernels = 2\n'
                   f'n_features = 4\n\n[broker]\nhost = "127.0.0.1"\nport = 1\n{inputs}')
    return cfg


INPUTS_TOML = """
[[inputs.columns]]
name = "temp"
[[inputs.columns]]
name = "site"
kind = "category"
levels = ["north", "south"]
[[inputs.columns]]
name = "rain"
kind = "boolean"
[[inputs.columns]]
name = "time"
kind = "timestamp"
"""


@pytest.fixture
def started(monkeypatch):
    """`AgentService.run` replaced: records the service and what its source yields (nothing connects)."""
    from streamfed.runtime.agent import AgentService

    calls: list = []

    async def fake_run(self):
        items = [item async for item in self.source] if self.source is not None else []
        calls.append((self, items))

    monkeypatch.setattr(AgentService, "run", fake_run)
    return calls


def _agent(cfg, *args, stdin=None):
    return CliRunner().invoke(app, ["agent", "--config", str(cfg), "--client", "c1", *args], input=stdin)


def _one_line_error(res, started, *needles):
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert started == [] and "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


MONDAY_6AM = [1.0, 0.0, 0.0, 1.0]  # hour angle π/2: sin 1, cos 0; Monday: sin 0, cos 1


def test_agent_csv_with_columns_on_the_command_line_or_in_the_configuration(tmp_path, started):
    data = tmp_path / "d.csv"
    data.write_text(DECLARED_CSV)
    for cfg, extra in ((_fleet_toml(tmp_path), ["--columns", SPEC]), (_fleet_toml(tmp_path, inputs=INPUTS_TOML), [])):
        res = _agent(cfg, "--source", f"csv:{data}", "--target", "load", *extra)
        assert res.exit_code == 0, res.output
        assert f"inputs {SPEC} (8 numbers)" in res.output
        _, items = started.pop()
        assert np.allclose(items[0].x, [1.5, 1.0, 0.0, 1.0, *MONDAY_6AM]) and items[0].y == 10.0
        assert [i.reason for i in items[1:]] == ["unknown_level", "bad_timestamp"]


def test_agent_sensor_topic_and_stdin_read_declared_columns(tmp_path, started):
    cfg = _fleet_toml(tmp_path, inputs=INPUTS_TOML)
    res = _agent(cfg)  # --source mqtt: the service parses the sensor topic's JSON itself
    assert res.exit_code == 0, res.output
    svc, _ = started.pop()
    r = svc.parser.parse(b'{"id": 1, "x": {"temp": 1.5, "site": "south", "rain": "ON", "time": 1714975200}}')
    assert np.allclose(r.x, [1.5, 0.0, 1.0, 1.0, *MONDAY_6AM])  # 1714975200 = 2024-05-06T06:00:00Z
    assert svc.parser.parse(b'{"id": 2, "x": {"temp": 1, "site": "east", "rain": 1, "time": 0}}').reason == \
        "unknown_level"
    lines = '{"id": 1, "x": {"temp": 2, "site": "north", "rain": false, "time": "2024-05-06T06:00:00Z"}}\n'
    res = _agent(_fleet_toml(tmp_path), "--source", "jsonl", "--columns", SPEC, stdin=lines)
    assert res.exit_code == 0, res.output
    _, items = started.pop()
    assert np.allclose(items[0].x, [2.0, 1.0, 0.0, 0.0, *MONDAY_6AM])


def test_agent_refuses_bad_declarations_in_one_line(tmp_path, started):
    data = tmp_path / "d.csv"
    data.write_text(DECLARED_CSV)
    csv = ["--source", f"csv:{data}", "--target", "load"]
    line = _one_line_error(_agent(_fleet_toml(tmp_path, n_inputs=5), *csv, "--columns", SPEC), started,
                           "--columns: the input columns make 8 numbers per reading", "n_inputs=5")
    assert "temp 1, site 2, rain 1, time 4" in line
    _one_line_error(_agent(_fleet_toml(tmp_path, n_inputs=3, inputs=INPUTS_TOML), *csv), started,
                    "[inputs] of", "make 8 numbers", "set n_inputs = 8")
    _one_line_error(_agent(_fleet_toml(tmp_path), *csv, "--columns", "temp,site:colour=red"), started,
                    "--columns: column 'site': unknown kind 'colour'")
    _one_line_error(_agent(_fleet_toml(tmp_path), *csv, "--columns", "temp,site:category=,x"), started,
                    "category needs its levels")
    _one_line_error(_agent(_fleet_toml(tmp_path), *csv, "--columns", "temp,site:hash=0,x,y,z,w,v"), started,
                    "buckets must be a whole number from 2 to 65536")
    _one_line_error(_agent(_fleet_toml(tmp_path), *csv, "--columns", SPEC.replace("site", "sight")), started,
                    "input column(s) 'sight' not found (did you mean 'site'?)")
    _one_line_error(_agent(_fleet_toml(tmp_path), *csv, "--columns", SPEC, "--features", "temp,rain"), started,
                    "--features 'temp,rain' differs from the input columns declared by --columns")
    bad = INPUTS_TOML.replace('kind = "boolean"', 'kind = "flag"')
    _one_line_error(_agent(_fleet_toml(tmp_path, inputs=bad), *csv), started,
                    "inputs.columns.2: column 'rain': unknown kind 'flag'")


def _units_csv(tmp_path):
    rng = np.random.default_rng(1)
    rows = ["time,unit,mode,temp,load"]
    for k in range(150):
        for unit in ("u1", "u2"):
            mode = ("eco", "boost")[int(rng.integers(2))]
            temp = rng.normal()
            y = (1.0 if mode == "boost" else -1.0) + math.sin(2 * math.pi * (k % 24) / 24) + 0.3 * temp
            rows.append(f"2024-05-{6 + k // 24:02d}T{k % 24:02d}:00:00,{unit},{mode},{temp:.4f},{y:.4f}")
    path = tmp_path / "units.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


REPLAY = ["-a", "fedbnr", "--n-kernels", "2", "--n-features", "8", "--param", "fedbnr.min_upload=8", "--no-plots"]


def test_replay_with_declared_columns_and_a_note_without_them(tmp_path):
    path = _units_csv(tmp_path)
    res = CliRunner().invoke(app, ["replay", "--dataset", str(path), "--target", "load", "--client-column", "unit",
                                   *REPLAY, "--out", str(tmp_path / "plain")])
    assert res.exit_code == 0, res.output
    notes = [ln for ln in res.output.splitlines() if ln.startswith("note:")]
    assert notes == ["note: text columns left out: 'time', 'mode'; to learn from them declare the inputs, e.g. "
                     "--columns 'temp,time:timestamp,mode:category=eco|boost'"], res.output
    plain = json.loads((tmp_path / "plain" / "results.json").read_text())["algorithms"]["fedbnr"]["mse_mean"]
    spec = "temp,time:timestamp,mode:category=eco|boost"
    res = CliRunner().invoke(app, ["replay", "--dataset", str(path), "--target", "load", "--client-column", "unit",
                                   "--columns", spec, *REPLAY, "--out", str(tmp_path / "declared")])
    assert res.exit_code == 0, res.output
    assert "note:" not in res.output and f"inputs '{spec}' (7 numbers)" in res.output
    data = json.loads((tmp_path / "declared" / "results.json").read_text())
    assert data["algorithms"]["fedbnr"]["mse_mean"] < plain
    assert "--columns" in (tmp_path / "declared" / "results.md").read_text()  # the command says how it ran


def test_replay_reads_the_agents_inputs_section(tmp_path):
    path = _units_csv(tmp_path)
    cfg = _fleet_toml(tmp_path, n_inputs=7, inputs='[[inputs.columns]]\nname = "temp"\n[[inputs.columns]]\n'
                      'name = "time"\nkind = "timestamp"\n[[inputs.columns]]\nname = "mode"\nkind = "category"\n'
                      'levels = ["eco", "boost"]\n')
    res = CliRunner().invoke(app, ["replay", "--dataset", str(path), "--target", "load", "--client-column", "unit",
                                   "--columns-file", str(cfg), *REPLAY, "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "inputs 'temp,time:timestamp,mode:category=eco|boost' (7 numbers)" in res.output


@pytest.mark.parametrize("args, needle", [
    (["--columns", "temp,mode:category=eco|eco"], "--columns: column 'mode': levels are repeated: ['eco']"),
    (["--columns", "temp,modus:category=eco|boost"], "input column(s) 'modus' not found (did you mean 'mode'?)"),
    (["--columns", "temp", "--features", "temp"], "give features or declared input columns, not both"),
    (["--columns", "temp", "--columns-file", "x.toml"], "give --columns or --columns-file, not both"),
    (["--columns-file", "nope.toml"], "--columns-file nope.toml:"),
])
def test_replay_refuses_bad_declarations_in_one_line(tmp_path, args, needle):
    path = _units_csv(tmp_path)
    res = CliRunner().invoke(app, ["replay", "--dataset", str(path), "--target", "load", "--client-column", "unit",
                                   *args, *REPLAY, "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.output


def test_replay_reads_a_csv_in_the_encoding_it_is_told(tmp_path):
    """Before: replay had no --encoding although its own error told the user to pass one (the agent had it)."""
    import numpy as np

    rng = np.random.default_rng(0)
    path = tmp_path / "latin.csv"
    rows = ["site,tempé,b,y"] + [f"s{i % 2},{rng.normal():.3f},{rng.normal():.3f},{rng.normal():.3f}"
                                   for i in range(120)]
    path.write_text("\n".join(rows) + "\n", encoding="latin-1")
    args = ["replay", "--dataset", str(path), "--target", "y", "--client-column", "site", "-a", "pofmkl",
            "--no-plots", "--out", str(tmp_path / "out")]
    refused = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert refused.exit_code == 2 and "--encoding 'latin-1'" in refused.output, refused.output
    done = CliRunner().invoke(app, [*args, "--encoding", "latin-1"], env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    assert "features ['tempé', 'b']" in done.output
    # the command that makes the results again (the report's) says it
    assert "--encoding latin-1" in (tmp_path / "out" / "results.md").read_text()
