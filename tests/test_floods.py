"""Floods (issue 15, part 4): back-pressure and bounded memory on the agent's input.

Formerly a 15 s sensor flood took an agent from ~70 MB to 0.45–1.3 GB (aiomqtt's incoming queue is
unbounded and paho reads whatever the broker sends) and tens of thousands of readings vanished: the
agent read its socket one packet per event-loop turn, the broker's queue for it filled and Mosquitto
dropped the rest, visible only in `$SYS`.

The integration test floods a real agent process (`python -m streamfed.cli agent --source mqtt`) through
the production Mosquitto (TLS, dynamic security; the sensor adapter's own account `a1.sensor` publishing
on `a1`'s sensor topic at QoS 1 as fast as the broker acknowledges), with a real aggregator process, and
reads the agent's RSS from /proc. Every reading acknowledged by the broker must be accounted for by
production observables alone: the broker's `$SYS/broker/publish/messages/dropped`, the agent's
`streamfed_agent_samples_total` and `streamfed_agent_samples_skipped_total{reason}`.
`STREAMFED_FLOODS_REPORT=path.json` keeps the measured numbers; `STREAMFED_FLOOD_SECONDS` sets the flood.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion

from streamfed.fleet.sources import MAX_MESSAGE_BYTES, ReadingParser, Skip, jsonl_source
from streamfed.runtime.mosquitto import free_port
from streamfed.runtime.mqtt import IncomingQueue, Lane, burst_reads
from streamfed.wire import topics
from tests import brokers

REPO = Path(__file__).resolve().parent.parent
FLOOD_SECONDS = float(os.environ.get("STREAMFED_FLOOD_SECONDS", "15"))
RSS_LIMIT_MB = 150.0
ROSTER = {"monitor": "monitor",
          "fleet": [{"name": "f", "agents": ["a1"], "aggregator": True, "sensor_adapters": True}]}


# =========================================================================== the lane, against a transcription


def reference_lane(ops: list[tuple[str, int]], limit: int, max_bytes: int,
                   policy: str) -> tuple[list[int], list[int], int]:
    """Plain transcription of the lane's rule: returns (kept sizes, taken sizes, dropped count)."""
    kept: list[int] = []
    taken: list[int] = []
    dropped = 0
    for op, size in ops:
        if op == "get":
            if kept:
                taken.append(kept.pop(0))
            continue
        if size > max_bytes:
            dropped += 1
            continue
        if policy == "drop_newest":
            if len(kept) >= limit or sum(kept) + size > max_bytes:
                dropped += 1
                continue
        else:
            while len(kept) >= limit or sum(kept) + size > max_bytes:
                kept.pop(0)
                dropped += 1
        kept.append(size)
    return kept, taken, dropped


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["offer", "offer", "get"]), st.integers(0, 40)), max_size=60),
       limit=st.integers(1, 6), max_bytes=st.integers(1, 100), policy=st.sampled_from(["drop_oldest", "drop_newest"]))
def test_the_lane_follows_its_transcription_and_counts_every_item(ops: list[tuple[str, int]], limit: int,
                                                                   max_bytes: int, policy: str) -> None:
    told: list[tuple[bytes, str]] = []
    lane = Lane(limit, max_bytes, policy, on_drop=lambda item, reason: told.append((item, reason)))  # type: ignore[arg-type]
    taken = []
    for op, size in ops:
        if op == "get":
            if lane:
                taken.append(len(lane.get_nowait()))
        else:
            lane.offer(b"x" * size)
    kept, ref_taken, dropped = reference_lane(ops, limit, max_bytes, policy)
    assert [len(i) for i in lane] == kept and taken == ref_taken and lane.dropped == dropped == len(told)
    assert lane.received == len(kept) + len(taken) + dropped  # nothing vanishes
    assert len(lane) <= limit and lane.nbytes == sum(kept) <= max_bytes
    assert all(reason == "queue_full" for _, reason in told)


def test_a_closed_lane_hands_out_what_is_left_then_none_and_clear_counts() -> None:
    async def scenario() -> list[Any]:
        lane = Lane(4)
        waiter = asyncio.create_task(lane.get())
        await asyncio.sleep(0)
        lane.offer(b"a")
        lane.offer(b"b")
        lane.offer(b"c")
        got = [await waiter]
        got.append(lane.clear("stopped"))
        lane.close()
        got.append(await lane.get())
        return got + [lane.dropped]

    assert asyncio.run(scenario()) == [b"a", 2, None, 2]


def test_the_incoming_queue_diverts_bounds_the_rest_and_never_refuses() -> None:
    """aiomqtt calls put_nowait from paho's read callback: it must never raise QueueFull (aiomqtt would log a
    warning per message and count nothing)."""
    sensors = Lane(3)
    dropped: list[tuple[bytes, str]] = []
    q = IncomingQueue.factory(limit=2, divert=lambda m: sensors if m.startswith(b"s") else None,
                              on_drop=lambda m, r: dropped.append((m, r)))(maxsize=0)
    for i in range(10):
        q.put_nowait(b"s%d" % i)
        q.put_nowait(b"g%d" % i)
    assert [q.get_nowait(), q.get_nowait()] == [b"g8", b"g9"] and list(sensors) == [b"s7", b"s8", b"s9"]
    assert (q.received, q.dropped, sensors.received, sensors.dropped) == (10, 8, 10, 7)
    assert dropped[0] == (b"g0", "queue_full")
    q.put_nowait(b"g10")
    assert q.discard("disconnected") == 1 and dropped[-1] == (b"g10", "disconnected")


def test_burst_reads_reads_on_while_the_socket_has_data() -> None:
    """A fake paho client over a socket pair: one loop_read call takes every packet waiting, not one."""
    import socket

    a, b = socket.socketpair()
    b.setblocking(False)

    class FakePaho:
        def __init__(self) -> None:
            self.reads = 0

        def socket(self) -> socket.socket:
            return b

        def loop_read(self, max_packets: int = 1) -> int:
            try:
                b.recv(1)
                self.reads += 1
            except BlockingIOError:
                pass
            return 0

    class FakeClient:
        _client = FakePaho()

    client = FakeClient()
    assert burst_reads(client, packets=100)
    a.sendall(b"x" * 30)
    time.sleep(0.05)
    client._client.loop_read()
    assert client._client.reads == 30
    a.sendall(b"x" * 300)
    time.sleep(0.05)
    client._client.loop_read()
    assert client._client.reads == 130  # at most `packets` per readable event: the loop's other tasks get a turn
    a.close()
    b.close()


def test_an_oversized_sensor_message_or_json_line_is_malformed_and_never_parsed() -> None:
    parser = ReadingParser(["a"])
    big = b'{"id": "r1", "x": {"a": 1}, "pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}'
    skip = parser.parse(big)
    assert isinstance(skip, Skip) and skip.reason == "malformed" and "bytes" in skip.detail
    assert parser.parse(b'{"id": "r1", "x": {"a": 1}}').x.tolist() == [1.0]  # the id was never seen

    async def lines() -> list[Any]:
        stream = io.BytesIO(b'{"id": 1, "x": [1], "y": 2}\n' + b"z" * (3 * MAX_MESSAGE_BYTES)
                            + b'\n{"id": 2, "x": [2]}\n')
        return [item async for item in jsonl_source(stream, ["a"])]

    first, long, last = asyncio.run(lines())
    assert first.y == 2.0 and isinstance(long, Skip) and long.reason == "malformed" and "line 2" in long.detail
    assert last.id == "2"


# =========================================================================== the flood, over the production broker


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def scrape(port: int) -> dict[str, float]:
    """The agent's samples, skips by reason (`skipped:<reason>`) and global version."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {"samples": 0.0, "global_version": 0.0}
    for line in text.splitlines():
        if line.startswith("streamfed_agent_samples_total{"):
            out["samples"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("streamfed_agent_samples_skipped_total{"):
            reason = re.search(r'reason="([^"]*)"', line).group(1)  # type: ignore[union-attr]
            out[f"skipped:{reason}"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("streamfed_agent_global_version{"):
            out["global_version"] = float(line.rsplit(" ", 1)[1])
    return out


def accounted(m: dict[str, float]) -> float:
    return m["samples"] + sum(v for k, v in m.items() if k.startswith("skipped:"))


class Publisher:
    """The sensor adapter's account, publishing labelled readings at QoS 1 (paho, its own thread)."""

    def __init__(self, broker: brokers.Broker) -> None:
        self.acked = 0
        self.unmatched = 0  # acknowledged with "no matching subscribers" (0x10): before the agent subscribed
        self.refused = 0
        self.sent = 0
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=broker.client_ids["a1.sensor"],
                             protocol=paho.MQTTv5)
        self.c.username_pw_set("a1.sensor", broker.users["a1.sensor"])
        self.c.tls_set(ca_certs=str(broker.ca))
        self.c.on_publish = self._on_publish
        self.c.connect(broker.host, broker.tls_port)  # type: ignore[arg-type]
        self.c.loop_start()
        self.topic = topics.sensor_topic("f", "a1")

    def _on_publish(self, c: Any, userdata: Any, mid: int, rc: Any, props: Any = None) -> None:
        if getattr(rc, "is_failure", False):
            self.refused += 1
        else:
            self.acked += 1
            self.unmatched += int(getattr(rc, "value", 0) == 0x10)

    def publish(self, n: int | None = None, seconds: float | None = None, rate: float | None = None,
                window: int = 2000) -> None:
        """`n` readings, or as many as the broker takes in `seconds` (at most `window` unacknowledged)."""
        t0 = time.monotonic()
        i = 0
        while (n is None or i < n) and (seconds is None or time.monotonic() - t0 < seconds):
            if self.sent - self.acked - self.refused > window:
                time.sleep(0.0005)
                continue
            if rate:
                time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
            k = self.sent
            payload = json.dumps({"id": k, "x": [k % 7 / 7, k % 11 / 11, k % 13 / 13, 0.5],
                                  "y": k % 5 / 5}).encode()
            self.c.publish(self.topic, payload, qos=1)
            self.sent += 1
            i += 1

    def settle(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.acked + self.refused < self.sent and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.acked + self.refused == self.sent and not self.refused, (self.sent, self.acked, self.refused)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def broker_dropped(broker: brokers.Broker) -> int:
    """Mosquitto's own count of messages it dropped (`$SYS`, retained, published when it changes at most
    every sys_interval = 1 s: the value on subscribing, or a newer one within 1.5 s)."""
    got: dict[str, str] = {}
    done = threading.Event()
    m = paho.Client(CallbackAPIVersion.VERSION2, client_id=broker.client_ids["monitor"], protocol=paho.MQTTv5)
    m.username_pw_set("monitor", broker.users["monitor"])
    m.tls_set(ca_certs=str(broker.ca))

    def on_message(c: Any, u: Any, msg: paho.MQTTMessage) -> None:
        got[msg.topic] = msg.payload.decode()
        done.set()

    m.on_message = on_message
    m.on_connect = lambda c, *a: c.subscribe("$SYS/broker/publish/messages/dropped")
    m.connect(broker.host, broker.tls_port)  # type: ignore[arg-type]
    m.loop_start()
    try:
        assert done.wait(5), "no $SYS/broker/publish/messages/dropped"
        time.sleep(1.5)  # a change made just before is published within one sys_interval
    finally:
        m.disconnect()
        m.loop_stop()
    return int(got["$SYS/broker/publish/messages/dropped"])


@pytest.fixture
def prod_broker() -> Iterator[brokers.Broker]:
    b = brokers.start_or_fail("prod", roster=ROSTER, overrides={"sys_interval": "1"})
    with b:
        yield b


def _config(path: Path, broker: brokers.Broker, user: str) -> Path:
    path.write_text(f"""
[fleet]
fleet = "f"
algorithm = "fedbnr"
n_inputs = 4
n_kernels = 1
n_features = 16

[fleet.fedbnr]
min_upload = 10

[broker]
host = "{broker.host}"
port = {broker.tls_port}
tls = true
tls_ca = "{broker.ca}"
username = "{user}"
""")
    return path


def _process(args: list[str], broker: brokers.Broker, user: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, STREAMFED_BROKER__PASSWORD=broker.users[user], OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "streamfed.cli", *args], cwd=REPO, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None,
          fail: bool = True) -> Any:
    """Until `check()` is true (returned); after `timeout` seconds an AssertionError, or False if not `fail`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except (OSError, KeyError):
            pass
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended with {proc.returncode}")
        if time.monotonic() > deadline:
            if not fail:
                return False
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def test_a_sensor_flood_keeps_the_agent_small_and_every_reading_counted(prod_broker: brokers.Broker,
                                                                          tmp_path: Path) -> None:
    broker = prod_broker
    port = free_port()
    agent_log, agg_log = tmp_path / "agent.log", tmp_path / "aggregator.log"
    aggregator = _process(["aggregator", "--config", str(_config(tmp_path / "agg.toml", broker, "f.aggregator")),
                           "--clients", "a1", "--window", "0.5"], broker, "f.aggregator", agg_log)
    agent = _process(["agent", "--config", str(_config(tmp_path / "a1.toml", broker, "a1")), "--client", "a1",
                      "--source", "mqtt", "--metrics-port", str(port), "--wait-for-global", "0"],
                     broker, "a1", agent_log)
    pub: Publisher | None = None
    report: dict[str, Any] = {"flood_seconds": FLOOD_SECONDS}
    sampling = threading.Event()
    n_after = 100
    try:
        _wait("agent metrics", lambda: scrape(port), 30, agent)
        pub = Publisher(broker)
        # warm-up at a sensor's pace: the agent is subscribed and learning once it has learned them all
        while not (pub.acked > pub.unmatched and accounted(scrape(port)) >= pub.acked - pub.unmatched
                   and scrape(port)["global_version"] >= 1):
            pub.publish(n=20, rate=200)
            time.sleep(0.3)
            assert pub.sent < 1000, f"the agent learns nothing: {agent_log.read_text()[-2000:]}"
        pub.settle()
        before = scrape(port)
        report["rss_start_mb"] = rss_mb(agent.pid)

        # ---- the flood: as fast as the broker acknowledges, for FLOOD_SECONDS
        peak = [report["rss_start_mb"]]

        def sample() -> None:
            with contextlib.suppress(OSError):  # the process ended
                while not sampling.is_set():
                    peak[0] = max(peak[0], rss_mb(agent.pid))
                    time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.monotonic()
        sent0 = pub.sent
        pub.publish(seconds=FLOOD_SECONDS)
        pub.settle()
        report["flood"] = {"readings": pub.sent - sent0, "seconds": round(time.monotonic() - t0, 2)}
        report["flood"]["rate_per_s"] = round(report["flood"]["readings"] / report["flood"]["seconds"])
        after_flood = scrape(port)
        # the backlog (at most one lane of readings) is learned, then the agent is idle
        last = [-1.0]

        def drained() -> bool:
            now, prev = accounted(scrape(port)), last[0]
            last[0] = now
            time.sleep(0.4)
            return now == prev

        report["drained"] = _wait("the backlog learned", drained, 20, agent, fail=False)
        sampling.set()
        sampler.join()
        report["rss_peak_mb"] = round(peak[0], 1)
        drained_m = scrape(port)

        # ---- after the flood: a sensor's pace again, every reading learned, the fleet moving
        if report["drained"]:
            pub.publish(n=n_after, rate=200)
            pub.settle()
            _wait("readings after the flood learned",
                  lambda: scrape(port)["samples"] >= drained_m["samples"] + n_after, 10, agent)
            _wait("globals after the flood", lambda: scrape(port)["global_version"] > drained_m["global_version"],
                  10, agent)
        final = scrape(port)
        dropped_by_broker = broker_dropped(broker)
    finally:
        sampling.set()
        if pub is not None:
            pub.close()
        agent.send_signal(signal.SIGINT)  # Ctrl-C: the agent says what became of its input, then exits
        aggregator.terminate()
        for p in (agent, aggregator):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    log = agent_log.read_text()
    warnings = [line for line in log.splitlines() if "input dropped unread" in line]
    at_stop = [json.loads(line.split("sensor input at stop: ", 1)[1]) for line in log.splitlines()
               if "sensor input at stop: " in line]
    acc = at_stop[0] if len(at_stop) == 1 else {}  # formerly: no account at all
    report.update({
        "agent": acc, "readings_dropped_by_broker": pub.acked - pub.unmatched - acc.get("received", 0),
        "published": pub.acked, "unmatched": pub.unmatched, "dropped_by_broker": dropped_by_broker,
        "learned": final["samples"],
        "skipped": {k[8:]: v for k, v in final.items() if k.startswith("skipped:") and v},
        "learned_during_flood": after_flood["samples"] - before["samples"],
        "global_versions": [before["global_version"], after_flood["global_version"], final["global_version"]],
        "warnings": len(warnings)})
    if os.environ.get("STREAMFED_FLOODS_REPORT"):
        Path(os.environ["STREAMFED_FLOODS_REPORT"]).write_text(json.dumps(report, indent=2))
    print(json.dumps(report))

    assert report["rss_peak_mb"] < RSS_LIMIT_MB, report
    assert report["drained"], report  # the backlog is bounded: learned within seconds
    assert acc, log[-3000:]
    # nothing vanishes at the agent: every message it received is learned, skipped or dropped by reason —
    # in its own account and in its Prometheus metrics
    assert acc["received"] == acc["learned"] + sum(acc["skipped"].values()) + sum(acc["dropped"].values()), acc
    assert acc["received"] == accounted(final) and acc["learned"] == final["samples"] and not acc["waiting"], report
    # ... nor on the way: what the broker acknowledged and did not deliver, it dropped and counted ($SYS;
    # that count also holds any global or ack it dropped from the agent's queue while it lagged)
    assert 0 <= report["readings_dropped_by_broker"] <= dropped_by_broker, report
    assert final.get("skipped:queue_full", 0) > 0, report  # the flood did overflow the lane
    assert {k for k, v in final.items() if k.startswith("skipped:") and v} == {"skipped:queue_full"}, report
    assert final["skipped:queue_full"] == drained_m["skipped:queue_full"]  # none after the flood
    assert final["samples"] == drained_m["samples"] + n_after
    # the warning is rate-limited: one at the first drop, then at most one per 10 s
    assert 1 <= len(warnings) <= FLOOD_SECONDS / 10 + 3, warnings
