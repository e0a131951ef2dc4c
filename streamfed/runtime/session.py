"""A service's MQTT session, as every service of the runtime keeps it: connecting and reconnecting, refusals,
subscriptions, and publishes that are written at once or watched for their PUBACK.

Shared by the agent (:mod:`streamfed.runtime.agent`), the aggregator and shard services
(:mod:`streamfed.runtime.service`) and the broker monitor (:mod:`streamfed.runtime.broker_metrics`); how a
:class:`~streamfed.fleet.config.BrokerConfig` becomes `aiomqtt.Client` arguments is
:mod:`streamfed.runtime.connection`'s.

* :func:`reconnect_loop` runs one session after another with exponential backoff (0.1 s … 10 s);
* a connection the broker *refuses* (bad user name or password, not authorised, banned, a refused
  subscription, a TLS certificate that does not verify: :func:`refusal_reason`, :func:`check_subscription`,
  :class:`PubackWatch`) is counted by reason and logged; after `max_refusals` such refusals in a row the loop
  raises :class:`BrokerRefused` instead of retrying forever;
* :func:`until_lost` waits for a PUBACK/SUBACK (at most :data:`OP_TIMEOUT` seconds) unless the connection is
  lost first; :func:`publish_now` writes a publish to the socket before it returns, and :func:`no_delay`
  turns Nagle's algorithm off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiomqtt
import paho.mqtt.client as mqtt

from streamfed.runtime.mqtt import connect_refusal_text, paho_of

__all__ = ["OP_TIMEOUT", "BrokerRefused", "PubackWatch", "check_subscription", "no_delay", "publish_now",
           "reconnect_loop", "refusal_reason", "until_lost"]

T = TypeVar("T")

log = logging.getLogger(__name__)
_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 10.0
# Waiting for a PUBACK/SUBACK. The CONNACK wait is `connect_timeout` instead: a connection accepted by a
# broker that is shutting down is never answered, and waiting aiomqtt's 10 s default for it would add
# 10 s to the recovery from every broker restart.
OP_TIMEOUT = 10.0

# CONNACK reasons that retrying cannot fix (MQTT v5 reason codes; v3.1.1 return codes 1, 2, 4, 5)
_FATAL_V5 = {0x84, 0x85, 0x86, 0x87, 0x8A, 0x8C}
_FATAL_V3 = {1, 2, 4, 5}


class BrokerRefused(RuntimeError):
    """The broker refused this client (`reason`, e.g. ``"Bad user name or password"``) `count` times in
    a row: retrying will not help until the configuration changes.

    >>> str(BrokerRefused("Not authorized", 3))
    'the broker refused the connection 3 times: Not authorized'
    """

    def __init__(self, reason: str, count: int) -> None:
        self.reason = reason
        self.count = count
        super().__init__(f"the broker refused the connection {count} times: {reason}")


def refusal_reason(error: BaseException) -> tuple[str, bool] | None:
    """`(reason, fatal)` when `error` is the broker (or TLS) refusing this client, None for a plain
    lost connection. `fatal`: retrying cannot help (credentials, authorisation, certificates).

    >>> from aiomqtt.exceptions import MqttConnectError
    >>> refusal_reason(MqttConnectError(4))
    ('Bad username or password', True)
    >>> refusal_reason(aiomqtt.MqttError("Disconnected during message iteration")) is None
    True
    """
    if isinstance(error, aiomqtt.MqttCodeError) and isinstance(error, aiomqtt.exceptions.MqttConnectError):
        rc = error.rc
        value = getattr(rc, "value", rc)
        if isinstance(rc, int) and not hasattr(rc, "getName"):
            text = connect_refusal_text(rc)
            return text, rc in _FATAL_V3
        return str(rc), value in _FATAL_V5
    if isinstance(error, BrokerRefused):
        return error.reason, True
    text = str(error)
    if isinstance(error.__cause__, ssl.SSLError) or "CERTIFICATE_VERIFY_FAILED" in text or "SSL" in text:
        return f"TLS: {text[:200]}", True
    return None


async def reconnect_loop(session: Callable[[], Awaitable[None]], *, name: str, stop: asyncio.Event,
                         refusals: dict[str, int], max_refusals: int, on_lost: Callable[[], None],
                         finished: Callable[[], bool] = lambda: False, logger: logging.Logger = log) -> None:
    """Run `session()` until `stop` is set (or `finished()` after a clean session), reconnecting with
    exponential backoff (0.1 s … 10 s). A refusal is counted in `refusals` by reason and logged; after
    `max_refusals` fatal ones in a row :class:`BrokerRefused` is raised (retrying cannot help). Shared by
    the agent and aggregator services."""
    backoff = _BACKOFF_MIN
    refused = 0
    while not stop.is_set():
        try:
            await session()
            backoff = _BACKOFF_MIN
            if finished():
                return
        except (aiomqtt.MqttError, BrokerRefused) as e:
            on_lost()
            refusal = refusal_reason(e)
            if refusal is not None:
                reason, fatal = refusal
                refusals[reason] = refusals.get(reason, 0) + 1
                refused = refused + 1 if fatal else 0
                logger.error("%s: the broker refused the connection: %s (%d in a row)", name, reason, refused)
                if refused >= max_refusals:
                    raise BrokerRefused(reason, refused) from e
            else:
                refused = 0
                logger.warning("%s: connection lost (%s); retrying in %.1fs", name, e, backoff)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)


def check_subscription(topic: str, result: Any) -> None:
    """Raise :class:`BrokerRefused` if the SUBACK of `topic` refused it (a reason code >= 0x80): an ACL
    that does not let this user read a topic it needs is a configuration error, not a transient one."""
    codes = list(result) if isinstance(result, list | tuple) else [result]
    for code in codes:
        value = getattr(code, "value", code)
        if isinstance(value, int) and value >= 0x80:
            raise BrokerRefused(f"subscription to {topic!r} refused: {code}", 1)


async def until_lost(aw: Awaitable[T], receiver: asyncio.Task[Any]) -> T:
    """Await `aw` (a publish or subscribe) unless the connection is lost first, which the `receiver` task
    (iterating `client.messages`) learns at once: aiomqtt lets a PUBACK/SUBACK wait run to its timeout
    when the connection drops. Raises that `MqttError` then. A receiver that stopped for another reason
    says nothing about the connection, and is not waited on.

    >>> async def demo():
    ...     receiver = asyncio.create_task(asyncio.sleep(3600))
    ...     value = await until_lost(asyncio.sleep(0, "ok"), receiver)
    ...     receiver.cancel()
    ...     return value
    >>> asyncio.run(demo())
    'ok'
    """
    task = asyncio.ensure_future(aw)
    if not receiver.done():
        await asyncio.wait({task, receiver}, return_when=asyncio.FIRST_COMPLETED)
    exc = receiver.exception() if receiver.done() and not receiver.cancelled() else None
    if not task.done() and isinstance(exc, aiomqtt.MqttError):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await task
        raise exc
    return await task


def publish_now(paho: mqtt.Client, topic: str, payload: bytes, qos: int = 0) -> mqtt.MQTTMessageInfo:
    """A publish written to the socket before this returns. Without a socket-writer callback paho
    writes a queued packet itself (`loop_write()`, its call for external event loops); with aiomqtt's it
    would only ask aiomqtt to add a socket writer, which happens a loop turn later (and the packet goes
    out one turn after that). So the callback is left out for this one call; should the socket take only
    part of the packet, it is called afterwards and aiomqtt's writer sends the rest.

    Only when paho has nothing else waiting: aiomqtt adds its writer a turn late but removes it at once,
    so writing a packet whose writer is still to be added would leave that writer behind, idle and
    firing on every turn. Otherwise the message queues behind the others, the usual way.

    QoS 1 goes through paho's instance `publish` (PubackWatch's hook, if any, notes the topic) and keeps
    the "published" callback: paho calls it on the PUBACK, not on the write."""
    if paho.want_write():
        return paho.publish(topic, payload, qos, False)
    register, on_publish = paho.on_socket_register_write, paho.on_publish
    paho.on_socket_register_write = None
    try:
        if qos:
            info = paho.publish(topic, payload, qos, False)
        else:
            # Written here and now, QoS 0 needs no "published" callback: there is no PUBACK for PubackWatch
            # to check and nothing waits for it; paho would build a reason code and v5 properties for it
            # (the largest part of a prediction's publishing cost). The class's publish also skips
            # PubackWatch's per-instance hook, which would remember the topic until that callback.
            paho.on_publish = None
            info = mqtt.Client.publish(paho, topic, payload, 0, False)
    finally:
        paho.on_publish = on_publish
        paho.on_socket_register_write = register
    if paho.want_write() and register is not None and (sock := paho.socket()) is not None:
        register(paho, paho.user_data_get(), sock)  # paho marked the writer as wanted while it had none
    return info


def no_delay(client: Any) -> bool:
    """Turn Nagle's algorithm off on an aiomqtt client's socket (paho leaves it on): a small packet —
    a prediction — is sent at once instead of waiting for the broker to acknowledge the previous one,
    which with delayed ACKs costs up to ~40 ms. Returns whether it could be set."""
    sock = getattr(paho_of(client), "socket", lambda: None)()
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError):  # not TCP (a unix socket, websockets through a proxy object)
        return False
    return True


class PubackWatch:
    """Records the publishes a broker refused (an MQTT v5 PUBACK reason code >= 0x80, e.g. 0x87 when the
    ACL does not let this user write a topic) — aiomqtt's `publish()` returns normally for those, so an
    agent posing as another client would otherwise lose every update silently. :meth:`check` raises
    :class:`BrokerRefused` for the first one. Hooks aiomqtt's paho client; without one it records nothing.

    >>> PubackWatch(object()).refused
    []
    """

    def __init__(self, client: Any) -> None:
        self.refused: list[tuple[str, str]] = []
        self._topics: dict[int, str] = {}
        paho = paho_of(client)
        if paho is None or not callable(getattr(paho, "on_publish", None)):
            return
        publish, on_publish = paho.publish, paho.on_publish

        def publish_hook(topic: str, *args: Any, **kwargs: Any) -> Any:
            info = publish(topic, *args, **kwargs)
            self._topics[info.mid] = topic
            return info

        def on_publish_hook(c: Any, userdata: Any, mid: int, reason_code: Any, properties: Any = None) -> None:
            topic = self._topics.pop(mid, "?")  # paho may acknowledge before publish() returns
            if getattr(reason_code, "is_failure", False):
                self.refused.append((topic, str(reason_code)))
            on_publish(c, userdata, mid, reason_code, properties)

        paho.publish = publish_hook
        paho.on_publish = on_publish_hook

    def check(self) -> None:
        if self.refused:
            topic, reason = self.refused[0]
            raise BrokerRefused(f"publish to {topic!r} refused: {reason}", 1)
