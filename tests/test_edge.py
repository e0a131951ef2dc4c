"""What goes onto a device (`edge/`): the agent configuration, the systemd unit, the sensor adapter —
and a sensor → agent → aggregator → subscriber run over a real Mosquitto."""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import doctest
import importlib.util
import itertools
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from types import ModuleType

import aiomqtt
import pytest
import typer
from typer.testing import CliRunner

from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.cli import app
from streamfed.evaluation.datasets import BEIJING_INPUTS
from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import BrokerConfig, FleetConfig, load_config
from streamfed.runtime.agent import AgentService
from streamfed.runtime.aggregator import AggregatorService
from streamfed.runtime.connection import client_kwargs
from streamfed.wire.message import decode
from streamfed.wire.topics import global_topic, predictions_topic, sensor_topic

REPO = Path(__file__).resolve().parent.parent
EDGE = REPO / "edge"
UNIT = EDGE / "streamfed-agent@.service"


def load_adapter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("edge_sensor_adapter", EDGE / "sensor_adapter.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclass/typing introspection looks the module up by name
    spec.loader.exec_module(mod)
    return mod


adapter = load_adapter()


async def until(cond, timeout: float, what: str) -> None:
    """Poll `cond()` until true; fail with `what` (and its last state) after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


# =========================================================================== agent.toml


def test_agent_toml_is_a_valid_complete_configuration():
    cfg = load_config(EDGE / "agent.toml", env={})
    f, b = cfg.fleet, cfg.broker
    assert (f.algorithm, f.n_inputs) == ("pofmkl", 10)
    assert (f.params.n_kernels, f.params.n_features, f.params.bin_size) == (16, 100, 1)  # in [fleet.pofmkl]
    assert f.n_inputs == len(BEIJING_INPUTS)
    assert b.use_tls and b.port == 8883 and b.tls_ca == "/etc/streamfed/ca.crt"
    assert b.username and b.password is None  # the password is never in the file
    assert b.protocol == "5" and b.session_expiry > 0  # persistent sessions survive a network outage
    # the broker must accept the fleet's largest message (prod.conf's max_packet_size)
    prod = (REPO / "broker_config" / "mosquitto" / "prod.conf").read_text()
    max_packet = int(re.search(r"^max_packet_size (\d+)", prod, re.M).group(1))
    assert f.protocol_schema.max_bytes < max_packet
    # the sensor topic is the one the production broker's generated roles let the agent read and write
    topic = sensor_topic(f.fleet, "station-01", f.sensor_topic)
    assert topic == f"streamfed/v1/{f.fleet}/sensors/station-01"
    gen = importlib.util.spec_from_file_location("make_dynsec_edge",
                                                 REPO / "broker_config" / "scripts" / "make-dynsec.py")
    dynsec = importlib.util.module_from_spec(gen)
    sys.modules[gen.name] = dynsec  # dataclasses look their module up
    gen.loader.exec_module(dynsec)
    accounts, roles = dynsec.build({"fleet": [{"name": f.fleet, "agents": ["station-01"]}]})
    [agent] = [a for a in accounts if a.username == "station-01"]
    acls = [(acl["acltype"], acl["topic"]) for r in roles if r["rolename"] in agent.roles for acl in r["acls"]]
    assert ("publishClientSend", topic) in acls and ("publishClientReceive", topic) in acls
    assert agent.clientid == f"{f.fleet}.station-01"  # the id the agent connects with (runtime/agent/service.py)


def test_agent_toml_takes_credentials_from_the_environment():
    env = {"STREAMFED_BROKER__PASSWORD": "s3cret", "STREAMFED_BROKER__USERNAME": "station-07"}
    b = load_config(EDGE / "agent.toml", env=env).broker
    assert b.username == "station-07" and b.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(b)
    kw = client_kwargs(b, "beijing-air.station-07", persistent=True)
    assert kw["password"] == "s3cret" and kw["tls_params"].ca_certs == "/etc/streamfed/ca.crt"


def test_agent_toml_documents_every_field():
    text = (EDGE / "agent.toml").read_text()
    lines = text.splitlines()
    # every setting (set or commented out) of every section appears in the example
    # the algorithm's own settings (FleetConfig.params) are the section named after it
    assert re.search(r"^\[fleet\.pofmkl\]", text, re.M)
    for model, section in ((FleetConfig, "fleet"), (POFMKLParams, "fleet.pofmkl"), (BrokerConfig, "broker")):
        for name in (n for n in model.model_fields if not (model is FleetConfig and n == "params")):
            assert (re.search(rf"^#?\s*{name} =", text, re.M) or re.search(rf"^#?\s*\[{section}\.{name}\]", text, re.M)
                    ), f"{model.__name__}.{name} is not in agent.toml"
    for name in ("sigma", "lam", "min_upload", "forgetting", "fit_hyperparameters"):
        assert re.search(rf"^#\s*{name} =", text, re.M), f"fedbnr.{name}"
    # and every key that is set has a comment: on its line or just above it
    for i, line in enumerate(lines):
        if re.match(r"^[a-z_]+ =", line):
            above = lines[i - 1].lstrip() if i else ""
            assert "#" in line or above.startswith("#"), f"line {i + 1} has no comment: {line}"
    assert tomllib.loads(text)["broker"].get("password") is None


# =========================================================================== systemd unit


def read_unit(path: Path = UNIT) -> configparser.ConfigParser:
    # systemd syntax: case-sensitive keys, no interpolation, backslash continuation lines
    text = path.read_text().replace("\\\n", " ")
    cp = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",),
                                   comment_prefixes=("#", ";"), empty_lines_in_values=False)
    cp.optionxform = str  # type: ignore[assignment, method-assign]
    cp.read_string(text)
    return cp


def test_systemd_unit_keys():
    unit = read_unit()
    assert unit.sections() == ["Unit", "Service", "Install"]
    s = unit["Service"]
    assert s["User"] == "streamfed" and s["Group"] == "streamfed"
    assert s["Restart"] == "on-failure" and float(s["RestartSec"]) > 0
    assert s["EnvironmentFile"] == "/etc/streamfed/%i.env"  # STREAMFED_BROKER__PASSWORD, root-only file
    assert "STREAMFED_BROKER__PASSWORD" in UNIT.read_text()
    assert "STREAMFED_BROKER__PASSWORD" not in s.get("Environment", "")  # never inline in the unit
    hardening = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                 "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
                 "ProtectControlGroups": "yes", "RestrictNamespaces": "yes", "RestrictSUIDSGID": "yes",
                 "LockPersonality": "yes", "SystemCallArchitectures": "native", "CapabilityBoundingSet": ""}
    assert {k: s.get(k) for k in hardening} == hardening
    assert set(s["RestrictAddressFamilies"].split()) <= {"AF_INET", "AF_INET6", "AF_UNIX"}
    # kernels built ahead of time at install, no JIT: so no writable-and-executable memory, and a missing
    # build is a start-up error, not a silent JIT (tests/test_compiled.py runs an agent under that rule)
    assert s["MemoryDenyWriteExecute"] == "yes"
    text = UNIT.read_text()
    assert "STREAMFED_KERNELS=aot" in text
    kdir = next(w.split("=", 2)[2] for w in text.split() if w.startswith("Environment=STREAMFED_KERNEL_DIR="))
    assert f"STREAMFED_KERNEL_DIR={kdir} " in (EDGE / "README.md").read_text()  # where the install builds
    assert "network-online.target" in unit["Unit"]["Wants"] and "network-online.target" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_unit_command_line_is_accepted_by_the_cli():
    unit = read_unit()
    argv = shlex.split(unit["Service"]["ExecStart"].replace("%i", "station-01")
                       .replace("${STREAMFED_AGENT_INDEX}", "3"))
    assert argv[0].endswith("/bin/streamfed") and argv[1] == "agent"
    joined = " ".join(argv)
    assert "--config /etc/streamfed/fleet/agent.toml" in joined and "--client station-01" in joined
    group = typer.main.get_command(app)
    with group.make_context("streamfed", argv[1:]) as ctx:
        sub = group.get_command(ctx, "agent")
        assert sub is not None
        params = sub.make_context("agent", argv[2:], parent=ctx).params  # parses and type-checks, runs nothing
    assert str(params["config"]) == "/etc/streamfed/fleet/agent.toml" and params["client"] == "station-01"
    assert params["index"] == 3 and params["source"] == "mqtt"
    fleet = load_config(EDGE / "agent.toml", env={}).fleet
    assert params["features"].split(",") == list(BEIJING_INPUTS)[: fleet.n_inputs]
    assert len(params["features"].split(",")) == fleet.n_inputs


def test_systemd_unit_verifies(tmp_path):
    """`systemd-analyze verify` where systemd is installed (it checks every key and the command); the
    configparser checks above run everywhere."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        read_unit()  # at least it parses
        return
    exe = Path(sys.executable).parent / "streamfed"
    assert exe.exists()
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace("/opt/streamfed/venv/bin/streamfed", str(exe)))
    res = subprocess.run([tool, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for complaint in ("Unknown key", "Unknown section", "ignoring", "Failed", "not executable", "Invalid"):
        assert complaint not in out, out
    # an exposure level above 2.0 ("OK") would mean the sandboxing was weakened
    sec = subprocess.run([tool, "security", "--offline=true", "--threshold=20", str(copy)],
                         capture_output=True, text=True, timeout=60)
    assert sec.returncode == 0, sec.stdout[-2000:] + sec.stderr


# =========================================================================== sensor adapter


def test_sensor_adapter_doctests_and_messages():
    res = doctest.testmod(adapter, optionflags=doctest.ELLIPSIS)
    assert res.attempted >= 4 and res.failed == 0
    samples = [({"a": float(i)}, float(i) / 10) for i in range(5)]
    clock = iter([3.0, 2.0, 4.0, 4.0, 5.0]).__next__  # stepped back once
    msgs = list(adapter.sensor_messages(samples, delay_labels=2, id_prefix="p", clock=clock))
    kinds = ["L" if "label_for" in m else "R" for m in msgs]
    assert kinds == ["R", "R", "R", "L", "R", "L", "R", "L", "L", "L"]
    assert [m["label_for"] for m in msgs if "label_for" in m] == [f"p-{i}" for i in range(5)]
    assert [m["ts"] for m in msgs if "id" in m] == [3.0, 3.0, 4.0, 4.0, 5.0]  # never decreasing
    assert all("y" not in m for m in msgs if "id" in m)
    inline = list(adapter.sensor_messages(samples, delay_labels=0, count=3, as_list=True))
    assert [m["x"] for m in inline] == [[0.0], [1.0], [2.0]] and [m["y"] for m in inline] == [0.0, 0.1, 0.2]
    assert len({m["id"].split("-")[0] for m in inline}) == 1
    assert all("y" not in m for m in adapter.sensor_messages(samples, delay_labels=-1))
    # every message the adapter makes parses on the agent's side
    from streamfed.fleet.sources import Label, Reading, ReadingParser

    p = ReadingParser(["a"])
    assert [type(p.parse(adapter._payload(m))) for m in msgs] == [Reading if k == "R" else Label for k in kinds]


# =========================================================================== end to end

E2E_FLEET = "edge-e2e"
E2E_CLIENT = "station-01"
N = 40


def test_sensor_to_agent_to_aggregator_over_mosquitto(mosquitto_dev):
    """The sensor adapter publishes N readings without labels, bad inputs in between, then the N labels
    (delayed labels); the MQTT-fed agent predicts each valid reading once, learns from every label,
    counts every bad input by reason, and its updates reach a newer global it installs."""
    cfg = FleetConfig(standardise="none",
                      fleet=E2E_FLEET, algorithm="pofmkl", n_inputs=10, n_kernels=4, n_features=20, bin_size=2,
                      seed=1)
    broker = mosquitto_dev.broker_config()
    samples = list(itertools.islice(adapter.beijing_samples("Dongsi"), N))
    msgs = list(adapter.sensor_messages(samples, delay_labels=N, id_prefix="e2e"))
    readings, labels = msgs[:N], msgs[N:]
    assert all("label_for" not in m and "y" not in m for m in readings)
    assert [m["label_for"] for m in labels] == [m["id"] for m in readings]
    x0 = readings[0]["x"]
    bad = [
        {"id": "bad-nan", "ts": readings[N // 2 - 1]["ts"], "x": {**x0, "PM2.5": math.nan}},
        {"id": "bad-missing", "x": {k: v for k, v in x0.items() if k != "SO2"}},
        {"id": "bad-text", "x": {**x0, "TEMP": "warm"}},
        b"{not json",
        {"id": "bad-old", "ts": 1.0, "x": x0},
        readings[3],  # a redelivered reading
        {"label_for": "never-sent", "y": 0.5},
    ]
    expected_skips = {"non_finite": 1, "missing_feature": 1, "non_numeric": 1, "malformed": 1, "out_of_order": 1,
                      "duplicate": 1, "unknown_reading": 1}
    stream = readings[: N // 2] + bad + readings[N // 2:] + labels

    async def main():
        agg = AggregatorService(AggregatorCore(cfg, mode="async", window=0.05), broker)
        core = AgentCore(cfg, E2E_CLIENT, 0, mode="async")
        agent = AgentService(core, broker, sensor_features=list(BEIJING_INPUTS))
        tasks = [asyncio.create_task(agg.run())]
        preds: list = []
        try:
            await asyncio.wait_for(agg.connected.wait(), 10)
            tasks.append(asyncio.create_task(agent.run()))
            await asyncio.wait_for(agent.connected.wait(), 10)
            async with aiomqtt.Client(**client_kwargs(broker, f"{E2E_FLEET}.viewer")) as sub:
                await sub.subscribe(predictions_topic(E2E_FLEET, E2E_CLIENT), qos=1)

                async def collect():
                    async for m in sub.messages:
                        preds.append(decode(m.payload, cfg, kinds=("prediction",)))

                collector = asyncio.create_task(collect())
                tasks.append(collector)
                sent = await asyncio.wait_for(adapter.publish_messages(
                    broker, sensor_topic(E2E_FLEET, E2E_CLIENT), stream, client_id=f"{E2E_FLEET}.sensor"), 15)
                assert sent == len(stream)
                await until(lambda: core.counters.learned == N and core.counters.skipped == expected_skips,
                            15, "the agent to learn every label and count every bad input")
                await until(lambda: len(preds) >= N, 10, f"{N} predictions")
                await until(lambda: core.seq >= 1 and agg.core.included().get(E2E_CLIENT) == core.seq
                            and core.global_version == agg.core.version, 10,
                            "the aggregator to include every update and the agent to install that global")
                await asyncio.sleep(0.3)  # anything extra would arrive now
                collector.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await collector
            async with aiomqtt.Client(**client_kwargs(broker, f"{E2E_FLEET}.reader")) as reader:
                await reader.subscribe(global_topic(E2E_FLEET), qos=1)
                retained = await asyncio.wait_for(anext(aiter(reader.messages)), 5)
                glob = decode(retained.payload, cfg, kinds=(cfg.global_kind,))
        finally:
            agent.stop()
            agg.stop()
            for t in tasks[2:]:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                    await asyncio.wait_for(t, 10)
        return core, agg, agent, preds, glob

    core, agg, agent, preds, glob = asyncio.run(main())
    # exactly one prediction per valid reading (none for the bad ones, none again at label time)
    assert len(preds) == N
    assert sorted(p.meta["reading"] for p in preds) == sorted(m["id"] for m in readings)
    assert sorted(p.seq for p in preds) == list(range(1, N + 1))
    assert all(p.client == E2E_CLIENT and math.isfinite(p.arrays["mean"][0]) for p in preds)
    assert core.counters.samples == N and core.counters.learned == N and len(core.join) == 0
    assert core.counters.skipped == expected_skips
    # every update accepted: one per learned sample while fewer than `outbox_limit` wait for a global, the
    # rest coalesced in the error feedback (flow control), so between N / N-per-update and N of them
    assert 1 <= core.seq <= N and agg.core.counters.accepted == core.seq and agg.core.rejected == {}
    assert core.seq >= min(N, agent.outbox_limit)
    assert agg.core.version >= 1 and glob.global_version == agg.core.version
    assert glob.included == {E2E_CLIENT: core.seq}
    assert core.global_version == agg.core.version
    assert agent.dropped_predictions == 0 and not agent.updates and not agent.predictions


def test_subscribe_cli_prints_prediction_json_lines(mosquitto_dev):
    """`streamfed subscribe --json` against the broker while an MQTT-fed agent predicts adapter readings."""
    fleet, client, k = "edge-sub", "dev-01", 5
    cfg = FleetConfig(standardise="none", fleet=fleet, algorithm="pofmkl", n_inputs=3, n_kernels=2, n_features=5)
    broker = mosquitto_dev.broker_config()
    args = ["subscribe", "--fleet", fleet, "--host", broker.host, "--port", str(broker.port), "--count", str(k),
            "--json"]
    results: list = []

    async def main():
        core = AgentCore(cfg, client, 0)
        agent = AgentService(core, broker, sensor_features=["x0", "x1", "x2"])
        agent_task = asyncio.create_task(agent.run())
        publisher = None
        stop = asyncio.Event()
        # a daemon thread: a CLI that never returns fails the test below instead of hanging the run
        cli = threading.Thread(target=lambda: results.append(CliRunner().invoke(app, args)), daemon=True)
        try:
            await asyncio.wait_for(agent.connected.wait(), 10)
            cli.start()
            # predictions are not retained: keep the readings coming until the subscriber has its k
            msgs = adapter.sensor_messages(adapter.simulated_samples(3), delay_labels=0, id_prefix="sub")
            publisher = asyncio.create_task(adapter.publish_messages(
                broker, sensor_topic(fleet, client), msgs, rate=40, client_id=f"{fleet}.sensor", stop=stop))
            await until(lambda: not cli.is_alive(), 20, "`streamfed subscribe --count` to exit")
        finally:
            stop.set()  # not cancel(): a cancellation lost in a timed wait (3.11) would hang the test
            agent.stop()
            for t in (publisher, agent_task):
                if t is not None:
                    with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                        await asyncio.wait_for(t, 10)
        return core

    core = asyncio.run(main())
    assert len(results) == 1
    res = results[0]
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == k, res.stdout
    for row in rows:
        assert {"client", "seq", "mean", "var", "global_version", "reading", "latency_s", "created"} <= set(row)
        assert row["client"] == client
        assert isinstance(row["seq"], int) and 1 <= row["seq"] <= core.pred_seq
        assert isinstance(row["mean"], float) and math.isfinite(row["mean"])
        assert row["var"] is None  # POF-MKL predictions carry no variance
        assert isinstance(row["global_version"], int) and row["global_version"] >= 0
        assert re.fullmatch(r"sub-\d+", row["reading"])
        assert isinstance(row["latency_s"], float) and 0 <= row["latency_s"] < 5
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == k
    assert core.counters.learned >= k  # labelled inline: learned as they came


@pytest.mark.parametrize("argv", [["--help"]])
def test_sensor_adapter_runs_as_a_script(argv):
    res = subprocess.run([sys.executable, str(EDGE / "sensor_adapter.py"), *argv], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "--delay-labels" in res.stdout and "--rate" in res.stdout


def test_sensor_adapter_cli_publishes_to_the_broker(mosquitto_dev):
    """`sensor_adapter.py --count` as a device would run it: the readings arrive on the sensor topic."""
    broker = mosquitto_dev.broker_config()
    topic = sensor_topic("edge-cli", "dev-02")

    async def main():
        got = []
        async with aiomqtt.Client(**client_kwargs(broker, "edge-cli.watch")) as sub:
            await sub.subscribe(topic, qos=1)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(EDGE / "sensor_adapter.py"), "--host", broker.host, "--port", str(broker.port),
                "--fleet", "edge-cli", "--client", "dev-02", "--source", "beijing", "--station", "Tiantan",
                "--rate", "0", "--count", "4", "--delay-labels", "2", "--id-prefix", "cli",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            try:
                _, err = await asyncio.wait_for(proc.communicate(), 60)
            finally:
                if proc.returncode is None:
                    proc.kill()
            assert proc.returncode == 0, err.decode()

            async def collect():
                async for m in sub.messages:
                    got.append(json.loads(m.payload))
                    if len(got) == 8:
                        return
            await asyncio.wait_for(collect(), 10)
        return got

    got = asyncio.run(main())
    assert [m.get("id") or "L:" + m["label_for"] for m in got] == [
        "cli-0", "cli-1", "cli-2", "L:cli-0", "cli-3", "L:cli-1", "L:cli-2", "L:cli-3"]
    assert all(list(m["x"]) == list(BEIJING_INPUTS) for m in got if "x" in m)


# =========================================================================== device life cycle
# Restarts, misconfiguration, delayed labels in lock-step, Ctrl-C: what a device's agent meets.


def test_a_restarted_agent_continues_its_update_sequence():
    import numpy as np

    from streamfed.fleet.sources import Reading
    from streamfed.wire.message import encode

    cfg = FleetConfig(standardise="none", fleet="restart", algorithm="pofmkl", n_inputs=2, n_kernels=3, n_features=4)
    agg = AggregatorCore(cfg, mode="async", window=1.0)  # one window: closed by the tick below
    rng = np.random.default_rng(0)
    before = AgentCore(cfg, "a1", 0)
    for i in range(5):
        for m in before.on_reading(Reading(f"r{i}", rng.random(2), float(i), 0.5))[1]:
            agg.on_update("a1", encode(m), now=float(i))
    glob = decode(encode(agg.tick(now=10.0)[0]), cfg, kinds=(cfg.global_kind,))
    assert glob.included == {"a1": 5}
    after = AgentCore(cfg, "a1", 0)  # systemd restarted the process; the retained global comes first
    assert after.on_global(glob)
    for m in after.on_reading(Reading("s0", rng.random(2), 0.0, 0.5))[1]:
        agg.on_update("a1", encode(m), now=20.0)
    assert agg.rejected == {}  # (was {'stale_seq': 1}, and every update until seq 6 lost)


def test_agent_service_refuses_sensor_features_that_do_not_fit_the_fleet():
    cfg = FleetConfig(standardise="none",
                      fleet="edge-mismatch", algorithm="pofmkl", n_inputs=3, n_kernels=2, n_features=5)
    with pytest.raises(ValueError):
        AgentService(AgentCore(cfg, "m1", 0), BrokerConfig(), sensor_features=["u", "v"])


def test_a_lockstep_agent_survives_a_delayed_label_while_it_waits_for_its_round(mosquitto_dev):
    cfg = FleetConfig(standardise="none",
                      fleet="edge-lockstep", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
    broker = mosquitto_dev.broker_config()
    core = AgentCore(cfg, "l1", 0, mode="lockstep")
    svc = AgentService(core, broker, sensor_features=["a", "b"])
    topic = sensor_topic(cfg.fleet, "l1")

    async def main():
        task = asyncio.create_task(svc.run())
        try:
            await asyncio.wait_for(svc.connected.wait(), 10)
            async with aiomqtt.Client(**client_kwargs(broker, "edge-lockstep.sensor")) as pub:
                for payload in ({"id": "r1", "x": [1, 2], "y": 0.5},  # learned: now waits for global 1
                                {"id": "r2", "x": [1, 2]},  # predicted, waits for its label
                                {"label_for": "r2", "y": 0.3},  # no aggregator: global 1 never comes
                                b"{not json"):
                    await pub.publish(topic, adapter._payload(payload), qos=1)
            await until(lambda: "malformed" in core.counters.skipped or task.done(), 2, "the malformed message")
        finally:
            svc.stop()  # a lock-step agent would wait up to 30 s for its round's global: cut that short
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 1)

    asyncio.run(main())
    # the label is skipped (like a labelled reading: `lockstep_busy`) or kept, never fatal
    assert core.counters.skipped.get("malformed") == 1
    assert core.counters.learned == 1 and core.counters.samples == 2


def test_a_cancelled_agent_is_marked_offline(mosquitto_dev):
    cfg = FleetConfig(standardise="none",
                      fleet="edge-cancel", algorithm="pofmkl", n_inputs=3, n_kernels=2, n_features=5)
    broker = mosquitto_dev.broker_config()

    async def main():
        svc = AgentService(AgentCore(cfg, "c1", 0), broker, sensor_features=["u", "v", "w"])
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.connected.wait(), 10)
        task.cancel()  # what asyncio.run does to the main task on Ctrl-C
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(task, 5)
        await asyncio.sleep(0.2)
        async with aiomqtt.Client(**client_kwargs(broker, "edge-cancel.reader")) as reader:
            from streamfed.wire.topics import status_topic

            await reader.subscribe(status_topic(cfg.fleet, "c1"), qos=1)
            retained = await asyncio.wait_for(anext(aiter(reader.messages)), 5)
        return decode(retained.payload, cfg, kinds=("status",)).meta["state"]

    assert asyncio.run(main()) == "offline"


def test_readme_sensor_examples_parse():
    """The message examples of edge/README.md are what the agent accepts (the docs cannot drift)."""
    from streamfed.fleet.sources import Label, Reading, ReadingParser

    text = (EDGE / "README.md").read_text()
    block = text.split("## 5. The sensor message format", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.strip()]
    p = ReadingParser(list(BEIJING_INPUTS))
    parsed = [p.parse(ln) for ln in lines]
    assert [type(x) for x in parsed] == [Reading, Reading, Label]
    assert parsed[2].id == parsed[0].id and parsed[1].y == 0.31
    # and the subscribe example line has the fields `streamfed subscribe --json` prints
    row = json.loads(next(ln for ln in text.splitlines() if ln.startswith('{"client"')))
    assert set(row) == {"client", "seq", "mean", "var", "global_version", "reading", "latency_s", "created"}
