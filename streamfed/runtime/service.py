"""A small base for the fleet's server-side MQTT services (aggregator shards and the reducer).

Each runs one persistent QoS 1 session (fixed client id, ``clean_start=False``,
``SessionExpiryInterval > 0``) through :func:`~streamfed.runtime.agent.reconnect_loop` (backoff, refusal
counting), and inside a session four tasks: a receiver that hands every message to :meth:`handle`
(taking already-queued messages in batches), a publisher that sends what the pure core returned, in
order, one QoS 1 publish at a time, a ticker that calls :meth:`on_tick`, and the stop event. A refused
publish (an MQTT v5 PUBACK reason code >= 0x80, e.g. an ACL) stops the service with
:class:`~streamfed.runtime.agent.BrokerRefused`, as a refused subscription does.

Subclasses say what to subscribe to, what to send on (re)connect, how to route a core's
:class:`~streamfed.fleet.protocol.Message` to a topic, and how to handle a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiomqtt

from streamfed.fleet.config import BrokerConfig
from streamfed.fleet.persistence import StateStore
from streamfed.fleet.protocol import Message, encode
from streamfed.fleet.topics import ParsedTopic, try_parse_topic
from streamfed.runtime.agent import OP_TIMEOUT, PubackWatch, check_subscription, reconnect_loop, until_lost
from streamfed.runtime.mqtt import incoming_drain

__all__ = ["Outgoing", "MqttService", "receive_batches"]

_BATCH = 256  # queued messages taken per receive step
_TOPIC_CACHE = 4096  # parsed topics remembered (one per client and channel)


class Outgoing(NamedTuple):
    """Where a core's message goes: topic, and whether it is retained."""

    topic: str
    retain: bool = False


async def receive_batches(client: aiomqtt.Client, take: Callable[[aiomqtt.Message], None]) -> None:
    """Call `take` on every message of `client`, in order.

    aiomqtt hands out one message per `async for` step, at the price of a task and an `asyncio.wait`
    each; the messages already waiting behind it are taken in the same step (at most `_BATCH`, so other
    tasks still get their turn)."""
    drain = incoming_drain(client)  # the incoming queue `messages` reads
    async for message in client.messages:
        take(message)
        if drain is None:
            continue
        for _ in range(_BATCH):
            try:
                message = drain()
            except asyncio.QueueEmpty:
                break
            take(message)


class MqttService:
    """Base of a server-side service: session, receiver, publisher, ticker. See the module doc.

    >>> svc = MqttService(BrokerConfig(), "f.example", tick=0.1)
    >>> svc.client_id, svc.published, svc.connected.is_set()
    ('f.example', 0, False)
    """

    log = logging.getLogger("streamfed.service")

    def __init__(self, broker: BrokerConfig, client_id: str, *, tick: float, max_refusals: int = 3,
                 connect_timeout: float = 5.0) -> None:
        self.broker = broker
        self.client_id = client_id
        self.tick = tick
        self.max_refusals = max(1, int(max_refusals))
        self.connect_timeout = connect_timeout
        self.refusals: dict[str, int] = {}
        self.connected = asyncio.Event()
        self.published = 0
        self.received = 0
        self.reconnects = 0
        self._stop = asyncio.Event()
        self._watch: PubackWatch | None = None
        self._topics: dict[str, ParsedTopic | str] = {}
        self.store: StateStore | None = None  # see keep_state
        self.restored = False
        self._durable: Any = None
        self._outbox: asyncio.Queue[Message] | None = None  # the current session's (see emit)

    # ------------------------------------------------------------------ what subclasses say
    def subscriptions(self) -> list[str]:
        """Topic filters to subscribe to (QoS 1) on every connect."""
        raise NotImplementedError

    def on_connect(self) -> list[Message]:
        """Messages to send once subscribed (e.g. the current global, or partials not yet acknowledged)."""
        return []

    def route(self, msg: Message) -> Outgoing:
        """The topic of a message the core produced."""
        raise NotImplementedError

    def handle(self, topic: ParsedTopic | str, payload: bytes) -> list[Message]:
        """One received message (its parsed topic, or the reason it did not parse); returns what to send."""
        raise NotImplementedError

    def on_tick(self, now: float) -> list[Message]:
        """Called every `tick` seconds while connected; returns what to send."""
        return []

    def on_published(self, msg: Message, at: float) -> None:
        """Called once the broker acknowledged the publish of `msg` (its PUBACK), at time `at`."""

    def emit(self, msgs: list[Message]) -> None:
        """Send what a core returned outside :meth:`handle` and :meth:`on_tick` (from a timer, say); dropped
        while disconnected, as a tick's would not run then."""
        if self._outbox is not None:
            for m in msgs:
                self._outbox.put_nowait(m)

    # ------------------------------------------------------------------ durable state
    def keep_state(self, core: Any, path: Path, kind: str) -> None:
        """Keep `core`'s state in the state file `path` (:mod:`streamfed.fleet.persistence`): resume from it now,
        checkpoint through `core.checkpoint` (the core calls it before handing out each new global: write-ahead),
        and once more when the service stops. `core` has `snapshot()`, `restore(state)` and `checkpoint`.
        Raises :class:`~streamfed.fleet.persistence.StateError` for a damaged, foreign or unusable state."""
        self.store = StateStore(path, kind=kind)
        self.restored = self.store.resume(lambda state: core.restore(state["core"])) is not None
        if self.restored:
            self.log.info("%s: resumed from %s at global version %d", self.client_id, path, core.version)
        self._durable = core
        core.checkpoint = self._save

    def _save(self, core: Any) -> None:
        assert self.store is not None
        # An OSError here propagates and stops the service: a global that is not on disk is never published.
        self.store.save({"core": core.snapshot(), "saved_at": time.time()})

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        self._stop.set()

    def _lost(self) -> None:
        self.connected.clear()
        self.reconnects += 1

    async def run(self) -> None:
        """Serve until `stop()`, reconnecting as needed; with a state file, save the state at the end."""
        try:
            await reconnect_loop(self._session, name=self.client_id, stop=self._stop, refusals=self.refusals,
                                 max_refusals=self.max_refusals, on_lost=self._lost, logger=self.log)
        finally:
            if self.store is not None:
                with contextlib.suppress(OSError):
                    self._save(self._durable)
                self.store.close()

    async def _session(self) -> None:
        kw = self.broker.aiomqtt_kwargs(self.client_id, persistent=True)
        async with aiomqtt.Client(**kw, max_queued_incoming_messages=0, timeout=self.connect_timeout) as client:
            self._watch = PubackWatch(client)
            outbox: asyncio.Queue[Message] = asyncio.Queue()
            self._outbox = outbox
            receiver = asyncio.create_task(receive_batches(client, lambda m: self._take(m, outbox)))
            tasks = [receiver]
            try:
                for topic in self.subscriptions():
                    check_subscription(topic, await until_lost(
                        client.subscribe(topic, qos=1, timeout=OP_TIMEOUT), receiver))
                for m in self.on_connect():
                    outbox.put_nowait(m)
                tasks += [asyncio.create_task(self._publisher(client, outbox)),
                          asyncio.create_task(self._ticker(outbox))]
                self.connected.set()
                stopper = asyncio.create_task(self._stop.wait())
                tasks.append(stopper)
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not stopper and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
            finally:
                self._outbox = None
                for t in tasks:
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                        await t

    async def _publisher(self, client: aiomqtt.Client, outbox: asyncio.Queue[Message]) -> None:
        # Apart from the receiver, so that it keeps reading (and notices a lost connection at once)
        # while a publish waits for its PUBACK.
        while True:
            m = await outbox.get()
            out = self.route(m)
            await client.publish(out.topic, encode(m), qos=1, retain=out.retain, timeout=OP_TIMEOUT)
            if self._watch is not None:
                self._watch.check()
            self.published += 1
            self.on_published(m, time.time())

    async def _ticker(self, outbox: asyncio.Queue[Message]) -> None:
        while True:
            await asyncio.sleep(self.tick)
            for m in self.on_tick(time.time()):
                outbox.put_nowait(m)

    def _take(self, message: aiomqtt.Message, outbox: asyncio.Queue[Message]) -> None:
        topic = message.topic.value
        parsed = self._topics.get(topic)
        if parsed is None:
            parsed = try_parse_topic(topic)
            if len(self._topics) >= _TOPIC_CACHE:
                self._topics.clear()
            self._topics[topic] = parsed
        payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
        self.received += 1
        for m in self.handle(parsed, bytes(payload)):
            outbox.put_nowait(m)
