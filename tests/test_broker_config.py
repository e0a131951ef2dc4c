"""The shipped Mosquitto configurations, against a real broker (see tests/brokers.py).

Dev flavour: MQTT v5 QoS 1 round trip, v3.1.1 accepted, persistent sessions (and why they need a
session expiry interval), persistence across a broker restart. Prod flavour: TLS with the generated
CA, password authentication, and the ACL — checked by a privileged subscriber that must *never* see
a forbidden message (aiomqtt's `publish()` does not surface MQTT v5 PUBACK reason codes, so the
PUBACK code is checked separately with paho)."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt
import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.client import topic_matches_sub
from paho.mqtt.enums import CallbackAPIVersion

from streamfed.algorithms.pofmkl.wire import update_message as pofmkl_update_message
from streamfed.fleet.config import BrokerConfig, FleetConfig
from streamfed.runtime import mosquitto as mosquitto_launcher
from streamfed.runtime.connection import client_kwargs
from streamfed.runtime.mosquitto import Mosquitto, MosquittoError
from streamfed.wire import topics
from streamfed.wire.message import decode, encode, status_message
from tests.brokers import BROKER_CONFIG, Broker

T = TypeVar("T")
_ids = itertools.count()


def run(coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def unique(prefix: str) -> str:
    """Fresh fleet/client names, so tests sharing a session broker never see each other's messages."""
    return f"{prefix}{next(_ids)}"


async def receive_until(client: aiomqtt.Client, done: Callable[[aiomqtt.Message], bool],
                        timeout: float = 5.0) -> list[aiomqtt.Message]:
    """Every message up to and including the first one for which `done` is true."""
    got: list[aiomqtt.Message] = []
    async with asyncio.timeout(timeout):
        async for m in client.messages:
            got.append(m)
            if done(m):
                return got
    raise AssertionError("unreachable")


def connect(cfg: BrokerConfig, client_id: str | None = None, **kw: Any) -> aiomqtt.Client:
    return aiomqtt.Client(**(client_kwargs(cfg, client_id, persistent=kw.pop("persistent", False)) | kw))


# =========================================================================== the files themselves


def _directives(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            out.append((key, value.strip()))
    return out


def test_dev_conf_is_loopback_anonymous_and_persistent() -> None:
    d = _directives(BROKER_CONFIG / "mosquitto" / "dev.conf")
    assert [v for k, v in d if k == "listener"] == ["1883 127.0.0.1"]
    assert ("allow_anonymous", "true") in d and ("persistence", "true") in d


def test_prod_conf_is_tls_only_authenticated_and_persistent() -> None:
    d = dict(_directives(BROKER_CONFIG / "mosquitto" / "prod.conf"))
    assert d["allow_anonymous"] == "false" and d["persistence"] == "true"
    assert [v for k, v in _directives(BROKER_CONFIG / "mosquitto" / "prod.conf") if k == "listener"] == ["8883"]
    for key in ("plugin_opt_config_file", "cafile", "certfile", "keyfile"):
        assert d[key].startswith("/etc/mosquitto/streamfed/")
    # accounts and roles come from the dynamic-security plugin only (see README: why not acl_file)
    assert d["plugin"].endswith("mosquitto_dynamic_security.so")
    assert "password_file" not in d and "acl_file" not in d


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_dynsec", BROKER_CONFIG / "scripts" / "make-dynsec.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


dynsec = _load_generator()
ROSTER = {"monitor": "monitor",
          "fleet": [{"name": "f", "agents": ["a1", "a2"], "shards": ["s0", "s1"], "viewers": ["viewer"]},
                    {"name": "g", "agents": ["b1"], "viewers": ["viewer"]}]}


def _allows(user: str, access: str, topic: str) -> bool:
    """What the generated roles grant `user` (no role denies, and the default denies everything):
    `access` is an acltype — publishClientSend, publishClientReceive, subscribeLiteral (the filter exactly)
    or subscribePattern (a filter covered by the role's filter)."""
    accounts, roles = dynsec.build(ROSTER)
    [acc] = [a for a in accounts if a.username == user]
    acls = [acl for r in roles if r["rolename"] in acc.roles for acl in r["acls"]]
    for acl in acls:
        if access == "subscribe":
            if (acl["acltype"] == "subscribeLiteral" and acl["topic"] == topic) or (
                    acl["acltype"] == "subscribePattern" and topic_matches_sub(acl["topic"], topic)):
                return True
        elif acl["acltype"] == access and topic_matches_sub(acl["topic"], topic):
            return True
    return False


def test_generated_roles_grant_each_agent_only_its_own_topics() -> None:
    send, recv = "publishClientSend", "publishClientReceive"
    own = [topics.updates_topic("f", "a1"), topics.predictions_topic("f", "a1"), topics.status_topic("f", "a1")]
    assert all(_allows("a1", send, t) for t in own)
    assert _allows("a1", recv, topics.global_topic("f")) and _allows("a1", "subscribe", topics.global_topic("f"))
    assert _allows("a1", recv, topics.acks_topic("f", "a1"))
    assert not _allows("a1", send, topics.updates_topic("f", "a2"))
    assert not _allows("a1", send, topics.global_topic("f"))
    assert not _allows("a1", send, topics.acks_topic("f", "a1"))
    assert not _allows("a1", recv, topics.acks_topic("f", "a2"))
    assert not _allows("a1", "subscribe", topics.topic_filter("acks", "f"))
    assert not _allows("a1", "subscribe", topics.topic_filter("updates", "f"))
    assert not _allows("a1", "subscribe", topics.shared_filter("shards", "f"))
    # another fleet's agent gets nothing in f
    assert not any(_allows("b1", a, t) for a in (send, recv, "subscribe")
                   for t in (topics.updates_topic("f", "b1"), topics.global_topic("f")))
    assert _allows("f.aggregator", recv, topics.updates_topic("f", "a2"))
    assert _allows("f.aggregator", send, topics.global_topic("f"))
    assert _allows("f.aggregator", send, topics.acks_topic("f", "a2"))
    assert not _allows("f.aggregator", send, topics.global_topic("g"))


def test_generated_roles_give_services_and_readers_no_update_rights() -> None:
    for user in ("f.aggregator", "f.shard.s0", "f.reducer", "viewer", "monitor", "g.aggregator"):
        assert not _allows(user, "publishClientSend", topics.updates_topic("f", user)), user
        assert not _allows(user, "publishClientSend", topics.updates_topic("f", "a1")), user
    # only shards may join the shards' group, and only with their own fleet's filter
    who = [a.username for a in dynsec.build(ROSTER)[0]
           if _allows(a.username, "subscribe", topics.shared_filter("shards", "f"))]
    assert who == ["f.shard.s0", "f.shard.s1"]
    assert not _allows("f.shard.s0", "subscribe", topics.shared_filter("other", "f"))
    assert _allows("f.shard.s0", "publishClientSend", "streamfed/v1/f/partials/s0")
    assert not _allows("f.shard.s0", "publishClientSend", "streamfed/v1/f/partials/s1")
    assert _allows("viewer", "publishClientReceive", topics.predictions_topic("g", "b1"))  # one account, two fleets
    assert _allows("monitor", "subscribe", "$SYS/#") and not _allows("viewer", "subscribe", "$SYS/#")


def test_generated_accounts_are_each_bound_to_one_client_id() -> None:
    accounts, _ = dynsec.build(ROSTER)
    bound = {a.username: a.clientid for a in accounts}
    assert bound == {"a1": "f.a1", "a2": "f.a2", "f.aggregator": "f.aggregator", "f.shard.s0": "f.shard.s0",
                     "f.shard.s1": "f.shard.s1", "f.reducer": "f.reducer", "viewer": "viewer", "b1": "g.b1",
                     "g.aggregator": "g.aggregator", "monitor": "monitor"}


def test_password_hash_is_the_plugins_pbkdf2() -> None:
    # computed with mosquitto_ctrl 2.0.11 (`dynsec setClientPassword a1 pw1`) and read from its JSON
    salt = base64.b64decode("1cx+d9tIBmOK246r")
    assert dynsec.ITERATIONS >= 100_000  # ours; mosquitto_ctrl's 101 below is the oracle's
    assert dynsec.hash_password("pw1", salt, iterations=101) == {
        "password": "UnkUgr5skRb4os+F0P8joLjBKKOEj0NR8xRNMQM8vCLrR/YQ7irlH6BjdD3toXF+xmL5avZeE0vyu8eD8XALsg==",
        "salt": "1cx+d9tIBmOK246r", "iterations": 101}


# =========================================================================== dev broker


def test_v5_client_publishes_qos1_and_receives(mosquitto_dev: Broker) -> None:
    fleet = unique("dev")
    cfg = FleetConfig(standardise="none",
                      fleet=fleet, algorithm="pofmkl", n_inputs=2, n_kernels=3, n_features=2, bin_size=2)
    msg = pofmkl_update_message(fleet, "a1", 1, np.array([2, 0]), np.ones((2, 4)), global_version=0,
                                kernel_version="k", created=1.0)

    async def scenario() -> None:
        broker = mosquitto_dev.broker_config()
        async with connect(broker, unique("agg")) as agg, connect(broker, "a1") as agent:
            codes = await agg.subscribe(topics.shared_filter("aggregators", fleet), qos=1)
            assert [int(c.value) for c in codes] == [1]  # granted QoS 1
            await agent.publish(topics.updates_topic(fleet, "a1"), encode(msg, cfg), qos=1)
            [m] = await receive_until(agg, lambda m: True)
        parsed = topics.parse_topic(m.topic.value)
        assert m.qos == 1 and parsed.client == "a1"
        assert decode(m.payload, cfg, client=parsed.client, kinds=cfg.protocol_schema.kinds_on(parsed.channel)) == msg

    run(scenario())


def test_v311_clients_are_accepted(mosquitto_dev: Broker) -> None:
    topic = f"streamfed/v1/{unique('v3')}/status/a1"

    async def scenario() -> None:
        broker = mosquitto_dev.broker_config(protocol="3.1.1")
        async with connect(broker, unique("c")) as c:
            await c.subscribe(topic, qos=1)
            await c.publish(topic, b"x", qos=1)
            assert [m.payload for m in await receive_until(c, lambda m: True)] == [b"x"]

    run(scenario())


def _offline_delivery(broker: Broker, session_expiry: int, restart: bool = False) -> list[bytes]:
    """Subscribe with a fixed client id and `clean_start=False`, disconnect, let three QoS 1 messages be
    published (optionally restart the broker), reconnect and return what arrives before a sentinel."""
    client_id, topic = unique("persistent"), f"streamfed/v1/{unique('p')}/acks/a1"
    cfg = broker.broker_config(session_expiry=session_expiry)

    async def scenario() -> list[bytes]:
        async with connect(cfg, client_id, persistent=True) as c:
            await c.subscribe(topic, qos=1)
        async with connect(cfg, unique("pub")) as pub:
            for i in range(3):
                await pub.publish(topic, f"m{i}".encode(), qos=1)
        if restart:
            await asyncio.to_thread(broker.restart)
        async with connect(cfg, client_id, persistent=True) as c:
            await c.subscribe(topic, qos=1)  # harmless if the session kept it; needed if it did not
            async with connect(cfg, unique("pub")) as pub:
                await pub.publish(topic, b"sentinel", qos=1)
            got = await receive_until(c, lambda m: m.payload == b"sentinel")
        return [bytes(m.payload) for m in got[:-1]]  # type: ignore[arg-type]

    return run(scenario())


def test_persistent_session_receives_what_was_published_while_offline(mosquitto_dev: Broker) -> None:
    assert _offline_delivery(mosquitto_dev, session_expiry=300) == [b"m0", b"m1", b"m2"]


def test_v5_session_without_expiry_interval_is_dropped_at_disconnect(mosquitto_dev: Broker) -> None:
    # The pitfall: clean_start=False alone does not keep a v5 session (expiry 0 = end with the connection).
    assert _offline_delivery(mosquitto_dev, session_expiry=0) == []


def test_sessions_and_retained_globals_survive_a_broker_restart(
        mosquitto_factory: Callable[..., Broker]) -> None:
    broker = mosquitto_factory("dev")
    assert _offline_delivery(broker, session_expiry=300, restart=True) == [b"m0", b"m1", b"m2"]
    topic = topics.global_topic(unique("r"))

    async def publish_retained() -> None:
        async with connect(broker.broker_config(), unique("agg")) as c:
            await c.publish(topic, b"theta-v7", qos=1, retain=True)

    async def read_retained() -> list[bytes]:
        async with connect(broker.broker_config(), unique("agent")) as c:
            await c.subscribe(topic, qos=1)
            return [bytes(m.payload) for m in await receive_until(c, lambda m: True)]  # type: ignore[arg-type]

    run(publish_retained())
    broker.restart()
    assert run(read_retained()) == [b"theta-v7"]


# =========================================================================== prod broker


@pytest.mark.parametrize("username, password", [("a1", "wrong"), ("nobody", "x"), (None, None)],
                         ids=["wrong-password", "unknown-user", "anonymous"])
def test_prod_refuses_bad_credentials(mosquitto_prod: Broker, username: str | None, password: str | None) -> None:
    async def scenario() -> None:
        async with connect(mosquitto_prod.broker_config(username, password=password), unique("x")):
            pass

    with pytest.raises(aiomqtt.MqttCodeError) as e:
        run(scenario())
    rc = e.value.rc
    assert getattr(rc, "value", rc) in (134, 135)  # v5: bad user name or password / not authorized


def test_prod_tls_needs_the_generated_ca(mosquitto_prod: Broker) -> None:
    async def with_config(cfg: BrokerConfig) -> None:
        # Plain MQTT to a TLS port gets no answer at all: bound the wait for the CONNACK.
        async with connect(cfg, "f.a1", timeout=2.0) as c:  # the client id bound to a1
            await c.publish(topics.status_topic("f", "a1"), b"", qos=1)

    run(with_config(mosquitto_prod.broker_config("a1")))  # TLS with the test CA: fine
    with pytest.raises(aiomqtt.MqttError):  # system CAs do not know the test CA
        run(with_config(mosquitto_prod.broker_config("a1").model_copy(update={"tls_ca": None, "tls": True})))
    with pytest.raises(aiomqtt.MqttError):  # plain MQTT on the TLS port
        run(with_config(BrokerConfig(port=mosquitto_prod.tls_port, username="a1",
                                     password=mosquitto_prod.users["a1"])))


def _forbidden_never_arrives(broker: Broker, watcher: str, watch: list[str], forbidden: str,
                             sentinel: str) -> list[str]:
    """`watcher` (an account whose role may receive `forbidden`) subscribes to `watch`; agent a1 publishes
    to `forbidden`, then to its own `sentinel` topic. Messages of one publisher are delivered in order, so
    once the sentinel is in, the forbidden one would have been too. Returns the topics the watcher received."""

    async def scenario() -> list[str]:
        async with connect(broker.broker_config(watcher), broker.client_ids[watcher]) as w:
            for t in watch:
                assert [c.value for c in await w.subscribe(t, qos=1)] == [1]
            async with connect(broker.broker_config("a1"), "f.a1") as a1:
                await a1.publish(forbidden, b"spoofed", qos=1)  # no error: PUBACK codes are not surfaced
                await a1.publish(sentinel, b"sentinel", qos=1)
            got = await receive_until(w, lambda m: m.payload == b"sentinel")
        return [m.topic.value for m in got]

    return run(scenario())


def test_agent_cannot_publish_another_agents_update(mosquitto_prod: Broker) -> None:
    got = _forbidden_never_arrives(mosquitto_prod, "f.aggregator", [topics.topic_filter("updates", "f")],
                                   topics.updates_topic("f", "a2"), topics.updates_topic("f", "a1"))
    assert got == [topics.updates_topic("f", "a1")]


def test_agent_cannot_publish_the_global(mosquitto_prod: Broker) -> None:
    got = _forbidden_never_arrives(mosquitto_prod, "viewer",
                                   [topics.global_topic("f"), topics.predictions_topic("f", "a1")],
                                   topics.global_topic("f"), topics.predictions_topic("f", "a1"))
    assert got == [topics.predictions_topic("f", "a1")]


def test_agent_cannot_acknowledge_itself(mosquitto_prod: Broker) -> None:
    # a1 itself is the one account that may receive its acks: it watches them on its own connection,
    # with its sensor topic (which it may publish and read) as the sentinel.
    async def scenario() -> list[str]:
        async with connect(mosquitto_prod.broker_config("a1"), "f.a1") as a1:
            for t in (topics.acks_topic("f", "a1"), topics.sensor_topic("f", "a1")):
                assert [c.value for c in await a1.subscribe(t, qos=1)] == [1]
            await a1.publish(topics.acks_topic("f", "a1"), b"spoofed", qos=1)
            await a1.publish(topics.sensor_topic("f", "a1"), b"sentinel", qos=1)
            got = await receive_until(a1, lambda m: m.payload == b"sentinel")
        return [m.topic.value for m in got]

    assert run(scenario()) == [topics.sensor_topic("f", "a1")]


def test_denied_publish_gets_not_authorized_puback_in_v5(mosquitto_prod: Broker) -> None:
    """What aiomqtt hides: Mosquitto answers a denied QoS 1 publish with PUBACK reason 0x87."""
    codes: dict[int, int] = {}
    done = threading.Event()
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id="f.a1", protocol=paho.MQTTv5)
    c.username_pw_set("a1", mosquitto_prod.users["a1"])
    c.tls_set(ca_certs=str(mosquitto_prod.ca))

    def on_publish(client: paho.Client, userdata: object, mid: int, rc: Any, props: object) -> None:
        codes[mid] = int(rc.value)
        if len(codes) == 3:
            done.set()

    c.on_publish = on_publish
    c.connect(mosquitto_prod.host, mosquitto_prod.tls_port)
    c.loop_start()
    try:
        mids = [c.publish(t, b"x", qos=1).mid for t in (topics.updates_topic("f", "a2"), topics.global_topic("f"),
                                                        topics.updates_topic("f", "a1"))]
        assert done.wait(5)
    finally:
        c.disconnect()
        c.loop_stop()
    # 0x87 not authorized; 0x10 "no matching subscribers" is a success code
    assert [codes[m] for m in mids] == [0x87, 0x87, 0x10]


def test_agent_cannot_read_other_agents_traffic(mosquitto_prod: Broker) -> None:
    fleet = "f"

    async def scenario() -> list[str]:
        async with connect(mosquitto_prod.broker_config("a1"), "f.a1") as a1:
            # The plugin refuses a wildcard subscription beyond the role (acl_file granted it and filtered).
            for f in (topics.topic_filter("acks", fleet), topics.topic_filter("updates", fleet)):
                assert [c.value for c in await a1.subscribe(f, qos=1)] == [0x87]
            await a1.subscribe(topics.acks_topic(fleet, "a1"), qos=1)
            async with connect(mosquitto_prod.broker_config("f.aggregator"), "f.aggregator") as agg:
                await agg.publish(topics.acks_topic(fleet, "a2"), b"for a2", qos=1)
                await agg.publish(topics.acks_topic(fleet, "a1"), b"sentinel", qos=1)
            async with connect(mosquitto_prod.broker_config("a2"), "f.a2") as a2:
                await a2.publish(topics.updates_topic(fleet, "a2"), b"a2's update", qos=1)
            got = await receive_until(a1, lambda m: m.payload == b"sentinel")
        return [m.topic.value for m in got]

    assert run(scenario()) == [topics.acks_topic(fleet, "a1")]


def test_last_will_marks_an_agent_offline(mosquitto_prod: Broker) -> None:
    fleet = "f"
    status = topics.status_topic(fleet, "a2")
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id="f.a2", protocol=paho.MQTTv5)
    c.username_pw_set("a2", mosquitto_prod.users["a2"])
    c.tls_set(ca_certs=str(mosquitto_prod.ca))
    c.will_set(status, encode(status_message(fleet, "a2", "offline", created=1.0)), qos=1, retain=True)
    c.connect(mosquitto_prod.host, mosquitto_prod.tls_port)
    for _ in range(50):  # drive the handshake by hand: no loop thread to notice the socket vanish
        c.loop(0.05)
        if c.is_connected():
            break
    assert c.is_connected()
    c.socket().close()  # the connection drops without a DISCONNECT packet: the broker sends the will

    async def read_status() -> list[str]:
        async with connect(mosquitto_prod.broker_config("viewer"), "viewer") as v:
            await v.subscribe(status, qos=1)
            [m] = await receive_until(v, lambda m: True)
        assert m.retain
        return [decode(m.payload, FleetConfig(standardise="none",
                                              fleet=fleet, algorithm="pofmkl", n_inputs=1)).meta["state"]]

    assert run(read_status()) == ["offline"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only a broker started as root drops to another user")
def test_prod_with_a_json_only_root_can_read_refuses_everyone(mosquitto_factory: Callable[..., Broker]) -> None:
    broker = mosquitto_factory("prod")
    (broker.workdir / "dynamic-security.json").chmod(0o600)  # root:mosquitto 0600: the broker's user cannot read
    broker.restart()

    async def login() -> None:
        async with connect(broker.broker_config("a1"), "f.a1"):
            pass

    with pytest.raises(aiomqtt.MqttCodeError) as e:
        run(login())
    assert getattr(e.value.rc, "value", e.value.rc) == 135
    assert "Error loading Dynamic security plugin config: File is not readable" in broker.log()


def _generate(tmp_path: Path, roster: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    (tmp_path / "roster.toml").write_text(roster)
    return subprocess.run([sys.executable, str(BROKER_CONFIG / "scripts" / "make-dynsec.py"), "-o",
                           str(tmp_path / "d.json"), str(tmp_path / "roster.toml"), *args],
                          capture_output=True, text=True, input=stdin)


@pytest.mark.parametrize("roster, error", [
    ('[[fleet]]\nname = "f"\nagents = ["a/b"]\n', "invalid agent: 'a/b'"),
    ('[[fleet]]\nname = "f"\nagents = ["aggregator"]\n', "collides with the service client id f.aggregator"),
    ('[[fleet]]\nname = "f"\nagents = ["shard.s0"]\n', "collides with the service client id f.shard.s0"),
    ('[[fleet]]\nname = "f"\nagents = ["a1"]\n[[fleet]]\nname = "g"\nagents = ["a1"]\n',
     "user name 'a1' is used twice"),
    ('[[fleet]]\nname = "f"\nagents = ["x.y"]\n[[fleet]]\nname = "f.x"\nagents = ["y"]\n',
     "client id 'f.x.y' is bound twice"),
    ('[[fleet]]\nname = "g"\nagents = ["f.aggregator"]\n[[fleet]]\nname = "f"\n', "user name 'f.aggregator'"),
    ('[[fleet]]\nname = "f"\nagents = ["a1", "a1"]\n', "agents listed twice: a1"),
    ('[[fleet]]\nname = "f"\nagent = ["a1"]\n', "unknown key(s) in fleet 'f': agent"),
    ('monitor = "m"\n', "the roster names no fleet"),
    ('[[fleet]\n', "cannot read roster"),
], ids=["bad-name", "agent-as-aggregator", "agent-as-shard", "agent-in-two-fleets", "dotted-names-meet",
        "agent-as-other-fleets-aggregator", "duplicate", "typo", "no-fleet", "not-toml"])
def test_generator_refuses_bad_rosters_in_one_line(tmp_path: Path, roster: str, error: str) -> None:
    res = _generate(tmp_path, roster)
    assert res.returncode == 2 and res.stdout == "" and not (tmp_path / "d.json").exists()
    assert res.stderr.startswith("make-dynsec.py: error: ") and error in res.stderr
    assert res.stderr.count("\n") == 1


def test_generator_prints_new_passwords_once_and_keeps_old_hashes(tmp_path: Path) -> None:
    roster = '[[fleet]]\nname = "f"\nagents = ["a1"]\n'
    res = _generate(tmp_path, roster)
    assert res.returncode == 0 and re.fullmatch(r"a1:\S{16,}\nf\.aggregator:\S{16,}\n", res.stdout)
    first = {c["username"]: c for c in json.loads((tmp_path / "d.json").read_text())["clients"]}
    assert (tmp_path / "d.json").stat().st_mode & 0o777 == (0o640 if os.geteuid() == 0 else 0o600)
    assert res.stdout.split("\n")[0].split(":", 1)[1] not in (tmp_path / "d.json").read_text()  # hashes only
    # a second run adds a2 (new password printed), a1 keeps its hash, f.aggregator gets the given one
    res = _generate(tmp_path, roster.replace('["a1"]', '["a1", "a2"]'), "--passwords", "-",
                    stdin="f.aggregator:s3cret\n")
    assert res.returncode == 0 and re.fullmatch(r"a2:\S{16,}\n", res.stdout)
    second = {c["username"]: c for c in json.loads((tmp_path / "d.json").read_text())["clients"]}
    assert second["a1"]["password"] == first["a1"]["password"]
    agg = second["f.aggregator"]
    assert agg == agg | dynsec.hash_password("s3cret", base64.b64decode(agg["salt"]))
    res = _generate(tmp_path, roster, "--passwords", "-", stdin="nobody:x\n")
    assert res.returncode == 2 and "not in the roster: nobody" in res.stderr


# =========================================================================== the shared launcher


def _anonymous(port: int) -> str:
    return f"listener {port} 127.0.0.1\nallow_anonymous true\nlog_dest stderr\n"


def test_launcher_reports_a_broker_that_dies_with_its_log() -> None:
    m = Mosquitto(lambda port: _anonymous(port) + "no_such_directive 1\n")
    with pytest.raises(MosquittoError, match=r"(?s)exited with code \d+.*no_such_directive") as e:
        m.start()
    assert not e.value.port_in_use and not m.running and m.port is None
    m.close()
    assert not m.workdir.exists()


def test_launcher_retries_when_a_stranger_took_its_port(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        taken = stranger.getsockname()[1]
        real = mosquitto_launcher.free_port
        picks = iter([taken])
        monkeypatch.setattr(mosquitto_launcher, "free_port", lambda host="127.0.0.1": next(picks, 0) or real(host))
        with Mosquitto(_anonymous) as m:
            assert m.running and m.port not in (None, taken)
            assert "Address already in use" in m.log_text()  # the first attempt's, kept in the log
            port, pid = m.port, m.proc.pid  # type: ignore[union-attr]
            m.restart()  # same port, new process
            assert m.port == port and m.proc.pid != pid  # type: ignore[union-attr]
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        assert m.proc is None and not m.workdir.exists()
        # no retries allowed: the failure says the port was taken
        picks = iter([taken])
        with pytest.raises(MosquittoError, match="(?i)address already in use") as e:
            Mosquitto(_anonymous, attempts=1).__enter__()
        assert e.value.port_in_use


def test_load_test_broker_runs_with_raised_descriptor_limit() -> None:
    from streamfed.runtime.loadtest import MosquittoProcess

    mosq = MosquittoProcess()
    try:
        assert mosq.config.port == mosq.port and mosq.running and mosq.log.parent == mosq.workdir
        limits = Path(f"/proc/{mosq.proc.pid}/limits").read_text()  # type: ignore[union-attr]
        soft, hard = re.search(r"Max open files\s+(\S+)\s+(\S+)", limits).groups()  # type: ignore[union-attr]
        assert soft == hard
    finally:
        mosq.close()
    assert not mosq.workdir.exists()


def test_docstring_examples() -> None:
    import doctest

    from tests import brokers

    result = doctest.testmod(brokers, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_an_operator_account_reads_every_fleet_topic_and_publishes_nothing() -> None:
    """`operators`: the broker operator of the privacy threat model (tests/test_secagg_fleet.py watches a
    secure fleet through one) — every topic readable, nothing publishable, bound to its own name."""
    accounts, roles = dynsec.build({"operators": ["ops"], "fleet": [{"name": "f", "agents": ["a1"]}]})
    [ops] = [a for a in accounts if a.username == "ops"]
    acls = [acl for r in roles if r["rolename"] in ops.roles for acl in r["acls"]]
    assert ops.clientid == "ops"
    assert {(a["acltype"], a["topic"]) for a in acls} == {("subscribePattern", "#"), ("publishClientReceive", "#")}
    with pytest.raises(dynsec.RosterError, match="used twice"):
        dynsec.build({"operators": ["a1"], "fleet": [{"name": "f", "agents": ["a1"]}]})
