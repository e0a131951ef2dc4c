"""Identities the production broker enforces (issue 15, part 3), over a real Mosquitto started from the
shipped `prod.conf` and a `make-dynsec.py` roster (tests/brokers.py).

Each test is an attempt measured against the former password_file + acl_file configuration:
- user `a1` connecting with client id `f.aggregator` kicked the connected aggregator off;
- `a1` subscribing to the shards' `$share` group got "Granted QoS 1", joined the group and took half the
  updates, which were then not delivered to it (read denied): lost;
- `viewer` (and every service account) could publish `…/updates/<its name>`, delivered to the aggregator.

MQTT v5 reason codes are read with paho (aiomqtt's `publish()` does not surface PUBACK codes).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from streamfed.runtime.connection import client_kwargs
from streamfed.wire import topics
from tests import brokers

NOT_AUTHORIZED = 0x87
ROSTER = {"monitor": "monitor",
          "fleet": [{"name": "f", "agents": ["a1", "a2"], "shards": ["s0", "s1"], "viewers": ["viewer"],
                     "sensor_adapters": True},
                    {"name": "g", "agents": ["b1"]}]}


@pytest.fixture(scope="module")
def broker() -> Iterator[brokers.Broker]:
    b = brokers.start_or_fail("prod", roster=ROSTER)
    with b:
        yield b


def run(coro: Any, timeout: float = 20.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def client(broker: brokers.Broker, user: str, client_id: str | None = None) -> aiomqtt.Client:
    """`user` with its bound client id unless another is given."""
    kw = client_kwargs(broker.broker_config(user), client_id or broker.client_ids[user])
    return aiomqtt.Client(**kw, timeout=5.0)


def connack(broker: brokers.Broker, user: str, client_id: str) -> int:
    """The CONNACK reason code `user` gets when it connects with `client_id` (0: accepted)."""
    async def attempt() -> int:
        try:
            async with client(broker, user, client_id):
                return 0
        except aiomqtt.MqttCodeError as e:
            return int(getattr(e.rc, "value", e.rc))

    return run(attempt())


async def drain(c: aiomqtt.Client, seconds: float) -> list[aiomqtt.Message]:
    got: list[aiomqtt.Message] = []
    try:
        async with asyncio.timeout(seconds):
            async for m in c.messages:
                got.append(m)
    except TimeoutError:
        pass
    return got


def puback_codes(broker: brokers.Broker, user: str, publishes: list[str]) -> list[int]:
    """PUBACK reason codes of QoS 1 publishes by `user` (on its bound client id), in order."""
    codes: dict[int, int] = {}
    done = threading.Event()
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=broker.client_ids[user], protocol=paho.MQTTv5)
    c.username_pw_set(user, broker.users[user])
    c.tls_set(ca_certs=str(broker.ca))

    def on_publish(cl: paho.Client, userdata: object, mid: int, rc: Any, props: object) -> None:
        codes[mid] = int(rc.value)
        if len(codes) == len(publishes):
            done.set()

    c.on_publish = on_publish
    c.connect(broker.host, broker.tls_port)  # type: ignore[arg-type]
    c.loop_start()
    try:
        mids = [c.publish(t, b"x", qos=1).mid for t in publishes]
        assert done.wait(5), codes
    finally:
        c.disconnect()
        c.loop_stop()
    return [codes[m] for m in mids]


# =========================================================================== client ids


def test_an_agent_cannot_hijack_the_aggregators_client_id(broker: brokers.Broker) -> None:
    """Formerly: a1 as `f.aggregator` kicked the aggregator off (its next publish: "not currently connected")."""
    async def scenario() -> tuple[int, list[bytes]]:
        async with client(broker, "f.aggregator") as agg, client(broker, "a1") as a1:
            await a1.subscribe(topics.global_topic("f"), qos=1)
            try:
                async with client(broker, "a1", "f.aggregator"):
                    code = 0
            except aiomqtt.MqttCodeError as e:
                code = int(getattr(e.rc, "value", e.rc))
            # still connected: its publish goes through and reaches the agent
            await agg.publish(topics.global_topic("f"), b"v1", qos=1)
            got = [bytes(m.payload) for m in await drain(a1, 1.0)]  # type: ignore[arg-type]
        return code, got

    code, got = run(scenario())
    assert code == NOT_AUTHORIZED and got == [b"v1"]


@pytest.mark.parametrize("user, client_id", [
    ("a1", "f.a2"), ("a1", "f.aggregator"), ("a1", "f.shard.s0"), ("a1", "f.reducer"), ("a1", "a1"),
    ("b1", "f.b1"), ("viewer", "f.aggregator"), ("f.shard.s0", "f.shard.s1"), ("monitor", "f.reducer"),
])
def test_no_account_connects_with_anothers_client_id(broker: brokers.Broker, user: str, client_id: str) -> None:
    assert connack(broker, user, client_id) == NOT_AUTHORIZED
    assert connack(broker, user, broker.client_ids[user]) == 0  # the same account, its own id: accepted


# =========================================================================== the shards' $share group


def test_an_agent_cannot_join_the_shards_group_and_shards_get_every_update(broker: brokers.Broker) -> None:
    """Formerly: a1's `$share/shards/…` was granted, it took half the updates and lost them (15 of 30)."""
    shared = topics.shared_filter("shards", "f")
    n = 30

    async def scenario() -> tuple[list[int], list[int], list[list[str]], list[aiomqtt.Message]]:
        async with client(broker, "f.shard.s0") as s0, client(broker, "f.shard.s1") as s1, \
                client(broker, "a1") as a1, client(broker, "a2") as a2:
            shard_codes = [int(c.value) for s in (s0, s1) for c in await s.subscribe(shared, qos=1)]
            agent_codes = [int(c.value) for c in await a1.subscribe(shared, qos=1)]
            agent_codes += [int(c.value) for c in await a1.subscribe(topics.topic_filter("updates", "f"), qos=1)]
            for i in range(n):
                await a2.publish(topics.updates_topic("f", "a2"), str(i).encode(), qos=1)
            got = await asyncio.gather(drain(s0, 1.5), drain(s1, 1.5))
            stolen = await drain(a1, 0.2)
        return shard_codes, agent_codes, [[bytes(m.payload).decode() for m in g] for g in got], stolen  # type: ignore[arg-type]

    shard_codes, agent_codes, got, stolen = run(scenario())
    assert shard_codes == [1, 1] and agent_codes == [NOT_AUTHORIZED, NOT_AUTHORIZED]
    assert sorted(int(p) for g in got for p in g) == list(range(n)) and not stolen
    assert all(got), got  # the broker split the stream between the two shards only


def test_a_shard_may_join_only_its_fleets_group(broker: brokers.Broker) -> None:
    async def codes() -> list[int]:
        async with client(broker, "f.shard.s0") as s0:
            out = []
            for f in (topics.shared_filter("other", "f"), topics.shared_filter("shards", "g"),
                      topics.topic_filter("updates", "g")):
                out += [int(c.value) for c in await s0.subscribe(f, qos=1)]
            return out

    assert run(codes()) == [NOT_AUTHORIZED] * 3


# =========================================================================== who may publish updates


@pytest.mark.parametrize("user", ["viewer", "monitor", "f.shard.s0", "f.reducer", "f.aggregator", "b1",
                                  "g.aggregator"])
def test_readers_services_and_other_fleets_cannot_publish_updates(broker: brokers.Broker, user: str) -> None:
    """Formerly: `viewer` publishing `…/updates/viewer` was delivered to the aggregator."""
    name = user.rsplit(".", 1)[-1]
    attempts = [topics.updates_topic("f", name), topics.updates_topic("f", user), topics.updates_topic("f", "a1")]

    watcher = "f.shard.s0" if user == "f.aggregator" else "f.aggregator"  # may read every update of f

    async def watch() -> list[str]:
        async with client(broker, watcher) as agg:
            await agg.subscribe(topics.topic_filter("updates", "f"), qos=1)
            codes = await asyncio.to_thread(puback_codes, broker, user, attempts)
            assert codes == [NOT_AUTHORIZED] * len(attempts), codes
            # a1's own update is the sentinel: one publisher's messages arrive in order, the refused
            # ones were published before it by another client — so wait a little after it, too
            async with client(broker, "a1") as a1:
                await a1.publish(topics.updates_topic("f", "a1"), b"sentinel", qos=1)
            return [m.topic.value for m in await drain(agg, 1.0)]

    assert run(watch()) == [topics.updates_topic("f", "a1")]


def test_an_agent_publishes_its_own_update_and_nothing_else(broker: brokers.Broker) -> None:
    own = [topics.updates_topic("f", "a1"), topics.predictions_topic("f", "a1"), topics.status_topic("f", "a1"),
           topics.sensor_topic("f", "a1")]
    others = [topics.updates_topic("f", "a2"), topics.updates_topic("g", "a1"), topics.global_topic("f"),
              topics.acks_topic("f", "a1"), "streamfed/v1/f/partials/s0"]
    # 0x10: "no matching subscribers", a success
    assert puback_codes(broker, "a1", own + others) == [0x10] * len(own) + [NOT_AUTHORIZED] * len(others)
    assert puback_codes(broker, "b1", [topics.updates_topic("g", "b1"), topics.updates_topic("f", "b1")]) == [
        0x10, NOT_AUTHORIZED]


def test_the_monitor_reads_sys_and_nothing_of_the_fleet(broker: brokers.Broker) -> None:
    async def scenario() -> tuple[list[int], list[str]]:
        async with client(broker, "monitor") as m:
            codes = [int(c.value) for f in ("$SYS/#", topics.global_topic("f"), topics.topic_filter("updates", "f"))
                     for c in await m.subscribe(f, qos=0)]
            # the broker publishes $SYS retained values (uptime, version, …) at once
            got = [msg.topic.value for msg in await drain(m, 1.0)]
        return codes, got

    codes, got = run(scenario())
    assert codes == [0, NOT_AUTHORIZED, NOT_AUTHORIZED]
    assert "$SYS/broker/version" in got and all(t.startswith("$SYS/") for t in got)


def test_a_sensor_adapter_feeds_its_agent_and_nothing_else(broker: brokers.Broker) -> None:
    """The adapter (edge/sensor_adapter.py, client id `<fleet>.<client>.sensor`) has its own account: it
    cannot take the agent's client id, and may only publish the agent's sensor topic."""
    assert broker.client_ids["a1.sensor"] == "f.a1.sensor"
    assert connack(broker, "a1.sensor", "f.a1") == NOT_AUTHORIZED
    forbidden = [topics.updates_topic("f", "a1"), topics.status_topic("f", "a1"), topics.sensor_topic("f", "a2")]

    async def scenario() -> list[bytes]:
        async with client(broker, "a1") as a1:
            await a1.subscribe(topics.sensor_topic("f", "a1"), qos=1)
            codes = await asyncio.to_thread(puback_codes, broker, "a1.sensor",
                                            [*forbidden, topics.sensor_topic("f", "a1")])
            assert codes == [NOT_AUTHORIZED] * len(forbidden) + [0], codes
            return [bytes(m.payload) for m in await drain(a1, 1.0)]  # type: ignore[arg-type]

    assert run(scenario()) == [b"x"]


def test_streamfed_subscribe_watches_predictions_as_a_viewer_account(broker: brokers.Broker,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`streamfed subscribe` (runtime.subscribe.watch) logs in as a viewer: its bound client id is its user
    name, which is what watch connects with by default; an agent's prediction reaches it."""
    import io

    import numpy as np
    from rich.console import Console

    from streamfed.runtime.subscribe import watch
    from streamfed.wire.message import encode, prediction_message

    async def scenario() -> int:
        out = io.StringIO()
        watcher = asyncio.create_task(watch("f", broker.broker_config("viewer"), Console(file=out), count=1,
                                            as_json=True))
        await asyncio.sleep(1.0)
        async with client(broker, "a1") as a1:
            msg = prediction_message("f", "a1", 1, np.array([0.5]), np.array([0.1]), global_version=2, epoch=1)
            await a1.publish(topics.predictions_topic("f", "a1"), encode(msg), qos=1)
        return await asyncio.wait_for(watcher, 10)

    assert run(scenario()) == 1
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (row["client"], row["mean"], row["global_version"], row["epoch"]) == ("a1", 0.5, 2, 1)
