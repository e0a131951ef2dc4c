"""Broker-side drops made visible: `streamfed broker-metrics` ($SYS → Prometheus) over the real production
broker, and the shipped alert evaluated by a real Prometheus.

The broker runs the shipped `prod.conf` with two values changed for test time: `max_queued_messages 5`
(so a handful of messages to an offline persistent session overflows its queue, as 9,130 did in the
measured flood) and `sys_interval 1` (statistics every second instead of every 10)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiomqtt
import pytest

from streamfed.runtime.broker_metrics import BrokerMetrics, SysSubscriber
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.exporter import make_registry, serve_metrics
from streamfed.runtime.session import BrokerRefused
from streamfed.wire import topics
from tests import brokers
from tests import prometheus as prom

RULES = prom.PROMETHEUS_CONFIG / "rules" / "mosquitto.rules.yml"
DROPPED = "mosquitto_publish_messages_dropped_total"
QUEUE = 5
ROSTER = {"monitor": "monitor", "fleet": [{"name": "f", "agents": ["a1"], "viewers": ["viewer"]}]}


@pytest.fixture(scope="module")
def broker() -> Iterator[brokers.Broker]:
    b = brokers.start_or_fail("prod", roster=ROSTER,
                                    overrides={"max_queued_messages": str(QUEUE), "sys_interval": "1"})
    with b:
        yield b


def client(broker: brokers.Broker, user: str, persistent: bool = False) -> aiomqtt.Client:
    return aiomqtt.Client(**client_kwargs(broker.broker_config(user), broker.client_ids[user], persistent=persistent),
                          timeout=5.0)


async def overflow_a_queue(broker: brokers.Broker, n: int) -> None:
    """a1 subscribes to its acks with a persistent session and goes offline; the aggregator sends it `n`
    QoS 1 acks: the broker queues `QUEUE` of them and drops the rest, telling nobody."""
    async with client(broker, "a1"):
        pass  # a clean start: whatever an earlier test left queued is discarded
    async with client(broker, "a1", persistent=True) as a1:
        await a1.subscribe(topics.acks_topic("f", "a1"), qos=1)
    async with client(broker, "f.aggregator") as agg:
        for i in range(n):
            await agg.publish(topics.acks_topic("f", "a1"), str(i).encode(), qos=1)  # every PUBACK a success


async def wait_until(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_dropped_messages_reach_the_exporter(broker: brokers.Broker) -> None:
    metrics = BrokerMetrics()

    async def scenario() -> tuple[float, float]:
        sub = SysSubscriber(broker.broker_config("monitor"), metrics)
        task = asyncio.create_task(sub.run())
        try:
            await asyncio.wait_for(sub.subscribed.wait(), 10)
            await wait_until(lambda: metrics.value(DROPPED) is not None)
            before = metrics.value(DROPPED)
            assert metrics.connected and metrics.value("mosquitto_clients_connected") is not None
            await overflow_a_queue(broker, QUEUE + 12)
            await wait_until(lambda: metrics.value(DROPPED) >= before + 12)
            return before, metrics.value(DROPPED)  # type: ignore[return-value]
        finally:
            sub.stop()
            await asyncio.wait_for(task, 5)

    before, after = asyncio.run(scenario())
    assert after - before == 12  # exactly the messages beyond the queue
    assert not metrics.connected and metrics.version == "mosquitto version 2.0.11"
    assert metrics.value("mosquitto_store_messages_bytes") is not None
    assert metrics.value("mosquitto_load_publish_dropped", window="1min") is not None


def test_a_drop_fires_the_shipped_alert_in_prometheus(broker: brokers.Broker) -> None:
    prom.require(lambda msg: pytest.fail(msg, pytrace=False))
    metrics = BrokerMetrics()

    async def scenario() -> tuple[float, list[dict[str, Any]]]:
        sub = SysSubscriber(broker.broker_config("monitor"), metrics)
        task = asyncio.create_task(sub.run())
        server, port = serve_metrics(make_registry(metrics))
        try:
            with server, prom.start_prometheus(prom.scrape_config({"mosquitto": [f"127.0.0.1:{port}"]},
                                                                  rule_files=[RULES])) as p:
                await asyncio.to_thread(p.wait_for_series, DROPPED)
                # an idle broker raises no alert
                assert await asyncio.to_thread(p.get, "/api/v1/alerts") == {"alerts": []}
                before = p.value(DROPPED)
                await overflow_a_queue(broker, QUEUE + 3)

                def firing() -> list[dict[str, Any]]:
                    return [a for a in p.get("/api/v1/alerts")["alerts"]
                            if a["labels"]["alertname"] == "MosquittoMessagesDropped" and a["state"] == "firing"]

                alerts = await asyncio.to_thread(p.wait_for, firing, 30.0)
                return p.value(DROPPED) - before, alerts
        finally:
            sub.stop()
            await asyncio.wait_for(task, 5)

    dropped, alerts = asyncio.run(scenario())
    assert dropped == 3 and [a["labels"]["severity"] for a in alerts] == ["critical"]


def test_an_account_without_sys_rights_is_refused(broker: brokers.Broker) -> None:
    sub = SysSubscriber(broker.broker_config("viewer"), BrokerMetrics())
    with pytest.raises(BrokerRefused, match=r"subscription to '\$SYS/#' refused: Not authorized"):
        asyncio.run(asyncio.wait_for(sub.run(), 20))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "streamfed.cli", "broker-metrics", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | (env or {}))


def test_cli_serves_the_broker_metrics(broker: brokers.Broker) -> None:
    port = brokers.free_port()
    proc = _cli("--host", broker.host, "--port", str(broker.tls_port), "--tls-ca", str(broker.ca),
                "--metrics-port", str(port), env={"STREAMFED_BROKER__PASSWORD": broker.users["monitor"]})
    try:
        deadline, body = time.monotonic() + 20, ""
        while f"{DROPPED} " not in body:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()  # type: ignore[union-attr]
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
            except OSError:
                continue
        assert re.search(r"^mosquitto_exporter_connected 1\.0$", body, re.M)
        assert re.search(r'^mosquitto_broker_info\{version="mosquitto version 2\.0\.11"\} 1\.0$', body, re.M)
    finally:
        proc.terminate()
        proc.wait(10)


def test_cli_refuses_the_wrong_password_and_a_bad_config(broker: brokers.Broker, tmp_path: Any) -> None:
    proc = _cli("--host", broker.host, "--port", str(broker.tls_port), "--tls-ca", str(broker.ca),
                "--metrics-port", "0", env={"STREAMFED_BROKER__PASSWORD": "wrong"})
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "refused the connection 3 times" in out, out
    bad = tmp_path / "b.toml"
    bad.write_text("[broker]\nport = 'x'\n")
    proc = _cli("--config", str(bad), "--metrics-port", "0")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and out.startswith("error: broker configuration: port") and out.count("\n") == 1, out


def test_promtool_checks_and_unit_tests_the_broker_rules() -> None:
    prom.require(lambda msg: pytest.fail(msg, pytrace=False))
    res = prom.promtool("check", "rules", str(RULES))
    assert res.returncode == 0 and "2 rules found" in res.stdout, res.stdout + res.stderr
    res = prom.promtool("test", "rules", str(prom.PROMETHEUS_CONFIG / "tests" / "mosquitto.rules.test.yml"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_exporter_doctests() -> None:
    import doctest

    from streamfed.runtime import broker_metrics

    result = doctest.testmod(broker_metrics)
    assert result.attempted > 0 and result.failed == 0
