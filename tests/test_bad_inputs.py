"""Bad input files and options for `streamfed agent`: a one-line error and exit 2 before connecting, or a
counted skip with its reason — never a traceback, never a silent run that learns nothing.

Start-up errors run the real CLI (`typer.testing.CliRunner`) with `AgentService.run` replaced by a stub that
records the call: an error must come before it (i.e. before any connection). The stub drains the source, so
the cases that must work show what the agent would have learned. The skip-share warning runs a real agent
against Mosquitto.
"""

from __future__ import annotations

import asyncio
import codecs
import gzip
import io
import json
import logging
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from streamfed.cli import app
from streamfed.fleet.sources import Reading, Skip, SkipWatch, csv_source, jsonl_source

GOOD = "temp,hum,load\n1.0,2.0,0.5\n3.0,4.0,1.5\n"


def _config(tmp_path, port=1, algorithm="pofmkl"):
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[fleet]\nfleet = "bad-inputs"\nalgorithm = "{algorithm}"\nn_inputs = 2\n'
                   f'n_kernels = 2\nn_features = 4\n\n[broker]\nhost = "127.0.0.1"\nport = {port}\n')
    return cfg


@pytest.fixture
def ran(monkeypatch):
    """`AgentService.run` replaced: records that it was reached and what the source yields."""
    from streamfed.runtime.agent import AgentService

    calls: list[list] = []

    async def fake_run(self):
        items = []
        if self.source is not None:
            items = [item async for item in self.source]
        calls.append(items)

    monkeypatch.setattr(AgentService, "run", fake_run)
    return calls


def agent(tmp_path, source, *extra, features="temp,hum", target="load"):
    args = ["agent", "--config", str(_config(tmp_path)), "--client", "a1", "--source", source]
    if features is not None:
        args += ["--features", features]
    if target is not None:
        args += ["--target", target]
    return CliRunner().invoke(app, [*args, *extra])


def refused(res, ran, *needles):
    """Exit 2, one line naming the problem, no traceback, and the agent never started."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    assert ran == [], "the agent started (it would have connected) before refusing"
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    line = lines[0]
    assert line.startswith("error:"), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


# =========================================================================== start-up errors (exit 2)


def test_missing_file(tmp_path, ran):
    refused(agent(tmp_path, f"csv:{tmp_path / 'nope.csv'}"), ran, "nope.csv", "no such file")


def test_a_directory_is_not_a_file(tmp_path, ran, monkeypatch):
    refused(agent(tmp_path, f"csv:{tmp_path}"), ran, "not a regular file")
    monkeypatch.chdir(tmp_path)
    refused(agent(tmp_path, "csv:."), ran, ".: not a regular file")
    refused(agent(tmp_path, "csv:"), ran, "a CSV source needs a file path (csv:PATH)")


def test_missing_target_column_names_the_columns(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text(GOOD)
    line = refused(agent(tmp_path, f"csv:{path}", target="Load"), ran, "target column 'Load' not found")
    assert "'load'" in line and "'temp', 'hum', 'load'" in line  # did-you-mean, and the columns


def test_unknown_feature_names_the_columns(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text(GOOD)
    refused(agent(tmp_path, f"csv:{path}", features="temp,humidity"), ran, "'humidity' not found",
            "columns are: 'temp', 'hum', 'load'")


@pytest.mark.parametrize("text", ["", "\n\n", "\ufeff"], ids=["empty", "blank-lines", "bom-only"])
def test_empty_file(tmp_path, ran, text):
    path = tmp_path / "d.csv"
    path.write_text(text, encoding="utf-8")
    refused(agent(tmp_path, f"csv:{path}"), ran, "empty file")


def test_header_only(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text("temp,hum,load\n")
    refused(agent(tmp_path, f"csv:{path}"), ran, "header only, no data rows", "'temp', 'hum', 'load'")


def test_non_utf8_file_says_where_and_suggests_encoding(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_bytes("temp,hum,load\n1,2,0.5\n3,4,1.5\n5,6,°C\n".encode("latin-1"))
    refused(agent(tmp_path, f"csv:{path}"), ran, "cannot decode as utf-8", "line 4", "--encoding")


def test_a_decoding_error_late_in_a_big_file_is_found_before_connecting(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_bytes(("temp,hum,load\n" + "1,2,3\n" * 50_000).encode() + b"9,9,\xff\n")
    refused(agent(tmp_path, f"csv:{path}"), ran, "line 50002")


def test_utf16_file_is_named(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_bytes(GOOD.encode("utf-16"))
    refused(agent(tmp_path, f"csv:{path}"), ran, "UTF-16", "--encoding utf-16")


def test_unknown_encoding(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text(GOOD)
    refused(agent(tmp_path, f"csv:{path}", "--encoding", "klingon"), ran, "unknown encoding 'klingon'")


def test_not_gzip(tmp_path, ran):
    path = tmp_path / "d.csv.gz"
    path.write_text(GOOD)
    refused(agent(tmp_path, f"csv:{path}"), ran, "cannot read")


def test_truncated_gzip(tmp_path, ran):
    path = tmp_path / "d.csv.gz"
    path.write_bytes(gzip.compress((GOOD * 200).encode())[:-30])
    refused(agent(tmp_path, f"csv:{path}"), ran, "cannot read")


def test_field_larger_than_the_csv_limit(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text("temp,hum,load\n1,2,3\n" + '1,"' + "x" * 200_000 + '",3\n')
    refused(agent(tmp_path, f"csv:{path}"), ran, "malformed CSV at line 3")


def test_a_column_named_twice_in_the_header(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text("temp,hum,temp,load\n1,2,3,4\n")
    refused(agent(tmp_path, f"csv:{path}"), ran, "more than once")


@pytest.mark.parametrize(("features", "target", "needle"), [
    ("temp,temp", "load", "repeated"),
    ("temp,load", "load", "also the target"),
    ("temp,", "load", "empty name"),
    ("temp,hum,load", "load", "3 features for a fleet with n_inputs=2"),
    ("temp,hum", None, "needs --features and --target"),
    (None, "load", "needs --features and --target"),
])
def test_bad_feature_and_target_options(tmp_path, ran, features, target, needle):
    path = tmp_path / "d.csv"
    path.write_text(GOOD)
    refused(agent(tmp_path, f"csv:{path}", features=features, target=target), ran, needle)


@pytest.mark.parametrize("source", ["jsonl", "mqtt"])
def test_repeated_or_empty_sensor_features(tmp_path, ran, source):
    refused(agent(tmp_path, source, features="a,a", target=None), ran, "repeated")
    refused(agent(tmp_path, source, features="a, ", target=None), ran, "empty name")


def test_unknown_source_and_river_dataset(tmp_path, ran):
    refused(agent(tmp_path, "kafka:x", target=None), ran, "unknown source 'kafka:x'")
    refused(agent(tmp_path, "river:NoSuchDataset", features=None, target=None), ran,
            "unknown River dataset 'NoSuchDataset'", "TrumpApproval")
    refused(agent(tmp_path, "river:TrumpApproval", features=None, target=None), ran,
            "River dataset 'TrumpApproval' has 6 features (ordinal_date, gallup", "n_inputs=2: pass --features")
    refused(agent(tmp_path, "river:TrumpApproval", features="ipsos,nope", target=None), ran,
            "feature(s) ['nope'] not found; features are: ordinal_date")
    assert agent(tmp_path, "river:TrumpApproval", features="ipsos,gallup", target=None).exit_code == 0
    assert len(ran[0]) == 1001 and all(isinstance(r, Reading) for r in ran[0])


def test_bad_config_file(tmp_path, ran):
    res = CliRunner().invoke(app, ["agent", "--config", str(tmp_path / "none.toml"), "--client", "a1"])
    refused(res, ran, "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[fleet\n")
    res = CliRunner().invoke(app, ["agent", "--config", str(bad), "--client", "a1"])
    refused(res, ran, "bad.toml")


def test_bad_max_skip_share(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text(GOOD)
    refused(agent(tmp_path, f"csv:{path}", "--max-skip-share", "1.5"), ran, "--max-skip-share")
    refused(agent(tmp_path, f"csv:{path}", "--skip-window", "0"), ran, "--skip-window")


# =========================================================================== inputs that work


def test_byte_order_mark_is_dropped(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text(GOOD, encoding="utf-8-sig")  # as spreadsheet exports do
    res = agent(tmp_path, f"csv:{path}")
    assert res.exit_code == 0, res.output
    (items,) = ran
    assert [(r.x.tolist(), r.y) for r in items] == [([1.0, 2.0], 0.5), ([3.0, 4.0], 1.5)]


def test_encoding_option(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_bytes("température,hum,load\n1,2,0.5\n".encode("latin-1"))
    res = agent(tmp_path, f"csv:{path}", "--encoding", "latin-1", features="température,hum")
    assert res.exit_code == 0, res.output
    assert [r.y for r in ran[0]] == [0.5]
    path.write_bytes(GOOD.encode("utf-16"))
    res = agent(tmp_path, f"csv:{path}", "--encoding", "utf-16")
    assert res.exit_code == 0, res.output
    assert len(ran[1]) == 2


def test_header_names_are_stripped(tmp_path, ran):
    path = tmp_path / "d.csv"
    path.write_text(" temp , hum ,load\r\n1,2,3\r\n")
    assert agent(tmp_path, f"csv:{path}").exit_code == 0
    assert [r.y for r in ran[0]] == [3.0]


# =========================================================================== counted skips


def _run(aiter):
    async def main():
        return [item async for item in aiter]
    return asyncio.run(asyncio.wait_for(main(), 20))


def test_ragged_and_bad_rows_are_counted_skips(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("temp,hum,load,note\n"
                    "1,2,3,ok\n"        # good
                    "1,2,3,ok,extra\n"  # too many fields: malformed
                    "1,2\n"             # short: load missing
                    "1,2,3\n"           # short, but only an unused column is absent: good
                    "\n"                # blank line: ignored, not a row
                    "1,x,3,ok\n"        # non-numeric
                    "1,2,NA,ok\n")      # NA target: missing
    items = _run(csv_source(path, "load", ["temp", "hum"]))
    got = [(i.id, i.y) if isinstance(i, Reading) else (i.reason, i.detail) for i in items]
    assert got == [("row0", 3.0),
                   ("malformed", "line 3: 5 fields for a header of 4"),  # file lines, as decode errors count
                   ("missing_feature", "line 4: missing ['load']"),
                   ("row3", 3.0),
                   ("non_numeric", "line 7: not numeric: ['hum']"),  # the blank line 6 counts as a line
                   ("missing_feature", "line 8: missing ['load']")]


def test_jsonl_bytes_that_are_not_text_are_a_skip(caplog):
    lines = [json.dumps({"id": "r1", "x": [1, 2], "y": 1}).encode(), b'{"id": "r2", "x": [1, "\xff"], "y": 1}',
             codecs.BOM_UTF8 + json.dumps({"id": "r3", "x": [1, 2], "y": 1}).encode()]
    items = _run(jsonl_source(io.BytesIO(b"\n".join([lines[2], lines[0], lines[1]]) + b"\n"), ["a", "b"]))
    assert [type(i).__name__ for i in items] == ["Reading", "Reading", "Skip"]
    assert items[2].reason == "malformed" and "line 3" in items[2].detail
    latin = _run(jsonl_source(io.BytesIO(lines[1]), ["a", "b"], encoding="latin-1"))
    assert latin[0].reason == "non_numeric"  # decoded, and 'ÿ' is not a number


def test_empty_jsonl_input_is_logged(caplog):
    with caplog.at_level(logging.WARNING, "streamfed"):
        assert _run(jsonl_source(io.BytesIO(b"\n \n"), ["a", "b"])) == []
    assert "no input" in caplog.text


# =========================================================================== skip share


def test_skip_watch_warns_when_the_recent_share_is_too_high(caplog):
    log = logging.getLogger("streamfed.test.skips")
    watch = SkipWatch(max_share=0.5, window=10, name="agent a1", log=log)
    bad = Skip("missing_feature", "row 3: missing ['load']")
    with caplog.at_level(logging.INFO, log.name):
        for _ in range(10):
            watch.observe(None)  # good rows
        for _ in range(5):
            watch.observe(bad)
        assert not watch.above and "share" not in caplog.text  # 5 of the last 10: not more than half
        watch.observe(bad)
        assert watch.above
        assert "6 of the last 10 items skipped (60%" in caplog.text and "missing_feature 6" in caplog.text
        caplog.clear()
        for _ in range(20):
            watch.observe(bad)
        assert "skipped" not in caplog.text  # said once per crossing
        for _ in range(10):
            watch.observe(None)
        assert not watch.above and "back to" in caplog.text
    assert watch.skipped == 26 and watch.seen == 46


def test_skip_watch_short_stream_and_first_skips_logged(caplog):
    log = logging.getLogger("streamfed.test.skips2")
    watch = SkipWatch(max_share=0.5, window=100, name="agent a1", log=log)
    with caplog.at_level(logging.WARNING, log.name):
        for i in range(4):
            watch.observe(Skip("non_numeric", f"row {i}: not numeric: ['hum']"))
        assert caplog.text.count("item skipped (non_numeric") == 3  # the first few of each reason, with detail
        assert "items skipped" not in caplog.text  # the window is not full yet
        watch.close()  # the source ended: judged on what there was
        assert "4 of the last 4 items skipped (100%" in caplog.text
    off = SkipWatch(max_share=None, window=10)
    for _ in range(20):
        off.observe(Skip("malformed"))
    assert not off.above


def test_agent_warns_when_most_rows_are_skipped(tmp_path, mosquitto_dev):
    """A real agent process on Mosquitto: its stderr (no logging configured) says what it skipped, and how much."""
    rows = ["temp,hum,load"] + [f"{i},{i + 1},{'NA' if i % 4 else i}" for i in range(40)]  # 3 of 4 lack a label
    path = tmp_path / "d.csv"
    path.write_text("\n".join(rows) + "\n")
    cfg = _config(tmp_path, port=mosquitto_dev.port, algorithm="fedbnr")
    proc = subprocess.run(
        [sys.executable, "-m", "streamfed.cli", "agent", "--config", str(cfg), "--client", "skippy",
         "--source", f"csv:{path}", "--features", "temp,hum", "--target", "load", "--skip-window", "20"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert proc.returncode == 5, proc.stderr  # a finite file with more than --max-skip-share skipped
    assert "Traceback" not in proc.stderr
    err = proc.stderr.splitlines()
    # file lines, 1-based with the header as line 1: data row k is line k + 2, as decode errors count
    assert [ln for ln in err if "item skipped" in ln] == [
        f"agent skippy: item skipped (missing_feature, {k} so far): line {k + 2}: missing ['load']"
        for k in (1, 2, 3)]
    assert ("agent skippy: 15 of the last 20 items skipped (75% > max 50%): missing_feature 15; "
            "last: line 21: missing ['load']") in err
    out = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert f"agent skippy: csv:{path} ended: 40 items, 10 learned, 30 skipped (missing_feature 30)" in out[-2]
    assert "MSE" in out[-2] and "in the stream's units" in out[-2]
    assert out[-1] == (f"error: agent skippy: csv:{path}: 30 of 40 items skipped (75% > --max-skip-share 50%): "
                       "missing_feature 30")


# =========================================================================== same messages as the replay


@pytest.mark.parametrize(("text", "target", "features"), [
    (GOOD, "Load", ["temp", "hum"]),
    (GOOD, "load", ["temp", "humidity"]),
    (GOOD, "load", ["tmp", "hm"]),
    ("", "load", ["temp", "hum"]),
    ("temp,hum,load\n", "load", ["temp", "hum"]),
    ("temp,hum,temp,load\n1,2,3,4\n", "load", ["temp", "hum"]),
    ("temp,hum,load\n1,2,3\n" + '1,"' + "x" * 200_000 + '",3\n', "load", ["temp", "hum"]),
], ids=["target", "feature", "two-features", "empty", "header-only", "twice", "csv-error"])
def test_messages_are_the_replays(tmp_path, text, target, features):
    """The agent's CSV checks are a light copy of the replay's reader (which loads numba): same messages."""
    from streamfed.evaluation.datasets.csv_fleet import csv_fleet_with_report
    from streamfed.fleet.sources import SourceError

    path = tmp_path / "d.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as replay:
        csv_fleet_with_report(path, target, features=features, normalisation="none")
    with pytest.raises(SourceError) as agent_:
        csv_source(path, target, features)
    assert str(agent_.value) == str(replay.value)


def test_decoding_messages_locate_the_same_byte(tmp_path):
    from streamfed.evaluation.datasets.csv_fleet import csv_fleet_with_report
    from streamfed.fleet.sources import SourceError

    path = tmp_path / "d.csv"
    path.write_bytes("temp,hum,load\n1,2,0.5\n5,6,°C\n".encode("latin-1"))
    with pytest.raises(ValueError) as replay:
        csv_fleet_with_report(path, "load", features=["temp", "hum"], normalisation="none")
    with pytest.raises(SourceError) as agent_:
        csv_source(path, "load", ["temp", "hum"])
    assert str(agent_.value).split(";")[0] == str(replay.value).split(";")[0]
    assert "line 3: invalid start byte (byte 0xb0)" in str(agent_.value)


def test_sensor_messages_pass_the_same_watch_and_counters(caplog):
    """The MQTT sensor path: parsed messages go through `_take_now`, like source items — logged and counted."""
    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import BrokerConfig, FleetConfig
    from streamfed.runtime.agent import AgentService, AgentSettings

    core = AgentCore(FleetConfig(standardise="none",
                                 fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3), "s1", 0)
    svc = AgentService(core, BrokerConfig(), sensor_features=["a", "b"],
                       settings=AgentSettings(skip_window=4, max_skip_share=0.5, gc_freeze=False))
    payloads = [b'{"id": "r1", "x": {"a": 1, "b": 2}, "y": 1}', b"{broken", b'{"id": "r2", "x": {"a": 1}, "y": 1}',
                b'{"id": "r3", "x": {"a": 1, "b": "hot"}, "y": 1}']

    async def main():
        for p in payloads:
            await svc._take_now(svc.parser.parse(p))

    with caplog.at_level(logging.WARNING, "streamfed.runtime.agent"):
        asyncio.run(main())
    assert core.counters.skipped == {"malformed": 1, "missing_feature": 1, "non_numeric": 1}
    assert core.stats.skipped["malformed"] == 1 and core.counters.learned == 1
    assert "agent s1: item skipped (missing_feature, 1 so far): missing ['b']" in caplog.text
    assert "agent s1: 3 of the last 4 items skipped (75% > max 50%)" in caplog.text


def test_jsonl_stdin_with_bytes_that_are_not_utf8(tmp_path, ran):
    stdin = b'{"id": "r1", "x": [1, 2], "y": 1}\n{"id": "r2", "x": [1, "\xb0"], "y": 1}\n'
    res = CliRunner().invoke(app, ["agent", "--config", str(_config(tmp_path)), "--client", "a1", "--source", "jsonl"],
                             input=stdin)
    assert res.exit_code == 0 and res.exception is None, res.output
    (items,) = ran
    assert isinstance(items[0], Reading)
    assert (items[1].reason, items[1].detail) == (
        "malformed", "line 2: not valid utf-8: invalid start byte (byte 0xb0)")
    res = CliRunner().invoke(app, ["agent", "--config", str(_config(tmp_path)), "--client", "a1", "--source", "jsonl",
                                   "--encoding", "latin-1"], input=stdin)
    assert ran[1][1].reason == "non_numeric"  # decoded as Latin-1: '°' is text, not a number


def test_the_recent_skip_share_is_exported() -> None:
    """The share of recent items skipped reaches Prometheus, and a source of mostly bad rows shows it."""
    import numpy as np
    from prometheus_client import generate_latest

    from streamfed.fleet.agent import AgentCore
    from streamfed.fleet.config import BrokerConfig, FleetConfig
    from streamfed.fleet.sources import Reading, Skip, SkipReason
    from streamfed.runtime.agent import AgentService, AgentSettings
    from streamfed.runtime.exporter import StreamfedCollector, make_registry

    cfg = FleetConfig(standardise="none", fleet="skips", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
    svc = AgentService(AgentCore(cfg, "a1", 0), BrokerConfig(), source=None, sensor_features=["u", "v"],
                       settings=AgentSettings(skip_window=10))
    items = [Skip(SkipReason.MISSING_FEATURE, "row")] * 7 + [Reading(str(i), np.zeros(2), float(i), 0.1)
                                                           for i in range(3)]

    async def feed() -> None:
        for item in items:
            await svc._take_now(item)

    asyncio.run(feed())
    assert svc.core.stats.recent_skip_ratio == 0.7
    text = generate_latest(make_registry(StreamfedCollector([svc.core.stats]))).decode()
    assert 'streamfed_agent_recent_skip_ratio{client="a1",fleet="skips"} 0.7' in text
