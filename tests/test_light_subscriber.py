"""The light MQTT v5 subscriber (streamfed/runtime/light_subscriber.py): frame parsing, and the aggregator's
update stream over it against a real Mosquitto (QoS 1, redelivery after a reconnect, bad input refused with a
reason and a metric, nothing lost)."""

from __future__ import annotations

import asyncio
import contextlib
import struct

import aiomqtt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamfed.fleet.agent import AgentCore
from streamfed.fleet.aggregator import AggregatorCore
from streamfed.fleet.config import FleetConfig
from streamfed.fleet.sources import Reading
from streamfed.runtime.aggregator import AggregatorService
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.light_subscriber import IngestLost, LightSubscriber
from streamfed.wire.message import encode
from streamfed.wire.topics import Channel, topic_filter, updates_topic
from tests.brokers import start_or_fail


def plain_publish(topic: str, payload: bytes, packet_id: int | None) -> bytes:
    """A PUBLISH packet written straight from the MQTT v5 spec (§3.3), independent of the module's helper:
    fixed header (type 3, QoS in bits 1-2), remaining length (7 bits a byte, high bit = more), topic as a
    two-byte-length string, the packet id for QoS 1, property length 0, payload."""
    t = topic.encode()
    body = len(t).to_bytes(2, "big") + t + (packet_id.to_bytes(2, "big") if packet_id is not None else b"")
    body += b"\x00" + payload
    n, rl = len(body), bytearray()
    while True:
        n, digit = n // 128, n % 128
        rl.append(digit | (128 if n else 0))
        if not n:
            break
    return bytes([0x32 if packet_id is not None else 0x30]) + bytes(rl) + body


messages = st.lists(st.tuples(st.sampled_from(["u/a", "streamfed/v1/f/updates/c1", "ü/x"]),
                              st.binary(max_size=300), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(messages, st.lists(st.integers(1, 97), min_size=1, max_size=40), st.integers(40, 400))
def test_any_split_of_the_stream_gives_every_message_once_in_order(msgs, cuts, limit) -> None:
    stream, expected, acks, oversized = b"", [], [], 0
    for i, (topic, payload, qos1) in enumerate(msgs, start=1):
        pkt = plain_publish(topic, payload, i if qos1 else None)
        stream += pkt
        if qos1:
            acks.append(i)  # acknowledged, oversized or not: redelivery would not make it smaller
    got: list[tuple[str, bytes]] = []
    sizes: list[int] = []
    sub = LightSubscriber(got.extend, max_packet=limit, on_oversized=lambda t, n: sizes.append(n))
    pos, k = 0, 0
    while pos < len(stream):  # the socket hands out arbitrary pieces
        step = cuts[k % len(cuts)]
        sub.feed(stream[pos:pos + step])
        pos, k = pos + step, k + 1
    for topic, payload, qos1 in msgs:
        body = 2 + len(topic.encode()) + (2 if qos1 else 0) + 1 + len(payload)
        if body > limit:
            oversized += 1
        else:
            expected.append((topic, payload))
    assert got == expected
    assert sub.pending_acks == acks
    assert len(sizes) == sub.oversized == oversized


def test_malformed_input_ends_the_connection() -> None:
    sub = LightSubscriber(lambda batch: None)
    with pytest.raises(IngestLost, match="remaining length"):
        sub.feed(b"\x30\xff\xff\xff\xff\x01")
    with pytest.raises(IngestLost, match="unexpected packet type"):
        LightSubscriber(lambda batch: None).feed(b"\x10\x00")
    with pytest.raises(IngestLost, match="properties past the end"):
        LightSubscriber(lambda batch: None).feed(b"\x32\x06\x00\x01a\x00\x01\x05")


# ---------------------------------------------------------------------------------------------- over Mosquitto
CFG = FleetConfig(fleet="lt", algorithm="pofmkl", n_inputs=2, n_kernels=2, n_features=3)
CLIENTS = ["a1", "a2"]


def honest(per_client: int) -> list[tuple[str, bytes]]:
    """Encoded updates an AgentCore made, round by round (every client's seq 1, then seq 2, ...)."""
    rng = np.random.default_rng(1)
    per = []
    for i, c in enumerate(CLIENTS):
        core, out, k = AgentCore(CFG, c, i, mode="async"), [], 0
        while len(out) < per_client:
            x = rng.uniform(-1, 1, CFG.n_inputs)
            out += [encode(m) for m in core.on_reading(Reading(f"r{k}", x, float(k), float(x.sum())), now=float(k))[1]]
            k += 1
        per.append(out[:per_client])
    return [(c, per[i][s]) for s in range(per_client) for i, c in enumerate(CLIENTS)]


async def publish(broker, items: list[tuple[str, bytes]]) -> None:
    async with aiomqtt.Client(**client_kwargs(broker, "lt-pub")) as p:
        for client, payload in items:
            await p.publish(updates_topic(CFG.fleet, client), payload, qos=1)


async def until(cond, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def mosquitto():
    with start_or_fail("dev") as b:
        yield b


@pytest.mark.slow
def test_aggregator_over_the_light_path_takes_everything_and_refuses_bad_input(mosquitto) -> None:
    broker = mosquitto.broker_config()
    updates = honest(30)

    async def main() -> None:
        core = AggregatorCore(CFG, clients=CLIENTS, mode="async", window=0.05)
        svc = AggregatorService(core, broker, lease=False)
        assert svc.light_subscriptions() and topic_filter(Channel.UPDATES, CFG.fleet) not in svc.subscriptions()
        task = asyncio.create_task(svc.run())
        await asyncio.wait_for(svc.connected.wait(), 10)
        limit = svc.light_max_packet()
        await publish(broker, updates[:20] + [("a1", b"\xc1 not msgpack"),
                                              ("a2", b"\x00" * (limit + 10)),  # over the light path's limit
                                              ("a1", b"\x00" * (core.schema.max_bytes + 1))])  # over the codec's
        await until(lambda: core.counters.accepted == 20 and sum(core.rejected.values()) == 3)
        # the aggregator goes away; what is published meanwhile waits in its ingest session
        svc.stop()
        await task
        await publish(broker, updates[20:])
        svc2 = AggregatorService(core, broker, lease=False)
        task2 = asyncio.create_task(svc2.run())
        await until(lambda: core.counters.accepted == len(updates))
        await asyncio.sleep(0.3)  # nothing more arrives: no duplicate was taken twice
        svc2.stop()
        await task2
        assert core.counters.accepted == len(updates)
        assert core.rejected == {"not_msgpack": 1, "too_large": 2}
        assert core.stats.rejected_by_reason.get("too_large") == 2  # exported as a metric
        assert core.included() == {c: 30 for c in CLIENTS}

    asyncio.run(main())


@pytest.mark.slow
def test_what_was_not_acknowledged_is_delivered_again(mosquitto) -> None:
    """PUBACKs go out after the batch was handled: a connection lost while handling leaves the batch
    unacknowledged in the broker's session, which sends it again on the next connect."""
    broker = mosquitto.broker_config()
    items = [("a1", f"m{i}".encode()) for i in range(50)]

    async def main() -> None:
        topics = [topic_filter(Channel.UPDATES, CFG.fleet)]
        first: list[bytes] = []

        def lose(batch: list[tuple[str, bytes]]) -> None:
            first.extend(p for _, p in batch)
            raise OSError("pulled the plug")  # the handler fails: this batch's PUBACKs never go out

        sub = await LightSubscriber.open(broker, "lt.redeliver", topics, lambda b: None)
        sub.close()  # the persistent session exists now
        await publish(broker, items)
        with contextlib.suppress(IngestLost):  # the queue arrives right after the CONNACK, during open()
            lost = await LightSubscriber.open(broker, "lt.redeliver", topics, lose)
            await asyncio.wait_for(lost.wait_closed(), 10)
        assert first, "nothing was received before the connection was lost"
        again: list[bytes] = []
        sub = await LightSubscriber.open(broker, "lt.redeliver", topics, lambda b: again.extend(p for _, p in b))
        await until(lambda: len(again) >= len(items) - len(first) + 1)
        await asyncio.sleep(0.2)
        sub.close()
        assert first[0] in again  # the batch that was never acknowledged came back
        assert sorted(set(first) | set(again)) == sorted(p for _, p in items)  # nothing lost

    asyncio.run(main())


def test_connect_packet_layout() -> None:
    from streamfed.runtime.light_subscriber import connect_packet

    pkt = connect_packet("x", keepalive=30, clean_start=False, session_expiry=60, receive_maximum=10,
                         username="u", password="p")
    # header 0x10, protocol name, level 5, flags: user name + password, no clean start
    assert pkt[0] == 0x10 and pkt[2:10] == b"\x00\x04MQTT\x05\xc0"
    assert struct.unpack("!H", pkt[10:12]) == (30,)
